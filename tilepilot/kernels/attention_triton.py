"""The Triton kernel of the `attention` family: O = softmax(Q Kᵀ / sqrt(D)) V, forward only.

Read as the forward pass of Triton's 06-fused-attention tutorial (FlashAttention-2), with plain
pointers instead of block pointers or tensor descriptors (so it runs alike under Triton 3.6 and
3.9 and under the interpreter), no warp specialisation, and arbitrary sequence lengths:

- a program owns BLOCK_M queries of one (batch, head) and keeps them, the fp32 accumulator and
  the running row maximum m and row sum l in registers while it walks the keys in blocks of
  BLOCK_N (the online softmax, in base 2: the scale folds in log2(e), so exp2 is exact exp);
- non-causal: the full key blocks without any mask, then at most one tail block with the keys
  past S masked to -inf (loaded as zeros);
- causal: the blocks left of the diagonal without any mask, then the diagonal band of BLOCK_M
  keys (BLOCK_N at a time) with the mask key <= query; blocks right of the diagonal are never
  visited, so the work is about half. Programs run the longest rows first (the last query
  block is scheduled first) so that the short ones fill the tail of the grid;
- query rows past S are loaded as zeros and never stored.

Q, K, V and O are [B, H, S, D] contiguous; the grid is (cdiv(S, BLOCK_M), B·H). Every row sees
at least one key in the first block it visits, so the running maximum is finite from the start
and no -inf - -inf (NaN) arises.

Imported only inside a worker's child process (it imports triton at module level). Set
TRITON_INTERPRET=1 before importing it to run it under the interpreter.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _attend(acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, offs_n, lo, hi, S,
            QK_SCALE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
            CAUSAL_MASK: tl.constexpr, BOUNDS_MASK: tl.constexpr):
    """Fold the keys [lo, hi) into (acc, l_i, m_i), BLOCK_N at a time."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        keys = start_n + offs_n
        if BOUNDS_MASK:
            k = tl.load(k_ptrs + start_n * HEAD_DIM, mask=keys[:, None] < S, other=0.0)
        else:
            k = tl.load(k_ptrs + start_n * HEAD_DIM)
        qk = tl.dot(q, tl.trans(k))
        if CAUSAL_MASK:
            qk = tl.where(offs_m[:, None] >= keys[None, :], qk * QK_SCALE, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        elif BOUNDS_MASK:
            qk = tl.where(keys[None, :] < S, qk * QK_SCALE, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * QK_SCALE)
            qk = qk * QK_SCALE - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)  # rescales what was summed under the old maximum
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if BOUNDS_MASK:
            v = tl.load(v_ptrs + start_n * HEAD_DIM, mask=keys[:, None] < S, other=0.0)
        else:
            v = tl.load(v_ptrs + start_n * HEAD_DIM)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr,
    S,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    QK_SCALE: tl.constexpr,
):
    if CAUSAL:
        start_m = tl.cdiv(S, BLOCK_M) - 1 - tl.program_id(0)  # longest rows first
    else:
        start_m = tl.program_id(0)
    head = tl.program_id(1) * S * HEAD_DIM  # < 2**31: the family bounds every operand's size
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(q_ptr + head + rows, mask=offs_m[:, None] < S, other=0.0)
    k_ptrs = k_ptr + head + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    v_ptrs = v_ptr + head + offs_n[:, None] * HEAD_DIM + offs_d[None, :]

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:
        diagonal = start_m * BLOCK_M
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, offs_n, 0, diagonal, S,
                                QK_SCALE, HEAD_DIM, BLOCK_N, False, False)
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, offs_n, diagonal,
                                tl.minimum(diagonal + BLOCK_M, S), S, QK_SCALE, HEAD_DIM, BLOCK_N, True, True)
    else:
        full = S - S % BLOCK_N
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, offs_n, 0, full, S,
                                QK_SCALE, HEAD_DIM, BLOCK_N, False, False)
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, offs_n, full, S, S,
                                QK_SCALE, HEAD_DIM, BLOCK_N, False, True)
    o = acc / l_i[:, None]
    tl.store(o_ptr + head + rows, o.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < S)
