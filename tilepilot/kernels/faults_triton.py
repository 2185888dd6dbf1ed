"""Triton kernels of the `matmul_faults` test family: one that writes far out of bounds, one
that never ends. Imported only inside a worker's child process."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def oob_kernel(out_ptr, far, BLOCK: tl.constexpr):
    # `far` elements past the buffer: an address nothing maps (illegal memory access).
    offs = far + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros((BLOCK,), dtype=out_ptr.dtype.element_ty))


@triton.jit
def hang_kernel(flag_ptr, out_ptr):
    # Spin until the flag, which nothing ever sets, becomes non-zero.
    x = tl.load(flag_ptr, volatile=True)
    while x == 0:
        x = tl.load(flag_ptr, volatile=True)
    tl.store(out_ptr, x)
