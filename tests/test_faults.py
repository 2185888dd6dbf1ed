"""Faults around the configs, on the CPU (interpreter backend, the test session's Ray, 2 CPUs): a
worker actor killed in the middle of a batch (the batch re-queued and finished, a new worker in its
place), a worker whose children keep dying (quarantined; the campaign finishes on the other), every
worker quarantined or none placeable (one line, no hang), two executors sharing a worker by name
(turns, never two batches at once), a compile worker killed (the pool heals, the compile goes again),
and out of memory (`oom`, then the next config in the same child).

The fault-injection hooks are test-only: TILEPILOT_FAULT_WORKERS (worker.py) and the families of
tests/worker_families.py (whose simulated out-of-memory errors say SIMULATED).
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import ray

from tests.worker_families import MEASURE_LOG
from tilepilot.experiments import Config, InputError, Problem, Status
from tilepilot.kernels.base import Target
from tilepilot.kernels.registry import get_family
from tilepilot.orchestrator.compile_pool import CompilePool
from tilepilot.orchestrator.driver import Driver
from tilepilot.orchestrator.executor import Batch, NoWorkerLeft
from tilepilot.orchestrator.ray_executor import RayExecutor
from tilepilot.orchestrator.ray_runtime import LOST, NAMESPACE
from tilepilot.orchestrator.tune import TuneOptions, plan
from tilepilot.orchestrator.worker import EvalWorker, WorkerInfo
from tilepilot.storage.store import Store

REPO = Path(__file__).resolve().parents[1]
PROBLEM = Problem.of({"M": 32, "N": 32, "K": 32, "dtype": "fp16"})
TIMEOUT_S = 60.0
TILES = ((16, 16, 16), (16, 16, 32), (32, 16, 16))

CAMPAIGN = """
[campaign]
name = "faults"
kernel = "matmul"
proposer = "random"
budget = 6
seed = 0
hypothesis_share = 0

[space]
BLOCK_SIZE_M = [16, 32]
BLOCK_SIZE_N = [16, 32]
BLOCK_SIZE_K = [16, 32]
GROUP_SIZE_M = [1]
num_warps = [4]
num_stages = [2]

