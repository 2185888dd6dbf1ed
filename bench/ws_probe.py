"""Does WARP_SPECIALIZE help the tma variant on this GPU, and which kernels does cuBLAS run where we trail?

    python bench/ws_probe.py --out bench/results/ws-probe-h100.json

For the matmul shapes where the tuned config trails cuBLAS most, and two where it matches it,
timed side by side with the timer and plan of bench/kernels.py (L2 cold, events or graphs):
- `cublas`: torch.matmul, and the names of the kernels it launches (torch.profiler), which say
  its tile shape, cluster and scheduling;
- `tuned`: the fastest recorded config of the shipped matmul datasets (what bench/kernels.py times);
- `tma-*` / `ws-*`: VARIANT=tma at the recorded grid's tiles, without and with WARP_SPECIALIZE
  (same tile, warps, stages), so the pair isolates warp specialisation.
Each arm's output is checked against the family's reference before it is timed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SHAPES = [(1000, 3000, 2000, "bf16"), (3000, 5000, 1000, "fp16"), (6144, 1536, 4096, "bf16"),
          (16384, 16384, 256, "bf16"), (8192, 2048, 512, "fp16"), (4096, 4096, 4096, "bf16"),
          (4096, 4096, 1024, "bf16")]
TILES = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4),
         (128, 128, 64, 8, 4), (128, 128, 128, 8, 3), (64, 256, 64, 4, 4)]


def cublas_kernels(fn: Any) -> list[str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from kernels import Arms, gpu_probe, tuned_configs, write_probe
    from record import tile_config

    fam, ev, target, timer = gpu_probe("matmul")
    tuned = tuned_configs("matmul")
    rows = []
    for m, n, k, dtype in SHAPES:
        problem = fam.parse_problem({"M": m, "N": n, "K": k, "dtype": dtype})
        arms = Arms(fam, problem, target)
        arms.baseline("cublas")
        if problem.key() in tuned:
            arms.config("tuned", tuned[problem.key()])
        for bm, bn, bk, w, s in TILES:
            for ws in (False, True):
                c = tile_config(bm, bn, bk, w, s, VARIANT="tma", WARP_SPECIALIZE=ws)
                reason = fam.space().check(c, problem)
                name = f"{'ws' if ws else 'tma'}-{bm}x{bn}x{bk}-w{w}s{s}"
                if reason is None:
                    arms.config(name, c)
                else:
                    arms.notes[name] = {"config": c.as_dict(), "error": f"invalid: {reason}"}
        kernels = cublas_kernels(arms.launches["cublas"]) if "cublas" in arms.launches else []
        row: dict[str, Any] = {"problem": problem.label(), "cublas_kernels": kernels,
                               "arms": arms.medians(arms.time(timer, fam.l2_flush))}
        rows.append(row)
        cub = row["arms"].get("cublas", {}).get("median_ms")
        pairs = []
        for bm, bn, bk, w, s in TILES:
            base, ws = (row["arms"].get(f"{p}-{bm}x{bn}x{bk}-w{w}s{s}", {}) for p in ("tma", "ws"))
            pairs.append(f"{bm}x{bn}x{bk}w{w}s{s} {base.get('median_ms') or base.get('error', '')[:40]}"
                         f"/{ws.get('median_ms') or ws.get('error', '')[:40]}")
        print(problem.label(), "cublas", cub, "tuned", row["arms"].get("tuned", {}).get("median_ms"), kernels,
              "|", "; ".join(pairs), flush=True)
    write_probe(args.out, __doc__, "ws_probe.py", argv, ev, rows)
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
