"""The compile-ahead pipeline of RayExecutor and what it reports: how many batches it takes, a
worker holding the batch it runs and the next (which starts as soon as the first ends, with no
round trip to the driver), the batch traces, the time a worker sat idle while compiled work
waited, and the Triton compiles each process made (the compile pool's count one per new kernel
and none on a cache hit; the interpreter's none). CPU only: the test session's Ray, 2 CPUs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import ray

from tests.worker_families import register_all
from tilepilot.experiments import Config, Problem, Status
from tilepilot.kernels.base import Target
from tilepilot.kernels.registry import get_family
from tilepilot.orchestrator.compile_pool import CompilePool
from tilepilot.orchestrator.executor import Batch, BatchTrace, idle_with_work
from tilepilot.orchestrator.ray_executor import PER_WORKER, READY_PER_GPU, RayExecutor, pipeline_room
from tilepilot.orchestrator.worker import BatchReply

REPO = Path(__file__).resolve().parents[1]
PROBLEM = Problem.of({"M": 32, "N": 32, "K": 32, "dtype": "fp16"})
TILES = ((16, 16, 16), (16, 16, 32), (32, 16, 16))


def cfg(bm: int, bn: int, bk: int, fault: str | None = None) -> Config:
    values: dict[str, Any] = {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 1,
                              "num_warps": 4, "num_stages": 2}
    return Config.of(values if fault is None else {**values, "FAULT": fault})


def trace(batch: int, worker: str, compiled: float, started: float, ended: float) -> BatchTrace:
    return BatchTrace(batch, worker, 1, submitted=0.0, compiled=compiled, dispatched=compiled, started=started,
                      ended=ended, returned=ended)


# ---- pure logic ---------------------------------------------------------------------------------
def test_pipeline_takes_batches_while_the_pool_has_room_up_to_the_ready_cap() -> None:
    assert pipeline_room(1, ready=0, waiting=0, compiling=0, capacity=15) == 1
    # the pool is full, but fewer than READY_PER_GPU batches wait: one more (small batches queue ahead)
    assert pipeline_room(1, ready=0, waiting=READY_PER_GPU - 1, compiling=15, capacity=15) == 1
    # the pool is full and enough batches wait for the GPU: none
    assert pipeline_room(1, ready=0, waiting=READY_PER_GPU, compiling=15, capacity=15) == 0
    # the pool has room but enough compiled batches wait already: none (no unbounded pile)
    assert pipeline_room(1, ready=READY_PER_GPU, waiting=READY_PER_GPU, compiling=0, capacity=15) == 0
    assert pipeline_room(4, ready=READY_PER_GPU, waiting=8, compiling=10, capacity=60) == 1
    assert pipeline_room(0, ready=0, waiting=0, compiling=0, capacity=15) == 0


def test_idle_with_work_counts_only_idle_time_while_a_compiled_batch_waited() -> None:
    traces = [trace(0, "w0", compiled=0.0, started=1.0, ended=2.0),  # w0 idle 0-1 with batch 0 waiting
              trace(1, "w0", compiled=3.0, started=4.0, ended=5.0),  # idle 2-3 with nothing compiled, 3-4 waiting
              trace(2, "w1", compiled=0.5, started=0.5, ended=5.0)]
    idle = idle_with_work(traces, start=0.0, end=6.0)
    assert idle["w0"] == pytest.approx(2.0)  # 0-1 and 3-4; not 2-3 (nothing compiled), not 5-6 (nothing left)
    assert idle["w1"] == pytest.approx(0.5)  # 0-0.5 batch 0 waited; busy from then on
    assert idle_with_work([], start=0.0, end=1.0) == {}


def test_waited_note_leaves_out_the_wait_behind_our_own_earlier_batch() -> None:
    from tilepilot.orchestrator.ray_executor import _waited_for_others

    # sent at 10 behind our batch that ended at 12, started at 12: no one else's work
    assert _waited_for_others(BatchReply([], 2.0, "w", started_at=12.0, ended_at=13.0), 12.0) == 0.0
    # another campaign's batch ran 12-15 between ours
    assert _waited_for_others(BatchReply([], 5.0, "w", started_at=15.0, ended_at=16.0), 12.0) == pytest.approx(3.0)
    # nothing of ours before it: the whole wait was behind others
    assert _waited_for_others(BatchReply([], 1.5, "w", started_at=11.5, ended_at=12.0), 0.0) == pytest.approx(1.5)


# ---- through Ray --------------------------------------------------------------------------------
def test_a_worker_holds_the_next_batch_and_starts_it_as_the_last_one_ends(ray_session: None,
                                                                          markers: Path) -> None:
    env = {"TILEPILOT_KERNEL_MODULES": "tests.worker_families", "PYTHONPATH": str(REPO),
           "TILEPILOT_TEST_MARKERS": str(markers), "TILEPILOT_TEST_SLOW_S": "0.3"}
    ex = RayExecutor(get_family("test_slow"), "interpret", workers=1, worker_env=env, shared=False, trace=True)
    try:
        assert ex.free_slots() == PER_WORKER + READY_PER_GPU
        for i, tiles in enumerate(TILES):
            ex.submit(Batch(i, PROBLEM, (cfg(*tiles, "sleep"),), (100 + i,)))
        assert [s.held for s in ex.slots] == [PER_WORKER]  # the third waits in the executor
        assert len(ex.ready) == 1
        out: dict[int, list[Any]] = {}
        deadline = time.monotonic() + 120
        while len(out) < len(TILES):
            assert time.monotonic() < deadline
            out.update({b.id: r for b, r in ex.poll(0.05)})
            time.sleep(0.3)  # a slow driver: the worker's second batch must not wait for it
        traces = sorted(ex.traces or [], key=lambda t: t.started)
        info = ray.get(ex.slots[0].actor.info.remote())
    finally:
        ex.close()
    assert {i: [r.status for r in rs] for i, rs in out.items()} == {i: [Status.OK] for i in range(len(TILES))}
    assert [t.batch for t in traces] == [0, 1, 2]
    for a, b in pairwise(traces):
        assert b.started >= a.ended  # one batch at a time on the device
    first, second = traces[0], traces[1]
    assert second.dispatched < first.ended  # it was sent before the first ended ...
    assert second.started - first.ended < 0.25  # ... and started without waiting for the driver's poll
    assert all(t.submitted <= t.compiled <= t.dispatched <= t.returned for t in traces)
    assert all(t.compiles == 0 for t in traces) and info.compiles == 0  # the interpreter compiles nothing
    assert ex.waited_s > 0


def test_compile_pool_counts_its_triton_compiles_and_none_on_a_cache_hit(ray_session: None,
                                                                         tmp_path: Path) -> None:
    register_all()
    env = {"TRITON_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO),
           "TILEPILOT_KERNEL_MODULES": "tests.worker_families"}
    pool = CompilePool(env=env, per_node=1)
    try:
        assert pool.capacity == 1
        problem = Problem.of({"M": 256, "N": 256, "K": 256, "dtype": "fp16"})
        config = Config.of({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8,
                            "num_warps": 4, "num_stages": 3})
        first = ray.get(pool.submit("matmul", problem, config, Target()))
        [worker] = [w for ws in pool.workers.values() for w in ws]
        after_one = ray.get(worker.info.remote()).compiles
        again = ray.get(pool.submit("matmul", Problem.of({"M": 512, "N": 256, "K": 1024, "dtype": "fp16"}),
                                    config, Target()))  # the same specialisation: a cache hit
        after_two = ray.get(worker.info.remote()).compiles
    finally:
        pool.close()
    assert (first.status, again.status) == (Status.OK, Status.OK)
    assert after_one is not None and after_one >= 1  # the kernel (Triton may compile helpers too)
    assert after_two == after_one


def test_withdraw_takes_back_what_no_worker_holds_and_the_worker_finishes_its_own(ray_session: None,
                                                                                  markers: Path) -> None:
    env = {"TILEPILOT_KERNEL_MODULES": "tests.worker_families", "PYTHONPATH": str(REPO),
           "TILEPILOT_TEST_MARKERS": str(markers), "TILEPILOT_TEST_SLOW_S": "0.3"}
    ex = RayExecutor(get_family("test_slow"), "interpret", workers=1, worker_env=env, shared=False)
    try:
        for i, tiles in enumerate(TILES):
            ex.submit(Batch(i, PROBLEM, (cfg(*tiles, "sleep"),), (100 + i,)))
        back = ex.withdraw()  # a person paused: the third batch waits in the executor, not at the worker
        assert [b.id for b in back] == [2] and ex.in_flight() == PER_WORKER
        out: dict[int, list[Any]] = {}
        deadline = time.monotonic() + 120
        while ex.in_flight():
            assert time.monotonic() < deadline
            out.update({b.id: r for b, r in ex.poll(0.05)})
        assert ex.withdraw() == []
    finally:
        ex.close()
    assert {i: [r.status for r in rs] for i, rs in out.items()} == {0: [Status.OK], 1: [Status.OK]}


# ---- compile stragglers: a worker does not wait for a batch's slowest compile -------------------
STRAGGLER_S = 4.0


@pytest.fixture
def straggling(ray_session: None, markers: Path, tmp_path: Path) -> Iterator[RayExecutor]:
    """An interpret executor fed by a real compile pool (one compile worker: the session's second
    CPU) compiling for an H100, whose FAULT=sleep configs take STRAGGLER_S to compile. The
    interpreter does not read the compiled kernels; the pipeline around them is the gpu backend's."""
    env = {"TILEPILOT_KERNEL_MODULES": "tests.worker_families", "PYTHONPATH": str(REPO),
           "TILEPILOT_TEST_MARKERS": str(markers), "TILEPILOT_TEST_COMPILE_S": str(STRAGGLER_S),
           "TRITON_CACHE_DIR": str(tmp_path / "triton-cache")}
    ex = RayExecutor(get_family("test_slow_compile"), "interpret", workers=1, worker_env=env, shared=False,
                     trace=True)
    ex.pool, ex.target = CompilePool(env=env, per_node=1), Target()
    try:
        yield ex
    finally:
        ex.close()


