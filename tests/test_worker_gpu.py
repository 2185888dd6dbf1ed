"""`EvalWorker` on a real GPU through Ray: an illegal address costs one config and the worker goes
on, a kernel that never ends is a timeout, configs compiled ahead in the CompilePool are cache
hits in the worker's child, and NVML samples name the worker's own GPU."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray

from tilepilot.experiments import Config, Problem, Status
from tilepilot.orchestrator.compile_pool import CompilePool
from tilepilot.orchestrator.worker import GPU_WORKER_CPUS, EvalWorker, WorkerInfo

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PROBLEM = Problem.of({"M": 512, "N": 512, "K": 512, "dtype": "fp16"})
TIMEOUT_S = 60.0


def cfg(bm: int, bn: int, bk: int, w: int = 4, s: int = 3, fault: str | None = None) -> Config:
    values: dict[str, Any] = {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 8,
                              "num_warps": w, "num_stages": s}
    return Config.of(values if fault is None else {**values, "FAULT": fault})


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A Triton cache of their own for the worker's child and the compile pool: cold at first."""
    return {"TRITON_CACHE_DIR": str(tmp_path_factory.mktemp("triton-cache"))}


@pytest.fixture(scope="module")
def gpu_worker(ray_session: None, cache_env: dict[str, str]) -> Iterator[Any]:
    if ray.cluster_resources().get("GPU", 0) < 1:
        pytest.skip("the test session's Ray sees no GPU")
    actor = EvalWorker.options(num_gpus=1, num_cpus=GPU_WORKER_CPUS, runtime_env={"env_vars": cache_env}).remote(
        "gpu", rounds=2, block_ms=2.0)
    yield actor
    ray.kill(actor)


def info(worker: Any) -> WorkerInfo:
    return ray.get(worker.info.remote())  # type: ignore[no-any-return]


def test_gpu_worker_reports_its_gpu_and_samples_it(gpu_worker: Any) -> None:
    about = info(gpu_worker)
    assert about.backend == "gpu" and about.environment.backend == "gpu" and about.environment.driver
    assert about.gpu_uuid and about.gpu_uuid.startswith("GPU-")
    assert about.target is not None and about.target.arch >= 70 and about.target.max_shared_bytes > 0
    sample = ray.get(gpu_worker.sample.remote())
    assert sample is not None
    assert (sample.uuid, sample.worker, sample.running) == (about.gpu_uuid, about.worker_id, "")
    assert sample.mem_total_mb > 0 and sample.sm_clock_mhz >= 0


def test_compile_ahead_then_evaluate_hits_the_cache(gpu_worker: Any, cache_env: dict[str, str]) -> None:
    target = info(gpu_worker).target
    # a first compile in the child pays one-time costs (Triton's backend loading): not what is measured
    [warm] = ray.get(gpu_worker.evaluate.remote("matmul", PROBLEM, [cfg(32, 32, 32, s=2)], TIMEOUT_S))
    assert warm.status is Status.OK, warm.message
    configs = [cfg(64, 64, 32), cfg(128, 128, 64, w=8, s=4)]
    pool = CompilePool(env=cache_env)
    try:
        outcomes = ray.get([pool.submit("matmul", PROBLEM, c, target) for c in configs])
    finally:
        pool.close()
    assert [o.status for o in outcomes] == [Status.OK, Status.OK], [o.message for o in outcomes]
    results = ray.get(gpu_worker.evaluate.remote("matmul", PROBLEM, configs, TIMEOUT_S))
    for outcome, r in zip(outcomes, results, strict=True):
        assert r.status is Status.OK, r.message
        assert r.extra["shared_bytes"] == outcome.shared_bytes
        assert r.compile_ms < min(50.0, outcome.compile_ms / 5), (r.compile_ms, outcome.compile_ms)
        assert r.timing.method in ("cuda-events", "cuda-graph") and r.timing.median_ms > 0


def test_illegal_address_crashes_one_config_and_gpu_worker_goes_on(gpu_worker: Any) -> None:
    before = info(gpu_worker)
    configs = [cfg(64, 64, 32, fault="none"), cfg(64, 64, 32, fault="oob"), cfg(128, 64, 32, fault="none")]
    results = ray.get(gpu_worker.evaluate.remote("matmul_faults", PROBLEM, configs, TIMEOUT_S))
    assert [r.status for r in results] == [Status.OK, Status.CRASHED, Status.OK], [r.message for r in results]
    assert "illegal" in results[1].message.lower()
    after = info(gpu_worker)
    assert after.respawns == before.respawns + 1 and after.child_pid != before.child_pid
    again = ray.get(gpu_worker.evaluate.remote("matmul_faults", PROBLEM, configs[:1], TIMEOUT_S))
    assert again[0].status is Status.OK, again[0].message


def test_kernel_that_never_ends_is_a_timeout_and_gpu_worker_goes_on(gpu_worker: Any) -> None:
    before = info(gpu_worker)
    timeout_s = 10.0
    configs = [cfg(64, 64, 32, fault="none"), cfg(64, 64, 32, fault="hang"), cfg(128, 64, 32, fault="none")]
    t0 = time.monotonic()
    results = ray.get(gpu_worker.evaluate.remote("matmul_faults", PROBLEM, configs, timeout_s))
    assert time.monotonic() - t0 < 2 * timeout_s + 60
    assert [r.status for r in results] == [Status.OK, Status.TIMEOUT, Status.OK], [r.message for r in results]
    assert info(gpu_worker).respawns == before.respawns + 1
    again = ray.get(gpu_worker.evaluate.remote("matmul_faults", PROBLEM, configs[:1], TIMEOUT_S))
    assert again[0].status is Status.OK, again[0].message


def test_baseline_and_recheck_on_the_gpu(gpu_worker: Any) -> None:
    timing = ray.get(gpu_worker.baseline.remote("matmul", PROBLEM, TIMEOUT_S))
    assert timing is not None and timing.median_ms > 0
    check = ray.get(gpu_worker.recheck.remote("matmul", PROBLEM, cfg(64, 64, 32), TIMEOUT_S))
    assert check.passed, check.message


def test_gpu_worker_measures_the_device_ceilings_in_its_child(gpu_worker: Any) -> None:
    about = info(gpu_worker)
    c = ray.get(gpu_worker.ceilings.remote(TIMEOUT_S))
    assert (c.device, c.driver) == (about.environment.device, about.environment.driver)
    assert 1000 < c.copy_gbps < 5000 and 300 < c.matmul_tflops < 1100
    assert info(gpu_worker).respawns == about.respawns
