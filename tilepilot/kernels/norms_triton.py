"""The Triton kernels of the `rmsnorm` and `layernorm` families (forward), in float32.

Read as Triton's 05-layer-norm tutorial (forward part), one row at a time:

- rmsnorm:   y = x / sqrt(mean(x²) + EPS) * w
- layernorm: y = (x - mean(x)) / sqrt(var(x) + EPS) * w + b   (biased variance, as torch)

Single pass (cols <= BLOCK_SIZE): the row is read once and kept in registers; the weight (and
bias) are read once per program, before the row loop. Two passes (cols > BLOCK_SIZE): a first
loop accumulates the statistics per lane, a second one normalises and writes. For layernorm
the first loop sums x - c and (x - c)² with c the mean of the row's first block, so that the
variance E[(x-c)²] - E[x-c]² does not cancel catastrophically for rows with a large mean.

A program handles ROWS_PER_PROGRAM consecutive rows; rows past the end are clamped to the last
row (recomputed and rewritten). NUM_STAGES pipelines the innermost loop.

Imported only inside a worker's child process (it imports triton at module level).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rmsnorm_kernel(
    x_ptr, w_ptr, y_ptr,
    rows, cols,
    EPS: tl.constexpr, BLOCK_SIZE: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr, NUM_STAGES: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
):
    first_row = tl.program_id(axis=0) * ROWS_PER_PROGRAM
    offs = tl.arange(0, BLOCK_SIZE)
    if SINGLE_PASS:
        mask = offs < cols
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        for r in tl.range(0, ROWS_PER_PROGRAM, num_stages=NUM_STAGES):
            start = tl.minimum(first_row + r, rows - 1) * cols
            x = tl.load(x_ptr + start + offs, mask=mask, other=0.0).to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / cols + EPS)
            tl.store(y_ptr + start + offs, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        for r in tl.range(0, ROWS_PER_PROGRAM):
            start = tl.minimum(first_row + r, rows - 1) * cols
            acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
            for col in tl.range(0, cols, BLOCK_SIZE, num_stages=NUM_STAGES):
                x = tl.load(x_ptr + start + col + offs, mask=col + offs < cols, other=0.0).to(tl.float32)
                acc += x * x
            rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / cols + EPS)
            for col in tl.range(0, cols, BLOCK_SIZE, num_stages=NUM_STAGES):
                mask = col + offs < cols
                x = tl.load(x_ptr + start + col + offs, mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + col + offs, mask=mask, other=0.0).to(tl.float32)
                tl.store(y_ptr + start + col + offs, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def layernorm_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr,
    rows, cols,
    EPS: tl.constexpr, BLOCK_SIZE: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr, NUM_STAGES: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
):
    first_row = tl.program_id(axis=0) * ROWS_PER_PROGRAM
    offs = tl.arange(0, BLOCK_SIZE)
    if SINGLE_PASS:
        mask = offs < cols
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        for r in tl.range(0, ROWS_PER_PROGRAM, num_stages=NUM_STAGES):
            start = tl.minimum(first_row + r, rows - 1) * cols
            x = tl.load(x_ptr + start + offs, mask=mask, other=0.0).to(tl.float32)
            mean = tl.sum(x, axis=0) / cols
            xc = tl.where(mask, x - mean, 0.0)
            rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / cols + EPS)
            tl.store(y_ptr + start + offs, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        for r in tl.range(0, ROWS_PER_PROGRAM):
            start = tl.minimum(first_row + r, rows - 1) * cols
            # The first block is full (cols > BLOCK_SIZE): its mean is the shift c.
            x = tl.load(x_ptr + start + offs).to(tl.float32)
            shift = tl.sum(x, axis=0) / BLOCK_SIZE
            s1 = x - shift
            s2 = s1 * s1
            for col in tl.range(BLOCK_SIZE, cols, BLOCK_SIZE, num_stages=NUM_STAGES):
                mask = col + offs < cols
                x = tl.load(x_ptr + start + col + offs, mask=mask, other=0.0).to(tl.float32)
                xs = tl.where(mask, x - shift, 0.0)
                s1 += xs
                s2 += xs * xs
            mean_shifted = tl.sum(s1, axis=0) / cols
            var = tl.maximum(tl.sum(s2, axis=0) / cols - mean_shifted * mean_shifted, 0.0)
            mean = shift + mean_shifted
            rstd = 1.0 / tl.sqrt(var + EPS)
            for col in tl.range(0, cols, BLOCK_SIZE, num_stages=NUM_STAGES):
                mask = col + offs < cols
                x = tl.load(x_ptr + start + col + offs, mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + col + offs, mask=mask, other=0.0).to(tl.float32)
                b = tl.load(b_ptr + col + offs, mask=mask, other=0.0).to(tl.float32)
                y = (x - mean) * rstd * w + b
                tl.store(y_ptr + start + col + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
