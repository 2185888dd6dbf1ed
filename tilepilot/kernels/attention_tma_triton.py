"""VARIANT=tma of the `attention` family: the forward pass of `attention_triton.py` with the K
and V tiles of the key loop moved through tensor descriptors (the Hopper path of Triton's
06-fused-attention tutorial).

On Hopper the bulk tensor copy engine (TMA) copies whole K and V tiles from global into shared
memory, where the tensor-core products read them, with no address arithmetic or masks in the
threads; the key loop is software-pipelined over num_stages K and V buffers, the copies running
ahead of the products. Q is loaded and O stored through pointers, once per program, as in the
plain kernel: each device-made descriptor costs its program a write of the descriptor to global
memory and a fence, and on the H100 (Triton 3.6) descriptors for Q and O as well made the
S=1024 problems 9 to 25% slower than the plain kernel.

Each program makes the K and V descriptors of its (batch, head): [S, D] row-major from the
head's base, so a tile that runs past S is filled with zeros by the copy engine. The keys past
S still get the -inf score mask in the tail block, and the causal diagonal its own mask, exactly
as in the plain kernel (same block walk, same order of the products, same longest-rows-first
schedule).

Warp specialisation (`tl.range(..., warp_specialize=True)`, the tutorial's Blackwell path) is
not a Hopper option with the installed compilers: for sm_90 the warp-specialisation pass fails
at 4 warps and leaves the PTX unchanged at 8 (Triton 3.6 on the H100 and 3.9, checked on four
configs; bench/results/attention-variant-probe-h100.json).

The descriptors are made on the device, in a global scratch buffer the host provides
(`triton.set_allocator`, see `attention._with_scratch`). TMA needs 16-byte aligned bases and row
strides: a head is S·D elements of 2 bytes with D >= 32, so every head's base is.

Imported only inside a worker's child process (it imports triton at module level).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _attend_tma(acc, l_i, m_i, q, k_desc, v_desc, offs_m, offs_n, lo, hi, S,
                QK_SCALE: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr,
                BOUNDS_MASK: tl.constexpr):
    """Fold the keys [lo, hi) into (acc, l_i, m_i), BLOCK_N at a time (see attention_triton._attend)."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        keys = start_n + offs_n
        k = k_desc.load([start_n, 0])
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
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = v_desc.load([start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def attention_tma_kernel(
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
    k_desc = tl.make_tensor_descriptor(k_ptr + head, shape=[S, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(v_ptr + head, shape=[S, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    rows = offs_m[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    q = tl.load(q_ptr + head + rows, mask=offs_m[:, None] < S, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:
        diagonal = start_m * BLOCK_M
        acc, l_i, m_i = _attend_tma(acc, l_i, m_i, q, k_desc, v_desc, offs_m, offs_n, 0, diagonal, S,
                                    QK_SCALE, BLOCK_N, False, False)
        acc, l_i, m_i = _attend_tma(acc, l_i, m_i, q, k_desc, v_desc, offs_m, offs_n, diagonal,
                                    tl.minimum(diagonal + BLOCK_M, S), S, QK_SCALE, BLOCK_N, True, True)
    else:
        full = S - S % BLOCK_N
        acc, l_i, m_i = _attend_tma(acc, l_i, m_i, q, k_desc, v_desc, offs_m, offs_n, 0, full, S,
                                    QK_SCALE, BLOCK_N, False, False)
        acc, l_i, m_i = _attend_tma(acc, l_i, m_i, q, k_desc, v_desc, offs_m, offs_n, full, S, S,
                                    QK_SCALE, BLOCK_N, False, True)
    o = acc / l_i[:, None]
    tl.store(o_ptr + head + rows, o.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < S)
