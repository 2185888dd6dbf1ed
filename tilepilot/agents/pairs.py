"""Observations and pairs: the data the hypothesis judge and miner work on.

An `Observation` is one `ok` result with its experiment key. A `Pair` is two observations of
the same problem whose configs differ only in one parameter: the unit of evidence for a
hypothesis about that parameter.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

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
