"""Does padding the operands' rows to 128 bytes at each call, in a Triton kernel, pay off for tma?

    python bench/pad_probe.py --out bench/results/pad-probe-h100.json

bench/align_probe.py found that rows which are not a multiple of 128 bytes slow the tma kernel's
loads (3000x5000x1000 fp16: 0.079 ms, 0.056 ms with A, B and C padded ahead of time, cuBLAS 0.058),
but that padding with `torch.Tensor.copy_` at each call costs more than it saves. Here the copy is a
Triton kernel (`pad_rows_kernel`, the one PAD_ROWS launches since,
tilepilot/kernels/matmul_pad_triton.py: tiles of whole vectors, the source's rows restated as
multiples of 16 bytes so its loads are vectors too) into a workspace whose rows are padded to 128
bytes, made once outside the timed closure; the family's own tma kernel (host-made tensor
descriptors over the padded views, C unpadded) then runs on the copies. Timed side by side with the
timer and plan of bench/kernels.py (L2 cold before each launch, so the copy reads its operand from
DRAM as the GEMM would): `cublas`; `tma` (the family's launch of the config); `pad-A`, `pad-B`,
`pad-AB` (the copies and the GEMM, two or three launches, timed together); `fused-B`, `fused-AB`
(one launch, `matmul_tma_pad_kernel`: every program first copies its share of blocks of R x C
elements, two blocks in flight, then waits at a grid-wide barrier before the tma tile loop);
`padded-AB` (the GEMM on copies made once, untimed: what the copies could buy at most); `copy-B`
(the pad kernel alone on B). Each arm's output is checked against the family's reference before it
is timed. Shapes: the matmul problems whose rows are not multiples of 128 bytes, at their tuned tma
configs and a second tile, and an aligned control (4096x4096x1024, nothing to pad: every arm is the
plain tma kernel there but for the copies).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tilepilot.kernels.matmul_pad_triton import BLOCK_C as PAD_BLOCK_C  # noqa: E402
from tilepilot.kernels.matmul_pad_triton import BLOCK_R as PAD_BLOCK_R  # noqa: E402
from tilepilot.kernels.matmul_pad_triton import ROW_BYTES, pad_rows_kernel  # noqa: E402
from tilepilot.kernels.matmul_pad_triton import WARPS as PAD_WARPS  # noqa: E402
from tilepilot.kernels.matmul_persistent_triton import _whole_waves  # noqa: E402
from tilepilot.kernels.matmul_triton import aligned  # noqa: E402

# problem, tma configs (BLOCK_SIZE_M, N, K, warps, stages, EPILOGUE_SUBTILE)
SHAPES = [((3000, 5000, 1000, "fp16"), [(128, 256, 64, 8, 3, True), (128, 256, 64, 8, 4, True)]),
          ((1000, 3000, 2000, "bf16"), [(128, 192, 64, 4, 4, False), (256, 128, 64, 8, 4, True)]),
          ((4096, 4096, 1024, "bf16"), [(128, 256, 64, 8, 4, True)])]


@triton.jit
def _pad_block(blk, blocks, blocks_c, rows, cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Rows, columns and mask of block `blk` of the grid of blocks over rows × cols (none past `blocks`)."""
    r = tl.where(blk < blocks, (blk // blocks_c) * BLOCK_R + tl.arange(0, BLOCK_R), rows)
    c = (blk % blocks_c) * BLOCK_C + tl.arange(0, BLOCK_C)
    return r, c, (r[:, None] < rows) & (c[None, :] < cols)


@triton.jit
def _pad_part(src_ptr, dst_ptr, rows, cols, ld, part, parts, ALIGN: tl.constexpr, LD_ALIGN: tl.constexpr,
              BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """pad_rows_kernel's blocks part, part + parts, ... (row-major over the grid of blocks), each
    block's load issued before the previous block is stored (two blocks in flight)."""
    cols = aligned(cols, ALIGN)
    ld = aligned(ld, LD_ALIGN)
    blocks_c = tl.cdiv(cols, BLOCK_C)
    blocks = tl.cdiv(rows, BLOCK_R) * blocks_c
    r, c, mask = _pad_block(part, blocks, blocks_c, rows, cols, BLOCK_R, BLOCK_C)
    x = tl.load(src_ptr + r[:, None].to(tl.int64) * cols + c[None, :], mask=mask)
    for blk in range(part + parts, blocks, parts):
        r2, c2, mask2 = _pad_block(blk, blocks, blocks_c, rows, cols, BLOCK_R, BLOCK_C)
        y = tl.load(src_ptr + r2[:, None].to(tl.int64) * cols + c2[None, :], mask=mask2)
        tl.store(dst_ptr + r[:, None].to(tl.int64) * ld + c[None, :], x, mask=mask)
        x, r, c, mask = y, r2, c2, mask2
    tl.store(dst_ptr + r[:, None].to(tl.int64) * ld + c[None, :], x, mask=mask)


@triton.jit
def _proxy_fence():
    """fence.proxy.async.global in every thread: order this thread's generic-proxy accesses to
    global memory against the async proxy's (TMA)."""
    tl.inline_asm_elementwise("fence.proxy.async.global;\n mov.b32 $0, $1;", "=r,r", [tl.full([1], 0, tl.int32)],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _grid_barrier(bar_ptr, programs):
    """Wait until every program of the launch has arrived (all must be resident: a persistent
    launch of at most one program per SM). bar_ptr[0] counts arrivals, bar_ptr[1] is the
    generation, bumped by the last to arrive after it resets the count: zero both once, and the
    barrier is ready again for the next launch."""
    tl.debug_barrier()
    _proxy_fence()
    gen = tl.atomic_add(bar_ptr + 1, 0, sem="relaxed", scope="gpu")
    arrived = tl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == programs - 1:
        tl.atomic_xchg(bar_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_add(bar_ptr + 1, 1, sem="release", scope="gpu")
    else:
        cur = tl.atomic_add(bar_ptr + 1, 0, sem="acquire", scope="gpu")
        while cur == gen:
            cur = tl.atomic_add(bar_ptr + 1, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()
    _proxy_fence()


@triton.jit
def matmul_tma_pad_kernel(a_desc, b_desc, c_desc, a_ptr, b_ptr, a_pad_ptr, b_pad_ptr, bar_ptr, M, N, K, lda, ldb,
                          BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                          GROUP_SIZE_M: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr, PAD_A: tl.constexpr,
                          PAD_B: tl.constexpr, ALIGN_A: tl.constexpr, ALIGN_B: tl.constexpr,
                          LD_ALIGN: tl.constexpr, COPY_R: tl.constexpr, COPY_C: tl.constexpr):
    """matmul_tma_kernel after every program has copied its share of A and/or B into the padded
    buffers the descriptors read (a grid-wide barrier between)."""
    start = tl.program_id(axis=0)
    programs = tl.num_programs(axis=0)
    if PAD_A:
        _pad_part(a_ptr, a_pad_ptr, M, K, lda, start, programs, ALIGN_A, LD_ALIGN, COPY_R, COPY_C)
    if PAD_B:
        _pad_part(b_ptr, b_pad_ptr, K, N, ldb, start, programs, ALIGN_B, LD_ALIGN, COPY_R, COPY_C)
    _grid_barrier(bar_ptr, programs)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    _whole_waves(a_desc, b_desc, c_desc, start, num_pid_m * num_pid_n, programs, num_pid_m, num_pid_n,
                 tl.cdiv(K, BLOCK_SIZE_K), BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, EPILOGUE_SUBTILE,
                 False)


def pad_store(t: Any) -> Any:
    """A view shaped as `t` over a new buffer whose rows are padded to ROW_BYTES."""
    import torch

    rows, cols = t.shape
    step = ROW_BYTES // t.element_size()
    return torch.empty((rows, -(-cols // step) * step), dtype=t.dtype, device=t.device)[:, :cols]


def pad_launch(src: Any, dst: Any) -> Any:
    """A closure copying `src` into the padded view `dst` with pad_rows_kernel."""
    from tilepilot.experiments import Config
    from tilepilot.kernels.compile import launch

    rows, cols = src.shape
    align = 16 // src.element_size()
    while cols % align:
        align //= 2
    grid = (-(-rows // PAD_BLOCK_R), -(-cols // PAD_BLOCK_C), 1)
    return launch(pad_rows_kernel, grid, {"src_ptr": src, "dst_ptr": dst, "rows": rows, "cols": cols,
                                          "ld": dst.stride(0)},
                  {"ALIGN": align, "LD_ALIGN": ROW_BYTES // src.element_size(), "BLOCK_R": PAD_BLOCK_R,
                   "BLOCK_C": PAD_BLOCK_C}, Config.of({"num_warps": PAD_WARPS, "num_stages": 1}), None)


def tma_on(arms: Any, config: Any, out: Any, pads: str, timed_copies: bool) -> Any:
    """The family's tma kernel for `config` over A and B, those named in `pads` replaced by padded
    copies: made at each call (`timed_copies`) or once, here."""
    from tilepilot.kernels import matmul
    from tilepilot.kernels.compile import launch

    problem = arms.problem
    compiled = arms.family.compile(problem, config, arms.target)
    tensors = {"a": arms.inputs[0], "b": arms.inputs[1], "c": out}
    copies = []
    for name in pads.lower():
        dst = pad_store(tensors[name])
        copies.append(pad_launch(tensors[name], dst))
        tensors[name] = dst
    fn, ints, constexprs = matmul._kernel(problem, config)
    pointers = matmul._descriptors(matmul.descriptor_blocks(config), tensors)
    m, n, _ = matmul.dims(problem)
    tiles = -(-m // int(config["BLOCK_SIZE_M"])) * -(-n // int(config["BLOCK_SIZE_N"]))
    gemm = launch(fn, (min(tiles, matmul._programs(arms.inputs[0])), 1, 1), {**pointers, **ints}, constexprs,
                  config, compiled)
    if not timed_copies:
        for copy in copies:
            copy()
        return gemm

    def run() -> None:
        for copy in copies:
            copy()
        gemm()

    return run


def vector(t: Any) -> int:
    """Elements of the widest vector (16 bytes at most) that divides a row of the contiguous `t`."""
    align = 16 // t.element_size()
    while t.shape[1] % align:
        align //= 2
    return align


def fused_on(arms: Any, config: Any, out: Any, pads: str, copy: tuple[int, int]) -> Any:
    """matmul_tma_pad_kernel for `config`, padding the operands in `pads` in its prologue."""
    import torch

    from tilepilot.kernels import matmul
    from tilepilot.kernels.compile import launch

    problem = arms.problem
    a, b = arms.inputs
    tensors = {"a": a, "b": b, "c": out}
    for name in pads.lower():
        tensors[name] = pad_store(tensors[name])
    pointers = matmul._descriptors(matmul.descriptor_blocks(config), tensors)
    m, n, k = matmul.dims(problem)
    tiles = -(-m // int(config["BLOCK_SIZE_M"])) * -(-n // int(config["BLOCK_SIZE_N"]))
    bar = torch.zeros(2, dtype=torch.int32, device=a.device)
    values = {**pointers, "a_ptr": a, "b_ptr": b, "a_pad_ptr": tensors["a"], "b_pad_ptr": tensors["b"],
              "bar_ptr": bar, "M": m, "N": n, "K": k, "lda": tensors["a"].stride(0), "ldb": tensors["b"].stride(0)}
    consts = {name: config[name] for name in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M",
                                              "EPILOGUE_SUBTILE")}
    consts.update(PAD_A="A" in pads, PAD_B="B" in pads, ALIGN_A=vector(a), ALIGN_B=vector(b),
                  LD_ALIGN=ROW_BYTES // a.element_size(), COPY_R=copy[0], COPY_C=copy[1])
    return launch(matmul_tma_pad_kernel, (min(tiles, matmul._programs(a)), 1, 1), values, consts, config, None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from kernels import Arms, gpu_probe, write_probe
    from record import tile_config

    from tilepilot.kernels import matmul

    fam, ev, target, timer = gpu_probe("matmul")
    rows = []
    for (m, n, k, dtype), configs in SHAPES:
        problem = fam.parse_problem({"M": m, "N": n, "K": k, "dtype": dtype})
        arms = Arms(fam, problem, target)
        arms.baseline("cublas")
        for bm, bn, bk, w, s, sub in configs:
            config = tile_config(bm, bn, bk, w, s, VARIANT="tma", EPILOGUE_SUBTILE=sub)
            tag = f"{bm}x{bn}x{bk}-w{w}s{s}"
            arms.config(f"tma-{tag}", config)
            for pads in ("A", "B", "AB"):
                arms.add(f"pad-{pads}-{tag}", lambda out, a=arms, p=pads, c=config: tma_on(a, c, out, p, True))
            for pads in ("B", "AB"):
                for copy in ((32, 256), (64, 256), (128, 256)):
                    if matmul.wide_split(bn):
                        continue
                    arms.add(f"fused-{pads}-{copy[0]}x{copy[1]}-{tag}",
                             lambda out, a=arms, p=pads, c=config, cp=copy: fused_on(a, c, out, p, cp))
            arms.add(f"padded-AB-{tag}", lambda out, a=arms, c=config: tma_on(a, c, out, "AB", False))
        copy_b = pad_launch(arms.inputs[1], pad_store(arms.inputs[1]))
        row: dict[str, Any] = {"problem": problem.label(),
                               "arms": arms.medians(arms.time(timer, fam.l2_flush, {"copy-B": copy_b}))}
        rows.append(row)
        print(problem.label(), {a: v.get("median_ms") or v.get("error") for a, v in row["arms"].items()}, flush=True)
    write_probe(args.out, __doc__, "pad_probe.py", argv, ev, rows)
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
