"""VARIANT=persistent and VARIANT=tma of the `matmul` family: persistent kernels with a tile
scheduler (Triton's 09-persistent-matmul tutorial).

The host launches one program per SM (fewer when there are fewer tiles); program p computes the
output tiles p, p + P, p + 2P, ... (P programs) in the grouped order of the tutorial kernel, so
a program's loads of the next tile overlap the epilogue of the current one (the tile loop and the
K loop are flattened into one pipelined loop) and no launch pays for more than one wave.

- `matmul_persistent_kernel` loads through pointers, like the grouped kernel (wrapped edge rows
  and columns, masked K, ALIGN_K / ALIGN_N, see matmul_triton.py);
- `matmul_tma_kernel` loads A and B and stores C through tensor descriptors
  (`tl.make_tensor_descriptor`): on Hopper the bulk tensor copy engine (TMA) moves whole tiles
  between global and shared memory and fills out-of-bounds rows and columns with zeros, so the
  kernel needs no masks. The descriptors are made on the device, in a global scratch buffer the
  host provides (`triton.set_allocator`). TMA needs 16-byte aligned row strides (K and N times
  the element size): the family's constraints refuse other problems.

Imported only inside a worker's child process.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tilepilot.kernels.matmul_triton import aligned, tile_pid


@triton.jit
def matmul_persistent_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, ALIGN_K: tl.constexpr, ALIGN_N: tl.constexpr,
):
    K = aligned(K, ALIGN_K)
    stride_am = aligned(stride_am, ALIGN_K)
    N = aligned(N, ALIGN_N)
    stride_bk = aligned(stride_bk, ALIGN_N)
    stride_cm = aligned(stride_cm, ALIGN_N)
    start = tl.program_id(axis=0)
    programs = tl.num_programs(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    k_blocks = tl.cdiv(K, BLOCK_SIZE_K)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    for tile in tl.range(start, num_pid_m * num_pid_n, programs, flatten=True):
        pid_m, pid_n = tile_pid(tile, num_pid_m, num_pid_n, GROUP_SIZE_M)
        offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
        offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
        accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k in range(0, k_blocks):
            k_left = K - k * BLOCK_SIZE_K
            a_ptrs = a_ptr + offs_am[:, None] * stride_am + (k * BLOCK_SIZE_K + offs_k[None, :]) * stride_ak
            b_ptrs = b_ptr + (k * BLOCK_SIZE_K + offs_k[:, None]) * stride_bk + offs_bn[None, :] * stride_bn
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            accumulator = tl.dot(a, b, accumulator)
        offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
        c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
        tl.store(c_ptrs, accumulator.to(c_ptr.dtype.element_ty), mask=c_mask)


@triton.jit
def matmul_tma_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_SIZE_M, BLOCK_SIZE_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BLOCK_SIZE_K, BLOCK_SIZE_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_SIZE_M, BLOCK_SIZE_N])
    start = tl.program_id(axis=0)
    programs = tl.num_programs(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    k_blocks = tl.cdiv(K, BLOCK_SIZE_K)
    for tile in tl.range(start, num_pid_m * num_pid_n, programs, flatten=True):
        pid_m, pid_n = tile_pid(tile, num_pid_m, num_pid_n, GROUP_SIZE_M)
        accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k in range(0, k_blocks):
            a = a_desc.load([pid_m * BLOCK_SIZE_M, k * BLOCK_SIZE_K])
            b = b_desc.load([k * BLOCK_SIZE_K, pid_n * BLOCK_SIZE_N])
            accumulator = tl.dot(a, b, accumulator)
        c_desc.store([pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N], accumulator.to(c_ptr.dtype.element_ty))
