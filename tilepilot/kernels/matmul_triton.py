"""The Triton GEMM kernel of the `matmul` family (VARIANT=grouped): C = A @ B, fp32 accumulation,
and the device helpers the other variants share (`tile_pid`, `aligned`).

Read as Triton's 03-matrix-multiplication tutorial: programs are ordered in groups of
GROUP_SIZE_M rows of tiles ("swizzled") so that neighbouring programs reuse tiles of A and B
from L2. Arbitrary M, N, K: rows of A and columns of B past the edge are wrapped (their
results are never stored), K is masked, and the store is masked.

ALIGN_K, ALIGN_N (1 unless the config sets ALIGN_HINT): Triton specialises an integer argument
only on divisibility by 16, so K=1000 looks unaligned although its fp16 rows are 2000 bytes, a
multiple of 16; the loads of that operand then go element by element. The host checks the real
alignment (K % ALIGN_K == 0, N % ALIGN_N == 0) and `aligned` restates K, N and the row strides
so that the compiler knows it: the loads and masks become vectors of ALIGN elements again.

FEW_ROWS (set by the host when M is below BLOCK_SIZE_M, the decode shapes): A's rows past M are
masked, not wrapped. Wrapped, each program would load A's M rows BLOCK_SIZE_M / M times over, every
program the same addresses at the same K step (at M = 1, 16 copies of one row a program).

Imported only inside a worker's child process (it imports triton at module level). Set
TRITON_INTERPRET=1 before importing it to run it under the interpreter.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def aligned(x, ALIGN: tl.constexpr):
    """`x` itself (the host checked that ALIGN divides it), computed as x // ALIGN * ALIGN so that
    the compiler's divisibility analysis knows ALIGN divides it."""
    if ALIGN > 1:
        x = x // ALIGN * ALIGN
    return x


@triton.jit
def a_mask(offs_m, offs_k, k_left, M, FEW_ROWS: tl.constexpr):
    """Which elements of an A tile to load: the K columns left, and with FEW_ROWS the rows below M."""
    mask = offs_k[None, :] < k_left
    if FEW_ROWS:
        mask = mask & (offs_m[:, None] < M)
    return mask


@triton.jit
def tile_pid(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    """Grouped ordering of the output tiles: walk GROUP_SIZE_M tile-rows column by column."""
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((tile_id % num_pid_in_group) % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    ALIGN_K: tl.constexpr = 1, ALIGN_N: tl.constexpr = 1, FEW_ROWS: tl.constexpr = False,
):
    K = aligned(K, ALIGN_K)
    stride_am = aligned(stride_am, ALIGN_K)
    N = aligned(N, ALIGN_N)
    stride_bk = aligned(stride_bk, ALIGN_N)
    stride_cm = aligned(stride_cm, ALIGN_N)
    pid_m, pid_n = tile_pid(tl.program_id(axis=0), tl.cdiv(M, BLOCK_SIZE_M), tl.cdiv(N, BLOCK_SIZE_N), GROUP_SIZE_M)

    # Tiles of A and B; rows/columns past the edge wrap around (A's rows are masked with FEW_ROWS)
    # and are masked at the store.
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_am = offs_m if FEW_ROWS else offs_m % M
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)

    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        k_left = K - k * BLOCK_SIZE_K
        a = tl.load(a_ptrs, mask=a_mask(offs_m, offs_k, k_left, M, FEW_ROWS), other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        accumulator = tl.dot(a, b, accumulator)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    c = accumulator.to(c_ptr.dtype.element_ty)

    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, c, mask=c_mask)
