"""The Triton kernel of the `silu_mul_fp8_quant` family: SwiGLU activation fused with
per-token-group fp8 (e4m3) quantisation, as block-quantised LLM inference runs it.

For a token row x = [a | b] (each H wide) and each group of GROUP_SIZE consecutive columns:

    y     = silu(a) * b = a / (1 + exp(-a)) * b               (float32)
    scale = max(max|y|, EPS) / FP8_MAX                        (one float32 per group)
    q     = fp8(clamp(y / scale, -FP8_MAX, FP8_MAX))          (round to nearest even)

as vLLM's `per_token_group_quant_fp8` does after `silu_and_mul`, without the round trip of y
through memory. The program (pid_m, pid_g) handles GROUPS_PER_PROGRAM groups of
ROWS_PER_PROGRAM consecutive rows, one row at a time (a [GROUPS_PER_PROGRAM, GROUP_SIZE]
tile); NUM_STAGES pipelines that row loop. Rows past the end are clamped to the last row
(recomputed and rewritten); groups past the end are masked.

ROUND_IN_FP32: the Triton interpreter converts float32 to fp8 wrongly when rounding carries
into the exponent (127.99 becomes 64, not 128). With the flag set, the kernel first rounds
y / scale to the e4m3 grid in float32 arithmetic (round to nearest even; subnormals below
2**-6 on the 2**-9 grid), so that the conversion only sees representable values. The
launcher sets it under the interpreter only; on a GPU the hardware conversion does the
rounding, and the GPU tests check that both ways give the same bits.

Imported only inside a worker's child process (it imports triton at module level).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _round_to_e4m3(v):
    """v (float32, |v| <= 448) rounded to the nearest e4m3 value, ties to even, in float32; the
    sign is kept, so that a negative value rounding to zero is -0 as in the hardware conversion."""
    bits = v.to(tl.int32, bitcast=True)
    biased = tl.maximum((bits >> 23) & 0xFF, 127 - 6)  # e4m3 subnormals share the smallest binade's spacing
    ulp = ((biased - 3) << 23).to(tl.float32, bitcast=True)  # 2**(exponent - 3): 3 mantissa bits
    magic = 12582912.0  # 1.5 * 2**23: adding it rounds a float32 below 2**22 to an integer, ties to even
    rounded = ((tl.abs(v) / ulp + magic) - magic) * ulp
    return (rounded.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)


@triton.jit
def silu_mul_fp8_quant_kernel(
    x_ptr, q_ptr, s_ptr,
    T, H,
    EPS: tl.constexpr, FP8_MAX: tl.constexpr, GROUP_SIZE: tl.constexpr,
    GROUPS_PER_PROGRAM: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr, NUM_STAGES: tl.constexpr,
    ROUND_IN_FP32: tl.constexpr,
):
    first_row = tl.program_id(axis=0) * ROWS_PER_PROGRAM
    n_groups = H // GROUP_SIZE
    groups = tl.program_id(axis=1) * GROUPS_PER_PROGRAM + tl.arange(0, GROUPS_PER_PROGRAM)
    cols = groups[:, None] * GROUP_SIZE + tl.arange(0, GROUP_SIZE)[None, :]
    group_mask = groups < n_groups
    mask = group_mask[:, None]
    for r in tl.range(0, ROWS_PER_PROGRAM, num_stages=NUM_STAGES):
        row = tl.minimum(first_row + r, T - 1)
        a = tl.load(x_ptr + row * 2 * H + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(x_ptr + row * 2 * H + H + cols, mask=mask, other=0.0).to(tl.float32)
        y = a / (1.0 + tl.exp(-a)) * b
        scale = tl.maximum(tl.max(tl.abs(y), axis=1), EPS) / FP8_MAX
        v = tl.clamp(y / scale[:, None], -FP8_MAX, FP8_MAX)
        if ROUND_IN_FP32:
            v = _round_to_e4m3(v)
        tl.store(q_ptr + row * H + cols, v.to(q_ptr.dtype.element_ty), mask=mask)
        tl.store(s_ptr + row * n_groups + groups, scale, mask=group_mask)
