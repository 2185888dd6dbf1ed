"""What the row-wise families (`softmax`, `rmsnorm`, `layernorm`) share: the problem, the config
space with its constraints, the default config and the launch grid.

Problem: `rows` × `cols` (positive ints, at most 2**31 - 1 elements: the kernels index with
32-bit offsets) and `dtype` (bf16 | fp16 | fp32); the input and the output are row-major with
the input's dtype, and every reduction runs along a row in float32.

Config: a program handles ROWS_PER_PROGRAM consecutive rows, one at a time, in blocks of
BLOCK_SIZE columns. When a row fits one block (cols <= BLOCK_SIZE) the kernel reads it once
and keeps it in registers ("single pass"); otherwise it loops over the row's blocks, a first
loop for the statistics and a second one to write ("two passes"). `num_stages` is the depth
of software pipelining of the innermost loop (`tl.range(..., num_stages=...)`: for loads
that feed no `tl.dot`, the kernel-wide num_stages option pipelines nothing).

Constraints (each names what is wrong): a block no longer than the row needs; every thread
holds at least one and at most 128 values of a block; num_stages > 1 only where there is a
loop to pipeline; no more rows per program than rows; the pipeline's shared memory within
the H100's 227 KiB per block.

No torch, no triton here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from tilepilot.experiments import Config, Constraint, InputError, Param, Problem, SearchSpace
from tilepilot.kernels.base import Target

DTYPES = ("bf16", "fp16", "fp32")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
MAX_DIM = 2**31 - 1
MAX_ELEMENTS = 2**31 - 1
MAX_ELEMENTS_PER_THREAD = 128  # fp32 values of one block per thread; beyond, registers spill for sure
WARP = 32
H100_SHARED_BYTES = Target().max_shared_bytes

PARAMS = (
    Param("BLOCK_SIZE", (256, 512, 1024, 2048, 4096, 8192, 16384)),
    Param("ROWS_PER_PROGRAM", (1, 2, 4)),
    Param("num_warps", (1, 2, 4, 8, 16)),
    Param("num_stages", (1, 2, 3, 4)),
)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def parse_rows_problem(family: str, raw: Mapping[str, Any]) -> Problem:
    """Check a `{rows, cols, dtype}` problem. Raises InputError naming the bad key or value."""
    allowed = ("rows", "cols", "dtype")
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise InputError(f"unknown {family} problem key {unknown[0]!r} (allowed: {', '.join(allowed)})")
    for key in ("rows", "cols"):
        if key not in raw:
            raise InputError(f"{family} problem is missing {key} (a positive integer)")
        value = raw[key]
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DIM:
            raise InputError(f"{family} problem {key}={value!r} is not a positive integer up to {MAX_DIM}")
    dtype = raw.get("dtype")
    if dtype not in DTYPES:
        raise InputError(f"{family} problem dtype={dtype!r} is not one of {{{', '.join(DTYPES)}}}")
    rows, cols = raw["rows"], raw["cols"]
    if rows * cols > MAX_ELEMENTS:
        raise InputError(f"{family} problem rows={rows} cols={cols} has {rows * cols} elements "
                         f"(at most {MAX_ELEMENTS} allowed)")
    return Problem.of({"rows": rows, "cols": cols, "dtype": dtype})


def dims(problem: Problem) -> tuple[int, int]:
    return int(problem["rows"]), int(problem["cols"])


def single_pass(problem: Problem, config: Config) -> bool:
    """A row fits one block: read once, kept in registers."""
    return int(problem["cols"]) <= int(config["BLOCK_SIZE"])


# ---- constraints: None when the config suits the problem, else the reason --------------------
def block_fits_row(config: Config, problem: Problem) -> str | None:
    block, cols = int(config["BLOCK_SIZE"]), int(problem["cols"])
    limit = max(PARAMS[0].choices[0], next_power_of_2(cols))  # type: ignore[arg-type]
    if block > limit:
        return f"BLOCK_SIZE={block} is longer than a row of {cols} columns needs ({limit}): only masked lanes added"
    return None


def threads_have_work(config: Config, problem: Problem) -> str | None:
    block, threads = int(config["BLOCK_SIZE"]), WARP * int(config["num_warps"])
    if threads > block:
        return f"{threads} threads (num_warps={config['num_warps']}) for a block of {block} elements leave threads idle"
    if block // threads > MAX_ELEMENTS_PER_THREAD:
        return (f"BLOCK_SIZE={block} over {threads} threads is {block // threads} values per thread "
                f"(at most {MAX_ELEMENTS_PER_THREAD}: registers would spill)")
    return None


def stages_need_a_loop(config: Config, problem: Problem) -> str | None:
    stages = int(config["num_stages"])
    if stages > 1 and single_pass(problem, config) and int(config["ROWS_PER_PROGRAM"]) == 1:
        return f"num_stages={stages} pipelines a loop, and one row in one block has none (use num_stages=1)"
    return None


def rows_per_program_fit(config: Config, problem: Problem) -> str | None:
    per_program, rows = int(config["ROWS_PER_PROGRAM"]), int(problem["rows"])
    if per_program > rows:
        return f"ROWS_PER_PROGRAM={per_program} is more than the problem's {rows} row(s)"
    return None


def pipelined_shared_bytes(config: Config, problem: Problem, vectors: int) -> int:
    """Shared memory of the pipelined loop: num_stages - 1 blocks in flight of each operand the
    innermost loop loads (x, and in two passes the `vectors` weight and bias too). Measured on
    sm_90 compiles; the reductions' few bytes of scratch are left out."""
    loads = 1 if single_pass(problem, config) else 1 + vectors
    size = DTYPE_BYTES[str(problem["dtype"])]
    return (int(config["num_stages"]) - 1) * int(config["BLOCK_SIZE"]) * size * loads


