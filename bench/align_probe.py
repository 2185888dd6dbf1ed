"""Do row strides that are not multiples of 128 bytes slow the tma variant down where it trails cuBLAS?

    python bench/align_probe.py --out bench/results/align-probe-h100.json

For the unaligned matmul shapes (3000x5000x1000 fp16: rows of 2000 and 10000 bytes;
1000x3000x2000 bf16: rows of 4000 and 6000 bytes), timed side by side with the timer and plan of
bench/kernels.py (L2 cold): `cublas`; `tma` (the family's launch of its best recorded tma
config); and the same tile loop with explicit row strides (`strided-*`), where the operands are
either the problem's own contiguous tensors (`strided-none`, which should time as `tma`) or
views of copies whose rows are padded to a multiple of 128 bytes: A alone, B alone, C alone,
or all three; `copy-B` and `copy-AB` pad at each call (the copies are timed with the kernel);
`mixed` loads B through pointers beside A's descriptor. The same problem padded whole to the
tile grid (`padded_problem`, more work) shows what the tiles cost when nothing is ragged; an
aligned shape (4096x4096x1024) is the control. Each arm's output is checked against the
family's reference before it is timed (a padded arm on its view of the problem). The probe's
kernels make their descriptors in every program, as the family's tma kernels did when the
committed result was recorded (they take host-made ones since: bench/hostdesc_probe.py).
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

from tilepilot.kernels.matmul_persistent_triton import _store_tile, _whole_waves  # noqa: E402
from tilepilot.kernels.matmul_triton import aligned, tile_pid  # noqa: E402

# problem, tma config (BLOCK_SIZE_M, N, K, warps, stages, EPILOGUE_SUBTILE): the recorded best
SHAPES = [((3000, 5000, 1000, "fp16"), (128, 256, 64, 8, 3, True)),
          ((1000, 3000, 2000, "bf16"), (256, 128, 64, 8, 4, True)),
          ((4096, 4096, 1024, "bf16"), (128, 256, 64, 8, 3, True))]


@triton.jit
def _c_descriptor(c_ptr, M, N, stride_cm, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                  EPILOGUE_SUBTILE: tl.constexpr):
    """C's descriptor, made in the program (its block half a tile wide with EPILOGUE_SUBTILE)."""
    if EPILOGUE_SUBTILE:
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1],
                                           block_shape=[BLOCK_SIZE_M, BLOCK_SIZE_N // 2])
    else:
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1],
                                           block_shape=[BLOCK_SIZE_M, BLOCK_SIZE_N])
    return c_desc


@triton.jit
def strided_tma_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
                       BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                       GROUP_SIZE_M: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr):
    """matmul_tma_kernel's tile loop (`_whole_waves`) over descriptors made in each program from
    the row strides of A, B and C."""
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1],
                                       block_shape=[BLOCK_SIZE_M, BLOCK_SIZE_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1],
                                       block_shape=[BLOCK_SIZE_K, BLOCK_SIZE_N])
    c_desc = _c_descriptor(c_ptr, M, N, stride_cm, BLOCK_SIZE_M, BLOCK_SIZE_N, EPILOGUE_SUBTILE)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    _whole_waves(a_desc, b_desc, c_desc, tl.program_id(axis=0), num_pid_m * num_pid_n, tl.num_programs(axis=0),
                 num_pid_m, num_pid_n, tl.cdiv(K, BLOCK_SIZE_K), BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K,
                 GROUP_SIZE_M, EPILOGUE_SUBTILE, False)