[[problems]]
M = 32
N = 32
K = 32
dtype = "fp16"
"""


def cfg(bm: int, bn: int, bk: int, fault: str | None = None) -> Config:
    values: dict[str, Any] = {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 1,
                              "num_warps": 4, "num_stages": 2}
    return Config.of(values if fault is None else {**values, "FAULT": fault})


def worker_env(markers: Path, **extra: str) -> dict[str, str]:
    return {"TILEPILOT_KERNEL_MODULES": "tests.worker_families", "PYTHONPATH": str(REPO),
            "TILEPILOT_TEST_MARKERS": str(markers), **extra}


def poll_all(executors: list[RayExecutor], batches: int, timeout_s: float = 120.0) -> dict[int, list[Any]]:
    """Poll the executors in turn until `batches` batches came back; batch id -> results."""
    out: dict[int, list[Any]] = {}
    deadline = time.monotonic() + timeout_s
    while len(out) < batches:
        assert time.monotonic() < deadline, f"only {len(out)} of {batches} batches came back"
        for ex in executors:
            out.update({b.id: r for b, r in ex.poll(0.05)})
    return out


def busy_pid(markers: Path, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    while not (found := list(markers.glob("*.busy"))):
        assert time.monotonic() < deadline, "no batch started"
        time.sleep(0.02)
    return int(found[0].name.split(".")[0])


def test_worker_actor_killed_mid_batch_is_requeued_and_a_new_worker_started(ray_session: None,
                                                                            markers: Path) -> None:
    ex = RayExecutor(get_family("test_slow"), "interpret", workers=2,
                     worker_env=worker_env(markers, TILEPILOT_TEST_SLOW_S="0.7"), shared=False)
    try:
        started = ex.events()
        assert sorted(e.data["worker"] for e in started if e.kind == "worker_started") == ["interpret-0",
                                                                                          "interpret-1"]
        batches = [Batch(i, PROBLEM, (cfg(*TILES[i], "sleep"),), (100 + i,)) for i in range(2)]
        for b in batches:
            ex.submit(b)
        pid = busy_pid(markers)  # a child is in the middle of its batch
        slot, _, pending = next(v for v in ex.running_refs.values() if v[0].info.child_pid == pid)
        t0 = time.monotonic()
        ray.kill(slot.actor)
        results = poll_all([ex], 2)
        elapsed = time.monotonic() - t0
        deadline = time.monotonic() + 60
        while not slot.ready:  # the batch may have finished on the other worker before the new one started
            assert time.monotonic() < deadline, "no worker replaced the one killed"
            ex.poll(0.1)
        events = ex.events()
    finally:
        ex.close()
    victim = slot.worker_id
    assert {i: [r.status for r in rs] for i, rs in results.items()} == {0: [Status.OK], 1: [Status.OK]}
    kinds = [(e.kind, e.data.get("worker")) for e in events]
    assert ("worker_lost", victim) in kinds and ("requeued", victim) in kinds and ("worker_started", victim) in kinds
    [requeued] = [e for e in events if e.kind == "requeued"]
    assert requeued.data["queue_ids"] == list(pending.batch.queue_ids)
    [back] = [e for e in events if e.kind == "worker_started"]
    assert back.data["replaces"] and back.data["back_s"] > 0
    assert results[pending.batch.id][0].extra["worker"] in ("interpret-0", "interpret-1")
    print(f"killed {victim} mid-batch: replacement ready {back.data['back_s']:.1f} s later, "
          f"both batches done {elapsed:.1f} s after the kill")


def _campaign(tmp_path: Path, *, workers: int, sick: str) -> tuple[Store, int, Driver]:
    toml = tmp_path / "c.toml"
    toml.write_text(CAMPAIGN)
    p = plan(TuneOptions(campaign=toml, backend="interpret", db=tmp_path / "t.db"))
    executor = RayExecutor(p.family, "interpret", workers=workers, shared=False,
                           worker_env={"TILEPILOT_FAULT_WORKERS": sick})
    store = Store(tmp_path / "t.db")
    cid = store.create_campaign(p.campaign, backend="interpret", dataset="", device=executor.environment.device)
    return store, cid, Driver(p.campaign, p.family, store, executor, spaces=p.spaces, campaign_id=cid)


def _events(db: Path, kind: str) -> list[tuple[str, dict[str, Any]]]:
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT message, data FROM events WHERE kind = ? ORDER BY id", [kind]).fetchall()
    finally:
        con.close()
    return [(m, json.loads(d)) for m, d in rows]


def test_worker_whose_children_keep_dying_is_quarantined_and_the_campaign_finishes_on_the_other(
        ray_session: None, tmp_path: Path) -> None:
    store, cid, driver = _campaign(tmp_path, workers=2, sick="interpret-1")
    t0 = time.time()
    try:
        winners = driver.run()
        trials = store.campaign_results(cid)
        state = store.get_campaign("faults").state
    finally:
        driver.executor.close()
        store.close()
    assert state == "finished" and len(winners) == 1
    assert len(trials) == 6 and len({t.experiment_key for t, _ in trials}) == 6  # each experiment once
    assert {r.status for _, r in trials} == {Status.OK}  # the failing worker blamed no config
    assert {r.extra["worker"] for _, r in trials} == {"interpret-0"}
    [(message, data)] = _events(tmp_path / "t.db", "quarantined")
    con = sqlite3.connect(tmp_path / "t.db")
    [(quarantined_at,)] = con.execute("SELECT ts FROM events WHERE kind = 'quarantined'").fetchall()
    con.close()
    print(f"interpret-1 quarantined {quarantined_at - t0:.1f} s after the campaign started")
    assert data["worker"] == "interpret-1" and "3 infrastructure failures in a row" in data["reason"]
    assert "died (exit code 5)" in data["reason"] and "running the health request" in data["reason"]
    assert "\n" not in message
    [(_, requeued)] = _events(tmp_path / "t.db", "requeued")
    assert requeued["worker"] == "interpret-1" and requeued["queue_ids"]


def test_every_worker_quarantined_stops_the_campaign_with_one_line(ray_session: None, tmp_path: Path) -> None:
    store, _, driver = _campaign(tmp_path, workers=1, sick="interpret-0")
    t0 = time.monotonic()
    try:
        with pytest.raises(NoWorkerLeft) as err:
            driver.run()
    finally:
        driver.executor.close()
        store.close()
    assert time.monotonic() - t0 < 60
    message = str(err.value)
    assert message.startswith("every worker is quarantined, so the campaign cannot go on (interpret-0: ")
    assert "\n" not in message
    assert [d["worker"] for _, d in _events(tmp_path / "t.db", "quarantined")] == ["interpret-0"]


def test_workers_that_cannot_be_placed_are_one_line_not_a_hang_and_are_not_left_asking(ray_session: None) -> None:
    from ray._private import state

    before = set(state.actors())
    t0 = time.monotonic()
    with pytest.raises(NoWorkerLeft, match=r"^no worker started within 3 s \(1 asked for with 1 CPU, "
                                           r"1 tilepilot_gpu\)$"):
        RayExecutor(get_family("matmul"), "interpret", worker_resources={"tilepilot_gpu": 1}, shared=False,
                    startup_timeout_s=3)
    assert time.monotonic() - t0 < 30
    deadline = time.monotonic() + 10
    while (left := {k: a["State"] for k, a in state.actors().items() if k not in before and a["State"] != "DEAD"}):
        assert time.monotonic() < deadline, f"actors still waiting for a node: {left}"  # killed, not pending
        time.sleep(0.1)


def test_bad_worker_resources_are_an_input_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TILEPILOT_WORKER_RESOURCES", "tilepilot_gpu=1")
    with pytest.raises(InputError, match="TILEPILOT_WORKER_RESOURCES='tilepilot_gpu=1' is not a JSON object"):
        RayExecutor(get_family("matmul"), "interpret")


def test_two_executors_share_a_named_worker_in_turns(ray_session: None, markers: Path) -> None:
    env = worker_env(markers, TILEPILOT_TEST_SLOW_S="0.5")  # a batch takes over WAITED_NOTE_S
    first = RayExecutor(get_family("test_slow"), "interpret", workers=1, worker_env=env, shared=True)
    second = RayExecutor(get_family("test_slow"), "interpret", workers=1, worker_env=env, shared=True)
    problems = {first: Problem.of({"M": 32, "N": 32, "K": 32, "dtype": "fp16"}),
                second: Problem.of({"M": 48, "N": 32, "K": 32, "dtype": "fp16"})}
    try:
        assert first.slots[0].info.child_pid == second.slots[0].info.child_pid  # one worker, found by name
        for n, ex in enumerate((first, second)):
            for i in range(2):
                ex.submit(Batch(10 * n + i, problems[ex], (cfg(*TILES[i], "sleep"),), (10 * n + i,)))
        results = poll_all([first, second], 4)
        waited = [e for ex in (first, second) for e in ex.events() if e.kind == "waited"]
    finally:
        first.close()
        second.close()
        ray.kill(ray.get_actor("tilepilot-interpret-0", namespace=NAMESPACE))
    assert all(r.status is Status.OK for rs in results.values() for r in rs)
    spans = sorted((float(a), float(b), label) for _, a, b, label, _ in
                   (line.split("\t") for line in (markers / MEASURE_LOG).read_text().splitlines()))
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1)), "two measurements at once"
    owners = [label for _, _, label in spans]
    switches = sum(owners[i] != owners[i + 1] for i in range(len(owners) - 1))
    assert switches >= 3, f"the two executors did not take turns: {owners}"  # a, b, a, b
    assert waited, "no batch waited for its turn on the shared worker"


def test_out_of_memory_is_oom_and_the_next_config_runs_in_the_same_child(ray_session: None,
                                                                         markers: Path) -> None:
    env = worker_env(markers, TILEPILOT_TEST_DEVICE_BYTES=str(10**6))
    actor = EvalWorker.options(num_cpus=1, num_gpus=0, runtime_env={"env_vars": env}).remote(
        "interpret", input_sets=2)
    try:
        before: WorkerInfo = ray.get(actor.info.remote())
        configs = [cfg(16, 16, 16, "none"), cfg(32, 32, 32, "oom"), cfg(16, 32, 16, "none")]
        results = ray.get(actor.evaluate.remote("test_oom", PROBLEM, configs, TIMEOUT_S))
        big = Problem.of({"M": 1024, "N": 1024, "K": 1024, "dtype": "fp16"})
        too_big = ray.get(actor.evaluate.remote("test_oom", big, configs[:1], TIMEOUT_S))
        again = ray.get(actor.evaluate.remote("test_oom", PROBLEM, configs[2:], TIMEOUT_S))
        after: WorkerInfo = ray.get(actor.info.remote())
    finally:
        ray.kill(actor)
    assert [r.status for r in results] == [Status.OK, Status.OOM, Status.OK], [r.message for r in results]
    assert results[1].message.startswith("OutOfMemoryError: CUDA out of memory") and results[1].timing is None
    assert [r.status for r in too_big] == [Status.OOM] and "inputs do not fit" in too_big[0].message
    assert again[0].status is Status.OK
    assert (after.child_pid, after.respawns) == (before.child_pid, before.respawns)  # no process was replaced


def test_compile_lost_with_its_worker_is_compiled_again_on_a_new_one_after_heal(ray_session: None,
                                                                               markers: Path) -> None:
    env = {**worker_env(markers), "TRITON_CACHE_DIR": str(markers.parent / "triton-cache")}
    problem = Problem.of({"M": 256, "N": 256, "K": 256, "dtype": "fp16"})
    tiles = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8, "num_warps": 4,
             "num_stages": 3}
    pool = CompilePool(per_node=1, env=env)
    try:
        (worker,) = next(iter(pool.workers.values()))
        lost = pool.submit("test_compile_hang", problem, Config.of({**tiles, "FAULT": "sleep"}), Target())
        ray.kill(worker)
        with pytest.raises(LOST):
            ray.get(lost)
        pool.heal()
        (fresh,) = next(iter(pool.workers.values()))
        assert fresh != worker
        again = ray.get(pool.submit("test_compile_hang", problem, Config.of({**tiles, "FAULT": "none"}), Target()))
    finally:
        pool.close()
    assert again.status is Status.OK, again.message


def test_launch_failures_map_out_of_memory_to_oom_and_out_of_resources_apart() -> None:
    import torch
    from triton.runtime.errors import OutOfResources

    from tilepilot.kernels.failures import launch_failure

    assert launch_failure(OutOfResources(300_000, 232_448, "shared memory")) is Status.OUT_OF_RESOURCES
    assert launch_failure(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")) is Status.OOM
    assert launch_failure(RuntimeError("Triton Error [CUDA]: out of memory")) is Status.OOM
    assert launch_failure(RuntimeError("CUDA error: too many resources requested for launch")) \
        is Status.OUT_OF_RESOURCES
    assert launch_failure(RuntimeError("CUDA error: an illegal memory access was encountered")) is None  # sticky
    assert launch_failure(ValueError("out of memory")) is None