def shared_memory_fits(vectors: int) -> Constraint:
    """The constraint for a family whose write loop also loads `vectors` per-column vectors."""

    def fits(config: Config, problem: Problem) -> str | None:
        need = pipelined_shared_bytes(config, problem, vectors)
        if need > H100_SHARED_BYTES:
            return (f"the {config['num_stages']}-stage pipeline needs {need} B of shared memory, more than "
                    f"the {H100_SHARED_BYTES} B a block can have")
        return None

    return fits


@functools.cache
def rows_space(vectors: int) -> SearchSpace:
    """The space of a family whose write loop loads `vectors` per-column vectors besides x."""
    return SearchSpace(PARAMS, (block_fits_row, threads_have_work, stages_need_a_loop, rows_per_program_fit,
                                shared_memory_fits(vectors)))


def rows_default_config(problem: Problem) -> Config:
    """The tutorial's choice: the whole row in one block (up to 16384 columns), warps by block size."""
    cols = int(problem["cols"])
    block = min(max(256, next_power_of_2(cols)), 16384)
    warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
    stages = 1 if cols <= block else 2
    return Config.of({"BLOCK_SIZE": block, "ROWS_PER_PROGRAM": 1, "num_warps": warps, "num_stages": stages})


def grid(problem: Problem, config: Config) -> tuple[int, int, int]:
    rows, _ = dims(problem)
    per_program = int(config["ROWS_PER_PROGRAM"])
    return ((rows + per_program - 1) // per_program, 1, 1)


def constexprs(problem: Problem, config: Config) -> dict[str, Any]:
    return {"BLOCK_SIZE": int(config["BLOCK_SIZE"]), "ROWS_PER_PROGRAM": int(config["ROWS_PER_PROGRAM"]),
            "NUM_STAGES": int(config["num_stages"]), "SINGLE_PASS": single_pass(problem, config)}


def specialisation(problem: Problem, config: Config) -> str:
    from tilepilot.kernels.compile import int_class

    rows, cols = dims(problem)
    passes = "single" if single_pass(problem, config) else "two"
    return f"{problem['dtype']} rows:{int_class(rows)} cols:{int_class(cols)} {passes}-pass"


def work_bytes(problem: Problem, vectors: int) -> float:
    """Read the input once, write the output once, read `vectors` per-column vectors (weight, bias)."""
    rows, cols = dims(problem)
    return float((2 * rows * cols + vectors * cols) * DTYPE_BYTES[str(problem["dtype"])])


def torch_dtype(name: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def reference_dtype(problem: Problem) -> Any:
    """float64 for fp32 problems, float32 for the 16-bit ones: always wider than the kernel's output."""
    import torch

    return torch.float64 if problem["dtype"] == "fp32" else torch.float32


def check_rows_operands(problem: Problem, tensors: Mapping[str, Any]) -> None:
    """Each operand contiguous, 16-byte aligned, of the problem's dtype; `x` and `out` rows × cols."""
    rows, cols = dims(problem)
    dtype = torch_dtype(str(problem["dtype"]))
    for name, t in tensors.items():
        shape = (rows, cols) if name in ("x", "out") else (cols,)
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ValueError(f"operand {name} is {tuple(t.shape)} {t.dtype}, the problem {problem.label()} "
                             f"needs {shape} {dtype}")
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise ValueError(f"operand {name} must be contiguous and 16-byte aligned")
