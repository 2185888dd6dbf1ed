"""Re-scoring a problem's queued configs as results arrive, and the regions known to fail.

After each collected batch the driver re-scores the queued entries (not yet compiling or
running) of the problems that got results. Each entry is placed in one of three tiers:

- up: it tests a hypothesis the results so far make likely (its paired effect beyond the
  noise, `LIKELY_PAIRS` pairs or more), or it carries the faster value of a hypothesis this
  campaign validated for the problem (`param = a` where "a beats b" holds in scope);
- down: it tests a hypothesis that is decided or given up (validated, ruled out,
  inconclusive: its pair is no longer needed), or it carries the slower value of a validated one;
- the rest keep their tier.

Within a tier the entries keep their order, except that entries the proposer can predict
(`Proposer.score`) are sorted by predicted time among the places they hold; entries that test
an open hypothesis are not sorted by speed (they are there for what they teach). The new
order takes over the problem's existing priorities (its slots), so the problems' turns in the
queue do not change, only which config takes each turn. Pinned and promoted entries (a
person's choice) are left where they are.

`FailureRegions`: a result that came back `compile_error` or `out_of_resources` marks the
configs that must fail the same way. Exact: the same config on a problem with the same
specialisation (`KernelFamily.specialisation`) compiles to the same kernel. Class (out of
resources only, in spaces with a tile model): a config of the same specialisation whose tile
needs the same shared memory and registers per thread, with the same warps. Such queued
configs are dropped unmeasured, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tilepilot.agents.tile_model import estimate, has_model
from tilepilot.experiments import Config, Hypothesis, Problem, Result, Status, same_value
from tilepilot.experiments.hypothesis import HypothesisState
from tilepilot.kernels.base import KernelFamily

PROMOTED = "promoted by a person"
PINNED = "pinned by a person"
LIKELY_PAIRS = 2  # paired results before an open hypothesis' effect counts as likely
UP, KEEP, DOWN = 1, 0, -1

Predict = Callable[[Sequence[Config]], list[tuple[float | None, str]]]


@dataclass(frozen=True)
class Entry:
    """A queued row as the scorer sees it, in the problem's current dispatch order."""

    id: int
    config: Config
    hypothesis_id: str | None
    priority: float
    reason: str


@dataclass(frozen=True)
class HypothesisStatus:
    """A hypothesis of this campaign with its latest verdict's figures."""

    hypothesis: Hypothesis
    state: HypothesisState
    pairs: int
    effect: float | None  # geometric mean of median_ms(b) / median_ms(a); > 1: a faster
    noise: float | None


@dataclass(frozen=True)
class Move:
    queue_id: int
    config: Config
    before: int  # 1-based place among the problem's re-scored entries
    after: int
    reason: str


@dataclass(frozen=True)
class Rescored:
    updates: tuple[tuple[int, float, str], ...]  # (queue id, priority, reason) that changed
    moves: tuple[Move, ...]  # biggest first

    def message(self, problem: Problem, top: int = 3) -> str:
        parts = [f"{m.config.label()} {_arrow(m)} {m.before}→{m.after}: {m.reason.split('; ')[0]}"
                 for m in self.moves[:top]]
        more = f"; {len(self.moves) - top} more" if len(self.moves) > top else ""
        return f"queue of {problem.label()} re-scored, {len(self.moves)} moved: " + "; ".join(parts) + more

    def data(self, problem: Problem) -> dict[str, object]:
        return {"problem": problem.key(), "moves": [
            {"queue_id": m.queue_id, "config": m.config.as_dict(), "from": m.before, "to": m.after,
             "reason": m.reason} for m in self.moves]}


def _arrow(m: Move) -> str:
    return "up" if m.after < m.before else "down"


def rescore(problem: Problem, entries: Sequence[Entry], *, predict: Predict | None,
            hypotheses: Sequence[HypothesisStatus]) -> Rescored:
    """The new order of `entries` (see the module docstring); nothing when nothing changes."""
    if not entries:
        return Rescored((), ())
    tiers: list[tuple[int, str]] = [tier_of(problem, e.config, e.hypothesis_id, hypotheses) for e in entries]
    sortable = [i for i, e in enumerate(entries) if tiers[i][0] != KEEP or not _tests_open(e, hypotheses)]
    scores: dict[int, tuple[float, str]] = {}
    if predict is not None and sortable:
        for i, (ms, why) in zip(sortable, predict([entries[i].config for i in sortable]), strict=True):
            if ms is not None:
                scores[i] = (ms, why)
    order: list[int] = []
    for tier in (UP, KEEP, DOWN):
        members = [i for i in range(len(entries)) if tiers[i][0] == tier]
        order.extend(_sorted_in_place(members, scores))
    slots = sorted((e.priority for e in entries), reverse=True)
    reasons = _reasons(entries, order, tiers, scores)
    updates: list[tuple[int, float, str]] = []
    moves: list[Move] = []
    for after, i in enumerate(order):
        e = entries[i]
        if slots[after] != e.priority or reasons[i] != e.reason:
            updates.append((e.id, slots[after], reasons[i]))
        if after != i:
            moves.append(Move(e.id, e.config, i + 1, after + 1, reasons[i]))
    moves.sort(key=lambda m: (-abs(m.after - m.before), m.after))
    return Rescored(tuple(updates), tuple(moves))


