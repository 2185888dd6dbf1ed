"""How fast can a decode-shaped matmul (M <= 64, B streamed once from HBM) go on this GPU?

    python bench/decode_probe.py --out bench/results/decode-probe-h100.json

For M in {1, 16, 64} x 4096 x 4096 bf16, timed side by side with the timer and plan of
bench/kernels.py (L2 flushed before each launch, events around it):
- `cublas`: torch.matmul;
- `tuned`: the fastest recorded config of the shipped matmul datasets (what bench/kernels.py times);
- `fused-*`: VARIANT=splitk_fused at tiles the recorded grid lacks (BLOCK_SIZE_N 256, BLOCK_SIZE_K 256,
  8 warps, SPLIT_K up to 16);
- `read-*`: the floor: a kernel that only reads B (every element once, 16-byte loads, a sum per
  program), at several program counts; no matmul can read B faster than this.
Each matmul arm's output is checked against the family's reference before it is timed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def read_kernel(b_ptr, out_ptr, n_elements, per_program, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    start = pid * per_program
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for off in range(start, min(start + per_program, n_elements), BLOCK):
        idx = off + tl.arange(0, BLOCK)
        acc += tl.load(b_ptr + idx, mask=idx < n_elements, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch
    from kernels import Arms, _sig, gpu_probe, tuned_configs, write_probe
    from record import tile_config

    fam, ev, target, timer = gpu_probe("matmul")
    tuned = tuned_configs("matmul")
    rows = []
    for m in (1, 16, 64):
        problem = fam.parse_problem({"M": m, "N": 4096, "K": 4096, "dtype": "bf16"})
        arms = Arms(fam, problem, target)
        arms.baseline("cublas")
        if problem.key() in tuned:
            arms.config("tuned", tuned[problem.key()])
        bm = 16 if m <= 16 else 64
        for bn, bk, w, s, split in ((128, 128, 4, 3, 4), (256, 128, 8, 3, 4), (256, 128, 8, 4, 8),
                                    (128, 256, 4, 3, 8), (128, 256, 8, 3, 8), (256, 256, 8, 3, 8),
                                    (64, 256, 4, 3, 16), (128, 128, 4, 4, 16), (256, 64, 8, 4, 16)):
            c = tile_config(bm, bn, bk, w, s, VARIANT="splitk_fused", SPLIT_K=split)
            if fam.space().check(c, problem) is None:
                arms.config(f"fused-{bn}x{bk}-w{w}s{s}-k{split}", c)
        b = arms.inputs[1]
        launches: dict[str, Any] = {}
        for programs in (132, 264, 528, 1056):
            for warps in (4, 8):
                sink = torch.empty(programs, device="cuda", dtype=torch.float32)
                per = triton.cdiv(triton.cdiv(b.numel(), programs), 4096) * 4096

                def run(b: Any = b, sink: Any = sink, per: int = per, programs: int = programs,
                        warps: int = warps) -> None:
                    read_kernel[(programs,)](b, sink, b.numel(), per, BLOCK=4096, num_warps=warps)
                run()
                launches[f"read-p{programs}-w{warps}"] = run
        timings = arms.time(timer, fam.l2_flush, extra=launches)
        b_bytes = b.numel() * b.element_size()
        row = {"problem": problem.label(), "b_bytes": b_bytes, "arms": arms.medians(timings)}
        for n, t in timings.items():
            row["arms"][n]["b_read_gbps"] = _sig(b_bytes / t.median_ms / 1e6)
        rows.append(row)
        print(problem.label(), {n: a.get("median_ms") for n, a in row["arms"].items()}, flush=True)
    write_probe(args.out, __doc__, "decode_probe.py", argv, ev, rows)
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
