"""The optuna proposer: how results are told to the study, duplicates, and whether TPE learns.

The objective is synthetic (tests/proposer_toys.py); nothing here is a measurement.
"""

from __future__ import annotations

import math

import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

import tilepilot.agents.optuna as optuna_proposer
from tests.proposer_toys import (
    PROBLEM,
    TINY_SPACE,
    TOY_SPACE,
    context,
    drive,
    evaluate,
    failed_result,
    ok_result,
    optimum_ms,
)
from tilepilot.agents import SearchState, get_proposer
from tilepilot.agents.optuna import OptunaProposer
from tilepilot.agents.optuna_params import ParamCodec
from tilepilot.agents.random import RandomProposer
from tilepilot.experiments import Config, Param, Problem, Result, SearchSpace, Status


def _config(t: FrozenTrial, p: OptunaProposer) -> Config:
    return ParamCodec(p.ctx.space).to_config(t.params)


def _running(p: OptunaProposer) -> list[FrozenTrial]:
    return p.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))


def test_optuna_beats_random_on_a_synthetic_objective() -> None:
    """Log-regret of the best config after 24 measurements, over 8 seeds."""
    seeds, budget = range(8), 24
    opt = optimum_ms()
    regret: dict[str, list[float]] = {"optuna": [], "random": []}
    for seed in seeds:
        for name in regret:
            p = get_proposer(name)(context(seed=seed, budget=budget))
            best = drive(p, budget=budget, batch=4).best()
            assert best is not None and best.median_ms is not None
            regret[name].append(math.log(best.median_ms / opt))
            p.close()
    mean = {k: sum(v) / len(v) for k, v in regret.items()}
    wins = sum(o <= r for o, r in zip(regret["optuna"], regret["random"], strict=True))
    assert mean["optuna"] <= 0.5 * mean["random"], mean
    assert wins >= 6, regret


def test_startup_size_follows_the_budget() -> None:
    assert OptunaProposer(context(budget=2)).n_startup == 1
    assert OptunaProposer(context(budget=20)).n_startup == 5
    assert OptunaProposer(context(budget=400)).n_startup == 8


def test_rationale_says_startup_then_model() -> None:
    p = OptunaProposer(context(budget=8))  # two startup trials
    state = drive(p, budget=8, batch=1)
    assert len(state.results) == 8
    first = p.propose(SearchState(), 1)  # a fresh state: only the model's view matters
    assert "TPE model of" in first[0].rationale
    q = OptunaProposer(context(budget=8))
    assert "startup random sample" in q.propose(SearchState(), 1)[0].rationale


def test_invalid_suggestions_are_told_as_violated_constraints() -> None:
    p = OptunaProposer(context(seed=1))
    state = drive(p, budget=40, batch=4)
    assert all(TOY_SPACE.check(c, PROBLEM) is None for c in state.results)
    invalid = [t for t in p.study.trials if TOY_SPACE.check(_config(t, p), PROBLEM)]
    assert invalid, "the toy space is a quarter invalid: TPE's samples hit it"
    for t in invalid:
        assert t.state is TrialState.COMPLETE
        assert t.constraints == {"runs": 1.0}
        assert t.user_attrs["status"] == "invalid"
    assert p.study.best_trial.constraints == {"runs": 0.0}


def test_each_status_is_told_as_designed() -> None:
    p = OptunaProposer(context(seed=2, budget=40))
    order = [s for s in Status if s is not Status.INVALID]
    told: dict[Config, Status] = {}

    def answer(config: Config) -> Result:
        status = order[len(told) % len(order)]
        told[config] = status
        return ok_result(config) if status is Status.OK else failed_result(config, status)

    drive(p, budget=40, batch=4, answer=answer)
    proposed = [t for t in p.study.trials if t.user_attrs.get("origin") == "proposed"]
    assert {t.user_attrs["status"] for t in proposed} == {str(s) for s in order}
    for t in proposed:
        status = told[_config(t, p)]
        assert t.user_attrs["status"] == str(status)
        if status is Status.OK:
            assert t.state is TrialState.COMPLETE and t.constraints == {"runs": 0.0}
            assert t.value == pytest.approx(math.log(ok_result(_config(t, p)).median_ms or 0))
        elif status.never_runs:
            assert t.state is TrialState.COMPLETE and t.constraints == {"runs": 1.0}
        else:
            assert status in (Status.TIMEOUT, Status.OOM)
            assert t.state is TrialState.FAIL


def test_no_running_trials_left_after_observe_or_close() -> None:
    p = OptunaProposer(context(seed=3))
    state = SearchState()
    for _ in range(5):
        batch = p.propose(state, 4)
        assert len(_running(p)) == len(batch)
        results = [evaluate(TOY_SPACE, c.config) for c in batch]
        state.results.update((r.config, r) for r in results)
        p.observe(results)
        assert _running(p) == []
    p.propose(state, 3)
    assert len(_running(p)) == 3
    p.close()
    assert _running(p) == []


