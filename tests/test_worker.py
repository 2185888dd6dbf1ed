"""`EvalWorker` through a real Ray actor on the CPU (interpreter backend): a batch evaluates,
and each way a child can fail (sticky error, death, hang) costs one config, never the batch
or the worker."""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from tilepilot.experiments import BackendUnavailable, Config, Problem, Status
from tilepilot.orchestrator.ray_runtime import fetch
from tilepilot.orchestrator.worker import EvalWorker, WorkerInfo

REPO = Path(__file__).resolve().parents[1]
PROBLEM = Problem.of({"M": 32, "N": 32, "K": 32, "dtype": "fp16"})
TIMEOUT_S = 60.0


def cfg(bm: int, bn: int, bk: int, fault: str | None = None) -> Config:
    values: dict[str, Any] = {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 1,
                              "num_warps": 4, "num_stages": 2}
    return Config.of(values if fault is None else {**values, "FAULT": fault})


@pytest.fixture(scope="module")
def worker(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    env = {"TILEPILOT_KERNEL_MODULES": "tests.worker_families", "PYTHONPATH": str(REPO),
           "TILEPILOT_TEST_MARKERS": str(tmp_path_factory.mktemp("markers"))}
    actor = EvalWorker.options(num_cpus=1, num_gpus=0, runtime_env={"env_vars": env}).remote(
        "interpret", input_sets=2)
    yield actor
    ray.kill(actor)


def info(worker: Any) -> WorkerInfo:
    return ray.get(worker.info.remote())  # type: ignore[no-any-return]


def evaluate(worker: Any, kernel: str, configs: list[Config], timeout_s: float = TIMEOUT_S) -> list[Any]:
    return ray.get(worker.evaluate.remote(kernel, PROBLEM, configs, timeout_s))  # type: ignore[no-any-return]


def test_interpret_worker_evaluates_batch(worker: Any) -> None:
    about = info(worker)
    assert (about.backend, about.gpu_uuid, about.target) == ("interpret", None, None)
    assert about.environment.backend == "interpret" and about.environment.device == "cpu (Triton interpreter)"
    assert about.child_pid and about.worker_id
    configs = [cfg(16, 16, 16), cfg(32, 32, 32), cfg(16, 32, 16)]
    results = evaluate(worker, "matmul", configs)
    assert [r.config for r in results] == configs
    for r in results:
        assert r.status is Status.OK, r.message
        assert r.problem == PROBLEM and r.env == about.environment
        assert 0 < r.max_rel_err < 2e-3
        assert r.timing.method == "cpu-wallclock" and r.timing.median_ms > 0
    assert ray.get(worker.sample.remote()) is None  # no GPU, no NVML sample
    assert info(worker).respawns == about.respawns


def test_remeasure_recheck_and_baseline_go_through_the_child(worker: Any) -> None:
    configs = [cfg(16, 16, 16), cfg(32, 32, 32)]
    again = ray.get(worker.remeasure.remote("matmul", PROBLEM, configs, 2, TIMEOUT_S))
    assert [(r.config, r.status) for r in again] == [(c, Status.OK) for c in configs]
    check = ray.get(worker.recheck.remote("matmul", PROBLEM, configs[1], TIMEOUT_S))
    assert check.passed and 0 < check.max_rel_err < 2e-3
    assert ray.get(worker.baseline.remote("matmul", PROBLEM, TIMEOUT_S)) is None  # no vendor library on a CPU
    assert ray.get(worker.ceilings.remote(TIMEOUT_S)) is None  # no device ceilings under the interpreter


def test_child_killed_is_retried_then_poison(worker: Any) -> None:
    before = info(worker)
    configs = [cfg(16, 16, 16, "none"), cfg(32, 32, 32, "exit"), cfg(16, 32, 16, "none")]
    results = evaluate(worker, "matmul_faults", configs)
    assert [r.status for r in results] == [Status.OK, Status.POISON, Status.OK], [r.message for r in results]
    assert results[1].message.count("exit code 3") == 2 and "died twice" in results[1].message
    assert results[1].env == before.environment and results[1].timing is None
    after = info(worker)
    assert after.respawns == before.respawns + 2  # the first death, then the retry's
    assert len(after.recover_s) == len(before.recover_s) + 2 and all(s > 0 for s in after.recover_s)
    assert after.child_pid != before.child_pid


def test_child_death_once_is_retried_on_a_fresh_child(worker: Any) -> None:
    before = info(worker)
    configs = [cfg(16, 16, 16, "none"), cfg(16, 16, 32, "exit"), cfg(32, 16, 16, "none")]
    results = evaluate(worker, "test_flaky_exit", configs)
    assert [r.status for r in results] == [Status.OK] * 3, [r.message for r in results]
    assert "exit code 3" in results[1].extra["retried"]
    assert "retried" not in results[0].extra and "retried" not in results[2].extra
    assert info(worker).respawns == before.respawns + 1


def test_hanging_child_times_out_and_worker_recovers(worker: Any) -> None:
    before = info(worker)
    timeout_s = 5.0
    configs = [cfg(16, 16, 16, "none"), cfg(32, 32, 32, "sleep"), cfg(16, 32, 16, "none")]
    t0 = time.monotonic()
    ref = worker.evaluate.remote("matmul_faults", PROBLEM, configs, timeout_s)
    time.sleep(2.0)
    during = info(worker)  # answers while the batch runs (a threaded actor)
    assert ray.wait([ref], timeout=0)[0] == []
    assert during.running == f"matmul_faults {PROBLEM.label()} {configs[1].label()}"
    results = ray.get(ref)
    elapsed = time.monotonic() - t0
    assert [r.status for r in results] == [Status.OK, Status.TIMEOUT, Status.OK], [r.message for r in results]
    assert "no answer within 5 s" in results[1].message
    # one step's budget for the hang, not the batch's three, and far from the hour it sleeps
    assert elapsed < 2 * timeout_s + 15
    after = info(worker)
    assert after.respawns == before.respawns + 1 and after.running == ""
    again = evaluate(worker, "matmul_faults", [cfg(32, 32, 16, "none")])
    assert again[0].status is Status.OK, again[0].message


def test_sticky_error_is_crashed_not_retried_and_batch_goes_on(worker: Any) -> None:
    before = info(worker)
    configs = [cfg(16, 16, 16, "none"), cfg(32, 32, 32, "oob"), cfg(16, 32, 16, "none")]
    results = evaluate(worker, "matmul_faults", configs)
    assert [r.status for r in results] == [Status.OK, Status.CRASHED, Status.OK], [r.message for r in results]
    assert "illegal memory access" in results[1].message
    after = info(worker)
    assert after.respawns == before.respawns + 1  # replaced once: the config was not run again
    assert after.child_pid != before.child_pid


def test_child_dead_between_batches_is_replaced_without_blame(worker: Any) -> None:
    before = info(worker)
    os.kill(before.child_pid, signal.SIGKILL)  # the child this test's worker started
    stat = Path(f"/proc/{before.child_pid}/stat")
    deadline = time.monotonic() + 10
    while stat.exists() and stat.read_text().split(") ")[-1][:1] != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    results = evaluate(worker, "matmul", [cfg(16, 16, 16), cfg(32, 32, 32)])
    assert [r.status for r in results] == [Status.OK, Status.OK]
    assert all("retried" not in r.extra for r in results)
    assert info(worker).respawns == before.respawns + 1


def test_bf16_is_refused_under_the_interpreter(worker: Any) -> None:
    before = info(worker)
    bf16 = Problem.of({"M": 32, "N": 32, "K": 32, "dtype": "bf16"})
    with pytest.raises(BackendUnavailable) as err:
        fetch(worker.evaluate.remote("matmul", bf16, [cfg(16, 16, 16)], TIMEOUT_S))
    assert type(err.value) is BackendUnavailable
    assert "bf16" in str(err.value) and "\n" not in str(err.value)
    after = info(worker)
    assert (after.respawns, after.child_pid) == (before.respawns, before.child_pid)  # the child is fine


def test_bad_timeout_is_refused(worker: Any) -> None:
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        fetch(worker.recheck.remote("matmul", PROBLEM, cfg(16, 16, 16), 0))
    assert not math.isnan(ray.get(worker.recheck.remote("matmul", PROBLEM, cfg(16, 16, 16), TIMEOUT_S)).max_rel_err)
