"""The Triton kernel of the `fused_moe` family: the grouped GEMM of a top-k mixture-of-experts
layer, structured as vLLM's `fused_moe_kernel` (the first GEMM, no routed-weight multiply).

A [M, K] holds the tokens, B [E, N, K] the experts' weights (vLLM's w1 layout: expert e computes
A @ B[e]^T), C [M, topk, N] one output row per (token, expert) pair, viewed as [M·topk, N].
The routing arrives sorted and padded per expert (`fused_moe.align_block_size`):

- sorted_token_ids [EM]: the flat indices t·topk + k of the (token, slot) pairs, grouped by
  expert, each expert's group padded with the value M·topk (no pair) to a multiple of
  BLOCK_SIZE_M;
- expert_ids [EM / BLOCK_SIZE_M]: the expert of each block of BLOCK_SIZE_M rows;
- num_tokens_post_padded [1]: the padded length actually used; EM is its upper bound, known
  on the host without a device sync (as in vLLM: the grid never waits for the routing).

Program pid computes one BLOCK_SIZE_M × BLOCK_SIZE_N tile of one expert's block, in grouped
order (GROUP_SIZE_M blocks of rows walked column by column, so that neighbouring programs
share tiles of B through L2). Programs past num_tokens_post_padded return at once; padding
rows are masked on load and store; columns past N wrap (never stored) and K is masked. The
expert offset is 64-bit, so the stacked weights may exceed 2**31 elements.

Imported only inside a worker's child process (it imports triton at module level). Set
TRITON_INTERPRET=1 before importing it to run it under the interpreter.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tilepilot.kernels.matmul_triton import tile_pid


@triton.jit
def fused_moe_kernel(
    a_ptr, b_ptr, c_ptr,
    sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
    N, K, EM, num_valid_tokens,
    stride_am, stride_ak,
    stride_be, stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, top_k: tl.constexpr,
):
    # Grouped ordering of the tiles over the padded, expert-sorted rows.
    pid_m, pid_n = tile_pid(tl.program_id(axis=0), tl.cdiv(EM, BLOCK_SIZE_M), tl.cdiv(N, BLOCK_SIZE_N), GROUP_SIZE_M)

    num_tokens_post_padded = tl.load(num_tokens_post_padded_ptr)
    if pid_m * BLOCK_SIZE_M >= num_tokens_post_padded:
        return

    # The block's (token, slot) pairs and its expert; padding rows carry num_valid_tokens.
    offs_token_id = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M).to(tl.int64)
    offs_token = tl.load(sorted_token_ids_ptr + offs_token_id)
    token_mask = offs_token < num_valid_tokens
    off_expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N).to(tl.int64)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_token[:, None] // top_k * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + off_expert * stride_be + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)

    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        k_left = K - k * BLOCK_SIZE_K
        a = tl.load(a_ptrs, mask=token_mask[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        accumulator = tl.dot(a, b, accumulator)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    c = accumulator.to(c_ptr.dtype.element_ty)

    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_token[:, None] + stride_cn * offs_cn[None, :]
    c_mask = token_mask[:, None] & (offs_cn[None, :] < N)
    tl.store(c_ptrs, c, mask=c_mask)
