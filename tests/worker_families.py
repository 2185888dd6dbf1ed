"""Test-only kernel families for the worker and compile-pool tests.

Child processes load them through TILEPILOT_KERNEL_MODULES=tests.worker_families.

- `test_flaky_exit`: like `matmul_faults`, but FAULT="exit" kills the process only the first
  time a given problem and config run (a marker file under $TILEPILOT_TEST_MARKERS remembers
  it): a death with no error of its own that a retry on a fresh process survives.
- `test_compile_hang`: like `matmul_faults`, but FAULT="sleep" hangs in `compile`.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from tilepilot.experiments import Config, Problem
from tilepilot.kernels import register
from tilepilot.kernels.base import Target
from tilepilot.kernels.faults import EXIT_CODE, SLEEP_S, MatmulFaultsFamily

MARKERS_ENV = "TILEPILOT_TEST_MARKERS"


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


def register_all() -> None:
    register(FlakyExitFamily)
    register(CompileHangFamily)


register_all()
