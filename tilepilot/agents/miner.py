"""The hypothesis miner: from the results so far to falsifiable statements and their experiments.

Once most problems have a few ok results, for each of them a ridge regression of log(median_ms) on one-hot
parameter values (a main-effects model) estimates, for each pair of adjacent values of each
parameter, the paired effect of switching one for the other. A statement "p=a beats p=b when
SCOPE" is proposed where the estimate is large enough and agrees in sign over most problems of
the scope; scopes are every problem, one-sided thresholds on a numeric problem dimension
between the campaign's problems ("M ≤ 64", "K ≥ 4096") and equality on a categorical one.

Not proposed: a statement the ledger holds already; one whose question (parameter and values)
an active or decided hypothesis asks of overlapping problems (it would restate, imply or
contradict it); one with no budget left in scope to test it.

The experiments that settle a hypothesis are random pairs: a config drawn from the valid
configs of a problem in scope and the same config with the parameter flipped, the problems in
scope taking turns and the draws balanced over the values of the other parameters and their
combinations. Only such
drawn pairs are evidence (see `hypotheses.judge`): the configs a proposer chose, or the best
config and its flip, are not a fair sample of the scope; on the recorded H100 grid, pairs near
the optimum can even reverse the sign of an effect that holds over the scope.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tilepilot.agents.pairs import Observation
from tilepilot.experiments import Candidate, Config, Problem, SearchSpace, Value, same_value
from tilepilot.experiments.hypothesis import Bound, Hypothesis, HypothesisState, Scope, statement_key
from tilepilot.experiments.values import canonical_json

NAME = "hypotheses"  # the proposer name on the candidates the miner queues
MAX_ACTIVE = 3  # hypotheses under test at once, per campaign
MIN_OBS = 4  # ok results a problem needs before it feeds the miner
MIN_READY = 0.5  # share of the campaign's problems with MIN_OBS results before anything is proposed
MIN_SIGNAL = math.log(1.03)  # estimated effect a statement needs (in log time)
MIN_AGREEMENT = 0.8  # share of the scope's problems whose estimate has the statement's sign
MIN_COVERAGE = 0.5  # share of the scope's problems that have an estimate at all
RIDGE = 1.0


@dataclass(frozen=True)
class LedgerEntry:
    hypothesis: Hypothesis
    state: HypothesisState
    here: bool = False  # stated in this campaign (then even an inconclusive one is not restated)


@dataclass(frozen=True)
class _Claim:
    param: str
    a: Value  # faster, by the estimate
    b: Value
    scope: Scope
    estimate: float  # mean log(t_b / t_a) over the scope's problems with an estimate
    agreement: float
    problems: int  # problems with an estimate

    @property
    def score(self) -> float:
        return abs(self.estimate) * self.agreement * math.sqrt(self.problems)


def room_in_scope(h: Hypothesis, room: Mapping[Problem, int]) -> int:
    return sum(n for p, n in room.items() if n > 0 and h.scope.contains(p))


def candidate_scopes(problems: Sequence[Problem]) -> list[tuple[Scope, tuple[Problem, ...]]]:
    """Scopes worth stating over these problems, each with its members; one per distinct set."""
    out: list[tuple[Scope, tuple[Problem, ...]]] = []
    sets: set[frozenset[str]] = set()

    def add(scope: Scope) -> None:
        members = tuple(p for p in problems if scope.contains(p))
        keys = frozenset(p.key() for p in members)
        if members and keys not in sets:
            sets.add(keys)
            out.append((scope, members))

    add(Scope())
    names = list(dict.fromkeys(name for p in problems for name in p))
    for name in names:
        values = [p[name] for p in problems if name in p]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            distinct = sorted(set(values))
            for lo, hi in itertools.pairwise(distinct):
                add(Scope.of([Bound(name, "<=", lo)]))
                add(Scope.of([Bound(name, ">=", hi)]))
        else:
            for v in dict.fromkeys(values):
                add(Scope.of([Bound(name, "=", v)]))
    return out


class HypothesisMiner:
    def __init__(self, *, kernel: str, device: str, origin: str, spaces: Mapping[Problem, SearchSpace],
                 seed: int = 0) -> None:
        self.kernel = kernel
        self.device = device
        self.origin = origin
        self.spaces = dict(spaces)
        self.seed = seed
        self.scopes = candidate_scopes(list(self.spaces))
        self.choices = _choices(list(self.spaces.values()))
        self._pairs: dict[tuple[str, str, str, Problem], list[tuple[Config, Config]]] = {}
        self._drawn: dict[str, Counter[tuple[str, ...]]] = {}  # per hypothesis: other parameters' values drawn
        self._columns = [(p, v) for p, values in self.choices.items() for v in values]  # every one-hot column
        self._read: dict[Problem, _Rows] = {}  # per problem: the observations fitted so far

    # ---- statements --------------------------------------------------------------------------
    def mine(self, observations: Sequence[Observation], *, known: Sequence[LedgerEntry],
             room: Mapping[Problem, int], max_new: int) -> list[Hypothesis]:
        """Up to `max_new` new hypotheses, strongest signal first (see the module docstring)."""
        if max_new <= 0:
            return []
        by_problem: dict[Problem, list[Observation]] = {}
        last: Problem | None = None
        bucket: list[Observation] | None = None
        for o in observations:  # a run of one problem's observations is grouped without hashing each
            if o.problem is not last:
                last = o.problem
                bucket = by_problem.setdefault(last, []) if last in self.spaces else None
            if bucket is not None:
                bucket.append(o)
        estimates = {p: self._fitted(p, obs) for p, obs in by_problem.items() if len(obs) >= MIN_OBS}
        if not estimates or len(estimates) < MIN_READY * len(self.spaces):
            return []
        min_problems = 2 if len(estimates) >= 2 else 1
        claims = [c for c in self._claims(estimates, min_problems)]
        claims.sort(key=lambda c: (-c.score, c.param, str(c.a), c.scope.key()))
        chosen: list[Hypothesis] = []
        asked = _Questions(known)
        for c in claims:
            if asked.blocks(self.kernel, self.device, c.param, c.a, c.b, c.scope):
                continue
            h = Hypothesis.new(origin=self.origin, kernel=self.kernel, device=self.device, param=c.param,
                               a=c.a, b=c.b, scope=c.scope, rationale=self._why(c, by_problem))
            if room_in_scope(h, room) < 2:
                continue  # no budget left in scope to draw a pair
            chosen.append(h)
            asked.add(LedgerEntry(h, HypothesisState.PROPOSED))
            if len(chosen) == max_new:
                break
        return chosen

    def _claims(self, estimates: Mapping[Problem, Mapping[tuple[str, Value, Value], float]],
                min_problems: int) -> list[_Claim]:
        out: list[_Claim] = []
        for param, values in self.choices.items():
            for a, b in itertools.pairwise(values):
                for scope, members in self.scopes:
                    with_data = [p for p in members if p in estimates]
                    e = [estimates[p][(param, a, b)] for p in with_data if (param, a, b) in estimates[p]]
                    if len(e) < min_problems or len(e) < MIN_COVERAGE * len(members):
                        continue
                    mean = sum(e) / len(e)
                    agreement = sum(x * mean > 0 for x in e) / len(e)
                    if abs(mean) < MIN_SIGNAL or agreement < MIN_AGREEMENT:
                        continue
                    fast, slow = (a, b) if mean > 0 else (b, a)
                    out.append(_Claim(param, fast, slow, scope, abs(mean), agreement, len(e)))
        return out

    def _fitted(self, problem: Problem, obs: list[Observation]) -> dict[tuple[str, Value, Value], float]:
        """`_effects(obs)`, reading only the observations that came since the last call: a campaign's
        driver mines after every batch, and each problem's observations only grow. The one-hot rows
        of those read already are kept, so the fit sees the same matrix, bit for bit, as one built
        from scratch; a problem whose observations did not change is not fitted again."""
        rows = self._read.get(problem)
        if rows is None or len(obs) < len(rows.obs) or obs[:len(rows.obs)] != rows.obs:  # identity first
            rows = self._read[problem] = _Rows(len(self._columns))
        if rows.effects is not None and len(obs) == len(rows.obs):
            return rows.effects
        for o in obs[len(rows.obs):]:
            rows.add(o, self._one_hot(o))
        rows.effects = self._solve(rows.matrix(), rows.ms)
        return rows.effects

    def _effects(self, obs: Sequence[Observation]) -> dict[tuple[str, Value, Value], float]:
        """Ridge main effects: log(t(p=b) / t(p=a)) for adjacent values a, b seen in `obs`."""
        full = np.array([self._one_hot(o) for o in obs]).reshape(len(obs), len(self._columns))
        return self._solve(full, [o.median_ms for o in obs])

    def _one_hot(self, o: Observation) -> list[float]:
        return [1.0 if same_value(o.config.get(p), v) else 0.0 for p, v in self._columns]

    def _solve(self, full: np.ndarray, ms: Sequence[float]) -> dict[tuple[str, Value, Value], float]:
        """The ridge fit on the columns of `full` (one-hot over every column) that some row has."""
        seen = full.any(axis=0)
        cols = [c for c, s in zip(self._columns, seen, strict=True) if s]
        x = np.ascontiguousarray(full[:, seen])
        y = np.log(ms)
        x -= x.mean(axis=0)
        y -= y.mean()
        beta = np.linalg.solve(x.T @ x + RIDGE * np.eye(len(cols)), x.T @ y)
        index = {(p, repr(v)): i for i, (p, v) in enumerate(cols)}
        out: dict[tuple[str, Value, Value], float] = {}
        for p, values in self.choices.items():
            for a, b in itertools.pairwise(values):
                ia, ib = index.get((p, repr(a))), index.get((p, repr(b)))
                if ia is not None and ib is not None:
                    out[(p, a, b)] = float(beta[ib] - beta[ia])
        return out

    def _why(self, c: _Claim, by_problem: Mapping[Problem, list[Observation]]) -> str:
        n = sum(len(obs) for p, obs in by_problem.items() if c.scope.contains(p))
        return (f"a main-effects fit of {n} results on {c.problems} problem(s) in scope puts {c.param}={c.a} "
                f"about {math.exp(c.estimate):.2f}x faster than {c.param}={c.b}, with that sign on "
                f"{c.agreement:.0%} of them")

    # ---- experiments -------------------------------------------------------------------------
    def experiments(self, h: Hypothesis, *, seen: Mapping[Problem, set[Config]], room: Mapping[Problem, int],
                    pairs: int) -> list[Candidate]:
        """Candidates for up to `pairs` new random pairs for `h`: each a config drawn uniformly
        from the problem's valid configs with the parameter at a or b, and its flip; what is not
        measured yet is queued (one or two experiments a pair, at most room[p] per problem, none
        in seen[p]). Problems in scope take turns, so the pairs spread over them."""
        problems = [p for p in self.spaces if h.scope.contains(p) and room.get(p, 0) > 0]
        random.Random(_seed(self.seed, h.id, len(seen))).shuffle(problems)
        draws = {p: self._draws(h, p) for p in problems}
        left = {p: room[p] for p in problems}
        taken = {p: set(seen.get(p, set())) for p in problems}
        out: list[Candidate] = []
        made = 0
        while made < pairs and problems:
            for p in list(problems):
                pair = self._next_pair(h, p, draws[p], taken[p], left[p])
                if pair is None:
                    problems.remove(p)
                    continue
                out.extend(pair)
                left[p] -= len(pair)
                taken[p].update(c.config for c in pair)
                made += 1
                if made == pairs:
                    break
        return out

    def _draws(self, h: Hypothesis, problem: Problem) -> list[tuple[Config, Config]]:
        """The problem's pairs for `h` (both sides valid), in a seeded random order."""
        key = (h.param, repr(h.a), repr(h.b), problem)
        if key not in self._pairs:
            space = self.spaces[problem]
            found = []
            for c in space.valid(problem):
                if same_value(c.get(h.param), h.a):
                    flip = Config.of({**c.as_dict(), h.param: h.b})
                    if space.check(flip, problem) is None:
                        found.append((c, flip))
            self._pairs[key] = found
        out = list(self._pairs[key])
        random.Random(_seed(self.seed, h.id, problem.key())).shuffle(out)
        return out

    def _next_pair(self, h: Hypothesis, problem: Problem, draws: list[tuple[Config, Config]], taken: set[Config],
                   left: int) -> list[Candidate] | None:
        """The next pair, balanced: among the draws, one whose other parameters' values (alone and
        two by two) have been drawn least for `h` so far (ties in the seeded random order), so that
        a few pairs already cover the values of the other parameters and most of their
        combinations: on the H100 grid an effect's tail sits in such combinations (e.g.
        BLOCK_SIZE_N=256 with 4 warps)."""
        counts = self._drawn.setdefault(h.id, Counter())
        fresh = [(a, b) for a, b in draws if a not in taken or b not in taken]
        if not fresh:
            return None
        a, b = min(fresh, key=lambda pair: sum(counts[cell] for cell in _cells(pair[0], h.param)))
        draws.remove((a, b))
        todo = [c for c in (a, b) if c not in taken]
        if len(todo) > left:
            return None
        counts.update(_cells(a, h.param))
        why = f"tests {h.id} ({h.text}): a random pair in scope, {h.param}={h.a} and {h.param}={h.b}"
        return [Candidate(problem, c, NAME, why, hypothesis_id=h.id) for c in todo]


