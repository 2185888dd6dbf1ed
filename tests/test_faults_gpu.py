"""Out of memory on a real GPU: a config of the `test_oom` family (tests/worker_families.py) asks
for twice the GPU's memory; it is `oom`, the memory is given back, and the next config runs and
verifies in the same child process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import ray

from tilepilot.experiments import Config, Problem, Status
from tilepilot.orchestrator.worker import GPU_WORKER_CPUS, EvalWorker

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

REPO = Path(__file__).resolve().parents[1]
PROBLEM = Problem.of({"M": 512, "N": 512, "K": 512, "dtype": "fp16"})
TIMEOUT_S = 60.0


def cfg(bm: int, fault: str) -> Config:
    return Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8,
                      "num_warps": 4, "num_stages": 3, "FAULT": fault})


def test_gpu_out_of_memory_is_oom_then_the_next_config_runs_in_the_same_child(ray_session: None) -> None:
    if ray.cluster_resources().get("GPU", 0) < 1:
        pytest.skip("the test session's Ray sees no GPU")
    env = {"TILEPILOT_KERNEL_MODULES": "tests.worker_families", "PYTHONPATH": str(REPO)}
    actor: Any = EvalWorker.options(num_gpus=1, num_cpus=GPU_WORKER_CPUS, runtime_env={"env_vars": env}).remote(
        "gpu", rounds=2, block_ms=2.0)
    try:
        before = ray.get(actor.info.remote())
        configs = [cfg(64, "none"), cfg(128, "oom"), cfg(128, "none")]
        results = ray.get(actor.evaluate.remote("test_oom", PROBLEM, configs, TIMEOUT_S))
        after = ray.get(actor.info.remote())
        sample = ray.get(actor.sample.remote())
    finally:
        ray.kill(actor)
    assert [r.status for r in results] == [Status.OK, Status.OOM, Status.OK], [r.message for r in results]
    assert "OutOfMemoryError" in results[1].message and "SIMULATED" not in results[1].message
    assert results[2].timing is not None and results[2].timing.median_ms > 0
    assert (after.child_pid, after.respawns) == (before.child_pid, before.respawns)  # recovered in place
    if sample is not None:  # NVML: the failed allocation holds nothing afterwards
        assert sample.mem_used_mb < 0.5 * sample.mem_total_mb, sample