@triton.jit
def mixed_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                 BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                 GROUP_SIZE_M: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr, ALIGN_N: tl.constexpr):
    """matmul_tma_kernel with B loaded through pointers (the grouped kernel's wrapped columns and
    masked K, its rows ALIGN_N-aligned) instead of its descriptor; A and C through descriptors."""
    N = aligned(N, ALIGN_N)
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_SIZE_M, BLOCK_SIZE_K])
    c_desc = _c_descriptor(c_ptr, M, N, N, BLOCK_SIZE_M, BLOCK_SIZE_N, EPILOGUE_SUBTILE)
    start = tl.program_id(axis=0)
    programs = tl.num_programs(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    k_blocks = tl.cdiv(K, BLOCK_SIZE_K)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    for tile in tl.range(start, num_pid_m * num_pid_n, programs, flatten=True):
        pid_m, pid_n = tile_pid(tile, num_pid_m, num_pid_n, GROUP_SIZE_M)
        offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
        accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k in range(0, k_blocks):
            a = a_desc.load([pid_m * BLOCK_SIZE_M, k * BLOCK_SIZE_K])
            b_ptrs = b_ptr + (k * BLOCK_SIZE_K + offs_k[:, None]) * N + offs_bn[None, :]
            b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
            accumulator = tl.dot(a, b, accumulator)
        _store_tile(c_desc, accumulator, pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N, BLOCK_SIZE_M, BLOCK_SIZE_N,
                    EPILOGUE_SUBTILE)


def padded(t: Any, pad: bool) -> Any:
    """`t` itself, or a view of a copy of it whose rows are padded to a multiple of 128 bytes."""
    import torch

    if not pad:
        return t
    rows, cols = t.shape
    step = 128 // t.element_size()
    store = torch.zeros((rows, -(-cols // step) * step), dtype=t.dtype, device=t.device)
    store[:, :cols] = t
    return store[:, :cols]


def persistent_launch(fn: Any, arms: Any, config: Any, values: dict[str, Any], extra: dict[str, Any],
                      out: Any) -> Any:
    """`fn` compiled ahead of time for `config` on the problem of `arms` (its `*_ptr` arguments of
    the problem's dtype, the other `values` ints; the config's tile, GROUP_SIZE_M and
    EPILOGUE_SUBTILE and `extra` as constants), launched with one program per SM at most and the
    scratch memory its descriptors need: a closure."""
    from tilepilot.kernels import attention, matmul
    from tilepilot.kernels.compile import Pointer, aot_compile, launch

    dtype = str(arms.problem["dtype"])
    args = {name: Pointer(dtype) if name.endswith("_ptr") else v for name, v in values.items()}
    consts = {**{name: config[name] for name in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M",
                                                 "EPILOGUE_SUBTILE")}, **extra}
    compiled = aot_compile(fn, args, consts, arms.target, num_warps=int(config["num_warps"]),
                           num_stages=int(config["num_stages"]))
    m, n, _ = matmul.dims(arms.problem)
    tiles = -(-m // int(config["BLOCK_SIZE_M"])) * -(-n // int(config["BLOCK_SIZE_N"]))
    programs = min(tiles, matmul._programs(arms.inputs[0]))
    return attention._with_scratch(launch(fn, (programs, 1, 1), values, consts, config, compiled), compiled,
                                   programs, out)


def strided_launch(arms: Any, config: Any, out: Any, pads: str, copy: bool = False) -> Any:
    """A launch of strided_tma_kernel for `config` on the problem of `arms`, with the operands named
    in `pads` (of "A", "B", "C") padded: a closure that returns C (a view, where C is padded). With
    `copy`, the closure copies the padded operands A and B from the problem's own tensors first (the
    cost of padding them at each call, timed)."""
    from tilepilot.kernels import matmul

    m, n, k = matmul.dims(arms.problem)
    a, b = (padded(t, name in pads) for t, name in zip(arms.inputs, "AB", strict=True))
    c = padded(out, "C" in pads)
    values = {"a_ptr": a, "b_ptr": b, "c_ptr": c, "M": m, "N": n, "K": k,
              "stride_am": a.stride(0), "stride_bk": b.stride(0), "stride_cm": c.stride(0)}
    run = persistent_launch(strided_tma_kernel, arms, config, values, {}, c)
    copies = [(padded_t, t) for padded_t, t in zip((a, b), arms.inputs, strict=True) if padded_t is not t]

    def run_view() -> Any:
        if copy:
            for dst, src in copies:
                dst.copy_(src)
        run()
        return None if c is out else c

    return run_view


def mixed_launch(arms: Any, config: Any, out: Any) -> Any:
    """A launch of mixed_kernel for `config` on the problem of `arms`."""
    from tilepilot.kernels import matmul

    m, n, k = matmul.dims(arms.problem)
    a, b = arms.inputs
    return persistent_launch(mixed_kernel, arms, config, {"a_ptr": a, "b_ptr": b, "c_ptr": out, "M": m, "N": n, "K": k},
                             {"ALIGN_N": matmul.alignment(n, str(arms.problem["dtype"]))}, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from kernels import Arms, gpu_probe, write_probe
    from record import tile_config

    fam, ev, target, timer = gpu_probe("matmul")
    rows = []
    for (m, n, k, dtype), (bm, bn, bk, w, s, sub) in SHAPES:
        problem = fam.parse_problem({"M": m, "N": n, "K": k, "dtype": dtype})
        config = tile_config(bm, bn, bk, w, s, VARIANT="tma", EPILOGUE_SUBTILE=sub)
        arms = Arms(fam, problem, target)
        arms.baseline("cublas")
        arms.config("tma", config)
        for pads in ("none", "A", "B", "C", "ABC"):
            arms.add(f"strided-{pads}", lambda out, pads=pads, a=arms, c=config: strided_launch(a, c, out, pads))
        for pads in ("B", "AB"):
            arms.add(f"copy-{pads}", lambda out, pads=pads, a=arms, c=config: strided_launch(a, c, out, pads, True))
        arms.add("mixed", lambda out, a=arms, c=config: mixed_launch(a, c, out))
        row: dict[str, Any] = {"problem": problem.label(), "config": config.as_dict(),
                               "arms": arms.medians(arms.time(timer, fam.l2_flush))}
        # the problem padded whole to the tile grid: more work, nothing ragged
        big = fam.parse_problem({"M": -(-m // bm) * bm, "N": -(-n // bn) * bn, "K": -(-k // bk) * bk,
                                 "dtype": dtype})
        if big != problem:
            whole = Arms(fam, big, target)
            whole.baseline("cublas")
            whole.config("tma", config)
            row["padded_problem"] = {"problem": big.label(), "arms": whole.medians(whole.time(timer, fam.l2_flush))}
        rows.append(row)
        print(problem.label(), {a: v.get("median_ms") or v.get("error") for a, v in row["arms"].items()},
              row.get("padded_problem", {}).get("problem"),
              {a: v.get("median_ms") for a, v in row.get("padded_problem", {}).get("arms", {}).items()}, flush=True)
    write_probe(args.out, __doc__, "align_probe.py", argv, ev, rows)
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
