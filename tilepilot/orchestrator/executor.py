"""The executor contract: where the driver sends batches of configs to be evaluated.

The driver never knows whether a number comes from a GPU, the interpreter or a recording:
it submits `Batch`es and polls for their results. Implementations: `ReplayExecutor`
(recorded measurements, in process) and `RayExecutor` (Ray workers, gpu or interpret).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tilepilot.experiments import (
    Config,
    DeviceCeilings,
    Environment,
    GpuSample,
    Problem,
    Result,
    TilepilotError,
    Timing,
)

if TYPE_CHECKING:
    from tilepilot.storage.store import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Batch:
    id: int
    problem: Problem
    configs: tuple[Config, ...]
    queue_ids: tuple[int, ...]  # the queue rows these configs came from, same order


@dataclass(frozen=True)
class ExecutorEvent:
    """Something the executor did that the campaign's event log should say: a worker started,
    lost, quarantined; a batch re-queued or kept waiting. The driver writes them to the store
    (kinds: worker_started, worker_lost, requeued, quarantined, waiting, waited)."""

    kind: str
    message: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BatchTrace:
    """When one batch went through an executor (epoch seconds; for benchmarks): submitted, all
    of its configs compiled, sent to a worker, started and ended in the worker's process (its
    clock: the same machine's for a local worker), and returned to the driver. `compiles`: the
    Triton compiles the worker's GPU process made for it (None: it cannot tell); `wakes`: the
    GPU timer's warm-ups after an idle spell."""

    batch: int
    worker: str
    configs: int  # sent to the worker (those that failed to compile were not)
    submitted: float
    compiled: float
    dispatched: float
    started: float
    ended: float
    returned: float
    compiles: int | None = None
    wakes: int = 0


def idle_with_work(traces: Sequence[BatchTrace], start: float, end: float) -> dict[str, float]:
    """Seconds each worker's process sat idle between `start` and `end` while some compiled batch
    waited to start (on any worker): the time a GPU waited with work ready for it. A worker counts
    from `start`, and up to `end` only once it started a batch (one that never did is not known
    to be up)."""
    waiting = _union([(t.compiled, t.started) for t in traces if t.started > t.compiled])
    out: dict[str, float] = {}
    for worker in sorted({t.worker for t in traces}):
        runs = sorted((t.started, t.ended) for t in traces if t.worker == worker)
        idle, free = [], start
        for begun, ended in runs:
            if begun > free:
                idle.append((free, begun))
            free = max(free, ended)
        if end > free:
            idle.append((free, end))
        out[worker] = sum(_overlap(gap, waiting) for gap in idle)
    return out


def _union(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _overlap(span: tuple[float, float], disjoint: Sequence[tuple[float, float]]) -> float:
    return sum(max(0.0, min(span[1], b) - max(span[0], a)) for a, b in disjoint)


class NoWorkerLeft(TilepilotError):
    """Every worker of the executor is quarantined, or none has been reachable for too long."""


@dataclass(frozen=True)
class Verdict:
    """A winner re-checked on fresh inputs."""

    passed: bool
    max_rel_err: float
    message: str


class Executor(ABC):
    """Evaluates batches. Not thread-safe: one driver thread calls it.

    `environment` and `kernel_version` are fixed once the executor has started; they go into
    every experiment key. Failures of a config come back as Results with a failed status;
    anything raised is a bug or a broken installation.
    """

    backend: str
    environment: Environment
    kernel_version: str

    @abstractmethod
    def free_slots(self) -> int:
        """How many more batches `submit` accepts now."""

    @abstractmethod
    def submit(self, batch: Batch) -> None:
        """Start evaluating a batch (all configs of one problem)."""

    @abstractmethod
    def poll(self, timeout_s: float) -> list[tuple[Batch, list[Result]]]:
        """Finished batches, each with one Result per config in order; waits up to timeout_s."""

    @abstractmethod
    def in_flight(self) -> int:
        """Batches submitted and not yet returned by `poll`."""

    @abstractmethod
    def remeasure(self, problem: Problem, configs: Sequence[Config]) -> list[Result]:
        """Re-time the top candidates interleaved before a winner is declared."""

    @abstractmethod
    def recheck(self, problem: Problem, config: Config) -> Verdict | None:
        """Verify the winner on fresh inputs; None where the backend cannot (replay)."""

    @abstractmethod
    def baseline(self, problem: Problem) -> tuple[str, Timing] | None:
        """The vendor library's timing for the problem (name, timing), where there is one."""

    def samples(self) -> list[GpuSample]:
        """NVML samples of the executor's GPUs since the last call; [] without GPUs."""
        return []

    def ceilings(self) -> dict[str, DeviceCeilings]:
        """Measure the ceilings of the executor's devices now: one measurement per distinct (device,
        driver), keyed by the worker that took it. {} where nothing real runs (replay, interpret)."""
        return {}

    def running(self) -> dict[str, str]:
        """Worker id -> what it runs now, for the dashboard."""
        return {}

    def withdraw(self) -> list[Batch]:
        """Take back the submitted batches no worker holds yet (a person paused or stopped the
        campaign: what runs finishes, nothing new starts); they no longer count as in flight. []
        where every submitted batch is with a worker at once."""
        return []

    def events(self) -> list[ExecutorEvent]:
        """What happened to the executor's workers since the last call (oldest first); [] by default."""
        return []

    def close(self) -> None:  # noqa: B027 - a no-op hook
        """Stop workers and release resources."""


def record_ceilings(executor: Executor, store: Store, campaign_id: int) -> list[DeviceCeilings]:
    """Measure and store the ceilings of the executor's devices unless the store has them for its
    (device, driver) already; returns those stored now. Only the gpu backend measures any."""
    env = executor.environment
    if env.backend != "gpu" or store.ceilings(env.device, env.driver) is not None:
        return []
    stored = []
    for worker, c in executor.ceilings().items():
        if store.ceilings(c.device, c.driver) is None:
            store.set_ceilings(c)
            stored.append(c)
            store.log_event("ceilings", f"{c.device} (driver {c.driver}): copy {c.copy_gbps:.0f} GB/s, "
                            f"{c.matmul_dtype} matmul {c.matmul_tflops:.0f} TFLOP/s, measured by {worker}",
                            campaign_id=campaign_id,
                            data={"device": c.device, "driver": c.driver, "copy_gbps": c.copy_gbps,
                                  "matmul_tflops": c.matmul_tflops})
            log.info("ceilings of %s (driver %s): copy %.0f GB/s, matmul %.0f TFLOP/s", c.device, c.driver,
                     c.copy_gbps, c.matmul_tflops)
    return stored
