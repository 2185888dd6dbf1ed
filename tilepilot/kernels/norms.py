"""Families `rmsnorm` and `layernorm`: the forward pass of the two normalisations of LLM blocks,
along each row of a rows × cols matrix, with a weight (and, for layernorm, a bias) per column
(the forward part of Triton's layer-norm tutorial).

    rmsnorm:   y = x / sqrt(mean(x²) + 1e-6) * w
    layernorm: y = (x - mean(x)) / sqrt(var(x) + 1e-5) * w + b     (biased variance)

eps is a constant of each family (1e-6 as Llama's RMSNorm, 1e-5 as torch's LayerNorm), not a
problem key. Problem, config space and constraints: see `rowwise.py`. Kernels:
`norms_triton.py`.

Inputs: x ~ N(0, 1) + 0.5 (a non-zero mean, which a careless variance formula gets wrong);
w ~ U(0.5, 1.5); b ~ N(0, 0.1²). Reference: the formula in float32 (float64 for fp32 problems),
from the same rounded inputs. Tolerance on ||y - ref|| / ||ref||: the output's own rounding
(~1.7e-3 bf16, ~2e-4 fp16) with 3× room; fp32 1e-5 (measured ~1e-7 under the interpreter;
the GPU's approximate square root and division add a few float32 ulps).

Work: rmsnorm 4 FLOPs per element (square, add, and two multiplies), layernorm 8 (sum,
subtract, square, add, then subtract, two multiplies, add); bytes: x read once, y written
once, w (and b) read once.

L2 is not flushed between timed launches: the input of a norm is the residual stream written
by the kernel just before it, in L2 when it fits; the weight stays in L2 across calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from tilepilot.experiments import Config, Problem, SearchSpace
from tilepilot.kernels import rowwise
from tilepilot.kernels.base import KernelFamily, Target, Work
from tilepilot.kernels.compile import hash_modules, launch

TOLERANCE = {"bf16": 5e-3, "fp16": 1e-3, "fp32": 1e-5}
X_MEAN = 0.5


class _NormFamily(KernelFamily):
    """What rmsnorm and layernorm share; subclasses name their kernel, vectors and formula."""

    dtypes: ClassVar[tuple[str, ...]] = rowwise.DTYPES
    l2_flush: ClassVar[bool] = False
    eps: ClassVar[float]
    kernel_name: ClassVar[str]
    vectors: ClassVar[tuple[str, ...]]  # per-column operands after x: ("w",) or ("w", "b")
    flops_per_element: ClassVar[int]

    # ---- CPU side ---------------------------------------------------------------------------
    def space(self) -> SearchSpace:
        return rowwise.rows_space(len(self.vectors))

    def parse_problem(self, raw: Mapping[str, Any]) -> Problem:
        return rowwise.parse_rows_problem(self.name, raw)

    def default_config(self, problem: Problem) -> Config:
        return rowwise.rows_default_config(problem)

    def work(self, problem: Problem) -> Work:
        rows, cols = rowwise.dims(problem)
        return Work(flops=float(self.flops_per_element * rows * cols),
                    bytes=rowwise.work_bytes(problem, len(self.vectors)))

    def specialisation(self, problem: Problem, config: Config) -> str:
        return rowwise.specialisation(problem, config)

    def source_hash(self) -> str:
        return hash_modules(type(self).__module__, "tilepilot.kernels.norms_triton", "tilepilot.kernels.rowwise")

    # ---- device side ------------------------------------------------------------------------
    def compile(self, problem: Problem, config: Config, target: Target) -> Any:
        from tilepilot.kernels.compile import Pointer, aot_compile

        rows, cols = rowwise.dims(problem)
        dtype = str(problem["dtype"])
        args: dict[str, Any] = {f"{name}_ptr": Pointer(dtype) for name in ("x", *self.vectors, "y")}
        args.update(rows=rows, cols=cols)
        return aot_compile(self._kernel(), args, self._constexprs(problem, config), target,
                           num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]))

    def make_inputs(self, problem: Problem, seed: int, device: str) -> tuple[Any, ...]:
        import torch

        rows, cols = rowwise.dims(problem)
        dtype = rowwise.torch_dtype(str(problem["dtype"]))
        gen = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn((rows, cols), generator=gen, device=device, dtype=torch.float32) + X_MEAN
        w = 0.5 + torch.rand(cols, generator=gen, device=device, dtype=torch.float32)
        b = 0.1 * torch.randn(cols, generator=gen, device=device, dtype=torch.float32)
        return tuple(t.to(dtype) for t in (x, w, b)[:1 + len(self.vectors)])

    def make_output(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        import torch

        return torch.empty_like(inputs[0])

    def tolerance(self, problem: Problem) -> float:
        return TOLERANCE[str(problem["dtype"])]

    def launcher(self, problem: Problem, config: Config, inputs: tuple[Any, ...], out: Any,
                 compiled: Any | None) -> Callable[[], None]:
        names = ("x", *self.vectors)
        if len(inputs) != len(names):
            raise ValueError(f"{self.name} takes {len(names)} inputs ({', '.join(names)}), got {len(inputs)}")
        rowwise.check_rows_operands(problem, {**dict(zip(names, inputs, strict=True)), "out": out})
        rows, cols = rowwise.dims(problem)
        values = {**{f"{n}_ptr": t for n, t in zip(names, inputs, strict=True)}, "y_ptr": out,
                  "rows": rows, "cols": cols}
        return launch(self._kernel(), rowwise.grid(problem, config), values, self._constexprs(problem, config),
                      config, compiled)

    def _kernel(self) -> Any:
        from tilepilot.kernels import norms_triton

        return getattr(norms_triton, self.kernel_name)

    def _constexprs(self, problem: Problem, config: Config) -> dict[str, Any]:
        return {"EPS": self.eps, **rowwise.constexprs(problem, config)}


class RmsnormFamily(_NormFamily):
    name: ClassVar[str] = "rmsnorm"
    baseline_name: ClassVar[str] = "eager PyTorch (F.rms_norm)"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = "RMSNorm forward, y = x / sqrt(mean(x²) + 1e-6) * w, float32 statistics"
    eps: ClassVar[float] = 1e-6
    kernel_name: ClassVar[str] = "rmsnorm_kernel"
    vectors: ClassVar[tuple[str, ...]] = ("w",)
    flops_per_element: ClassVar[int] = 4

    def reference(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        import torch

        x, w = (t.to(rowwise.reference_dtype(problem)) for t in inputs)
        return x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + self.eps) * w

    def baseline(self, problem: Problem, inputs: tuple[Any, ...], out: Any) -> Callable[[], None] | None:
        import torch

        x, w = inputs
        cols = int(problem["cols"])

        def run() -> Any:
            return torch.nn.functional.rms_norm(x, (cols,), w, self.eps)

        return run


class LayernormFamily(_NormFamily):
    name: ClassVar[str] = "layernorm"
    baseline_name: ClassVar[str] = "eager PyTorch (F.layer_norm)"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = "LayerNorm forward, y = (x - mean) / sqrt(var + 1e-5) * w + b, float32 statistics"
    eps: ClassVar[float] = 1e-5
    kernel_name: ClassVar[str] = "layernorm_kernel"
    vectors: ClassVar[tuple[str, ...]] = ("w", "b")
    flops_per_element: ClassVar[int] = 8

    def reference(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        import torch

        x, w, b = (t.to(rowwise.reference_dtype(problem)) for t in inputs)
        var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
        return (x - mean) * torch.rsqrt(var + self.eps) * w + b

    def baseline(self, problem: Problem, inputs: tuple[Any, ...], out: Any) -> Callable[[], None] | None:
        import torch

        x, w, b = inputs
        cols = int(problem["cols"])

        def run() -> Any:
            return torch.nn.functional.layer_norm(x, (cols,), w, b, self.eps)

        return run
