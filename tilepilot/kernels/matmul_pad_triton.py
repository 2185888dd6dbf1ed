"""PAD_ROWS of the `matmul` family's tensor-descriptor variants: copy an operand into a buffer whose
rows are padded to a multiple of 128 bytes before the GEMM reads it.

TMA loads rows that start off a 128-byte boundary at a cost: on the H100, 3000×5000×1000 fp16 (rows
of 2000 and 10000 bytes) takes the tma kernel 0.078 ms on the operands as they are and 0.057 ms on
copies padded ahead of time (bench/results/pad-probe-h100.json). `pad_rows_kernel` makes that copy
at each call: one program per block of BLOCK_R × BLOCK_C elements, the source's row length restated
as a multiple of its widest vector (ALIGN) and the copy's row pitch as a multiple of 128 bytes
(LD_ALIGN), so that loads and stores are 16-byte vectors. The padding columns are never written nor
read: the GEMM's tensor descriptors have the operand's own shape and the copy's row pitch.

Imported only inside a worker's child process.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tilepilot.kernels.matmul_triton import aligned

ROW_BYTES = 128  # the row pitch of a padded copy is a multiple of this (matmul.PAD_ROW_BYTES)
# bench/pad_probe.py: copying in blocks of 32×256, 64×256 or 128×256 elements timed alike (one-launch form)
BLOCK_R, BLOCK_C, WARPS = 32, 256, 4


@triton.jit
def pad_rows_kernel(src_ptr, dst_ptr, rows, cols, ld, ALIGN: tl.constexpr, LD_ALIGN: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """dst[r, c] = src[r, c] over the rows × cols of `src` (contiguous, `cols` a multiple of ALIGN),
    into `dst`, whose rows are `ld` elements apart (a multiple of LD_ALIGN)."""
    cols = aligned(cols, ALIGN)
    ld = aligned(ld, LD_ALIGN)
    r = tl.program_id(axis=0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(axis=1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    x = tl.load(src_ptr + r[:, None].to(tl.int64) * cols + c[None, :], mask=mask)
    tl.store(dst_ptr + r[:, None].to(tl.int64) * ld + c[None, :], x, mask=mask)
