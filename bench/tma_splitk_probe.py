"""Does split-K on the tensor-descriptor kernel close the gap on the long-K and few-tile shapes?

    python bench/tma_splitk_probe.py --out bench/results/tma-splitk-probe-h100.json

Where M·N gives fewer 128×256 tiles than SMs and K is long (1024×1024×16384: 32 tiles), the
family splits K either through pointer loads (splitk, splitk_fused) or by tma_tail, which gives
every SM a piece of the last wave and sums a tile's pieces in the one program that arrives last:
that program reads all of them alone. Here `tma_splitk_kernel` (below) is the tma kernel's
K loop on a grid of tiles × SPLIT_K, each program's fp32 partial stored to a workspace, reduced
either by a second launch over all SMs (`two`, the family's splitk_reduce_kernel) or by the last
program to arrive (`fused`, as splitk_fused). Timed side by side with the timer and plan of
bench/kernels.py (L2 flushed before each launch, events around it): `cublas`; `tuned` (the
fastest recorded config, as bench/kernels.py's finalists pick from); the family's configs named
`fam-*`; `tsk-{two,fused}-BMxBNxBK-wW-sS-kSPLIT`. Each arm's output is checked against the
family's reference before it is timed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tilepilot.kernels.matmul_persistent_triton import _k_range  # noqa: E402
from tilepilot.kernels.matmul_splitk_triton import REDUCE_BLOCK, REDUCE_WARPS, splitk_reduce_kernel  # noqa: E402
from tilepilot.kernels.matmul_triton import tile_pid  # noqa: E402

SHAPES = ((1024, 1024, 16384, "bf16"), (2048, 2048, 8192, "bf16"), (1024, 4096, 4096, "bf16"),
          (128, 4096, 4096, "bf16"), (64, 4096, 4096, "bf16"), (768, 3072, 768, "fp16"))
# BLOCK_SIZE_M, N, K, warps, stages
TILES = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4), (64, 128, 128, 4, 4),
         (64, 256, 64, 4, 4)]
SPLITS = (2, 4, 8)
MAX_PROGRAMS = 2 * 132  # arms whose grid is larger than two waves are skipped: not what split-K is for


@triton.jit
def tma_splitk_kernel(a_desc, b_desc, c_ptr, ws_ptr, lock_ptr, M, N, K, stride_cm,
                      BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                      GROUP_SIZE_M: tl.constexpr, SPLIT_K: tl.constexpr, FUSED: tl.constexpr):
    tile = tl.program_id(axis=0)
    split = tl.program_id(axis=1)
    pid_m, pid_n = tile_pid(tile, tl.cdiv(M, BLOCK_SIZE_M), tl.cdiv(N, BLOCK_SIZE_N), GROUP_SIZE_M)
    k_blocks = tl.cdiv(K, BLOCK_SIZE_K)
    per_split = tl.cdiv(k_blocks, SPLIT_K)
    first = split * per_split
    last = min(first + per_split, k_blocks)
    acc = _k_range(a_desc, b_desc, pid_m, pid_n, first, last, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if FUSED:
        tile_size: tl.constexpr = BLOCK_SIZE_M * BLOCK_SIZE_N
        offs_tile = tl.arange(0, BLOCK_SIZE_M)[:, None] * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)[None, :]
        ws_tile = ws_ptr + tile.to(tl.int64) * (SPLIT_K * tile_size) + offs_tile
        tl.store(ws_tile + split * tile_size, acc, cache_modifier=".cg")
        tl.debug_barrier()
        ticket = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:
            total = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                total += tl.load(ws_tile + s * tile_size, cache_modifier=".cg")
            tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], total.to(c_ptr.dtype.element_ty),
                     mask=mask)
            tl.atomic_xchg(lock_ptr + tile, 0)
    else:
        ws = ws_ptr + split.to(tl.int64) * M * N + offs_m[:, None] * N + offs_n[None, :]
        tl.store(ws, acc, mask=mask, cache_modifier=".cg")


def tsk_launch(a: Any, b: Any, tile: tuple[int, ...], split: int, fused: bool) -> Any:
    """For Arms.add: the split-K launch (and its reduction) writing `out`; buffers made here."""
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk, warps, stages = tile
    (m, k), n = a.shape, b.shape[1]
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    ws = torch.empty(split * (tiles * bm * bn if fused else m * n), device=a.device, dtype=torch.float32)
    locks = torch.zeros(tiles, device=a.device, dtype=torch.int32)
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(b, [bk, bn])

    def make(out: Any) -> Any:
        def run() -> None:
            tma_splitk_kernel[(tiles, split)](a_desc, b_desc, out, ws, locks, m, n, k, out.stride(0),
                                              BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=8,
                                              SPLIT_K=split, FUSED=fused, num_warps=warps, num_stages=stages)
            if not fused:
                splitk_reduce_kernel[(triton.cdiv(m * n, REDUCE_BLOCK),)](
                    ws, out, m * n, SPLIT_K=split, BLOCK=REDUCE_BLOCK, num_warps=REDUCE_WARPS, num_stages=1)
        return run
    return make


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch
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
        for name, c in {"fam-grouped-64x128x128": tile_config(64, 128, 128, 4, 4),
                        "fam-splitk-128x256x64-k4": tile_config(128, 256, 64, 8, 4, VARIANT="splitk", SPLIT_K=4),
                        "fam-tail-128x256x64": tile_config(128, 256, 64, 8, 3, VARIANT="tma_tail"),
                        "fam-tma-128x256x64": tile_config(128, 256, 64, 8, 3, VARIANT="tma")}.items():
            if fam.space().check(c, problem) is None:
                arms.config(name, c)
        a, b = arms.inputs
        for tile in TILES:
            bm, bn, bk, w, s = tile
            tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
            for split in SPLITS:
                if tiles * split > MAX_PROGRAMS or triton.cdiv(k, bk) < 2 * split:
                    continue
                for fused in (False, True):
                    arms.add(f"tsk-{'fused' if fused else 'two'}-{bm}x{bn}x{bk}-w{w}-s{s}-k{split}",
                             tsk_launch(a, b, tile, split, fused))
        timings = arms.time(timer, fam.l2_flush)
        row = {"problem": problem.label(), "arms": arms.medians(timings)}
        rows.append(row)
        best = sorted((a["median_ms"], name) for name, a in row["arms"].items() if a.get("median_ms"))[:8]
        print(problem.label(), "cublas", row["arms"].get("cublas", {}).get("median_ms"),
              "tuned", row["arms"].get("tuned", {}).get("median_ms"), best, flush=True)
        torch.cuda.empty_cache()
    write_probe(args.out, __doc__, "tma_splitk_probe.py", argv, ev, rows)
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
