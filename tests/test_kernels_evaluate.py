"""The Evaluator under the Triton interpreter (CPU), in child processes so that this test
session never enters interpreter mode: correctness with masks, planted wrong results, NaN,
invalid configs, bf16 refused, and the crash-recovery faults (oob, exit, sleep)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

PRELUDE = """
import json, sys
from tilepilot.experiments import Config, Problem
from tilepilot.kernels import get_family, register
from tilepilot.kernels.evaluate import Evaluator, StickyCudaError
from tilepilot.kernels.matmul import MatmulFamily

def cfg(bm, bn, bk, g=8, w=4, s=2, **extra):
    return Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": g,
                      "num_warps": w, "num_stages": s, **extra})

PROBLEM = Problem.of({"M": 33, "N": 47, "K": 65, "dtype": "fp16"})
"""

MAIN_CHILD = PRELUDE + """
class LastColumnZeroed(MatmulFamily):
    name = "test_last_column_zeroed"
    def launcher(self, problem, config, inputs, out, compiled):
        run = super().launcher(problem, config, inputs, out, compiled)
        def buggy():
            run()
            out[:, -1] = 0
        return buggy

class NeverWrites(MatmulFamily):
    name = "test_never_writes"
    def launcher(self, problem, config, inputs, out, compiled):
        return lambda: None

register(LastColumnZeroed)
register(NeverWrites)
ev = Evaluator("interpret", input_sets=2, seed=7)
starts = []
configs = [cfg(16, 16, 16, g=1), cfg(32, 64, 32, g=4), cfg(64, 32, 16), cfg(256, 256, 128, s=3)]
results = ev.evaluate("matmul", PROBLEM, configs, on_start=starts.append)
out = {
    "matmul": [[r.status.value, r.max_rel_err, r.message, r.timing.method if r.timing else None,
                r.timing.reps if r.timing else None, r.timing.l2_flushed if r.timing else None,
                r.env.device, r.env.backend] for r in results],
    "starts": starts,
    "recheck": list(vars(ev.recheck("matmul", PROBLEM, configs[1])).values()),
    "wrong": [[r.status.value, r.max_rel_err, r.message]
              for r in ev.evaluate("test_last_column_zeroed", PROBLEM, configs[:1])],
    "nan": [[r.status.value, r.message, r.max_rel_err]
            for r in ev.evaluate("test_never_writes", PROBLEM, configs[:1])],
    "baseline": ev.baseline("matmul", PROBLEM),
    "target": ev.target(), "uuid": ev.gpu_uuid(),
}
import torch
family, ref = MatmulFamily(), torch.tensor([[3.0, 4.0]])
out["default_error"] = [
    family.error(PROBLEM, torch.tensor([[3.0, 4.5]], dtype=torch.float16), ref),
    family.error(PROBLEM, (torch.tensor([3.0]), torch.tensor([4.0, 1.0])),
                 (torch.tensor([3.0]), torch.tensor([4.0, 0.0]))),
    family.error(PROBLEM, torch.tensor([[float("nan"), 4.0]]), ref),
    family.error(PROBLEM, torch.tensor([[float("inf"), 4.0]]), ref),
]
try:
    ev.evaluate("matmul", Problem.of({"M": 16, "N": 16, "K": 16, "dtype": "bf16"}), configs[:1])
except Exception as e:
    out["bf16"] = [type(e).__name__, str(e)]
try:
    ev.evaluate("matmul_faults", PROBLEM, [cfg(16, 16, 16, FAULT="none"), cfg(16, 16, 16, FAULT="oob")])
except StickyCudaError as e:
    out["oob"] = [e.index, e.message]
print(json.dumps(out))
"""

FAULT_CHILD = PRELUDE + """
ev = Evaluator("interpret")
fault = sys.argv[1]
def started(i):
    print("started", i, flush=True)
ev.evaluate("matmul_faults", PROBLEM, [cfg(16, 16, 16, FAULT="none"), cfg(16, 16, 16, FAULT=fault)],
            on_start=started)
