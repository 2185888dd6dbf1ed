"""Does a decode matmul without tensor cores (B loaded straight to registers, FMA) beat cuBLAS?

    python bench/gemv_probe.py --out bench/results/gemv-probe-h100.json

bench/decode_probe.py found every tensor-core variant at M <= 4 (N = K = 4096 bf16) about 6% behind
cuBLAS, and a kernel that only reads B, with many programs of 8 warps, as fast as cuBLAS: what the
decode shapes need is loads in flight, not MMAs. `matmul_gemv_kernel` (below) loads its block of B
into registers as 16-byte vectors and multiplies it by A's few rows on the FMA units, split along K
with a deterministic reduction. Timed side by side with the timer and plan of bench/kernels.py (L2
flushed before each launch, events around it): `cublas`; `tuned` (the fastest recorded config, as
bench/kernels.py's finalists pick from); `gemv-BNxBK-kSPLIT-wW-sS` at a spread of its block shapes,
splits, warps and stages. Each arm's output is checked against the family's reference before it is
timed.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


@triton.jit
def matmul_gemv_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr, lock_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    pid_n = tl.program_id(axis=0)
    split = tl.program_id(axis=1)
    k_blocks = tl.cdiv(K, BLOCK_SIZE_K)
    per_split = tl.cdiv(k_blocks, SPLIT_K)
    first = split * per_split
    last = min(first + per_split, k_blocks)

    offs_m = tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_K, BLOCK_SIZE_N), dtype=tl.float32)
    for kb in range(first, last):
        k = kb * BLOCK_SIZE_K + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=m_ok[:, None] & (k[None, :] < K), other=0.0)
        b = tl.load(b_ptr + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(k[:, None] < K) & n_ok[None, :], other=0.0)
        acc += a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :]
    partial = tl.sum(acc, axis=1)

    c_mask = m_ok[:, None] & n_ok[None, :]
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    if SPLIT_K == 1:
        tl.store(c_ptrs, partial.to(c_ptr.dtype.element_ty), mask=c_mask)
    else:
        tile_size: tl.constexpr = BLOCK_SIZE_M * BLOCK_SIZE_N
        offs_tile = offs_m[:, None] * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)[None, :]
        ws_tile = ws_ptr + pid_n.to(tl.int64) * (SPLIT_K * tile_size) + offs_tile
        tl.store(ws_tile + split * tile_size, partial, mask=c_mask, cache_modifier=".cg")
        tl.debug_barrier()  # every thread's partial is stored before the ticket is taken
        ticket = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:
            total = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                total += tl.load(ws_tile + s * tile_size, mask=c_mask, other=0.0, cache_modifier=".cg")
            tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=c_mask)
            tl.atomic_xchg(lock_ptr + pid_n, 0)


SHAPES = ((1, 4096, 4096), (4, 4096, 4096), (16, 4096, 4096))
# BLOCK_SIZE_N, BLOCK_SIZE_K, SPLIT_K, warps, stages
CONFIGS = [(bn, bk, split, w, s) for bn, w in ((256, 8), (512, 8), (128, 4), (256, 4))
           for bk in (8, 16, 32, 64) for split in (4, 8, 16, 32) for s in (1, 3)]
MAX_ACC_REGS = 128  # fp32 accumulator registers a thread may hold: BM·BK·BN / threads


def gemv_launch(a: Any, b: Any, bm: int, bn: int, bk: int, split: int, warps: int, stages: int) -> Any:
    """For Arms.add: the gemv kernel's launch writing `out`, its workspace and counters made here."""
    import torch

    (m, k), n = a.shape, b.shape[1]
    blocks = triton.cdiv(n, bn)
    ws = torch.empty(blocks * split * bm * bn, device=a.device, dtype=torch.float32)
    locks = torch.zeros(blocks, device=a.device, dtype=torch.int32)

    def make(out: Any) -> Any:
        def run() -> None:
            matmul_gemv_kernel[(blocks, split)](
                a, b, out, ws, locks, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                out.stride(0), out.stride(1), BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk,
                SPLIT_K=split, num_warps=warps, num_stages=stages)
        return run
    return make


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-arms", type=int, default=36, help="gemv arms per shape (a random sample of CONFIGS)")
    args = ap.parse_args(argv)

    from kernels import Arms, gpu_probe, tuned_configs, write_probe

    fam, ev, target, timer = gpu_probe("matmul")
    tuned = tuned_configs("matmul")
    rows = []
    for m, n, k in SHAPES:
        problem = fam.parse_problem({"M": m, "N": n, "K": k, "dtype": "bf16"})
        arms = Arms(fam, problem, target)
        arms.baseline("cublas")
        if problem.key() in tuned:
            arms.config("tuned", tuned[problem.key()])
        a, b = arms.inputs
        bm = triton.next_power_of_2(m)
        fit = [c for c in CONFIGS if bm * c[1] * c[0] // (32 * c[3]) <= MAX_ACC_REGS]
        for bn, bk, split, w, s in random.Random(0).sample(fit, min(len(fit), args.max_arms)):
            make = gemv_launch(a, b, bm, bn, bk, split, w, s)
            arms.add(f"gemv-{bn}x{bk}-k{split}-w{w}-s{s}", make,
                     config={"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "SPLIT_K": split,
                             "num_warps": w, "num_stages": s})
        timings = arms.time(timer, fam.l2_flush)
        row = {"problem": problem.label(), "arms": arms.medians(timings)}
        rows.append(row)
        best = sorted((a["median_ms"], name) for name, a in row["arms"].items() if a.get("median_ms"))[:6]
        print(problem.label(), "cublas", row["arms"].get("cublas", {}).get("median_ms"),
              "tuned", row["arms"].get("tuned", {}).get("median_ms"), best, flush=True)
    write_probe(args.out, __doc__, "gemv_probe.py", argv, ev, rows)
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
