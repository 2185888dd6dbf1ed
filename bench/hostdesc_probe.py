"""Does making the tma variant's tensor descriptors on the host, not in each program, save time?

    python bench/hostdesc_probe.py --out bench/results/hostdesc-probe-h100.json

Made in each program (`tl.make_tensor_descriptor`), the three descriptors are written to global
scratch memory at the start of the launch and must be visible to the copy engine before the
first load. Made once on the host (`TensorDescriptor`, passed as kernel arguments), they cost the
launch nothing on the GPU. Here the family's tma launch of a config (`host`: host-made
descriptors) is timed beside the same tile loop over descriptors made in each program (`device`:
bench/align_probe.py's strided kernel on the problem's own tensors) and cuBLAS, by the timer and
plan of bench/kernels.py, for the recorded best tma config of shapes where the tuned config
trailed cuBLAS by 2-8%; each launch is checked against the family's reference first.

The committed result was recorded before the family's tma kernels took host-made descriptors:
then `device` was the family's launch and `host` a copy of its tile loop with descriptor
arguments, launched through Triton's JIT.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# problem, tma config (BLOCK_SIZE_M, N, K, warps, stages, EPILOGUE_SUBTILE)
SHAPES = [((4096, 4096, 1024, "bf16"), (128, 256, 64, 8, 3, True)),
          ((2048, 4096, 4096, "bf16"), (128, 256, 64, 8, 3, True)),
          ((16384, 1024, 1024, "bf16"), (128, 256, 64, 8, 4, True)),
          ((8192, 2048, 512, "fp16"), (128, 128, 64, 4, 4, True)),
          ((4096, 4096, 4096, "bf16"), (128, 256, 64, 8, 3, True)),
          ((16384, 16384, 256, "bf16"), (128, 256, 64, 8, 4, True))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from align_probe import strided_launch
    from kernels import Arms, gpu_probe, write_probe
    from record import tile_config

    fam, ev, target, timer = gpu_probe("matmul")
    rows = []
    for (m, n, k, dtype), (bm, bn, bk, w, s, sub) in SHAPES:
        problem = fam.parse_problem({"M": m, "N": n, "K": k, "dtype": dtype})
        config = tile_config(bm, bn, bk, w, s, VARIANT="tma", EPILOGUE_SUBTILE=sub)
        arms = Arms(fam, problem, target)
        arms.baseline("cublas")
        arms.add("device", lambda out, a=arms, c=config: strided_launch(a, c, out, ""))
        arms.config("host", config)
        row: dict[str, Any] = {"problem": problem.label(), "config": config.as_dict(),
                               "arms": arms.medians(arms.time(timer, fam.l2_flush))}
        rows.append(row)
        print(problem.label(), {a: v.get("median_ms") or v.get("error") for a, v in row["arms"].items()}, flush=True)
    write_probe(args.out, __doc__, "hostdesc_probe.py", argv, ev, rows)
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