print("returned", flush=True)
"""


def run_child(code: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TRITON_INTERPRET", None)  # the Evaluator sets it itself, before any kernel import
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def main_child() -> dict[str, Any]:
    proc = run_child(MAIN_CHILD)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_masked_shapes_are_correct_for_several_configs(main_child: dict[str, Any]) -> None:
    for status, err, message, method, reps, flushed, device, backend in main_child["matmul"][:3]:
        assert (status, message) == ("ok", "")
        assert 0 < err < 2e-3
        assert (method, flushed, device, backend) == ("cpu-wallclock", False, "cpu (Triton interpreter)",
                                                      "interpret")
        assert reps >= 3


def test_config_violating_the_space_is_invalid_and_never_launched(main_child: dict[str, Any]) -> None:
    status, err, message, *_ = main_child["matmul"][3]
    assert status == "invalid" and err is None and "shared memory" in message


def test_on_start_precedes_each_config_and_each_timing_block(main_child: dict[str, Any]) -> None:
    starts = main_child["starts"]
    assert starts[:4] == [0, 1, 2, 3]  # verification, in order
    assert set(starts[4:]) == {0, 1, 2}  # timing blocks of the verified configs only
    assert len(starts[4:]) == 3 * 3  # 3 rounds of 3 configs


def test_wrong_output_is_wrong_result_with_its_error(main_child: dict[str, Any]) -> None:
    [[status, err, message]] = main_child["wrong"]
    assert status == "wrong_result" and err > 0.05
    assert message.startswith("relative error") and "tolerance 0.002" in message


def test_unwritten_output_never_passes(main_child: dict[str, Any]) -> None:
    [[status, message, err]] = main_child["nan"]
    assert status == "wrong_result" and "NaN" in message and err == math.inf


def test_default_family_error_is_the_relative_frobenius_error_and_inf_for_nan(main_child: dict[str, Any]) -> None:
    half_off, tuple_summed, nan, inf = main_child["default_error"]
    assert half_off == pytest.approx(0.5 / 5) and tuple_summed == pytest.approx(1 / 5)  # ||ref|| = 5 both times
    assert nan == math.inf and inf == math.inf


def test_recheck_on_fresh_inputs_passes_for_a_correct_config(main_child: dict[str, Any]) -> None:
    passed, err, message = main_child["recheck"]
    assert passed and 0 < err < 2e-3 and message == ""


def test_interpreter_has_no_target_uuid_or_vendor_baseline(main_child: dict[str, Any]) -> None:
    assert main_child["baseline"] is None and main_child["target"] is None and main_child["uuid"] is None


def test_bf16_is_refused_under_the_interpreter(main_child: dict[str, Any]) -> None:
    name, message = main_child["bf16"]
    assert name == "BackendUnavailable" and "bf16" in message


def test_oob_fault_raises_sticky_error_naming_the_config(main_child: dict[str, Any]) -> None:
    index, message = main_child["oob"]
    assert index == 1 and "illegal memory access" in message


def test_exit_fault_kills_the_process_after_on_start() -> None:
    proc = run_child(FAULT_CHILD, "exit")
    assert proc.returncode == 3
    assert proc.stdout.splitlines() == ["started 0", "started 1"]


def test_sleep_fault_hangs_after_on_start() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TRITON_INTERPRET", None)
    with subprocess.Popen([sys.executable, "-c", textwrap.dedent(FAULT_CHILD), "sleep"], stdout=subprocess.PIPE,
                          text=True, env=env) as proc:
        try:
            assert proc.stdout is not None
            lines = [proc.stdout.readline().strip() for _ in range(2)]
            assert lines == ["started 0", "started 1"]
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
        finally:
            proc.kill()


def test_unknown_backend_is_an_input_error() -> None:
    from tilepilot.experiments import InputError
    from tilepilot.kernels.evaluate import Evaluator

    with pytest.raises(InputError, match=r"unknown backend 'tpu' .*allowed: gpu, interpret"):
        Evaluator("tpu")