def poll_until_empty(ex: RayExecutor, out: list[tuple[Batch, list[Any]]], limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while ex.in_flight():
        assert time.monotonic() < deadline
        out.extend(ex.poll(0.05))


def test_a_batch_starts_its_compiled_configs_before_its_straggler_has_compiled(straggling: RayExecutor) -> None:
    ex = straggling
    first = Batch(0, PROBLEM, (cfg(16, 16, 16, "none"), cfg(16, 16, 32, "none"), cfg(32, 16, 16, "sleep")),
                  (100, 101, 102))
    second = Batch(1, PROBLEM, (cfg(32, 32, 32, "none"),), (103,))
    ex.submit(first)
    ex.submit(second)
    out: list[tuple[Batch, list[Any]]] = []
    poll_until_empty(ex, out)
    assert sorted(b.id for b, _ in out) == [0, 1]  # each batch once, whole
    for batch, results in out:
        assert next(b for b in (first, second) if b.id == batch.id) == batch
        assert [r.config for r in results] == list(batch.configs)  # one result per config, in order
        assert [r.status for r in results] == [Status.OK] * len(batch.configs)
    parts = sorted((t for t in ex.traces or [] if t.batch == 0), key=lambda t: t.started)
    # the fast configs went as they compiled (one part or two, the worker being idle), the straggler alone
    *early, rest = parts
    assert early and sum(t.configs for t in early) == 2 and rest.configs == 1
    assert all(t.ended < rest.compiled for t in early)  # measured while the straggler still compiled
    assert rest.compiled - rest.submitted >= STRAGGLER_S
    for a, b in pairwise(sorted(ex.traces or [], key=lambda t: t.started)):
        assert b.started >= a.ended  # one measurement at a time on the worker


def test_withdraw_takes_back_the_remainder_no_worker_holds(straggling: RayExecutor) -> None:
    ex = straggling
    batch = Batch(0, PROBLEM, (cfg(16, 16, 16, "none"), cfg(16, 16, 32, "none"), cfg(32, 16, 16, "sleep")),
                  (100, 101, 102))
    ex.submit(batch)
    deadline = time.monotonic() + 60
    while not ex.compiling or ex.compiling[0].sent != {0, 1}:  # the fast configs compiled and went to the worker
        assert time.monotonic() < deadline
        assert ex.poll(0.05) == []
    assert ex.compiling[0].compiles  # the straggler still compiles
    back = ex.withdraw()  # a person paused
    assert [(b.id, b.configs, b.queue_ids) for b in back] == [(0, batch.configs[2:], (102,))]
    out: list[tuple[Batch, list[Any]]] = []
    poll_until_empty(ex, out)
    assert ex.withdraw() == []
    [(part, results)] = out  # the driver gets the part the worker held, and nothing of the remainder
    assert (part.id, part.configs, part.queue_ids) == (0, batch.configs[:2], (100, 101))
    assert [(r.config, r.status) for r in results] == [(c, Status.OK) for c in batch.configs[:2]]
