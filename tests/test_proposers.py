"""The proposer contract (agents/base.py), run against every registered proposer.

The objective is synthetic (tests/proposer_toys.py); nothing here is a measurement.
"""

from __future__ import annotations

import itertools

import pytest

from tests.proposer_toys import (
    PROBLEM,
    TINY_SPACE,
    TOY_SPACE,
    context,
    drive,
    evaluate,
    failed_result,
    ok_result,
)
from tilepilot.agents import DEFAULT_PROPOSER, Proposer, SearchState, get_proposer, proposer_names
from tilepilot.experiments import Candidate, Config, InputError, Result, Status


def test_registry_lists_every_proposer_and_the_default() -> None:
    assert proposer_names() == ["grid", "llm", "optuna", "optuna-gp", "portfolio", "random", "rules"]
    assert DEFAULT_PROPOSER in proposer_names()


def test_unknown_proposer_names_the_known_ones() -> None:
    known = "grid, llm, optuna, optuna-gp, portfolio, random, rules"
    with pytest.raises(InputError, match=rf"unknown proposer 'x' \(known proposers: {known}\)"):
        get_proposer("x")


def _check_batch(proposer: Proposer, state: SearchState, batch: list[Candidate], n: int) -> None:
    assert len(batch) <= n
    configs = [c.config for c in batch]
    assert len(set(configs)) == len(configs), "two alike in one batch"
    assert not set(configs) & state.seen, "a seen config was proposed again"
    for c in batch:
        assert c.proposer == proposer.name
        assert c.problem == PROBLEM
        assert c.rationale.strip() and "\n" not in c.rationale
        assert proposer.ctx.space.parse(c.config.as_dict()) == c.config


# `llm` needs a model: tests/test_llm_proposer.py runs this class on it through the SDK's mock transport.
# `optuna-gp` asks ahead in a thread by default: tests/test_optuna_gp.py runs this class on it, inline
# and in the background.
@pytest.mark.parametrize("name", [n for n in proposer_names() if n not in ("llm", "optuna-gp")])
class TestProposerContract:
    def make(self, name: str, **kw: object) -> Proposer:
        return get_proposer(name)(context(**kw))  # type: ignore[arg-type]

    def test_name_matches_registry(self, name: str) -> None:
        assert get_proposer(name).name == name

    def test_batches_are_new_distinct_and_explained(self, name: str) -> None:
        p = self.make(name)
        state = SearchState()
        for n in (1, 3, 5, 2):  # the first batches stay pending while the next are asked
            batch = p.propose(state, n)
            _check_batch(p, state, batch, n)
            assert batch, "a large space is not exhausted after a few configs"
            state.pending.update(c.config for c in batch)
        for config in sorted(state.pending, key=Config.key):
            r = evaluate(TOY_SPACE, config)
            state.pending.discard(config)
            state.results[config] = r
            p.observe([r])
        _check_batch(p, state, p.propose(state, 4), 4)
        p.close()

    def test_zero_asked_gives_nothing(self, name: str) -> None:
        assert self.make(name).propose(SearchState(), 0) == []

    def test_same_seed_same_proposals(self, name: str) -> None:
        runs = []
        for _ in range(2):
            p = self.make(name, seed=7)
            state = drive(p, budget=16, batch=3)
            runs.append([(c, r.status) for c, r in state.results.items()])
            p.close()
        assert runs[0] == runs[1]

    def test_survives_results_of_every_status(self, name: str) -> None:
        statuses = itertools.cycle(list(Status))
        p = self.make(name, budget=30)

        def answer(config: Config) -> Result:
            status = next(statuses)
            if TOY_SPACE.check(config, PROBLEM):
                status = Status.INVALID
            return ok_result(config) if status is Status.OK else failed_result(config, status)

        state = drive(p, budget=30, batch=4, answer=answer)
        assert {r.status for r in state.results.values()} == set(Status)
        batch = p.propose(state, 4)
        _check_batch(p, state, batch, 4)
        assert batch
        p.close()

    def test_exhausts_a_tiny_space_gracefully(self, name: str) -> None:
        p = self.make(name, space=TINY_SPACE, budget=4)
        state = SearchState()
        for _ in range(10):
            batch = p.propose(state, 2)
            _check_batch(p, state, batch, 2)
            if not batch:
                break
            results = [evaluate(TINY_SPACE, c.config) for c in batch]
            state.results.update((r.config, r) for r in results)
            p.observe(results)
        assert set(TINY_SPACE.valid(PROBLEM)) <= set(state.results)
        assert p.propose(state, 3) == []
        assert p.propose(state, 3) == []
        p.close()

    def test_observe_accepts_results_it_did_not_propose(self, name: str) -> None:
        p = self.make(name)
        outside = TOY_SPACE.valid(PROBLEM)[::97]
        results = [ok_result(c) if i % 2 else failed_result(c, Status.COMPILE_ERROR)
                   for i, c in enumerate(outside)]
        state = SearchState(results={r.config: r for r in results})
        p.observe(results)
        batch = p.propose(state, 6)
        _check_batch(p, state, batch, 6)
        assert len(batch) == 6
        p.close()


def test_the_default_proposer_is_the_portfolio() -> None:
    assert DEFAULT_PROPOSER == "portfolio"
