"""The compile-ahead pool on the CPU: real ahead-of-time compiles for an H100 target in Ray actors
with no GPU, a second compile of the same kernel hitting the on-disk cache, one compile in
flight per cache key, a hanging compile becoming `compile_error` without losing the actor, and
a free compile worker taking the next compile while another is busy with a slow one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from tests.worker_families import register_all
from tilepilot.experiments import Config, Problem, Status
from tilepilot.kernels.base import Target
from tilepilot.orchestrator.compile_pool import CompilePool

REPO = Path(__file__).resolve().parents[1]
TARGET = Target()  # H100: sm_90


def cfg(bm: int, bn: int, bk: int, fault: str | None = None) -> Config:
    values: dict[str, Any] = {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 8,
                              "num_warps": 4, "num_stages": 3}
    return Config.of(values if fault is None else {**values, "FAULT": fault})


def prob(m: int, n: int, k: int) -> Problem:
    return Problem.of({"M": m, "N": n, "K": k, "dtype": "fp16"})


@pytest.fixture
def pool_env(tmp_path: Path) -> dict[str, str]:
    register_all()  # the driver side computes cache keys with the test families too
    return {"TRITON_CACHE_DIR": str(tmp_path / "triton-cache"), "PYTHONPATH": str(REPO),
            "TILEPILOT_KERNEL_MODULES": "tests.worker_families"}


@pytest.fixture
def pool(ray_session: None, pool_env: dict[str, str]) -> Iterator[CompilePool]:
    p = CompilePool(env=pool_env)
    yield p
    p.close()


def test_pool_takes_the_cpus_no_gpu_worker_holds(pool: CompilePool) -> None:
    nodes = [n for n in ray.nodes() if n["Alive"]]
    cpus = sum(int(n["Resources"].get("CPU", 0)) for n in nodes)
    gpus = sum(int(n["Resources"].get("GPU", 0)) for n in nodes)
    assert pool.size == max(1, cpus - gpus)


def test_pool_compiles_into_the_cache_and_hits_it_again(pool: CompilePool) -> None:
    first = ray.get(pool.submit("matmul", prob(256, 256, 256), cfg(64, 64, 32), TARGET))
    assert (first.status, first.message) == (Status.OK, ""), first.message
    assert first.shared_bytes and first.shared_bytes > 0
    # another problem with the same specialisation (multiples of 16): the same compiled kernel
    again = ray.get(pool.submit("matmul", prob(512, 256, 1024), cfg(64, 64, 32), TARGET))
    assert again.status is Status.OK
    assert again.compile_ms < first.compile_ms / 5, (first.compile_ms, again.compile_ms)


def test_one_compile_in_flight_per_cache_key(pool: CompilePool) -> None:
    a = pool.submit("matmul", prob(256, 256, 256), cfg(32, 64, 32), TARGET)
    b = pool.submit("matmul", prob(1024, 512, 256), cfg(32, 64, 32), TARGET)  # same specialisation
    c = pool.submit("matmul", prob(256, 256, 256), cfg(64, 32, 32), TARGET)
    assert a == b and a != c
    assert [o.status for o in ray.get([a, c])] == [Status.OK, Status.OK]


def test_shared_memory_beyond_the_target_is_out_of_resources(pool: CompilePool) -> None:
    small = Target(max_shared_bytes=16_384)
    outcome = ray.get(pool.submit("matmul", prob(256, 256, 256), cfg(128, 128, 64), small))
    assert outcome.status is Status.OUT_OF_RESOURCES and "16384" in outcome.message


def test_hanging_compile_times_out_and_worker_recovers(ray_session: None, pool_env: dict[str, str]) -> None:
    pool = CompilePool(per_node=1, timeout_s=5.0, env=pool_env)
    try:
        (worker,) = next(iter(pool.workers.values()))
        before = ray.get(worker.info.remote())
        t0 = time.monotonic()
        hung = ray.get(pool.submit("test_compile_hang", prob(256, 256, 256), cfg(64, 64, 32, "sleep"), TARGET))
        assert time.monotonic() - t0 < 60
        assert hung.status is Status.COMPILE_ERROR and "compile timed out" in hung.message
        good = ray.get(pool.submit("test_compile_hang", prob(256, 256, 256), cfg(64, 64, 32, "none"), TARGET))
        assert good.status is Status.OK, good.message
        after = ray.get(worker.info.remote())
        assert after.respawns == before.respawns + 1 and after.child_pid != before.child_pid
    finally:
        pool.close()


def test_a_free_compile_worker_takes_the_next_compile_while_another_is_slow(ray_session: None,
                                                                           pool_env: dict[str, str]) -> None:
    pool = CompilePool(per_node=2, env={**pool_env, "TILEPILOT_TEST_COMPILE_S": "8"})
    try:
        slow = pool.submit("test_slow_compile", prob(256, 256, 256), cfg(64, 64, 32, "sleep"), TARGET)
        fast = [pool.submit("test_slow_compile", prob(256, 256, 256), cfg(*tiles, "none"), TARGET)
                for tiles in ((32, 64, 32), (64, 32, 32))]
        done, _ = ray.wait(fast, num_returns=2, timeout=60)
        straggling = not ray.wait([slow], timeout=0)[0]
        outcomes = ray.get([slow, *fast])
    finally:
        pool.close()
    assert len(done) == 2 and straggling  # neither fast compile was assigned ahead behind the slow one
    assert [o.status for o in outcomes] == [Status.OK] * 3
