"""The GPU faults of one worker on a real GPU, each with its figure (printed with `pytest -s`, and kept
as properties of the test in the JUnit XML), all on one worker of the `test_oom` family
(tests/worker_families.py: the matmul_faults family plus FAULT="oom"):

- out of memory: a config asks for twice the GPU's memory; it is `oom`, the memory is given back,
  and the next config runs and verifies in the same child process;
- an illegal memory access in 1 config of 50: 49 results, 1 `crashed`, a fresh child in < 10 s;
- a kernel that never ends: `timeout` within its deadline, and the GPU is usable afterwards.

The worker's runtime environment adds the repository to PYTHONPATH and keeps what was there: where
Ray itself is found only through PYTHONPATH (a site folder outside the interpreter's own), replacing
it leaves the actor's worker process unable to import Ray, and Ray starts it again every minute,
forever. Every wait on the worker is bounded (`ray.get(timeout=)`), so a worker that never comes
up fails the test instead of hanging the session.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from tilepilot.experiments import Config, Problem, Result, Status
from tilepilot.orchestrator.worker import GPU_WORKER_CPUS, EvalWorker, WorkerInfo

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

REPO = Path(__file__).resolve().parents[1]
PROBLEM = Problem.of({"M": 512, "N": 512, "K": 512, "dtype": "fp16"})
TIMEOUT_S = 60.0  # per config
HANG_TIMEOUT_S = 10.0
READY_S = 120.0  # the worker and its child up (Ray worker start, CUDA context)
BATCH_S = 150.0  # one batch, the 50 configs of the crash test compiled cold included
RECOVER_LIMIT_S = 10.0
CRASH_AT = 25
Record = Callable[[str, object], None]


def cfg(bm: int, fault: str, bn: int = 64, bk: int = 32, warps: int = 4, stages: int = 3) -> Config:
    return Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 8,
                      "num_warps": warps, "num_stages": stages, "FAULT": fault})


def worker_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {"TILEPILOT_KERNEL_MODULES": "tests.worker_families", "PYTHONPATH": path}


@pytest.fixture(scope="module")
def gpu_worker(ray_session: None) -> Iterator[Any]:
    if ray.cluster_resources().get("GPU", 0) < 1:
        pytest.skip("the test session's Ray sees no GPU")
    actor = EvalWorker.options(num_gpus=1, num_cpus=GPU_WORKER_CPUS, runtime_env={"env_vars": worker_env()}).remote(
        "gpu", rounds=2, block_ms=2.0)
    try:
        ray.get(actor.info.remote(), timeout=READY_S)
        yield actor
    finally:
        ray.kill(actor)


def info(worker: Any) -> WorkerInfo:
    return ray.get(worker.info.remote(), timeout=READY_S)  # type: ignore[no-any-return]


def evaluate(worker: Any, configs: list[Config], timeout_s: float = TIMEOUT_S) -> tuple[list[Result], float]:
    """The batch's results and its wall-clock seconds."""
    t0 = time.monotonic()
    results = ray.get(worker.evaluate.remote("test_oom", PROBLEM, configs, timeout_s), timeout=BATCH_S)
    return results, time.monotonic() - t0


def figure(record: Record, line: str, **values: object) -> None:
    for key, value in values.items():
        record(key, value)
    print(line)


def test_gpu_out_of_memory_is_oom_then_the_next_config_runs_in_the_same_child(
        gpu_worker: Any, record_property: Record) -> None:
    before = info(gpu_worker)
    results, batch_s = evaluate(gpu_worker, [cfg(64, "none"), cfg(128, "oom"), cfg(128, "none")])
    after = info(gpu_worker)
    sample = ray.get(gpu_worker.sample.remote(), timeout=READY_S)
    assert [r.status for r in results] == [Status.OK, Status.OOM, Status.OK], [r.message for r in results]
    assert "OutOfMemoryError" in results[1].message and "SIMULATED" not in results[1].message
    assert results[2].timing is not None and results[2].timing.median_ms > 0
    assert (after.child_pid, after.respawns) == (before.child_pid, before.respawns)  # recovered in place
    if sample is not None:  # NVML: the failed allocation holds nothing afterwards
        assert sample.mem_used_mb < 0.5 * sample.mem_total_mb, sample
    used = f"{sample.mem_used_mb:.0f} of {sample.mem_total_mb:.0f} MB in use after" if sample else "no NVML"
    figure(record_property, f"out of memory: ok, oom, ok in {batch_s:.1f} s, same child {after.child_pid}, {used}; "
           f"{results[1].message[:120]}", oom_batch_s=round(batch_s, 2),
           oom_mem_used_mb=sample.mem_used_mb if sample else None)


def test_illegal_address_in_one_config_of_fifty_is_one_crashed_and_49_results(
        gpu_worker: Any, record_property: Record) -> None:
    tiles = itertools.product((32, 64, 128), (32, 64, 128), (32, 64), (4, 8), (2, 3))
    good = [cfg(bm, "none", bn, bk, w, s) for bm, bn, bk, w, s in itertools.islice(tiles, 49)]
    configs = [*good[:CRASH_AT], cfg(64, "oob"), *good[CRASH_AT:]]
    before = info(gpu_worker)
    results, batch_s = evaluate(gpu_worker, configs)
    after = info(gpu_worker)
    statuses = [r.status for r in results]
    assert statuses[CRASH_AT] is Status.CRASHED and "illegal" in results[CRASH_AT].message.lower(), statuses
    assert statuses.count(Status.OK) == 49, [(r.status, r.message) for r in results if r.status is not Status.OK]
    assert all(r.timing is not None and r.timing.median_ms > 0 for r in results if r.status is Status.OK)
    assert after.respawns == before.respawns + 1 and after.child_pid != before.child_pid
    back_s = after.recover_s[-1]
    assert back_s < RECOVER_LIMIT_S, after.recover_s
    figure(record_property, f"illegal address in 1 config of 50: 49 ok, 1 crashed; fresh child ready in "
           f"{back_s:.1f} s; batch {batch_s:.1f} s", crash_recover_s=round(back_s, 2),
           crash_batch_s=round(batch_s, 2))


def test_kernel_that_never_ends_is_a_timeout_within_its_deadline_and_the_gpu_works_after(
        gpu_worker: Any, record_property: Record) -> None:
    before = info(gpu_worker)
    results, batch_s = evaluate(gpu_worker, [cfg(64, "none"), cfg(64, "hang"), cfg(128, "none")], HANG_TIMEOUT_S)
    after = info(gpu_worker)
    again, _ = evaluate(gpu_worker, [cfg(64, "none")])
    assert [r.status for r in results] == [Status.OK, Status.TIMEOUT, Status.OK], [r.message for r in results]
    assert after.respawns == before.respawns + 1 and after.child_pid != before.child_pid
    assert again[0].status is Status.OK and again[0].timing is not None, again[0].message
    back_s = after.recover_s[-1]
    # the hang's step may take HANG_TIMEOUT_S; the rest: two configs, a kill and a fresh child
    assert batch_s < HANG_TIMEOUT_S + back_s + 30, (batch_s, back_s)
    figure(record_property, f"kernel that never ends: timeout (deadline {HANG_TIMEOUT_S:g} s), batch of 3 in "
           f"{batch_s:.1f} s; fresh child ready in {back_s:.1f} s; the next batch ok", hang_batch_s=round(batch_s, 2),
           hang_recover_s=round(back_s, 2))
