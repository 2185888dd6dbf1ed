"""Family `softmax`: y = softmax(x) along each row of a rows × cols matrix (Triton's fused-softmax
tutorial, with an online pass for rows longer than one block).

Problem, config space and constraints: see `rowwise.py` (rows, cols, dtype ∈ {bf16, fp16,
fp32}; BLOCK_SIZE, ROWS_PER_PROGRAM, num_warps, num_stages). The kernel is in
`softmax_triton.py`.

Reference: `torch.softmax` in float32 (float64 for fp32 problems). Tolerance on
||y - ref|| / ||ref||: the output's own rounding is about 1.7e-3 (bf16), 2e-4 (fp16) and 3e-8
(fp32, plus the float32 exponentials and sums: ~1e-7 measured); the tolerances (5e-3, 1e-3,
1e-5) leave 3× or more room above that and stay far below the error of any real mistake (one
row wrong in a thousand is ~3e-2).

Work: 5 FLOPs per element (max, subtract, exp, sum, divide); bytes: the input read once and
the output written once (the two-pass kernel reads twice; the work model counts the least).

L2 is not flushed between timed launches: in a model the input of a softmax was written by
the kernel just before it (attention scores, logits), so it is in L2 when it fits there;
inputs larger than the L2 stream from memory either way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from tilepilot.experiments import Config, Problem, SearchSpace
from tilepilot.kernels import rowwise
from tilepilot.kernels.base import KernelFamily, Target, Work
from tilepilot.kernels.compile import hash_modules, launch

TOLERANCE = {"bf16": 5e-3, "fp16": 1e-3, "fp32": 1e-5}
FLOPS_PER_ELEMENT = 5


class SoftmaxFamily(KernelFamily):
    name: ClassVar[str] = "softmax"
    baseline_name: ClassVar[str] = "eager PyTorch (torch.softmax)"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = "row-wise softmax, max-subtracted, online pass for long rows (fused-softmax tutorial)"
    dtypes: ClassVar[tuple[str, ...]] = rowwise.DTYPES
    l2_flush: ClassVar[bool] = False

    # ---- CPU side ---------------------------------------------------------------------------
    def space(self) -> SearchSpace:
        return rowwise.rows_space(0)

    def parse_problem(self, raw: Mapping[str, Any]) -> Problem:
        return rowwise.parse_rows_problem(self.name, raw)

    def default_config(self, problem: Problem) -> Config:
        return rowwise.rows_default_config(problem)

    def work(self, problem: Problem) -> Work:
        rows, cols = rowwise.dims(problem)
        return Work(flops=float(FLOPS_PER_ELEMENT * rows * cols), bytes=rowwise.work_bytes(problem, 0))

    def specialisation(self, problem: Problem, config: Config) -> str:
        return rowwise.specialisation(problem, config)

    def source_hash(self) -> str:
        return hash_modules(type(self).__module__, "tilepilot.kernels.softmax_triton", "tilepilot.kernels.rowwise")

    # ---- device side ------------------------------------------------------------------------
    def compile(self, problem: Problem, config: Config, target: Target) -> Any:
        from tilepilot.kernels import softmax_triton
        from tilepilot.kernels.compile import Pointer, aot_compile

        rows, cols = rowwise.dims(problem)
        dtype = str(problem["dtype"])
        args = {"x_ptr": Pointer(dtype), "y_ptr": Pointer(dtype), "rows": rows, "cols": cols}
        return aot_compile(softmax_triton.softmax_kernel, args, rowwise.constexprs(problem, config), target,
                           num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]))

    def make_inputs(self, problem: Problem, seed: int, device: str) -> tuple[Any, ...]:
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)
        x = 2.0 * torch.randn(rowwise.dims(problem), generator=gen, device=device, dtype=torch.float32)
        return (x.to(rowwise.torch_dtype(str(problem["dtype"]))),)

    def make_output(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        import torch

        return torch.empty_like(inputs[0])

    def reference(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        import torch

        return torch.softmax(inputs[0].to(rowwise.reference_dtype(problem)), dim=-1)

    def tolerance(self, problem: Problem) -> float:
        return TOLERANCE[str(problem["dtype"])]

    def launcher(self, problem: Problem, config: Config, inputs: tuple[Any, ...], out: Any,
                 compiled: Any | None) -> Callable[[], None]:
        from tilepilot.kernels import softmax_triton

        (x,) = inputs
        rowwise.check_rows_operands(problem, {"x": x, "out": out})
        rows, cols = rowwise.dims(problem)
        values = {"x_ptr": x, "y_ptr": out, "rows": rows, "cols": cols}
        return launch(softmax_triton.softmax_kernel, rowwise.grid(problem, config), values,
                      rowwise.constexprs(problem, config), config, compiled)

    def baseline(self, problem: Problem, inputs: tuple[Any, ...], out: Any) -> Callable[[], None] | None:
        import torch

        (x,) = inputs

        def run() -> None:
            torch.softmax(x, dim=-1, out=out)

        return run