def test_results_from_elsewhere_become_trials() -> None:
    p = OptunaProposer(context())
    configs = TOY_SPACE.valid(PROBLEM)[:6]
    results = [ok_result(configs[0]), ok_result(configs[1]),
               failed_result(configs[2], Status.CRASHED), failed_result(configs[3], Status.TIMEOUT),
               failed_result(configs[4], Status.OUT_OF_RESOURCES), ok_result(configs[5])]
    p.observe(results)
    p.observe(results[:2])  # delivered again (state and observe): told once
    observed = {_config(t, p): t for t in p.study.trials if t.user_attrs.get("origin") == "observed"}
    assert set(observed) == set(configs) and len(p.study.trials) == 6
    assert observed[configs[0]].constraints == {"runs": 0.0}
    assert observed[configs[2]].constraints == {"runs": 1.0}
    assert observed[configs[3]].state is TrialState.FAIL
    assert p.study.best_trial.number in {observed[c].number for c in (configs[0], configs[1], configs[5])}


def test_a_config_outside_the_space_is_ignored() -> None:
    p = OptunaProposer(context())
    stray = Config.of({"BLOCK_M": 512, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4, "num_stages": 2})
    p.observe([ok_result(stray)])
    assert p.study.trials == []


def test_results_held_only_in_state_are_learned_too() -> None:
    p = OptunaProposer(context())
    r = ok_result(TOY_SPACE.valid(PROBLEM)[0])
    p.propose(SearchState(results={r.config: r}), 1)
    assert [t.user_attrs["origin"] for t in p.study.trials][:1] == ["observed"]


def test_a_result_for_another_problem_is_a_bug() -> None:
    p = OptunaProposer(context())
    other = Problem.of({"M": 64, "N": 64, "K": 64, "dtype": "fp16"})
    with pytest.raises(ValueError, match="given to the proposer of"):
        p.observe([ok_result(TOY_SPACE.valid(other)[0], problem=other)])


def test_seen_suggestions_are_told_at_once_and_never_returned() -> None:
    """Two of TINY_SPACE's three valid configs are seen (one done, one in flight)."""
    done, in_flight, fresh = TINY_SPACE.valid(PROBLEM)
    outcomes: list[FrozenTrial] = []
    for seed in range(10):
        p = OptunaProposer(context(space=TINY_SPACE, seed=seed, budget=8))
        r = ok_result(done)
        p.observe([r])
        state = SearchState(results={done: r}, pending={in_flight})
        assert [c.config for c in p.propose(state, 2)] == [fresh]
        outcomes += [t for t in p.study.trials if t.user_attrs.get("origin") == "duplicate"]
    states = {t.state for t in outcomes}
    assert states == {TrialState.COMPLETE, TrialState.FAIL}, "over ten seeds TPE suggests both seen configs"
    for t in outcomes:
        if t.params == ParamCodec(TINY_SPACE).to_params(done):
            assert t.state is TrialState.COMPLETE and t.value == pytest.approx(math.log(r.median_ms or 0))
        else:
            assert t.state is TrialState.FAIL  # in flight: no outcome to tell yet


def test_fallback_enqueues_an_unseen_valid_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(optuna_proposer, "MAX_FREE_ASKS", 0)
    p = OptunaProposer(context(seed=4))
    batch = p.propose(SearchState(), 3)
    assert len(batch) == 3
    for c in batch:
        assert "random unseen valid config" in c.rationale
        assert TOY_SPACE.check(c.config, PROBLEM) is None
    fallback = [t for t in p.study.trials if t.user_attrs.get("origin") == "fallback"]
    assert [_config(t, p) for t in fallback] == [c.config for c in batch]
    assert all(t.state is TrialState.RUNNING for t in fallback)


def test_random_proposer_never_proposes_invalid_configs() -> None:
    p = RandomProposer(context())
    state = drive(p, budget=60, batch=6)
    assert all(r.status is Status.OK for r in state.results.values())


def test_powers_of_two_are_sampled_through_their_exponent() -> None:
    codec = ParamCodec(TOY_SPACE)
    assert codec.distributions["log2_BLOCK_M"] == IntDistribution(4, 8)
    assert codec.distributions["log2_BLOCK_K"] == IntDistribution(4, 7)
    assert codec.distributions["num_stages"] == IntDistribution(2, 5)
    assert all(codec.to_config(codec.to_params(c) or {}) == c for c in TOY_SPACE)


def test_other_params_keep_their_order_or_become_categorical() -> None:
    space = SearchSpace((Param("gaps", (1, 2, 8)), Param("even", (16, 64, 256)),
                         Param("f", (0.5, 1.0, 4.0)), Param("kind", ("a", "b")), Param("on", (False, True)),
                         Param("one", (3,))))
    codec = ParamCodec(space)
    assert codec.distributions == {
        "index_gaps": IntDistribution(0, 2), "log2_even": IntDistribution(4, 8, step=2),
        "index_f": IntDistribution(0, 2), "kind": CategoricalDistribution(("a", "b")),
        "on": CategoricalDistribution((False, True)), "one": CategoricalDistribution((3,)),
    }
    assert all(codec.to_config(codec.to_params(c) or {}) == c for c in space)
    assert codec.to_params(Config.of({"gaps": 4, "even": 16, "f": 0.5, "kind": "a", "on": True, "one": 3})) is None


def test_a_dropped_config_has_its_trial_failed() -> None:
    p = OptunaProposer(context(seed=5))
    state = SearchState()
    batch = p.propose(state, 3)
    state.pending.update(c.config for c in batch[1:])
    state.dropped.add(batch[0].config)  # taken off the queue unmeasured: no result will come
    p.propose(state, 1)
    trial = next(t for t in p.study.trials if _config(t, p) == batch[0].config)
    assert trial.state is TrialState.FAIL and trial.user_attrs["origin"] == "dropped"
    assert len(_running(p)) == 3  # the two still pending and the new one
    p.close()
