"""VARIANT=splitk_fused of the `matmul` family: split-K in one launch, the reduction fused in.

The K dimension is cut into SPLIT_K ranges of whole BLOCK_SIZE_K blocks, each computed by its
own program (grid: tiles × SPLIT_K), as in the two-launch split-K (matmul_splitk_triton.py). Each
program writes its fp32 partial tile to its slot of a workspace (tile-major: the SPLIT_K
partials of one output tile lie together, BLOCK_SIZE_M × BLOCK_SIZE_N floats each) and then
takes a ticket from the tile's counter (an atomic add, release/acquire at GPU scope, after a
barrier so that every thread's stores are ordered before it). The program that draws the last
ticket sums the SPLIT_K partials in a fixed order (split 0 first) in fp32, writes C in its
dtype and resets the counter to 0 for the next launch. Whichever program arrives last, the sum
is the same sequence of additions of the same numbers: the result is deterministic, and there
is no second launch to wait for, which matters for the decode shapes (M ≤ 256) where the whole
matmul takes about as long as streaming B once.

The counters (one int32 per output tile, zero between launches) and the workspace are set aside
by the host when the launch is built. Tile order, wrapped edge rows and columns, K masking,
ALIGN_K / ALIGN_N and FEW_ROWS are those of the grouped kernel (matmul_triton.py). Imported only
inside a worker's child process.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tilepilot.kernels.matmul_splitk_triton import split_partial
from tilepilot.kernels.matmul_triton import aligned, tile_pid


@triton.jit
def matmul_splitk_fused_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr, lock_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, SPLIT_K: tl.constexpr,
    ALIGN_K: tl.constexpr, ALIGN_N: tl.constexpr, FEW_ROWS: tl.constexpr = False,
):
    K = aligned(K, ALIGN_K)
    stride_am = aligned(stride_am, ALIGN_K)
    N = aligned(N, ALIGN_N)
    stride_bk = aligned(stride_bk, ALIGN_N)
    stride_cm = aligned(stride_cm, ALIGN_N)
    tile = tl.program_id(axis=0)
    pid_m, pid_n = tile_pid(tile, tl.cdiv(M, BLOCK_SIZE_M), tl.cdiv(N, BLOCK_SIZE_N), GROUP_SIZE_M)
    split = tl.program_id(axis=1)
    accumulator = split_partial(a_ptr, b_ptr, pid_m, pid_n, split, M, N, K, stride_am, stride_ak, stride_bk,
                                stride_bn, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, SPLIT_K, FEW_ROWS)

    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tile_size: tl.constexpr = BLOCK_SIZE_M * BLOCK_SIZE_N
    offs_tile = tl.arange(0, BLOCK_SIZE_M)[:, None] * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)[None, :]
    ws_tile = ws_ptr + tile.to(tl.int64) * (SPLIT_K * tile_size) + offs_tile
    tl.store(ws_tile + split * tile_size, accumulator, mask=c_mask, cache_modifier=".cg")
    tl.debug_barrier()  # every thread's partial is stored before the ticket is taken
    ticket = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
    if ticket == SPLIT_K - 1:
        total = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            total += tl.load(ws_tile + s * tile_size, mask=c_mask, other=0.0, cache_modifier=".cg")
        c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
        tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=c_mask)
        tl.atomic_xchg(lock_ptr + tile, 0)