class _Rows:
    """One problem's observations read by the miner: their one-hot rows (in a buffer that doubles
    as it fills), their times, and the effects fitted on them."""

    def __init__(self, width: int) -> None:
        self.obs: list[Observation] = []
        self.ms: list[float] = []
        self._x = np.zeros((16, width))
        self.effects: dict[tuple[str, Value, Value], float] | None = None

    def add(self, o: Observation, row: list[float]) -> None:
        n = len(self.obs)
        if n == len(self._x):
            self._x = np.concatenate([self._x, np.zeros_like(self._x)])
        self._x[n] = row
        self.obs.append(o)
        self.ms.append(o.median_ms)

    def matrix(self) -> np.ndarray:
        return self._x[:len(self.obs)]


def _cells(config: Config, param: str) -> list[tuple[str, ...]]:
    """The values of the other parameters, alone and two by two: what a balanced draw spreads."""
    values = [f"{k}={v!r}" for k, v in config.items() if k != param]
    return [(v,) for v in values] + list(itertools.combinations(values, 2))


class _Questions:
    """The ledger's entries by question (kernel, device, parameter and the two values in either
    order). `blocks` says whether a statement is already stated, or the same question asked of
    overlapping problems by a hypothesis of this campaign, or by one of another campaign that is
    active or decided (an inconclusive one leaves the question open for later campaigns); it takes
    the statement's parts, so a mining round weighs its hundreds of claims, nearly all of them
    asked already, without making a hypothesis of each."""

    def __init__(self, entries: Sequence[LedgerEntry]) -> None:
        self._by: dict[tuple[str, str, str, frozenset[str]], list[LedgerEntry]] = {}
        for e in entries:
            self.add(e)

    @staticmethod
    def _key(kernel: str, device: str, param: str, a: Value, b: Value) -> tuple[str, str, str, frozenset[str]]:
        return kernel, device, param, frozenset((canonical_json({"v": a}), canonical_json({"v": b})))

    def add(self, e: LedgerEntry) -> None:
        g = e.hypothesis
        self._by.setdefault(self._key(g.kernel, g.device, g.param, g.a, g.b), []).append(e)

    def blocks(self, kernel: str, device: str, param: str, a: Value, b: Value, scope: Scope) -> bool:
        same = self._by.get(self._key(kernel, device, param, a, b))
        if not same:
            return False
        key = statement_key(kernel, device, param, a, b, scope)
        return any(e.hypothesis.statement_key == key
                   or ((e.here or e.state is not HypothesisState.INCONCLUSIVE) and e.hypothesis.scope.overlaps(scope))
                   for e in same)


def _blocked(h: Hypothesis, entries: Sequence[LedgerEntry]) -> bool:
    """`h` is blocked by the ledger's `entries` (see `_Questions.blocks`)."""
    return _Questions(entries).blocks(h.kernel, h.device, h.param, h.a, h.b, h.scope)


def _choices(spaces: Sequence[SearchSpace]) -> dict[str, tuple[Value, ...]]:
    """Per parameter, the union of the spaces' choices in the family's order; single-valued ones left out."""
    out: dict[str, list[Value]] = {}
    for space in spaces:
        for param in space.params:
            values = out.setdefault(param.name, [])
            values.extend(v for v in param.choices if not any(same_value(v, w) for w in values))
    ordered = {name: sorted(values) if all(isinstance(v, int | float) for v in values) else values  # type: ignore[type-var]
               for name, values in out.items()}
    return {name: tuple(values) for name, values in ordered.items() if len(values) > 1}


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big")
