"""Shared workers' lifetime on the CPU (the test session's Ray, interpreter backend): a shared
worker left idle for TILEPILOT_SHARED_IDLE_S ends by itself with its child, and the next
executor starts a fresh one; a batch sent to a worker that ended that way is re-queued and
finished on a fresh one; a request that comes just as a worker ends sees it lost, never a hang;
a shared compile worker ends the same way and the pool heals; bad input is one line.

The campaigns on a real cluster (`tune --address`, a campaign ending while another uses the
worker it started, `tilepilot workers stop`) are in tests/test_cluster_faults.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import ray

from tests.test_faults import PROBLEM, TILES, cfg, poll_all, worker_env
from tests.worker_families import register_all
from tilepilot.experiments import InputError, Problem, Status
from tilepilot.kernels.base import Target
from tilepilot.kernels.registry import get_family
from tilepilot.orchestrator.compile_pool import CompilePool
from tilepilot.orchestrator.executor import Batch
from tilepilot.orchestrator.ray_executor import RayExecutor
from tilepilot.orchestrator.ray_runtime import LOST, NAMESPACE
from tilepilot.orchestrator.shared import SHARED_IDLE_ENV, SHARED_IDLE_S, IdleExit, shared_idle_s, stop_shared_workers

REPO = Path(__file__).resolve().parents[1]
IDLE_S = "3"  # the time from a worker's start to its first batch stays well below it on a loaded machine
WORKER = "tilepilot-interpret-0"


@pytest.fixture
def shared_idle(ray_session: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[float]:
    """A short idle time for the shared workers started here; none of them outlives the test."""
    monkeypatch.setenv(SHARED_IDLE_ENV, IDLE_S)
    yield float(IDLE_S)
    stop_shared_workers(wait_s=5)


def named(name: str) -> bool:
    """Whether the cluster has a live actor of that name in tilepilot's namespace."""
    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    return True


def wait_until(done: Callable[[], bool], what: str, timeout_s: float = 30.0) -> float:
    """Poll until `done()`; the seconds it took."""
    t0 = time.monotonic()
    while not done():
        assert time.monotonic() - t0 < timeout_s, f"{what}: not within {timeout_s:g} s"
        time.sleep(0.05)
    return time.monotonic() - t0


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1][:1] != "Z"
    except OSError:
        return False


def batch(i: int, problem: Problem = PROBLEM) -> Batch:
    return Batch(i, problem, (cfg(*TILES[i % len(TILES)], "sleep"),), (100 + i,))


def test_idle_shared_worker_ends_with_its_child_and_the_next_executor_starts_a_fresh_one(
        shared_idle: float, markers: Path) -> None:
    env = worker_env(markers, TILEPILOT_TEST_SLOW_S="0.05")
    first = RayExecutor(get_family("test_slow"), "interpret", workers=1, worker_env=env, shared=True)
    try:
        first.submit(batch(0))
        assert [r.status for r in poll_all([first], 1)[0]] == [Status.OK]
        child = first.slots[0].info.child_pid
    finally:
        first.close()
    assert named(WORKER) and alive(child)  # closing left the shared worker to the others
    gone = wait_until(lambda: not named(WORKER), "the idle worker did not end")
    assert gone >= shared_idle - 0.5  # not before its idle time (its last request came just before the close)
    wait_until(lambda: not alive(child), "its child outlived it", timeout_s=5)
    print(f"the idle shared worker ended {gone:.1f} s after its last request (idle limit {shared_idle:g} s)")

    second = RayExecutor(get_family("test_slow"), "interpret", workers=1, worker_env=env, shared=True)
    try:
        second.submit(batch(1))
        assert [r.status for r in poll_all([second], 1)[1]] == [Status.OK]
        fresh = second.slots[0].info.child_pid
        kinds = [e.kind for e in second.events()]
    finally:
        second.close()
    assert fresh != child and "worker_started" in kinds
    assert "worker_lost" not in kinds and "requeued" not in kinds


def test_a_batch_sent_to_a_worker_that_ended_when_idle_is_requeued_and_finished_on_a_fresh_one(
        shared_idle: float, markers: Path) -> None:
    env = worker_env(markers, TILEPILOT_TEST_SLOW_S="0.05")
    ex = RayExecutor(get_family("test_slow"), "interpret", workers=1, worker_env=env, shared=True)
    try:
        ex.submit(batch(0))
        first = poll_all([ex], 1)
        wait_until(lambda: not named(WORKER), "the idle worker did not end")
        ex.submit(batch(1))
        second = poll_all([ex], 1)
        events = ex.events()
    finally:
        ex.close()
    assert {i: [r.status for r in rs] for i, rs in (first | second).items()} == {0: [Status.OK], 1: [Status.OK]}
    kinds = [e.kind for e in events]
    assert kinds.count("worker_lost") == 1 and kinds.count("requeued") == 1
    [requeued] = [e for e in events if e.kind == "requeued"]
    assert requeued.data["queue_ids"] == [101]
    [back] = [e for e in events if e.kind == "worker_started" and e.data["replaces"]]
    assert kinds.index("worker_lost") < kinds.index("requeued")
    print(f"the batch sent to the ended worker finished on a fresh one, back {back.data['back_s']:.1f} s "
          "after the loss")


