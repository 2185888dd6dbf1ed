"""The kernel-family contract. One subclass per module under `kernels/`.

A family reads like Triton's matmul tutorial: the config space, the kernel, a launcher that
validates and computes the grid, a reference with its tolerance, and the work formula.

Everything that needs torch or triton is imported inside methods, so that the registry,
the CLI and the proposers can load a family without a GPU stack.

Thread safety: a family object is stateless after construction and may be shared.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from tilepilot.experiments import Config, Problem, SearchSpace


@dataclass(frozen=True)
class Work:
    """The least work a problem needs: floating-point operations and bytes through memory."""

    flops: float
    bytes: float

    def tflops(self, median_ms: float) -> float:
        return self.flops / (median_ms * 1e-3) / 1e12

    def gbps(self, median_ms: float) -> float:
        return self.bytes / (median_ms * 1e-3) / 1e9


@dataclass(frozen=True)
class Target:
    """What a compile is for: `GPUTarget(backend, arch, warp_size)` in Triton's terms."""

    backend: str = "cuda"
    arch: int = 90
    warp_size: int = 32
    max_shared_bytes: int = 232448  # opt-in shared memory per block (H100: 227 KiB)


class KernelFamily(ABC):
    name: ClassVar[str]
    version: ClassVar[str]  # bump on a change of meaning; the source hash catches the rest
    description: ClassVar[str]
    dtypes: ClassVar[tuple[str, ...]]
    l2_flush: ClassVar[bool]  # flush L2 between timed repetitions (cold) or not (warm)
    baseline_name: ClassVar[str] = ""  # what `baseline` runs, as shown beside the winners

    # ---- CPU side: no torch, no triton --------------------------------------------------
    @abstractmethod
    def space(self) -> SearchSpace:
        """The config space with its constraints."""

    @abstractmethod
    def parse_problem(self, raw: Mapping[str, Any]) -> Problem:
        """Check one `[[problems]]` table. Raises InputError naming the bad key or value."""

    @abstractmethod
    def default_config(self, problem: Problem) -> Config:
        """The config the family would use untuned."""

    @abstractmethod
    def work(self, problem: Problem) -> Work:
        """FLOPs and the fewest bytes moved, to read a time as TFLOP/s and GB/s."""

    def specialisation(self, problem: Problem, config: Config) -> str:
        """What a compiled kernel depends on besides the config (dtype, divisibility, ...).

        Two problems with the same specialisation share one compiled kernel per config.
        """
        return problem.key()

    def source_hash(self) -> str:
        """Hash of the family's module source, so an edited kernel is a new experiment."""
        src = inspect.getsource(sys.modules[type(self).__module__])
        return hashlib.sha256(src.encode()).hexdigest()[:12]

    def kernel_version(self) -> str:
        return f"{self.version}+{self.source_hash()}"

    # ---- device side: torch and triton, inside a worker's child process ------------------
    @abstractmethod
    def compile(self, problem: Problem, config: Config, target: Target) -> Any:
        """Compile ahead of time, in a process with no CUDA context. Returns Triton's
        CompiledKernel. Raises triton's CompilationError for a config that does not compile.
        A second call with the same arguments must hit Triton's on-disk cache."""

    @abstractmethod
    def make_inputs(self, problem: Problem, seed: int, device: str) -> tuple[Any, ...]:
        """Random inputs (never zeros) for one input set."""

    @abstractmethod
    def make_output(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        """An output buffer; the evaluator poisons it with NaN before every checked launch."""

    @abstractmethod
    def reference(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        """The exact answer in float32 or float64."""

    @abstractmethod
    def tolerance(self, problem: Problem) -> float:
        """Largest accepted `error(problem, out, ref)` for the problem (its dtype, its size)."""

    def error(self, problem: Problem, out: Any, ref: Any) -> float:
        """How far an output is from the reference: the number the evaluator holds against
        `tolerance(problem)` and records as the result's `max_rel_err` (the largest over the
        input sets). Never NaN: an output with NaN or inf, or any error that is not a finite
        number, is `math.inf`, so that it can never pass.

        Default: `relative_error(out, ref)`, ||out - ref|| / ||ref|| over all outputs together.
        Override it where that norm hides a part of the output (small scales beside large
        values); `tolerance` must then be stated in the same measure.
        """
        return relative_error(out, ref)

    @abstractmethod
    def launcher(self, problem: Problem, config: Config, inputs: tuple[Any, ...], out: Any,
                 compiled: Any | None) -> Callable[[], None]:
        """A closure that launches the kernel once. `compiled` is the ahead-of-time kernel
        (GPU backend) or None (interpreter: launch through the JIT)."""

    def baseline(self, problem: Problem, inputs: tuple[Any, ...], out: Any) -> Callable[[], None] | None:
        """The vendor library doing the same work (cuBLAS for matmul), or None. The closure
        writes `out` or returns its result, so that the work can be checked and a compiler
        (torch.compile in bench/kernels.py) cannot drop it as unused."""
        return None


def poison(out: Any) -> None:
    """Fill every output tensor (one, or a tuple or list of them) with NaN, so that any element a
    launch leaves unwritten can never pass the check."""
    for t in out if isinstance(out, (tuple, list)) else (out,):
        t.fill_(float("nan"))


def written(out: Any) -> bool:
    """False while some floating-point output tensor is still all NaN (as `poison` left it)."""
    return not any(bool(t.isnan().all()) for t in (out if isinstance(out, (tuple, list)) else (out,))
                   if t.is_floating_point())


def relative_error(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| in float32 or wider, over all outputs together (a tuple or list of
    tensors counts as one vector); ||out - ref|| where the reference is all zeros. `math.inf`
    when the result is not finite (NaN or inf in the output)."""
    import torch

    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    num = den = 0.0
    for o, r in zip(outs, refs, strict=True):
        r = r if r.dtype in (torch.float32, torch.float64) else r.float()
        num += float(torch.linalg.vector_norm(o.to(r.dtype) - r)) ** 2
        den += float(torch.linalg.vector_norm(r)) ** 2
    err = math.sqrt(num / den) if den > 0 else math.sqrt(num)
    return err if math.isfinite(err) else math.inf
