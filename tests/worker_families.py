"""Test-only kernel families for the worker and compile-pool tests.

Child processes load them through TILEPILOT_KERNEL_MODULES=tests.worker_families.

- `test_flaky_exit`: like `matmul_faults`, but FAULT="exit" kills the process only the first
  time a given problem and config run (a marker file under $TILEPILOT_TEST_MARKERS remembers
  it): a death with no error of its own that a retry on a fresh process survives.
- `test_compile_hang`: like `matmul_faults`, but FAULT="sleep" hangs in `compile`.
- `test_slow`: like `matmul_faults`, but FAULT="sleep" sleeps $TILEPILOT_TEST_SLOW_S (default
  0.3) seconds each time a launch is prepared (once per input set), then runs the real matmul.
  With $TILEPILOT_TEST_MARKERS set, it marks the process busy while it sleeps (a file named
  after its pid, `<pid>.busy`) and appends "pid start end problem config" (tab-separated) to `measure.log` there:
  the witness of where and when the work ran.
- `test_slow_compile`: like `test_slow`, and FAULT="sleep" also sleeps $TILEPILOT_TEST_COMPILE_S
  (default 3) seconds in `compile` before compiling the plain matmul: a compile straggler.
- `test_oom`: `matmul_faults` (oob, exit, sleep, hang) plus FAULT="oom": preparing its launch
  allocates twice the GPU's memory (a real torch.OutOfMemoryError on a GPU; on the CPU, where
  memory is the host's, it raises torch.OutOfMemoryError itself, SIMULATED). Its input factory
  raises torch.OutOfMemoryError, SIMULATED, when a problem's inputs exceed
  $TILEPILOT_TEST_DEVICE_BYTES (unset: no limit).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from tilepilot.experiments import Config, Param, Problem, SearchSpace
from tilepilot.kernels import register
from tilepilot.kernels.base import Target
from tilepilot.kernels.faults import EXIT_CODE, FAULTS, SLEEP_S, MatmulFaultsFamily
from tilepilot.kernels.matmul import PARAMS, shared_memory_fits

MARKERS_ENV = "TILEPILOT_TEST_MARKERS"
SLOW_ENV = "TILEPILOT_TEST_SLOW_S"
COMPILE_SLOW_ENV = "TILEPILOT_TEST_COMPILE_S"
DEVICE_BYTES_ENV = "TILEPILOT_TEST_DEVICE_BYTES"
MEASURE_LOG = "measure.log"


class FlakyExitFamily(MatmulFaultsFamily):
    name: ClassVar[str] = "test_flaky_exit"
    description: ClassVar[str] = "test family: FAULT=exit dies on the first run of a config only"

    def launcher(self, problem: Problem, config: Config, inputs: tuple[Any, ...], out: Any,
                 compiled: Any | None) -> Callable[[], None]:
        if config["FAULT"] != "exit":
            return super().launcher(problem, config, inputs, out, compiled)
        run = super().launcher(problem, Config.of({**config.as_dict(), "FAULT": "none"}), inputs, out, compiled)
        digest = hashlib.sha256(f"{problem.key()} {config.key()}".encode()).hexdigest()[:16]
        marker = Path(os.environ[MARKERS_ENV]) / digest

        def first_run_dies() -> None:
            if not marker.exists():
                marker.touch()
                os._exit(EXIT_CODE)
            run()

        return first_run_dies


class CompileHangFamily(MatmulFaultsFamily):
    name: ClassVar[str] = "test_compile_hang"
    description: ClassVar[str] = "test family: FAULT=sleep hangs the compiler"

    def compile(self, problem: Problem, config: Config, target: Target) -> Any:
        if config["FAULT"] == "sleep":
            time.sleep(SLEEP_S)
        return super().compile(problem, config, target)


class SlowFamily(MatmulFaultsFamily):
    name: ClassVar[str] = "test_slow"
    description: ClassVar[str] = "test family: FAULT=sleep sleeps a while, then runs the real matmul"

    def launcher(self, problem: Problem, config: Config, inputs: tuple[Any, ...], out: Any,
                 compiled: Any | None) -> Callable[[], None]:
        if config["FAULT"] != "sleep":
            return super().launcher(problem, config, inputs, out, compiled)
        markers = os.environ.get(MARKERS_ENV)
        busy = Path(markers) / f"{os.getpid()}.busy" if markers else None
        if busy is not None:
            busy.touch()
        start = time.time()
        time.sleep(float(os.environ.get(SLOW_ENV, "0.3")))
        if busy is not None:
            with open(busy.parent / MEASURE_LOG, "a") as f:  # one short line per write: appends stay whole
                f.write(f"{os.getpid()}\t{start:.6f}\t{time.time():.6f}\t{problem.label()}\t{config.label()}\n")
            busy.unlink()
        plain = Config.of({**config.as_dict(), "FAULT": "none"})
        return super().launcher(problem, plain, inputs, out, compiled)


class SlowCompileFamily(SlowFamily):
    name: ClassVar[str] = "test_slow_compile"
    description: ClassVar[str] = "test family: FAULT=sleep compiles slowly, then sleeps a while and runs"

    def compile(self, problem: Problem, config: Config, target: Target) -> Any:
        if config["FAULT"] == "sleep":
            time.sleep(float(os.environ.get(COMPILE_SLOW_ENV, "3")))
        return super().compile(problem, config, target)


class OomFamily(MatmulFaultsFamily):
    name: ClassVar[str] = "test_oom"
    description: ClassVar[str] = "test family: FAULT=oom allocates twice the GPU's memory"

    def space(self) -> SearchSpace:
        return SearchSpace((*PARAMS, Param("FAULT", (*FAULTS, "oom"))), (shared_memory_fits,))

    def make_inputs(self, problem: Problem, seed: int, device: str) -> tuple[Any, ...]:
        import torch

        limit = os.environ.get(DEVICE_BYTES_ENV)
        need = 2 * (int(problem["M"]) * int(problem["K"]) + int(problem["K"]) * int(problem["N"]))
        if limit is not None and need > int(limit):
            raise torch.OutOfMemoryError(f"CUDA out of memory (SIMULATED by the test family: the inputs need "
                                         f"{need} bytes, {DEVICE_BYTES_ENV}={limit})")
        return super().make_inputs(problem, seed, device)

    def launcher(self, problem: Problem, config: Config, inputs: tuple[Any, ...], out: Any,
                 compiled: Any | None) -> Callable[[], None]:
        if config["FAULT"] != "oom":
            return super().launcher(problem, config, inputs, out, compiled)
        import torch

        if out.is_cuda:
            total = torch.cuda.get_device_properties(out.device).total_memory
            torch.empty(2 * total, dtype=torch.uint8, device=out.device)  # raises torch.OutOfMemoryError
            raise AssertionError(f"allocating {2 * total} bytes on a {total}-byte GPU did not fail")
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate twice the device's memory "
                                     "(SIMULATED by the test family: on the CPU there is no GPU to fill)")


def register_all() -> None:
    register(FlakyExitFamily)
    register(CompileHangFamily)
    register(SlowFamily)
    register(SlowCompileFamily)
    register(OomFamily)


register_all()
