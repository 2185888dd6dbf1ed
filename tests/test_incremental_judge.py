"""The judge's pair index, `random`'s draws and `SearchState.seen` cost what arrived, and give what
the from-scratch versions give: the drawn pairs `find_pairs` finds, the spread and verdicts of a lab
that pairs everything anew, the samples of the full unseen list for the same seed.

The observations are SYNTHETIC (tests/hypothesis_fixture.py), not GPU measurements.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from tests import hypothesis_fixture as fx
from tests.test_driver_overhead import _judge_from_scratch
from tilepilot.agents.base import ProposerContext, SearchState
from tilepilot.agents.hypotheses import HypothesisLab, _extension
from tilepilot.agents.pairs import Observation, PairIndex, find_pairs
from tilepilot.agents.random import RandomProposer, _Unseen
from tilepilot.experiments import (
    Config,
    Environment,
    Hypothesis,
    HypothesisState,
    Param,
    Problem,
    Result,
    Scope,
    SearchSpace,
    Status,
    Timing,
)

ENV = Environment("replay", fx.DEVICE, "0.0", "0.0")
PROBLEMS = [Problem.of(p) for p in fx.PROBLEMS]
SPACE = SearchSpace(tuple(Param(k, v) for k, v in fx.GRID.items()))
GRID = fx.grid_observations()


def hyp(param: str, a: object, b: object, scope: str = "") -> Hypothesis:
    return Hypothesis.new(origin="t", kernel="matmul", device=fx.DEVICE, param=param, a=a, b=b,
                          scope=Scope.parse(scope))


HYPS = [hyp("BLOCK_SIZE_M", 64, 128, "M<=64"), hyp("num_stages", 4, 3), hyp("BLOCK_SIZE_N", 128, 64, "K>=4096"),
        hyp("num_warps", 8, 4)]


def arrivals(seed: int, n: int = len(GRID)) -> list[Observation]:
    """Grid observations in a random order, each drawn for one of HYPS (or none), some twice."""
    rng = random.Random(seed)
    out = []
    for o in rng.sample(GRID, n):
        h = rng.choice([*HYPS, None])
        out.append(dataclasses.replace(o, tests=h.id if h else None))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pair_index_finds_the_drawn_pairs_find_pairs_finds_as_observations_arrive(seed):
    obs = arrivals(seed)
    obs.insert(150, dataclasses.replace(obs[10], median_ms=obs[10].median_ms * 2))  # observed twice: the later counts
    index = PairIndex()
    asked = random.Random(seed)
    done = 0
    for end in [*range(0, len(obs), 13), len(obs)]:
        index.add(obs[done:end])
        done = end
        for h in HYPS:
            if asked.random() < 0.7:  # a hypothesis not asked for a while catches up
                assert index.drawn(h) == find_pairs(h, obs[:end], drawn=True)
    found = [index.drawn(h) for h in HYPS]
    assert found == [find_pairs(h, obs, drawn=True) for h in HYPS]
    assert sum(map(len, found)) > 20, "too few pairs to compare"


def _hook_lists(obs: list[Observation], cuts: list[int]) -> list[list[Observation]]:
    """What the hook hands each step: every observation so far, grouped by problem in arrival order."""
    out = []
    for cut in cuts:
        by_problem: dict[Problem, list[Observation]] = {}
        for o in obs[:cut]:
            by_problem.setdefault(o.problem, []).append(o)
        out.append([o for run in by_problem.values() for o in run])
    return out


def test_extension_reads_each_problems_new_tail_and_refuses_anything_else():
    obs = arrivals(3)
    first, second = _hook_lists(obs, [80, 150])
    found = _extension(first, {})
    assert found is not None and found[0] == first
    new, runs = _extension(second, found[1])
    assert sorted(map(id, new)) == sorted(map(id, obs[80:150]))
    assert _extension(second[1:], found[1]) is None  # lost one
    assert _extension(list(reversed(second)), found[1]) is None  # not grouped the same way
    assert _extension(obs[:150], {}) is None  # a problem in two runs
    assert _extension(second, runs) == ([], runs)


def _lab() -> HypothesisLab:
    """A lab whose HYPS are under test already, so the judge and the spread have drawn pairs from the start."""
    lab = HypothesisLab(kernel="matmul", origin="t", env=ENV, spaces=dict.fromkeys(PROBLEMS, SPACE), seed=4)
    for h in HYPS:
        lab.hypotheses[h.id], lab.states[h.id] = h, HypothesisState.TESTING
    return lab


def _steps(lab: HypothesisLab, lists: list[list[Observation]]) -> list[tuple]:
    out = []
    for i, obs in enumerate(lists):
        seen = {p: {o.config for o in obs if o.problem == p} for p in PROBLEMS}
        step = lab.step(obs, seen=seen, room=dict.fromkeys(PROBLEMS, 6), pending={}, final=i == len(lists) - 1)
        out.append((step.proposed, [(j.verdict, j.evidence, j.previous) for j in step.judgements],
                    step.learnings, step.candidates, lab._step_spread))
    return out


@pytest.mark.parametrize("order", ["grouped", "arrival"])
def test_lab_steps_as_a_lab_that_pairs_everything_anew(monkeypatch, order):
    obs = arrivals(5)
    cuts = [*range(12, len(obs), 12), len(obs)]
    lists = _hook_lists(obs, cuts) if order == "grouped" else [obs[:c] for c in cuts]
    lab = _lab()
    added: list[int] = []
    add = PairIndex.add
    monkeypatch.setattr(PairIndex, "add", lambda self, o: added.append(len(o := list(o))) or add(self, o))
    fast = _steps(lab, lists)
    monkeypatch.undo()
    if order == "grouped":  # each observation indexed once
        assert sum(added) == len(obs)
    _judge_from_scratch(monkeypatch)
    slow = _steps(_lab(), lists)
    assert fast == slow
    assert any(j for _, j, *_ in fast) and any(s != 0.1 for *_, s in fast), "nothing judged on a spread"


# ---- random ----------------------------------------------------------------------------------------

def test_unseen_sequence_is_the_list_without_the_skipped_positions():
    rng = random.Random(0)
    valid = [Config.of({"i": i}) for i in range(300)]
    for _ in range(50):
        skipped = sorted(rng.sample(range(300), rng.randrange(0, 300)))
        gone = set(skipped)
        assert list(_Unseen(valid, skipped)) == [c for i, c in enumerate(valid) if i not in gone]


def _old_propose(valid: list[Config], rng: random.Random, state: SearchState, n: int) -> list[Config]:
    seen = set(state.results) | state.pending | state.dropped
    unseen = [c for c in valid if c not in seen]
    return rng.sample(unseen, min(max(n, 0), len(unseen)))


@pytest.mark.parametrize(("size", "n"), [(40, 3), (3000, 8), (3000, 200)])  # sample's list and set paths
def test_random_draws_what_sampling_the_full_unseen_list_draws(size, n):
    space = SearchSpace((Param("a", tuple(range(size // 10))), Param("b", tuple(range(10)))))
    problem = Problem.of({"M": 1})
    proposer = RandomProposer(ProposerContext("matmul", problem, space, seed=9, budget=size))
    valid, ref = space.valid(problem), random.Random(9)
    state, rng = SearchState(), random.Random(1)
    outside = Config.of({"a": -1, "b": 0})  # not a valid config: seen, but not in the listing
    state.dropped.add(outside)
    while True:
        got = [c.config for c in proposer.propose(state, n)]
        assert got == _old_propose(valid, ref, state, n)
        if not got:
            break
        for c in got:  # some measured, some left pending, some dropped; a pending one withdrawn
            r = rng.random()
            if r < 0.6:
                state.results[c] = Result(problem, c, Status.OK, ENV, Timing(1.0, 1.0, 1.0, 1.0, 1, False))
            elif r < 0.9:
                state.pending.add(c)
            else:
                state.dropped.add(c)
        if state.pending and rng.random() < 0.3:
            state.pending.discard(next(iter(state.pending)))
    assert len(state.seen) == size + 1


# ---- SearchState.seen --------------------------------------------------------------------------------

def test_seen_is_a_live_view_of_results_pending_and_dropped():
    a, b, c, d = (Config.of({"i": i}) for i in range(4))
    state = SearchState(pending={a}, dropped={b})
    seen = state.seen
    state.results[c] = Result(Problem.of({"M": 1}), c, Status.OK, ENV, Timing(1.0, 1.0, 1.0, 1.0, 1, False))
    state.pending.add(c)  # in two parts: counted once
    assert c in seen and d not in seen
    assert seen == {a, b, c} and len(seen) == 3 and set(seen) == {a, b, c}
    assert seen | {d} == {a, b, c, d} and type(seen | {d}) is set
    assert {d} | seen == {a, b, c, d} and seen - {a} == {b, c}
