"""Does a persistent tma launch with two programs per SM (so one program's epilogue can overlap the
other's main loop) beat one program per SM?

    python bench/ctas_probe.py --out bench/results/ctas-probe-h100.json

For the matmul shapes where the tuned config trails cuBLAS and K is short, timed side by side with
the timer and plan of bench/kernels.py: `cublas`, and VARIANT=tma at tiles whose shared memory
lets two programs share an SM, launched with one program per SM (`p1-*`, as the family launches
it) and with two (`p2-*`, the family's program count doubled while the arm is built).
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

SHAPES = [(16384, 16384, 256, "bf16"), (8192, 2048, 512, "fp16"), (3000, 5000, 1000, "fp16"),
          (4096, 4096, 1024, "bf16"), (1000, 3000, 2000, "bf16"), (4096, 4096, 4096, "bf16")]
TILES = [(128, 128, 64, 4, 2), (128, 128, 32, 4, 3), (128, 128, 64, 8, 2), (64, 256, 32, 4, 3),
         (128, 256, 64, 8, 3), (128, 128, 64, 4, 4)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from kernels import Arms, gpu_probe, write_probe

    from tilepilot.experiments import Config
    from tilepilot.kernels import matmul

    fam, ev, target, timer = gpu_probe("matmul")
    one = matmul._programs
    rows = []
    for m, n, k, dtype in SHAPES:
        problem = fam.parse_problem({"M": m, "N": n, "K": k, "dtype": dtype})
        arms = Arms(fam, problem, target)
        arms.baseline("cublas")
        for bm, bn, bk, w, s in TILES:
            c = Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 8,
                           "num_warps": w, "num_stages": s, "VARIANT": "tma"})
            if fam.space().check(c, problem) is not None:
                continue
            for per_sm in (1, 2):
                matmul._programs = (lambda a, k=per_sm: k * one(a))  # type: ignore[assignment]
                try:
                    arms.config(f"p{per_sm}-{bm}x{bn}x{bk}-w{w}s{s}", c)
                finally:
                    matmul._programs = one  # type: ignore[assignment]
        row: dict[str, Any] = {"problem": problem.label(), "arms": arms.medians(arms.time(timer, fam.l2_flush))}
        rows.append(row)
        pairs = [f"{a[3:]} {row['arms'][a].get('median_ms')}/{row['arms'].get('p2-' + a[3:], {}).get('median_ms')}"
                 for a in row["arms"] if a.startswith("p1-")]
        print(problem.label(), "cublas", row["arms"].get("cublas", {}).get("median_ms"), "|", "; ".join(pairs),
              flush=True)
    write_probe(args.out, __doc__, "ctas_probe.py", argv, ev, rows)
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
