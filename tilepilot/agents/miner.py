"""The hypothesis miner: from the results so far to falsifiable statements and their experiments.

For each problem with enough ok results, a ridge regression of log(median_ms) on one-hot
parameter values (a main-effects model) estimates, for each pair of adjacent values of each
parameter, the paired effect of switching one for the other. A statement "p=a beats p=b when
SCOPE" is proposed where the estimate is large enough and agrees in sign over most problems of
the scope; scopes are every problem, one-sided thresholds on a numeric problem dimension
between the campaign's problems ("M ≤ 64", "K ≥ 4096") and equality on a categorical one.

Not proposed: a statement the ledger holds already; one whose question (parameter and values)
an active or decided hypothesis asks of overlapping problems (it would restate, imply or
contradict it); one with no budget left in scope to test it.

The experiments that settle a hypothesis are paired configs: a measured config of a problem in
scope with the parameter flipped, the problem's best config first, then others in a seeded
order, spread round-robin over the problems in scope.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tilepilot.agents.pairs import Observation, find_pairs
from tilepilot.experiments import Candidate, Config, Problem, SearchSpace, Value
from tilepilot.experiments.hypothesis import Bound, Hypothesis, HypothesisState, Scope

NAME = "hypotheses"  # the proposer name on the candidates the miner queues
MAX_ACTIVE = 3  # hypotheses under test at once, per campaign
MIN_OBS = 4  # ok results a problem needs before it feeds the miner
MIN_SIGNAL = math.log(1.03)  # estimated effect a statement needs (in log time)
MIN_AGREEMENT = 0.8  # share of the scope's problems whose estimate has the statement's sign
MIN_COVERAGE = 0.5  # share of the scope's problems that have an estimate at all
RIDGE = 1.0
MIN_PAIRS_WITHOUT_ROOM = 3  # a statement with no budget left in scope needs this many pairs already


@dataclass(frozen=True)
class LedgerEntry:
    hypothesis: Hypothesis
    state: HypothesisState


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

    # ---- statements --------------------------------------------------------------------------
    def mine(self, observations: Sequence[Observation], *, known: Sequence[LedgerEntry],
             room: Mapping[Problem, int], max_new: int) -> list[Hypothesis]:
        """Up to `max_new` new hypotheses, strongest signal first (see the module docstring)."""
        if max_new <= 0:
            return []
        by_problem: dict[Problem, list[Observation]] = {}
        for o in observations:
            if o.problem in self.spaces:
                by_problem.setdefault(o.problem, []).append(o)
        estimates = {p: self._effects(obs) for p, obs in by_problem.items() if len(obs) >= MIN_OBS}
        if not estimates:
            return []
        min_problems = 2 if len(estimates) >= 2 else 1
        claims = [c for c in self._claims(estimates, min_problems)]
        claims.sort(key=lambda c: (-c.score, c.param, str(c.a), c.scope.key()))
        chosen: list[Hypothesis] = []
        entries = list(known)
        for c in claims:
            h = Hypothesis.new(origin=self.origin, kernel=self.kernel, device=self.device, param=c.param,
                               a=c.a, b=c.b, scope=c.scope, rationale=self._why(c, by_problem))
            if _blocked(h, entries):
                continue
            if room_in_scope(h, room) == 0 and len(find_pairs(h, observations)) < MIN_PAIRS_WITHOUT_ROOM:
                continue
            chosen.append(h)
            entries.append(LedgerEntry(h, HypothesisState.PROPOSED))
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

    def _effects(self, obs: Sequence[Observation]) -> dict[tuple[str, Value, Value], float]:
        """Ridge main effects: log(t(p=b) / t(p=a)) for adjacent values a, b seen in `obs`."""
        cols = [(p, v) for p, values in self.choices.items() for v in values
                if any(_same(o.config.get(p), v) for o in obs)]
        x = np.array([[1.0 if _same(o.config.get(p), v) else 0.0 for p, v in cols] for o in obs])
        y = np.log([o.median_ms for o in obs])
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
    def experiments(self, h: Hypothesis, observations: Sequence[Observation], *,
                    seen: Mapping[Problem, set[Config]], room: Mapping[Problem, int], n: int) -> list[Candidate]:
        """Up to `n` paired configs for `h`, at most room[p] per problem, none in seen[p]."""
        queues = [self._flips(h, p, observations, seen.get(p, set())) for p in self.spaces
                  if h.scope.contains(p) and room.get(p, 0) > 0]
        left = {p: room[p] for p in self.spaces if room.get(p, 0) > 0}
        out: list[Candidate] = []
        while len(out) < n and any(queues):
            for q in queues:
                if q and len(out) < n and left[q[0].problem] > 0:
                    cand = q.pop(0)
                    left[cand.problem] -= 1
                    out.append(cand)
                elif q:
                    q.clear()
        return out

    def _flips(self, h: Hypothesis, problem: Problem, observations: Sequence[Observation],
               seen: set[Config]) -> list[Candidate]:
        space = self.spaces[problem]
        bases = sorted((o for o in observations if o.problem == problem
                        and (_same(o.config.get(h.param), h.a) or _same(o.config.get(h.param), h.b))),
                       key=lambda o: o.median_ms)
        rest = bases[1:]
        random.Random(_seed(self.seed, h.id, problem.key())).shuffle(rest)
        out: list[Candidate] = []
        taken: set[Config] = set()
        for rank, base in enumerate(bases[:1] + rest):
            other = h.b if _same(base.config[h.param], h.a) else h.a
            flip = Config.of({**base.config.as_dict(), h.param: other})
            if flip in seen or flip in taken or space.check(flip, problem) is not None:
                continue
            taken.add(flip)
            which = "best" if rank == 0 else "a measured"
            out.append(Candidate(problem, flip, NAME, f"tests {h.id} ({h.text}): {which} config "
                                 f"({base.median_ms:.4g} ms) with {h.param} {base.config[h.param]}->{other}",
                                 hypothesis_id=h.id))
        return out


def _blocked(h: Hypothesis, entries: Sequence[LedgerEntry]) -> bool:
    """Already stated, or the same question asked of overlapping problems by a hypothesis that is
    active or decided (an inconclusive one leaves the question open)."""
    for e in entries:
        g = e.hypothesis
        if not g.same_question(h):
            continue
        if g.statement_key == h.statement_key:
            return True
        if e.state is not HypothesisState.INCONCLUSIVE and g.scope.overlaps(h.scope):
            return True
    return False


def _choices(spaces: Sequence[SearchSpace]) -> dict[str, tuple[Value, ...]]:
    """Per parameter, the union of the spaces' choices in the family's order; single-valued ones left out."""
    out: dict[str, list[Value]] = {}
    for space in spaces:
        for param in space.params:
            values = out.setdefault(param.name, [])
            values.extend(v for v in param.choices if not any(_same(v, w) for w in values))
    ordered = {name: sorted(values) if all(isinstance(v, int | float) for v in values) else values  # type: ignore[type-var]
               for name, values in out.items()}
    return {name: tuple(values) for name, values in ordered.items() if len(values) > 1}


def _same(x: object, y: object) -> bool:
    return type(x) is type(y) and x == y


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big")
