"""The executor contract: where the driver sends batches of configs to be evaluated.

The driver never knows whether a number comes from a GPU, the interpreter or a recording:
it submits `Batch`es and polls for their results. Implementations: `ReplayExecutor`
(recorded measurements, in process) and `RayExecutor` (Ray workers, gpu or interpret).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from tilepilot.experiments import Config, Environment, GpuSample, Problem, Result, Timing


@dataclass(frozen=True)
class Batch:
    id: int
    problem: Problem
    configs: tuple[Config, ...]
    queue_ids: tuple[int, ...]  # the queue rows these configs came from, same order


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

    def running(self) -> dict[str, str]:
        """Worker id -> what it runs now, for the dashboard."""
        return {}

    def close(self) -> None:  # noqa: B027 - a no-op hook
        """Stop workers and release resources."""
