"""The Triton kernel of the `softmax` family: y = softmax(x) along each row, in float32.

Read as Triton's 02-fused-softmax tutorial, extended to rows longer than one block:

- single pass (cols <= BLOCK_SIZE): the row is loaded once, its maximum subtracted before the
  exponential (so no exp overflows), normalised and stored, as in the tutorial;
- two passes (cols > BLOCK_SIZE): the online softmax of Milakov & Gimelshein (2018). A first
  loop over the row's blocks keeps a running maximum m and a running sum l of exp(x - m); when
  a block raises the maximum to m', the sum so far is rescaled by exp(m - m'). A second loop
  writes exp(x - m) / l. Two reads and one write per element instead of three reads.

A program handles ROWS_PER_PROGRAM consecutive rows; the last program's rows past the end
are clamped to the last row (they recompute and rewrite it, so nothing outside is touched).
NUM_STAGES pipelines the innermost loop.

Imported only inside a worker's child process (it imports triton at module level). Set
TRITON_INTERPRET=1 before importing it to run it under the interpreter.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def softmax_kernel(
    x_ptr, y_ptr,
    rows, cols,
    BLOCK_SIZE: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr, NUM_STAGES: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
):
    first_row = tl.program_id(axis=0) * ROWS_PER_PROGRAM
    offs = tl.arange(0, BLOCK_SIZE)
    if SINGLE_PASS:
        mask = offs < cols
        for r in tl.range(0, ROWS_PER_PROGRAM, num_stages=NUM_STAGES):
            start = tl.minimum(first_row + r, rows - 1) * cols
            x = tl.load(x_ptr + start + offs, mask=mask, other=-float("inf")).to(tl.float32)
            num = tl.exp(x - tl.max(x, axis=0))
            y = num / tl.sum(num, axis=0)
            tl.store(y_ptr + start + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        for r in tl.range(0, ROWS_PER_PROGRAM):
            start = tl.minimum(first_row + r, rows - 1) * cols
            # The first block is full (cols > BLOCK_SIZE): it starts the running max and sum.
            x = tl.load(x_ptr + start + offs).to(tl.float32)
            m = tl.max(x, axis=0)
            l = tl.sum(tl.exp(x - m), axis=0)  # noqa: E741
            for col in tl.range(BLOCK_SIZE, cols, BLOCK_SIZE, num_stages=NUM_STAGES):
                mask = col + offs < cols
                x = tl.load(x_ptr + start + col + offs, mask=mask, other=-float("inf")).to(tl.float32)
                m_new = tl.maximum(m, tl.max(x, axis=0))
                l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)  # noqa: E741
                m = m_new
            inv = 1.0 / l
            for col in tl.range(0, cols, BLOCK_SIZE, num_stages=NUM_STAGES):
                mask = col + offs < cols
                x = tl.load(x_ptr + start + col + offs, mask=mask, other=-float("inf")).to(tl.float32)
                y = tl.exp(x - m) * inv
                tl.store(y_ptr + start + col + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
