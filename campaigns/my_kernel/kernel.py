"""The Triton kernel of the example family: z = ALPHA · x + y, BLOCK_SIZE elements per program.

Imported only where a kernel runs (it imports triton at module level): under the interpreter,
TRITON_INTERPRET=1 must be set before this import, which tilepilot's evaluator does for you.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, z_ptr, n, ALPHA: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(axis=0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(z_ptr + offs, (ALPHA * x + y).to(z_ptr.dtype.element_ty), mask=mask)
