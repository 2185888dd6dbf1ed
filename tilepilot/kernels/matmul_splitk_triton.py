"""VARIANT=splitk of the `matmul` family: the K dimension is cut into SPLIT_K ranges of whole
BLOCK_SIZE_K blocks, each computed by its own program, so that a problem with few output tiles
(small M or N, long K) still fills the GPU.

Deterministic reduction in two launches: `matmul_splitk_kernel` (grid: tiles × SPLIT_K) writes
each range's fp32 partial tile to a workspace of SPLIT_K × M × N floats (allocated by the host
once, outside the timed launches); `splitk_reduce_kernel` then sums the SPLIT_K partials of every
element in a fixed order (split 0 first) in fp32 and writes C in its dtype. The same inputs give
the same bits on every run, whatever order the programs ran in.

Tile order, wrapping of the edge rows and columns, K masking and ALIGN_K / ALIGN_N are those of
the grouped kernel (matmul_triton.py). Imported only inside a worker's child process.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tilepilot.kernels.matmul_triton import a_mask, aligned, tile_pid

REDUCE_BLOCK = 1024
REDUCE_WARPS = 4


@triton.jit
def split_partial(a_ptr, b_ptr, pid_m, pid_n, split, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                  SPLIT_K: tl.constexpr, FEW_ROWS: tl.constexpr = False):
    """Split `split`'s fp32 partial of output tile (pid_m, pid_n): the product over its range of
    whole BLOCK_SIZE_K blocks of K (the last range may be shorter, or empty). A's rows past M wrap,
    or are masked with FEW_ROWS, as in the grouped kernel (matmul_triton.py)."""
    k_blocks = tl.cdiv(K, BLOCK_SIZE_K)
    per_split = tl.cdiv(k_blocks, SPLIT_K)
    first = split * per_split
    last = min(first + per_split, k_blocks)

    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_am = offs_m if FEW_ROWS else offs_m % M
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + (first * BLOCK_SIZE_K + offs_k[None, :]) * stride_ak)
    b_ptrs = b_ptr + ((first * BLOCK_SIZE_K + offs_k[:, None]) * stride_bk + offs_bn[None, :] * stride_bn)

    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(first, last):
        k_left = K - k * BLOCK_SIZE_K
        a = tl.load(a_ptrs, mask=a_mask(offs_m, offs_k, k_left, M, FEW_ROWS), other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        accumulator = tl.dot(a, b, accumulator)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    return accumulator


@triton.jit
def matmul_splitk_kernel(
    a_ptr, b_ptr, ws_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, SPLIT_K: tl.constexpr,
    ALIGN_K: tl.constexpr, ALIGN_N: tl.constexpr, FEW_ROWS: tl.constexpr = False,
):
    K = aligned(K, ALIGN_K)
    stride_am = aligned(stride_am, ALIGN_K)
    N = aligned(N, ALIGN_N)
    stride_bk = aligned(stride_bk, ALIGN_N)
    pid_m, pid_n = tile_pid(tl.program_id(axis=0), tl.cdiv(M, BLOCK_SIZE_M), tl.cdiv(N, BLOCK_SIZE_N),
                            GROUP_SIZE_M)
    split = tl.program_id(axis=1)
    accumulator = split_partial(a_ptr, b_ptr, pid_m, pid_n, split, M, N, K, stride_am, stride_ak, stride_bk,
                                stride_bn, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, SPLIT_K, FEW_ROWS)

    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    ws_ptrs = ws_ptr + split * M * N + offs_cm[:, None] * N + offs_cn[None, :]
    tl.store(ws_ptrs, accumulator, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


@triton.jit
def splitk_reduce_kernel(ws_ptr, c_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    total = tl.load(ws_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        total += tl.load(ws_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(c_ptr + offs, total.to(c_ptr.dtype.element_ty), mask=mask)
