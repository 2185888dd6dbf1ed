"""What a GPU process spends on a config besides timing it, by matmul variant.

    python bench/load_probe.py --out bench/results/load-probe-h100.json [--configs 24]

For each variant of `bench/throughput.py --part scale`'s space (grouped, persistent, tma), the same
tiles on one fp16 problem are compiled ahead in a process without CUDA (launchers built, as the
compile pool does), then evaluated in a fresh GPU process by the campaigns' Evaluator, one config
at a time, interleaved across the variants. Per config it reports the cache load (the results'
compile_ms: the kernel found in Triton's on-disk cache), the evaluation's wall time, its GPU timing
(timed_ms) and the rest (verification launches, host work), and the C modules the GPU process
built (0 where the compile side built every launcher).
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

VARIANTS = ("grouped", "persistent", "tma")
PROBLEM = {"M": 2048, "N": 2048, "K": 2048, "dtype": "fp16"}

COMPILE = textwrap.dedent("""
    import json, sys
    from tilepilot.experiments import Config, Problem
    from tilepilot.kernels.base import Target
    from tilepilot.kernels.evaluate import compile_config
    configs, problem = json.loads(sys.argv[1]), Problem.of(json.loads(sys.argv[2]))
    out = [compile_config("matmul", problem, Config.of(c), Target()) for c in configs]
    print(json.dumps([[o.status.value, o.launchers_built] for o in out]))
""")

EVALUATE = textwrap.dedent("""
    import json, sys, time
    from tilepilot.experiments import Config, Problem
    from tilepilot.kernels.evaluate import Evaluator
    from tilepilot.orchestrator.child import _CompileCounter, _warm_up_gpu
    configs, problem = json.loads(sys.argv[1]), Problem.of(json.loads(sys.argv[2]))
    ev = Evaluator("gpu")
    _warm_up_gpu()
    counter = _CompileCounter("gpu")
    ev.evaluate("matmul", problem, [Config.of(configs[0])])  # inputs made, the first launch's costs paid
    rows = []
    for c in configs[1:]:
        t0 = time.perf_counter()
        [r] = ev.evaluate("matmul", problem, [Config.of(c)])
        wall = (time.perf_counter() - t0) * 1e3
        timed = r.timing.timed_ms if r.timing is not None else None
        rows.append({"variant": c.get("VARIANT", "grouped"), "status": r.status.value, "wall_ms": wall,
                     "cache_load_ms": r.compile_ms, "timed_ms": timed,
                     "stop": r.timing.stop_reason if r.timing is not None else None})
    env = ev.environment().as_dict()
    print(json.dumps({"rows": rows, "c_builds_and_compiles": counter.take(), "environment": env}))
""")


def configs(n: int) -> list[dict[str, Any]]:
    """n tiles of the scale space, each in every variant, interleaved (grouped, persistent, tma, ...)."""
    from record import tile_config

    from tilepilot.experiments import Problem
    from tilepilot.kernels import get_family

    family = get_family("matmul")
    problem = Problem.of(PROBLEM)
    tiles = [t for t in itertools.product([64, 128], [64, 128, 256], [32, 64], [4, 8], [3, 4])
             if all(family.space().check(tile_config(*t, VARIANT=v), problem) is None for v in VARIANTS)]
    step = max(1, len(tiles) // n)
    return [tile_config(*t, VARIANT=v).as_dict() for t in tiles[::step][:n] for v in VARIANTS]


def run(script: str, env: dict[str, str], *args: str) -> Any:
    proc = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          cwd=ROOT, check=False, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", type=int, default=24, help="tiles per variant")
    args = ap.parse_args(argv)
    import torch

    from tilepilot.experiments import BackendUnavailable

    if not torch.cuda.is_available():
        raise BackendUnavailable("no CUDA GPU visible to torch: this probe times on a GPU")
    cs = configs(args.configs)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
        env.pop("TRITON_INTERPRET", None)
        compiled = run(COMPILE, {**env, "CUDA_VISIBLE_DEVICES": ""}, json.dumps(cs), json.dumps(PROBLEM))
        evaluated = run(EVALUATE, env, json.dumps(cs), json.dumps(PROBLEM))
    summary: dict[str, Any] = {}
    for v in VARIANTS:
        rows = [r for r in evaluated["rows"] if r["variant"] == v and r["status"] == "ok"]
        if not rows:
            continue

        def med(key: str, rows: list[dict[str, Any]] = rows) -> float | None:
            xs = [r[key] for r in rows if r[key] is not None]
            return round(statistics.median(xs), 3) if xs else None

        rest = [r["wall_ms"] - (r["cache_load_ms"] or 0) - (r["timed_ms"] or 0) for r in rows]
        summary[v] = {"configs": len(rows), "median_wall_ms": med("wall_ms"),
                      "median_cache_load_ms": med("cache_load_ms"),
                      "median_timed_ms": med("timed_ms"), "median_rest_ms": round(statistics.median(rest), 3),
                      "stops": {s: sum(1 for r in rows if r["stop"] == s) for s in {r["stop"] for r in rows}}}
    result = {"command": "python " + " ".join(sys.argv), "date": dt.date.today().isoformat(),
              "environment": evaluated["environment"], "problem": PROBLEM,
              "compile_side": {"statuses": sorted({s for s, _ in compiled}),
                               "launchers_built": sum(b or 0 for _, b in compiled)},
              "gpu_process_c_builds_and_compiles": evaluated["c_builds_and_compiles"],
              "summary": summary, "rows": evaluated["rows"], "wall_s": round(time.perf_counter() - start, 1)}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"summary": summary, "compile_side": result["compile_side"],
                      "gpu_process_c_builds_and_compiles": result["gpu_process_c_builds_and_compiles"]}, indent=1))
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
