"""Observations and pairs: the data the hypothesis judge and miner work on.

An `Observation` is one `ok` result with its experiment key. A `Pair` is two observations of
the same problem whose configs differ only in one parameter: the unit of evidence for a
hypothesis about that parameter.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tilepilot.experiments import Config, Problem, Result, canonical_json
from tilepilot.experiments.hypothesis import Hypothesis


@dataclass(frozen=True)
class Observation:
    key: str  # the experiment key ("" where there is none, e.g. a dataset line)
    problem: Problem
    config: Config
    median_ms: float
    rel_spread: float  # (p80 - p20) / median of the repetitions
    tests: str | None = None  # the hypothesis this experiment was queued to test, if any

    @classmethod
    def of(cls, key: str, result: Result, tests: str | None = None) -> Observation | None:
        """The observation of an ok result; None for any other status."""
        if result.timing is None:
            return None
        return cls(key, result.problem, result.config, result.timing.median_ms, result.timing.rel_spread, tests)


@dataclass(frozen=True)
class Pair:
    a: Observation  # param = hypothesis.a
    b: Observation  # param = hypothesis.b, everything else equal

    @property
    def ratio(self) -> float:
        """median_ms(b) / median_ms(a): above 1 when a is faster."""
        return self.b.median_ms / self.a.median_ms

    @property
    def spread(self) -> float:
        return max(self.a.rel_spread, self.b.rel_spread)


def find_pairs(h: Hypothesis, observations: Iterable[Observation], *, drawn: bool = False) -> list[Pair]:
    """Every pair for `h` among the observations in its scope, in a stable order; `drawn`: only
    the pairs drawn to test it (a side queued for `h`)."""
    if drawn:
        return _drawn_pairs(h, observations)
    sides: dict[tuple[str, str], dict[int, Observation]] = {}
    a_key, b_key = canonical_json({"v": h.a}), canonical_json({"v": h.b})
    for o in observations:
        if h.param not in o.config or not h.scope.contains(o.problem):
            continue
        value = canonical_json({"v": o.config[h.param]})
        side = 0 if value == a_key else 1 if value == b_key else None
        if side is None:
            continue
        rest = canonical_json({k: v for k, v in o.config.items() if k != h.param})
        sides.setdefault((o.problem.key(), rest), {})[side] = o
    return [Pair(s[0], s[1]) for _, s in sorted(sides.items()) if len(s) == 2]


def _drawn_pairs(h: Hypothesis, observations: Iterable[Observation]) -> list[Pair]:
    obs = list(observations)
    index = {(o.problem, o.config): o for o in obs}
    found: dict[tuple[str, str], Pair] = {}
    for o in obs:
        if o.tests != h.id or h.param not in o.config or not h.scope.contains(o.problem):
            continue
        value = o.config[h.param]
        if type(value) is type(h.a) and value == h.a:
            other = index.get((o.problem, Config.of({**o.config.as_dict(), h.param: h.b})))
            pair = Pair(o, other) if other else None
        elif type(value) is type(h.b) and value == h.b:
            other = index.get((o.problem, Config.of({**o.config.as_dict(), h.param: h.a})))
            pair = Pair(other, o) if other else None
        else:
            pair = None
        if pair is not None:
            found[(pair.a.problem.key(), pair.a.config.key())] = pair
    return [found[k] for k in sorted(found)]


class PairIndex:
    """The drawn pairs of every hypothesis over a campaign's observations, kept up to date as
    observations arrive: `add` indexes new ones, `drawn(h)` gives what `find_pairs(h, ..., drawn=True)`
    gives over everything added so far, looking only at what arrived since `h` was last asked
    (its own drawn observations and those still waiting for their flip)."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[Problem, Config], Observation] = {}
        self._tests: dict[str, list[Observation]] = {}  # drawn observations by hypothesis id, in arrival order
        self._state: dict[str, _Drawn] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def add(self, observations: Iterable[Observation]) -> None:
        for o in observations:
            key = (o.problem, o.config)
            if key in self._by_key:  # observed twice: the later one counts, as in find_pairs; pair again
                self._state.clear()
            self._by_key[key] = o
            if o.tests is not None:
                self._tests.setdefault(o.tests, []).append(o)

    def drawn(self, h: Hypothesis) -> list[Pair]:
        st = self._state.get(h.id)
        if st is None or (st.hypothesis is not h and st.hypothesis != h):
            st = self._state[h.id] = _Drawn(h)
        tested = self._tests.get(h.id, [])
        for o in tested[st.read:]:
            other = _flip_of(h, o)
            if other is not None:
                st.waiting.append((o, other))
        st.read = len(tested)
        still = []
        for o, (side, key) in st.waiting:
            partner = self._by_key.get(key)
            if partner is None:
                still.append((o, (side, key)))
                continue
            pair = Pair(o, partner) if side == 0 else Pair(partner, o)
            st.found[(pair.a.problem.key(), pair.a.config.key())] = pair
            st.pairs = None
        st.waiting = still
        if st.pairs is None:
            st.pairs = [st.found[k] for k in sorted(st.found)]
        return list(st.pairs)


@dataclass
class _Drawn:
    hypothesis: Hypothesis
    read: int = 0  # drawn observations of the hypothesis looked at
    waiting: list[tuple[Observation, tuple[int, tuple[Problem, Config]]]] = field(default_factory=list)
    found: dict[tuple[str, str], Pair] = field(default_factory=dict)
    pairs: list[Pair] | None = None  # found, in key order (None: to sort again)


def _flip_of(h: Hypothesis, o: Observation) -> tuple[int, tuple[Problem, Config]] | None:
    """The side of `h` a drawn observation is on, and the key of its flip; None when it is on neither
    side or out of scope (as `_drawn_pairs` skips it)."""
    if h.param not in o.config or not h.scope.contains(o.problem):
        return None
    value = o.config[h.param]
    if type(value) is type(h.a) and value == h.a:
        return 0, (o.problem, Config.of({**o.config.as_dict(), h.param: h.b}))
    if type(value) is type(h.b) and value == h.b:
        return 1, (o.problem, Config.of({**o.config.as_dict(), h.param: h.a}))
    return None