@ray.remote(num_cpus=0, max_concurrency=4)
class _Idler:
    """An actor that ends when idle, whose clean-up (stopping its child, in a worker) takes
    `cleanup_s` and leaves a marker first: a wide window for a request to come as it ends."""

    def __init__(self, idle_s: float, cleanup_s: float, marker: str) -> None:
        def cleanup() -> None:
            Path(marker).touch()
            time.sleep(cleanup_s)

        self._life = IdleExit(idle_s, cleanup, "test idler")
        self._life.start()

    def hold(self, seconds: float) -> int:
        with self._life.request():
            time.sleep(seconds)
            return os.getpid()


def test_a_request_that_comes_as_the_worker_ends_sees_it_lost_never_hangs(ray_session: None,
                                                                          tmp_path: Path) -> None:
    marker = tmp_path / "ending"
    actor = _Idler.options(runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}}).remote(0.5, 3.0, str(marker))
    pid = ray.get(actor.hold.remote(1.5), timeout=60)  # a request longer than the idle time: never cut
    held = time.monotonic()
    wait_until(marker.exists, "the idle actor did not start to end")
    assert time.monotonic() - held >= 0.5 - 0.1
    t0 = time.monotonic()
    with pytest.raises(LOST):  # it came while the actor stopped its child: it never runs
        ray.get(actor.hold.remote(0.0), timeout=30)
    assert time.monotonic() - t0 < 3.0 + 5.0
    wait_until(lambda: not alive(pid), "the actor's process outlived it", timeout_s=10)


def test_idle_shared_compile_worker_ends_and_heal_starts_a_fresh_one(shared_idle: float, tmp_path: Path) -> None:
    register_all()
    env = {"TRITON_CACHE_DIR": str(tmp_path / "triton-cache"), "PYTHONPATH": str(REPO),
           "TILEPILOT_KERNEL_MODULES": "tests.worker_families"}
    pool = CompilePool(per_node=1, env=env, shared=True)
    try:
        problem = Problem.of({"M": 64, "N": 64, "K": 64, "dtype": "fp16"})
        config = cfg(16, 16, 16)
        assert ray.get(pool.submit("matmul", problem, config, Target()), timeout=120).status is Status.OK
        [worker] = [w for ws in pool.workers.values() for w in ws]
        child = ray.get(worker.info.remote()).child_pid
        [name] = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["namespace"] == NAMESPACE and a["name"].startswith("tilepilot-compile-")]
        wait_until(lambda: not named(name), "the idle compile worker did not end")
        wait_until(lambda: not alive(child), "its child outlived it", timeout_s=5)
        with pytest.raises(LOST):
            ray.get(pool.submit("matmul", problem, cfg(16, 16, 32), Target()), timeout=60)
        pool.heal()
        again = ray.get(pool.submit("matmul", problem, cfg(32, 16, 16), Target()), timeout=120)
        [fresh] = [w for ws in pool.workers.values() for w in ws]
        assert again.status is Status.OK and ray.get(fresh.info.remote()).child_pid != child
    finally:
        pool.close()


def test_shared_idle_time_comes_from_the_environment_and_bad_values_are_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SHARED_IDLE_ENV, raising=False)
    assert shared_idle_s() == SHARED_IDLE_S
    monkeypatch.setenv(SHARED_IDLE_ENV, " 2.5 ")
    assert shared_idle_s() == 2.5
    for bad in ("0", "-1", "nan", "inf", "soon"):
        monkeypatch.setenv(SHARED_IDLE_ENV, bad)
        with pytest.raises(InputError, match=rf"^TILEPILOT_SHARED_IDLE_S='{bad}' is not a positive number"):
            RayExecutor(get_family("matmul"), "interpret", shared=True)


@pytest.mark.parametrize(("address", "says"), [
    ("nowhere", "Ray address 'nowhere' is not 'auto' or host:port"),
    ("127.0.0.1:1", "no Ray cluster answers at '127.0.0.1:1'"),
])
def test_workers_stop_with_a_bad_address_is_one_line_and_exit_2(address: str, says: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    proc = subprocess.run([sys.executable, "-m", "tilepilot", "workers", "stop", "--address", address],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"tilepilot: error: {says}") and proc.stderr.count("\n") == 1, proc.stderr
