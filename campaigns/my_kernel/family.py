"""Family `my_scaled_add`: z = 2.5 · x + y for vectors of n elements, fp16 or fp32.

Everything a kernel family gives tilepilot, in one small class: the config space (block size,
warps) with a constraint, the problem check, the untuned config, the work model, and on the
device side the inputs, the output buffer, the reference with its tolerance, the ahead-of-time
compile and the launcher. torch and triton are imported inside the methods, so registering the
family costs nothing and works on a machine without a GPU stack. The source hash and the launch
closure come from tilepilot's public helpers in `tilepilot.kernels.compile`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from tilepilot.experiments import Config, InputError, Param, Problem, SearchSpace
from tilepilot.kernels import KernelFamily, Target, Work
from tilepilot.kernels.compile import hash_modules, launch

ALPHA = 2.5
DTYPES = {"fp16": 2, "fp32": 4}  # name -> bytes per element
MAX_N = 2**31 - 1
TOLERANCE = {"fp16": 1e-3, "fp32": 1e-6}  # output rounding alone: ~2.5e-4 (fp16), ~3e-8 (fp32)


def block_not_longer_than_vector(config: Config, problem: Problem) -> str | None:
    block, n = int(config["BLOCK_SIZE"]), int(problem["n"])
    if block > max(128, 1 << (n - 1).bit_length()):
        return f"BLOCK_SIZE={block} is longer than a vector of {n} elements needs"
    return None


class ScaledAddFamily(KernelFamily):
    name: ClassVar[str] = "my_scaled_add"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = "example user family: z = 2.5 * x + y"
    dtypes: ClassVar[tuple[str, ...]] = tuple(DTYPES)
    l2_flush: ClassVar[bool] = True  # the vectors are streamed once

    # ---- CPU side: no torch, no triton --------------------------------------------------------
    def space(self) -> SearchSpace:
        params = (Param("BLOCK_SIZE", (128, 256, 512, 1024, 2048, 4096)), Param("num_warps", (1, 2, 4, 8)))
        return SearchSpace(params, (block_not_longer_than_vector,))

    def parse_problem(self, raw: Mapping[str, Any]) -> Problem:
        unknown = sorted(set(raw) - {"n", "dtype"})
        if unknown:
            raise InputError(f"unknown {self.name} problem key {unknown[0]!r} (allowed: n, dtype)")
        n = raw.get("n")
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
            raise InputError(f"{self.name} problem n={n!r} is not a positive integer up to {MAX_N}")
        if raw.get("dtype") not in DTYPES:
            raise InputError(f"{self.name} problem dtype={raw.get('dtype')!r} is not one of {{fp16, fp32}}")
        return Problem.of({"n": n, "dtype": raw["dtype"]})

    def default_config(self, problem: Problem) -> Config:
        return Config.of({"BLOCK_SIZE": 128, "num_warps": 4})

    def work(self, problem: Problem) -> Work:
        n = int(problem["n"])
        return Work(flops=2.0 * n, bytes=3.0 * n * DTYPES[str(problem["dtype"])])

    def source_hash(self) -> str:
        """This module and the kernel module, so that an edited kernel is a new experiment."""
        return hash_modules(type(self).__module__, "my_kernel.kernel")

    # ---- device side: torch and triton -----------------------------------------------------------
    def compile(self, problem: Problem, config: Config, target: Target) -> Any:
        from my_kernel.kernel import scaled_add_kernel
        from tilepilot.kernels.compile import Pointer, aot_compile

        dtype = str(problem["dtype"])
        args = {"x_ptr": Pointer(dtype), "y_ptr": Pointer(dtype), "z_ptr": Pointer(dtype), "n": int(problem["n"])}
        return aot_compile(scaled_add_kernel, args, self._constexprs(config), target,
                           num_warps=int(config["num_warps"]), num_stages=1)

    def make_inputs(self, problem: Problem, seed: int, device: str) -> tuple[Any, ...]:
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)
        dtype = {"fp16": torch.float16, "fp32": torch.float32}[str(problem["dtype"])]
        n = int(problem["n"])
        return tuple(torch.randn(n, generator=gen, device=device).to(dtype) for _ in range(2))

    def make_output(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        import torch

        return torch.empty_like(inputs[0])

    def reference(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        x, y = (t.double() for t in inputs)
        return ALPHA * x + y

    def tolerance(self, problem: Problem) -> float:
        return TOLERANCE[str(problem["dtype"])]

    def launcher(self, problem: Problem, config: Config, inputs: tuple[Any, ...], out: Any,
                 compiled: Any | None) -> Callable[[], None]:
        from my_kernel.kernel import scaled_add_kernel

        x, y = inputs
        n = int(problem["n"])
        if x.shape != (n,) or y.shape != (n,) or out.shape != (n,):
            raise ValueError(f"operands must have {n} elements")
        grid = ((n + int(config["BLOCK_SIZE"]) - 1) // int(config["BLOCK_SIZE"]), 1, 1)
        values = {"x_ptr": x, "y_ptr": y, "z_ptr": out, "n": n}
        # the ahead-of-time kernel, or the JIT under the interpreter (no num_stages in this space)
        return launch(scaled_add_kernel, grid, values, self._constexprs(config), config, compiled)

    @staticmethod
    def _constexprs(config: Config) -> dict[str, Any]:
        return {"ALPHA": ALPHA, "BLOCK_SIZE": int(config["BLOCK_SIZE"])}
