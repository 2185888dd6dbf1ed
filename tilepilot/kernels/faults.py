"""Family `matmul_faults`: a TEST family for crash recovery, not a kernel to tune.

The matmul space plus a parameter FAULT:

- "none":  the real matmul (verifies and times like `matmul`);
- "oob":   a kernel that writes far out of bounds. On the GPU: an illegal memory access, a
           sticky CUDA error (the evaluator raises StickyCudaError). Under the interpreter the
           kernel would scribble over host memory, so it is not launched: the launcher raises
           RuntimeError("an illegal memory access was encountered ...") instead, which the
           evaluator treats exactly like the GPU error (StickyCudaError, recorded `crashed`);
- "exit":  the launcher calls os._exit(3): a process that dies with no error of its own
           (works on the CPU too);
- "sleep": the launcher sleeps for an hour on the host: a hang (works on the CPU too);
- "hang":  a GPU kernel that never ends (GPU only; under the interpreter it spins on the CPU).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, ClassVar

from tilepilot.experiments import Config, Param, Problem, SearchSpace
from tilepilot.kernels.base import Target
from tilepilot.kernels.compile import hash_modules, launch
from tilepilot.kernels.matmul import PARAMS, TILE_PARAMS, MatmulFamily, shared_memory_fits

FAULTS = ("none", "oob", "exit", "sleep", "hang")
EXIT_CODE = 3
SLEEP_S = 3600.0
OOB_DISTANCE = 1 << 40  # elements past the output buffer
OOB_BLOCK = 128
INTERPRETER_OOB_MESSAGE = ("an illegal memory access was encountered (FAULT=oob under the Triton "
                           "interpreter: not launched, it would write over host memory)")


class MatmulFaultsFamily(MatmulFamily):
    name: ClassVar[str] = "matmul_faults"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = "test family: matmul plus planted faults (oob, exit, sleep, hang)"
    l2_flush: ClassVar[bool] = True

    def space(self) -> SearchSpace:
        return SearchSpace((*PARAMS, Param("FAULT", FAULTS)), (shared_memory_fits,))

    def default_config(self, problem: Problem) -> Config:
        return Config.of({**super().default_config(problem).as_dict(), "FAULT": "none"})

    def specialisation(self, problem: Problem, config: Config) -> str:
        return f"{super().specialisation(problem, config)} FAULT:{config['FAULT']}"

    def source_hash(self) -> str:
        return hash_modules(type(self).__module__, "tilepilot.kernels.faults_triton",
                            "tilepilot.kernels.matmul", "tilepilot.kernels.matmul_triton")

    def compile(self, problem: Problem, config: Config, target: Target) -> Any:
        from tilepilot.kernels import faults_triton
        from tilepilot.kernels.compile import Pointer, aot_compile

        fault = config["FAULT"]
        options = {"num_warps": int(config["num_warps"]), "num_stages": int(config["num_stages"])}
        if fault == "oob":
            return aot_compile(faults_triton.oob_kernel, {"out_ptr": Pointer(str(problem["dtype"])),
                                                          "far": OOB_DISTANCE},
                               {"BLOCK": OOB_BLOCK}, target, **options)
        if fault == "hang":
            return aot_compile(faults_triton.hang_kernel, {"flag_ptr": Pointer("i32"), "out_ptr": Pointer("i32")},
                               {}, target, **options)
        return super().compile(problem, _matmul_part(config), target)

    def launcher(self, problem: Problem, config: Config, inputs: tuple[Any, ...], out: Any,
                 compiled: Any | None) -> Callable[[], None]:
        fault = config["FAULT"]
        if fault == "oob":
            return _oob_launcher(config, out, compiled)
        if fault == "hang":
            return _hang_launcher(config, out, compiled)
        if fault == "exit":
            return _exit
        if fault == "sleep":
            return _sleep
        return super().launcher(problem, _matmul_part(config), inputs, out, compiled)


def _matmul_part(config: Config) -> Config:
    return Config.of({k: config[k] for k in TILE_PARAMS})


def _exit() -> None:
    os._exit(EXIT_CODE)


def _sleep() -> None:
    time.sleep(SLEEP_S)


def _oob_launcher(config: Config, out: Any, compiled: Any | None) -> Callable[[], None]:
    from tilepilot.kernels import faults_triton

    if compiled is None:
        def refuse() -> None:
            raise RuntimeError(INTERPRETER_OOB_MESSAGE)

        return refuse
    return launch(faults_triton.oob_kernel, (1, 1, 1), {"out_ptr": out, "far": OOB_DISTANCE},
                  {"BLOCK": OOB_BLOCK}, config, compiled)


def _hang_launcher(config: Config, out: Any, compiled: Any | None) -> Callable[[], None]:
    import torch

    from tilepilot.kernels import faults_triton

    flag = torch.zeros(4, dtype=torch.int32, device=out.device)
    sink = torch.zeros(4, dtype=torch.int32, device=out.device)
    return launch(faults_triton.hang_kernel, (1, 1, 1), {"flag_ptr": flag, "out_ptr": sink}, {}, config, compiled)
