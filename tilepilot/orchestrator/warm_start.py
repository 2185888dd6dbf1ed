"""Warm start: a new campaign begins with what the store knows of nearby problems.

For each problem of a new campaign (not a resumed one), the winners the store holds for the
same kernel on the same device are ranked by their problem's distance in log-shape space:
the Euclidean distance of the log2 of the numeric problem values (M, N, K, ...), plus
`MISMATCH` for each other value that differs (dtype) or is missing. Each winning problem
counts once (its latest winner, one measured with the same torch and Triton preferred). The
winners of the nearest problems are queued first, nearest first, until `NEAREST` distinct
winning configs that fit the new problem are taken (nearby problems often share a winner);
each is followed by the variants the learnings in scope imply: a learning "p=a beats p=b"
whose scope holds the new problem turns a winner with p=b into the same config with p=a.
Every config is checked against the new problem's space (choices and constraints); at most
`limit(budget)` are queued, and they count against the budget like any trial. Where the
campaign's proposer predicts a time for every one of them (`Proposer.score`: rules' tile model
does), they go in the order of its predictions instead (`by_prediction`): the nearest problem's
winner is not always the best of them on the new shape; and only those it predicts no slower than
its own first pick (`Proposer.best_prediction`) go first: the rest are left to its ranking, since
on recorded grids a winner that the model ranks below its own picks costs a slot of a small
budget more often than it finds the optimum (bench/search.py --arm history, heads warm and
warmall).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tilepilot.experiments import (
    Candidate,
    Config,
    Hypothesis,
    InputError,
    Learning,
    Problem,
    SearchSpace,
    same_value,
)
from tilepilot.storage.store import WinnerSource

NAME = "warm-start"  # the proposer name on the candidates
NEAREST = 3  # distinct winning configs (of the nearest problems) a new campaign starts from
MISMATCH = 1.0  # distance added per non-numeric problem value that differs (as a factor 2 in one dim)
MAX_CONFIGS = 6  # warm-start configs per problem at most
BUDGET_SHARE = 0.25  # of a problem's budget, at most (at least one config)


@dataclass(frozen=True)
class Rule:
    """A learning with the statement it validated: `param = a` beats `param = b` in scope."""

    learning: Learning
    hypothesis: Hypothesis


def limit(budget: int) -> int:
    return max(1, min(MAX_CONFIGS, int(budget * BUDGET_SHARE)))


def distance(a: Problem, b: Problem) -> float:
    """Distance in log-shape space (see the module docstring)."""
    total = 0.0
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if _number(x) and _number(y) and x > 0 and y > 0:  # type: ignore[operator]
            total += (math.log2(x) - math.log2(y)) ** 2  # type: ignore[arg-type]
        elif x != y or type(x) is not type(y):
            total += MISMATCH**2
    return math.sqrt(total)


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def nearest_winners(problem: Problem, winners: Sequence[WinnerSource], *, torch: str = "", triton: str = "",
                    exclude_self: bool = False, n: int | None = None) -> list[tuple[WinnerSource, float]]:
    """One winner per problem (same toolchain first, then the newest), nearest problem first (`n` at most)."""
    def preference(w: WinnerSource) -> tuple[bool, float]:
        return (w.torch, w.triton) != (torch, triton), -w.decided_at

    best: dict[str, WinnerSource] = {}
    for w in sorted(winners, key=preference):
        key = w.problem.key()
        if key not in best and not (exclude_self and w.problem == problem):
            best[key] = w
    ranked = sorted(best.values(), key=lambda w: (distance(problem, w.problem), preference(w), w.problem.key()))
    return [(w, distance(problem, w.problem)) for w in ranked[:n]]


def warm_candidates(problem: Problem, space: SearchSpace, winners: Sequence[WinnerSource],
                    rules: Sequence[Rule] = (), *, budget: int, torch: str = "", triton: str = "",
                    skip: set[Config] | None = None, exclude_self: bool = False) -> list[Candidate]:
    """The configs a new campaign on `problem` starts from, in order, with their sources."""
    skip = set(skip or ())
    applicable = [r for r in rules if r.learning.scope.contains(problem)]
    out: list[Candidate] = []
    taken = 0  # winning configs taken
    for w, d in nearest_winners(problem, winners, torch=torch, triton=triton, exclude_self=exclude_self):
        if taken >= NEAREST or len(out) >= limit(budget):
            break
        fit = _fits(space, problem, w.config)
        if fit is None or fit in skip:
            continue  # outside the space, or taken already (a nearer problem had the same winner)
        taken += 1
        toolchain = "" if (w.torch, w.triton) == (torch, triton) else f", torch {w.torch} / triton {w.triton}"
        source = (f"winner of {w.problem.label()} in campaign {w.campaign} ({w.median_ms:.4g} ms, "
                  f"log-distance {d:.2f}{toolchain})")
        proposals = [(w.config, f"warm start: {source}")]
        for r in applicable:
            h = r.hypothesis
            if same_value(w.config.get(h.param), h.b):
                variant = Config.of({**w.config.as_dict(), h.param: h.a})
                proposals.append((variant, f"warm start: {source} with {h.param}={h.a} instead of {h.b}, as "
                                           f"learning {r.learning.id} says ({r.learning.effect:.2f}x when "
                                           f"{r.learning.scope.text()})"))
        for config, why in proposals:
            fit = _fits(space, problem, config)
            if fit is None or fit in skip:
                continue
            skip.add(fit)
            out.append(Candidate(problem, fit, NAME, why))
    return out[:limit(budget)]


Score = Callable[[Sequence[Config]], list[tuple[float | None, str]]]


def by_prediction(cands: Sequence[Candidate], score: Score, best: float | None = None) -> list[Candidate]:
    """The warm-start candidates fastest-predicted first, when `score` (a proposer's) predicts every
    one of them; else as they are. Ties keep their order (nearest problem first). With `best` (the
    proposer's prediction of its own first pick, `Proposer.best_prediction`), only those predicted
    no slower than that: the others are left to the proposer's own ranking."""
    scores = score([c.config for c in cands]) if len(cands) > 1 or best is not None else []
    if not scores or any(ms is None for ms, _ in scores):
        return list(cands)
    order = sorted(range(len(cands)), key=lambda i: (scores[i][0], i))
    if best is not None:
        order = [i for i in order if (scores[i][0] or math.inf) <= best]
    return [replace(cands[i], predicted_ms=scores[i][0],
                    rationale=f"{cands[i].rationale}; queued {rank} of {len(order)}: "
                              f"{scores[i][1] or f'predicted {scores[i][0]:.3g} ms'}")
            for rank, i in enumerate(order, start=1)]


def _fits(space: SearchSpace, problem: Problem, config: Config) -> Config | None:
    """The config as the space reads it, or None when it lies outside the space or breaks a constraint."""
    try:
        parsed = space.parse(config.as_dict())
    except InputError:
        return None
    return parsed if space.check(parsed, problem) is None else None
