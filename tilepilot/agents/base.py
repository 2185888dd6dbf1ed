"""The proposer contract: `propose(state, n)` and `observe(results)`.

One proposer instance serves one problem of one campaign. It never touches a GPU: it sees
the space, the problem and the results the driver hands it.

Contract, for every implementation:
- `propose` returns at most `n` candidates, none of whose configs is in `state.seen` (tried
  or pending), no two alike, each with the proposer's `name` and a one-line rationale.
  An empty list means the proposer has nothing more to offer for this problem.
- Proposed configs may be invalid for the problem; the driver checks them against the
  space's constraints, records `invalid` and passes that result to `observe` (free of budget).
- `observe` receives every result for the problem, including those of configs that other
  proposers chose or that were already in the store. It must accept each result once.
- Deterministic for a given seed and sequence of calls (except `llm`: a model's reply is not).
- Proposers never write to the store. What they have to record beyond their candidates (calls
  to a model, hypotheses they state, notes for the event log) they hand over through
  `drain_records`, which the driver calls after each `propose` and once after `close`, and
  stores.
- `unavailable()` says, before any instance is built, why the proposer cannot run here (e.g. no
  API key); the registry refuses to hand out such a proposer.
- `score(configs)` (optional) predicts configs that are queued, so the driver can reorder its
  queue as results arrive: one (predicted_ms or None, one-line reason) per config, in order,
  from what the proposer has observed so far; it must not change what `propose` returns next.
  The default predicts nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

from tilepilot.experiments import Candidate, Config, Hypothesis, Problem, Result, SearchSpace
from tilepilot.experiments.llm_call import LlmCall

if TYPE_CHECKING:
    from tilepilot.storage.ledger import HypothesisRow, LearningRow


class LedgerReader(Protocol):
    """Read-only access to the hypothesis ledger (what the driver lets proposers consult)."""

    def hypotheses(self, *, kernel: str | None = None, device: str | None = None,
                   campaign_id: int | None = None) -> list[HypothesisRow]: ...

    def learnings(self, *, kernel: str | None = None, device: str | None = None) -> list[LearningRow]: ...


class HistoryReader(Protocol):
    """Read-only access to the results the store holds (what the driver lets proposers consult)."""

    def devices(self, kernel: str) -> list[str]: ...

    def measured_problems(self, kernel: str, device: str) -> list[Problem]: ...

    def measured(self, kernel: str, device: str, problem: Problem) -> list[tuple[Config, float]]: ...

    def kernel_versions(self, kernel: str, device: str, problem: Problem) -> frozenset[str]: ...


@dataclass(frozen=True)
class ProposerContext:
    kernel: str
    problem: Problem
    space: SearchSpace  # for replay: restricted to the recorded configs
    seed: int
    budget: int  # distinct configs that will be measured for this problem
    device: str = ""  # the device the results come from ("" where unknown)
    ledger: LedgerReader | None = None  # hypotheses and learnings so far (None: none to consult)
    members: tuple[str, ...] = ()  # a portfolio's member proposers, from the campaign (empty: its defaults)
    history: HistoryReader | None = None  # results of earlier campaigns (None: a cold start)
    kernel_version: str = ""  # the version of the kernel the campaign measures ("": unknown)


@dataclass(frozen=True)
class ProposerRecords:
    """What a proposer hands the driver to store (see `Proposer.drain_records`)."""

    llm_calls: tuple[LlmCall, ...] = ()
    hypotheses: tuple[Hypothesis, ...] = ()  # statements it wants tested; the lab decides which it takes
    notes: tuple[str, ...] = ()  # one-line messages for the event log

    def __bool__(self) -> bool:
        return bool(self.llm_calls or self.hypotheses or self.notes)

    def __add__(self, other: ProposerRecords) -> ProposerRecords:
        return ProposerRecords(self.llm_calls + other.llm_calls, self.hypotheses + other.hypotheses,
                               self.notes + other.notes)


class SeenConfigs(Set[Config]):
    """The configs of a `SearchState` tried, pending or dropped: a read-only live view of the three,
    so asking costs nothing however many results there are. A membership test looks in each; counting
    or iterating takes their union (set operations such as `|` give a plain set)."""

    __slots__ = ("_parts",)

    def __init__(self, results: Mapping[Config, Result], pending: Set[Config], dropped: Set[Config]) -> None:
        self._parts = (results, pending, dropped)

    def __contains__(self, config: object) -> bool:
        return any(config in part for part in self._parts)

    def __iter__(self) -> Iterator[Config]:
        return iter(self._union())

    def __len__(self) -> int:
        return len(self._union())

    def _union(self) -> set[Config]:
        results, pending, dropped = self._parts
        return set(results).union(pending, dropped)

    @classmethod
    def _from_iterable(cls, it: Iterable[Config]) -> set[Config]:
        return set(it)

    def __repr__(self) -> str:
        return f"SeenConfigs({self._union()!r})"


@dataclass
class SearchState:
    """What the driver knows of one problem: finished results and configs in flight."""

    results: dict[Config, Result] = field(default_factory=dict)
    pending: set[Config] = field(default_factory=set)
    dropped: set[Config] = field(default_factory=set)  # taken off the queue unmeasured: never proposed again

    @property
    def seen(self) -> SeenConfigs:
        """Tried, pending or dropped: a live read-only view (see `SeenConfigs`), not a copy."""
        return SeenConfigs(self.results, self.pending, self.dropped)

    def best(self) -> Result | None:
        ok = [r for r in self.results.values() if r.median_ms is not None]
        return min(ok, key=lambda r: r.median_ms or 0.0) if ok else None


class Proposer(ABC):
    name: ClassVar[str]
    # A sweep means to measure every config it proposes: the driver drops none of them for a
    # failure elsewhere (a person still may).
    exhaustive: ClassVar[bool] = False

    def __init__(self, ctx: ProposerContext) -> None:
        self.ctx = ctx

    @abstractmethod
    def propose(self, state: SearchState, n: int) -> list[Candidate]:
        """Up to n new candidates (see the module docstring)."""

    def observe(self, results: Sequence[Result]) -> None:  # noqa: B027 - a no-op hook
        """Learn from finished results. The default ignores them."""

    def _check_problem(self, result: Result) -> None:
        """Refuse a result of another problem: each proposer serves one."""
        if result.problem != self.ctx.problem:
            raise ValueError(f"result for {result.problem.label()} given to the proposer of "
                             f"{self.ctx.problem.label()}")

    def close(self) -> None:  # noqa: B027 - a no-op hook
        """Release resources (threads, studies). Called once when the campaign ends."""

    def drain_records(self) -> ProposerRecords:
        """What the proposer recorded since the last call, handed over once. The default: nothing."""
        return ProposerRecords()

    def best_prediction(self) -> float | None:
        """The time `score` predicts for the config the proposer would propose first now, or None
        where it predicts nothing (the default). Warm start queues a winner of a nearby problem
        first only where `score` puts it no slower than this."""
        return None

    def score(self, configs: Sequence[Config]) -> list[tuple[float | None, str]]:
        """Predicted median_ms of each config with a one-line reason; (None, "") where the proposer
        cannot tell. The default predicts nothing."""
        return [(None, "")] * len(configs)

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this proposer cannot run here (one line), or None when it can."""
        return None


ProposerFactory = type[Proposer]
Registry = Mapping[str, str]
