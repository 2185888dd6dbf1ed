"""Where a GPU process's first batch spends its time, from a cold Triton cache.

A compile process (no visible GPU, as in the compile pool) compiles a few matmul configs into a
fresh Triton cache; then a fresh GPU process (warmed up as a worker's child is: CUDA context,
cuRAND, cuBLAS, Triton's driver) evaluates them one at a time, and each step of the first one is
timed apart: the problem's data (inputs, references, cold copies), loading the compiled kernel
from the cache, its first launch handle (Triton builds the kernel's C launcher here with gcc, once
per kernel signature, where it has not been built into the cache before), then the evaluations.
Two arms, each in fresh processes and a fresh cache: `plain` (the compile process compiles only)
and `launchers` (it also builds the launchers, `compile.build_launchers`).

    python bench/first_batch.py --out bench/results/first-batch-h100.json

Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROBLEM = {"M": 4096, "N": 4096, "K": 4096, "dtype": "fp16"}
CONFIGS = [
    {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8, "num_warps": 8, "num_stages": 3},
    {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8, "num_warps": 4, "num_stages": 4},
    {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8, "num_warps": 4, "num_stages": 4},
    {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8, "num_warps": 8, "num_stages": 3,
     "VARIANT": "tma"},
]


def compile_step(launchers: bool) -> dict[str, Any]:
    """In the compile process: compile every config (and build their launchers if asked)."""
    from tilepilot.experiments import Config, Problem
    from tilepilot.kernels.base import Target
    from tilepilot.kernels.evaluate import compile_config

    out = []
    for c in CONFIGS:
        t0 = time.perf_counter()
        o = compile_config("matmul", Problem.of(PROBLEM), Config.of(c), Target(), launchers=launchers)
        out.append({"status": o.status.value, "ms": round((time.perf_counter() - t0) * 1e3, 1),
                    "launchers_built": o.launchers_built})
    return {"compiles": out}


def gpu_step() -> dict[str, Any]:
    """In the fresh GPU process: warm up as a worker's child does, then time the first batch's steps."""
    from tilepilot.experiments import Config, Problem
    from tilepilot.kernels.evaluate import Evaluator
    from tilepilot.orchestrator.child import _warm_up_gpu

    t0 = time.perf_counter()
    ev = Evaluator("gpu")
    _warm_up_gpu()
    steps: dict[str, float] = {"warm_up_ms": (time.perf_counter() - t0) * 1e3}
    problem = Problem.of(PROBLEM)
    family, problem = ev._family("matmul", problem)
    target = ev.target()
    assert target is not None
    t = time.perf_counter()
    ev._data("matmul", family, problem)
    steps["problem_data_ms"] = (time.perf_counter() - t) * 1e3
    first = Config.of(CONFIGS[0])
    t = time.perf_counter()
    compiled = family.compile(problem, first, target)
    steps["cache_load_ms"] = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    compiled.run  # noqa: B018 - the launch handle: launcher (built or loaded) and the binary loaded
    steps["first_handle_ms"] = (time.perf_counter() - t) * 1e3
    evals = []
    for c in CONFIGS:
        t = time.perf_counter()
        r = ev.evaluate("matmul", problem, [Config.of(c)])[0]
        evals.append({"config": c, "status": r.status.value, "ms": round((time.perf_counter() - t) * 1e3, 1),
                      "median_ms": r.timing.median_ms if r.timing else None,
                      "stop": r.timing.stop_reason if r.timing else None})
    return {"steps_ms": {k: round(v, 1) for k, v in steps.items()}, "evaluations": evals}


def arm(launchers: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tilepilot-first-batch-") as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
        res: dict[str, Any] = {"launchers_prebuilt": launchers}
        for step, extra in (("compile", {"CUDA_VISIBLE_DEVICES": ""}), ("gpu", {})):
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, __file__, "--step", step, *(["--launchers"] if launchers else [])],
                                  env={**env, **extra}, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"{step} step failed: {proc.stderr[-3000:]}")
            res[step] = json.loads(proc.stdout.strip().splitlines()[-1])
            res[step]["process_wall_s"] = round(time.perf_counter() - t0, 2)
        return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step", choices=("compile", "gpu"))
    ap.add_argument("--launchers", action="store_true")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if a.step == "compile":
        print(json.dumps(compile_step(a.launchers)))
        return 0
    if a.step == "gpu":
        print(json.dumps(gpu_step()))
        return 0
    import torch
    import triton

    from tilepilot.experiments import BackendUnavailable
    from tilepilot.kernels import telemetry

    if not torch.cuda.is_available():
        raise BackendUnavailable("no CUDA GPU visible to torch: this benchmark times on a GPU")
    arms = [arm(launchers) for _ in range(a.repeats) for launchers in (False, True)]
    for r in arms:
        print(("launchers " if r["launchers_prebuilt"] else "plain     "), json.dumps(r["gpu"]["steps_ms"]),
              [e["ms"] for e in r["gpu"]["evaluations"]])
    doc = {"what": __doc__.splitlines()[0], "command": " ".join(["python", *sys.argv]),
           "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(0), "driver": telemetry.driver_version(),
           "torch": torch.__version__, "triton": triton.__version__, "problem": PROBLEM, "arms": arms}
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