def _sorted_in_place(members: list[int], scores: dict[int, tuple[float, str]]) -> list[int]:
    """Members in their order, the predicted ones sorted by prediction among the places they hold."""
    predicted = sorted((i for i in members if i in scores), key=lambda i: (scores[i][0], i))
    it = iter(predicted)
    return [next(it) if i in scores else i for i in members]


def _reasons(entries: Sequence[Entry], order: list[int], tiers: list[tuple[int, str]],
             scores: dict[int, tuple[float, str]]) -> dict[int, str]:
    ranked = sorted(scores, key=lambda i: (scores[i][0], i))
    rank = {i: n for n, i in enumerate(ranked, start=1)}
    out: dict[int, str] = {}
    for i in order:
        tier, why = tiers[i]
        parts = [why] if tier != KEEP else []
        if i in scores:
            parts.append(f"{scores[i][1]}; {_ordinal(rank[i])} fastest of {len(ranked)} predicted")
        out[i] = "; ".join(parts) if parts else entries[i].reason
    return out


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _tests_open(e: Entry, hypotheses: Sequence[HypothesisStatus]) -> bool:
    return e.hypothesis_id is not None and any(
        h.hypothesis.id == e.hypothesis_id and not h.state.terminal for h in hypotheses)


def tier_of(problem: Problem, config: Config, hypothesis_id: str | None,
            hypotheses: Sequence[HypothesisStatus]) -> tuple[int, str]:
    """UP, KEEP or DOWN with the reason (empty for KEEP), for a queued config of `problem` that
    tests `hypothesis_id` (or none)."""
    if hypothesis_id is not None:
        h = next((h for h in hypotheses if h.hypothesis.id == hypothesis_id), None)
        if h is not None:
            return _test_tier(h)
    votes = 0
    why: list[str] = []
    for h in hypotheses:
        hyp = h.hypothesis
        if h.state is not HypothesisState.VALIDATED or not hyp.scope.contains(problem):
            continue
        value = config.get(hyp.param)
        if same_value(value, hyp.a):
            votes += 1
            why.append(f"{hyp.param}={hyp.a}, which validated {hyp.id} says beats {hyp.param}={hyp.b} here")
        elif same_value(value, hyp.b):
            votes -= 1
            why.append(f"{hyp.param}={hyp.b}, which validated {hyp.id} says loses to {hyp.param}={hyp.a} here")
    if votes > 0:
        return UP, "moved up: " + "; ".join(why)
    if votes < 0:
        return DOWN, "moved down: " + "; ".join(why)
    return KEEP, ""


def _test_tier(h: HypothesisStatus) -> tuple[int, str]:
    hid = h.hypothesis.id
    if h.state is HypothesisState.RULED_OUT:
        return DOWN, f"moved down: tests {hid}, which the results ruled out"
    if h.state is HypothesisState.VALIDATED:
        return DOWN, f"moved down: tests {hid}, validated already"
    if h.state is HypothesisState.INCONCLUSIVE:
        return DOWN, f"moved down: tests {hid}, given up as inconclusive"
    noise = h.noise or 0.0
    if h.pairs >= LIKELY_PAIRS and h.effect is not None and h.effect > 1.0 + noise:
        return UP, (f"moved up: tests {hid}, which the last {2 * h.pairs} results made likely "
                    f"({h.effect:.2f}x over {h.pairs} pairs)")
    return KEEP, ""


# ---- failure regions ---------------------------------------------------------------------------

class FailureRegions:
    """Configs that must fail like a result that came back compile_error or out_of_resources."""

    STATUSES = (Status.COMPILE_ERROR, Status.OUT_OF_RESOURCES)

    def __init__(self, family: KernelFamily) -> None:
        self.family = family
        self._exact: dict[tuple[str, str], str] = {}  # (specialisation, config key) -> reason
        self._class: dict[tuple[str, tuple[int, int, int]], str] = {}  # (specialisation, resources) -> reason

    def __bool__(self) -> bool:
        return bool(self._exact)

    def __len__(self) -> int:
        """Regions known: each new one adds an exact region."""
        return len(self._exact)

    def learn(self, result: Result) -> bool:
        """Take in a result; True when it marks a new region."""
        if result.status not in self.STATUSES:
            return False
        p, c = result.problem, result.config
        spec = self.family.specialisation(p, c)
        key = (spec, c.key())
        if key in self._exact:
            return False
        self._exact[key] = (f"dropped: compiles to the same kernel as {c.label()} on {p.label()}, "
                            f"which failed with {result.status}")
        resources = _resources(p, c) if result.status is Status.OUT_OF_RESOURCES else None
        if resources is not None:
            self._class.setdefault((spec, resources), (
                f"dropped: needs the same shared memory ({resources[0] / 1024:.0f} KiB), registers and warps "
                f"as {c.label()}, which ran out of resources on {p.label()}"))
        return True

    def match(self, problem: Problem, config: Config) -> str | None:
        """Why (problem, config) must fail, or None."""
        if not self._exact:
            return None
        spec = self.family.specialisation(problem, config)
        exact = self._exact.get((spec, config.key()))
        if exact or not self._class:
            return exact
        resources = _resources(problem, config)
        return self._class.get((spec, resources)) if resources is not None else None


def _resources(problem: Problem, config: Config) -> tuple[int, int, int] | None:
    """Shared bytes, registers per thread and warps of the tile model's estimate; None without a model."""
    if not has_model(problem, config):
        return None
    est = estimate(problem, config)
    return est.shared_bytes, round(est.regs), est.tile.warps
