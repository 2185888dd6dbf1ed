"""`ReplayExecutor`: answers batches from a recorded dataset, in process, instantly."""

from __future__ import annotations

from collections.abc import Sequence

from tilepilot.experiments import Config, Environment, Problem, Result, Timing
from tilepilot.orchestrator.executor import Batch, Executor, Verdict
from tilepilot.orchestrator.replay import ReplayDataset


class ReplayExecutor(Executor):
    backend = "replay"

    def __init__(self, dataset: ReplayDataset, *, slots: int = 4) -> None:
        self.dataset = dataset
        first = next(iter(dataset.records(dataset.problems[0]).values()))
        self.environment = Environment(
            backend="replay", device=dataset.device, torch=first.env.torch,
            triton=first.env.triton, driver=first.env.driver)
        self.kernel_version = dataset.identity
        self._slots = slots
        self._done: list[tuple[Batch, list[Result]]] = []

    def free_slots(self) -> int:
        return self._slots - len(self._done)

    def submit(self, batch: Batch) -> None:
        self._done.append((batch, [self.dataset.result(batch.problem, c) for c in batch.configs]))

    def poll(self, timeout_s: float) -> list[tuple[Batch, list[Result]]]:
        done, self._done = self._done, []
        return done

    def in_flight(self) -> int:
        return len(self._done)

    def remeasure(self, problem: Problem, configs: Sequence[Config]) -> list[Result]:
        """A recording cannot be re-timed: the recorded results stand, with their spread."""
        return [self.dataset.result(problem, c) for c in configs]

    def recheck(self, problem: Problem, config: Config) -> Verdict | None:
        return None

    def baseline(self, problem: Problem) -> tuple[str, Timing] | None:
        return self.dataset.baseline(problem)
