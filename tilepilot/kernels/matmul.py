"""Family `matmul`: C = A @ B in bf16 or fp16 with fp32 accumulation (Triton's GEMM tutorial).

Problem: M, N, K (positive ints up to 65536, each operand under 2**31 elements) and dtype
(bf16 | fp16); A is M×K, B is K×N, C is M×N, all row-major. The config space is the
tutorial's: tile sizes, the group size of the swizzled program order, warps and pipeline
stages. The kernel itself is in `matmul_triton.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from tilepilot.experiments import Config, InputError, Param, Problem, SearchSpace
from tilepilot.kernels.base import KernelFamily, Target, Work
from tilepilot.kernels.compile import hash_modules, launch

DTYPES = ("bf16", "fp16")
DTYPE_BYTES = {"bf16": 2, "fp16": 2}
MAX_DIM = 65536
MAX_ELEMENTS = 2**31 - 1  # the kernel indexes each operand with 32-bit offsets
TOLERANCE = {"bf16": 1e-2, "fp16": 2e-3}  # ||C - ref|| / ||ref||; output rounding alone is ~2e-3 / ~3e-4
H100_SHARED_BYTES = Target().max_shared_bytes

PARAMS = (
    Param("BLOCK_SIZE_M", (16, 32, 64, 128, 256)),
    Param("BLOCK_SIZE_N", (16, 32, 64, 128, 256)),
    Param("BLOCK_SIZE_K", (16, 32, 64, 128, 256)),
    Param("GROUP_SIZE_M", (1, 4, 8, 16)),
    Param("num_warps", (2, 4, 8)),
    Param("num_stages", (2, 3, 4, 5)),
)
TILE_PARAMS = tuple(p.name for p in PARAMS)


def pipelined_shared_bytes(config: Config, problem: Problem) -> int:
    """Shared memory of the software pipeline: num_stages buffers of an A tile and a B tile."""
    bm, bn, bk = (int(config[k]) for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"))
    return int(config["num_stages"]) * (bm * bk + bk * bn) * DTYPE_BYTES[str(problem["dtype"])]


def shared_memory_fits(config: Config, problem: Problem) -> str | None:
    """The pipelined A/B tiles must fit the per-block shared memory of the device (H100: 227 KiB)."""
    need = pipelined_shared_bytes(config, problem)
    if need > H100_SHARED_BYTES:
        return (f"the {config['num_stages']}-stage pipeline needs {need} B of shared memory for its A and B "
                f"tiles, more than the {H100_SHARED_BYTES} B a block can have")
    return None


class MatmulFamily(KernelFamily):
    name: ClassVar[str] = "matmul"
    baseline_name: ClassVar[str] = "cuBLAS (torch.matmul)"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = "C = A @ B, bf16/fp16 in and out, fp32 accumulation (Triton GEMM tutorial)"
    dtypes: ClassVar[tuple[str, ...]] = DTYPES
    l2_flush: ClassVar[bool] = True

    # ---- CPU side ---------------------------------------------------------------------------
    def space(self) -> SearchSpace:
        return SearchSpace(PARAMS, (shared_memory_fits,))

    def parse_problem(self, raw: Mapping[str, Any]) -> Problem:
        return parse_matmul_problem(raw)

    def default_config(self, problem: Problem) -> Config:
        return Config.of({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64,
                          "GROUP_SIZE_M": 8, "num_warps": 8, "num_stages": 3})

    def work(self, problem: Problem) -> Work:
        m, n, k = dims(problem)
        size = DTYPE_BYTES[str(problem["dtype"])]
        return Work(flops=2.0 * m * n * k, bytes=float((m * k + k * n + m * n) * size))

    def specialisation(self, problem: Problem, config: Config) -> str:
        from tilepilot.kernels.compile import int_class

        m, n, k = dims(problem)
        return f"{problem['dtype']} M:{int_class(m)} N:{int_class(n)} K:{int_class(k)}"

    def source_hash(self) -> str:
        """The family module and its kernel module, so that an edited kernel is a new experiment."""
        return hash_modules(type(self).__module__, "tilepilot.kernels.matmul_triton")

    # ---- device side ------------------------------------------------------------------------
    def compile(self, problem: Problem, config: Config, target: Target) -> Any:
        from tilepilot.kernels import matmul_triton
        from tilepilot.kernels.compile import Pointer, aot_compile

        args: dict[str, Any] = {name: Pointer(str(problem["dtype"])) for name in ("a_ptr", "b_ptr", "c_ptr")}
        args.update(_int_args(problem))
        return aot_compile(matmul_triton.matmul_kernel, args, _constexprs(config), target,
                           num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]))

    def make_inputs(self, problem: Problem, seed: int, device: str) -> tuple[Any, ...]:
        import torch

        m, n, k = dims(problem)
        dtype = torch_dtype(problem)
        gen = torch.Generator(device=device).manual_seed(seed)
        a = torch.randn((m, k), generator=gen, device=device, dtype=torch.float32).to(dtype)
        b = torch.randn((k, n), generator=gen, device=device, dtype=torch.float32).to(dtype)
        return (a, b)

    def make_output(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        import torch

        m, n, _ = dims(problem)
        return torch.empty((m, n), dtype=inputs[0].dtype, device=inputs[0].device)

    def reference(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        import torch

        a, b = inputs
        allow_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False  # a true fp32 product
        try:
            return torch.matmul(a.float(), b.float())
        finally:
            torch.backends.cuda.matmul.allow_tf32 = allow_tf32

    def tolerance(self, problem: Problem) -> float:
        return TOLERANCE[str(problem["dtype"])]

    def launcher(self, problem: Problem, config: Config, inputs: tuple[Any, ...], out: Any,
                 compiled: Any | None) -> Callable[[], None]:
        from tilepilot.kernels import matmul_triton

        a, b = inputs
        _check_operands(problem, a, b, out)
        m, n, _ = dims(problem)
        bm, bn = int(config["BLOCK_SIZE_M"]), int(config["BLOCK_SIZE_N"])
        grid = ((m + bm - 1) // bm * ((n + bn - 1) // bn), 1, 1)
        values: dict[str, Any] = {"a_ptr": a, "b_ptr": b, "c_ptr": out, **_int_args(problem)}
        return launch(matmul_triton.matmul_kernel, grid, values, _constexprs(config), config, compiled)

    def baseline(self, problem: Problem, inputs: tuple[Any, ...], out: Any) -> Callable[[], None] | None:
        import torch

        a, b = inputs

        def run() -> None:
            torch.matmul(a, b, out=out)

        return run


# ---- helpers shared with the faults family ---------------------------------------------------
def parse_matmul_problem(raw: Mapping[str, Any]) -> Problem:
    if not isinstance(raw, Mapping):
        raise InputError(f"matmul problem {raw!r:.80} is not a table of M, N, K, dtype")
    allowed = ("M", "N", "K", "dtype")
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise InputError(f"unknown matmul problem key {unknown[0]!r} (allowed: {', '.join(allowed)})")
    for key in ("M", "N", "K"):
        if key not in raw:
            raise InputError(f"matmul problem is missing {key} (a positive integer up to {MAX_DIM})")
        value = raw[key]
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DIM:
            raise InputError(f"matmul problem {key}={value!r} is not a positive integer up to {MAX_DIM}")
    dtype = raw.get("dtype")
    if dtype not in DTYPES:
        raise InputError(f"matmul problem dtype={dtype!r} is not one of {{{', '.join(DTYPES)}}}")
    m, n, k = raw["M"], raw["N"], raw["K"]
    for name, count in (("A (M×K)", m * k), ("B (K×N)", k * n), ("C (M×N)", m * n)):
        if count > MAX_ELEMENTS:
            raise InputError(f"matmul problem M={m} N={n} K={k}: {name} has {count} elements "
                             f"(at most {MAX_ELEMENTS} allowed)")
    return Problem.of({"M": m, "N": n, "K": k, "dtype": dtype})


def dims(problem: Problem) -> tuple[int, int, int]:
    return int(problem["M"]), int(problem["N"]), int(problem["K"])


def torch_dtype(problem: Problem) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}[str(problem["dtype"])]


def _int_args(problem: Problem) -> dict[str, int]:
    m, n, k = dims(problem)
    return {"M": m, "N": n, "K": k, "stride_am": k, "stride_ak": 1, "stride_bk": n, "stride_bn": 1,
            "stride_cm": n, "stride_cn": 1}


def _constexprs(config: Config) -> dict[str, int]:
    return {k: int(config[k]) for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")}


def _check_operands(problem: Problem, a: Any, b: Any, out: Any) -> None:
    m, n, k = dims(problem)
    shapes = (tuple(a.shape), tuple(b.shape), tuple(out.shape))
    if shapes != ((m, k), (k, n), (m, n)):
        raise ValueError(f"operand shapes {shapes} do not match the problem {problem.label()}")
    for t in (a, b, out):
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise ValueError("matmul operands must be contiguous and 16-byte aligned")

