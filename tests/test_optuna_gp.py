"""`optuna-gp`: the contract inline and asking ahead, infeasible configs, the background thread.

The objective is synthetic (tests/proposer_toys.py); nothing here is a measurement. The GP's
acquisition search is made smaller (`_fast`) to keep the tests quick; a fit is made slow where
a test needs one by gating the sampler on an event, never by sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import FrozenTrial, TrialState

import tests.test_proposers as contract
from tests.proposer_toys import PROBLEM, TOY_SPACE, context, drive, evaluate, failed_result, ok_result
from tests.replay_fixture import PROBLEMS, write_campaign, write_dataset
from tilepilot.agents import SearchState, get_proposer
from tilepilot.agents.optuna_gp import GpSettings, OptunaGpProposer
from tilepilot.agents.optuna_params import ParamCodec
from tilepilot.agents.portfolio import PortfolioProposer, PortfolioSettings
from tilepilot.experiments import Config, InputError, Param, Result, SearchSpace, Status
from tilepilot.orchestrator.tune import TuneOptions, tune
from tilepilot.storage.store import Store

INLINE = GpSettings(synchronous=True)
# "at once": a round that waited for the held fit would take the Gate's 30 s; 0.05 s failed once on a
# loaded 2-core machine (288 ms, the fit's thread taking the other core)
QUICK_S = 2.0


def _fast(p: OptunaGpProposer) -> OptunaGpProposer:
    """A smaller acquisition search (Optuna's private knobs; without them the tests are only slower)."""
    s = p.study.sampler
    s._n_preliminary_samples, s._n_local_search, s._n_qmc_samples_qei = 128, 2, 16  # type: ignore[attr-defined]
    return p


def make(settings: GpSettings = INLINE, **kw: Any) -> OptunaGpProposer:
    return _fast(OptunaGpProposer(context(**kw), settings))


def _config(t: FrozenTrial, p: OptunaGpProposer) -> Config:
    return ParamCodec(p.ctx.space).to_config(t.params)


class Gate:
    """Lets the first `through` GP fits of a proposer pass, then holds each until opened; says when
    one is held."""

    def __init__(self, p: OptunaGpProposer, through: int = 0) -> None:
        self.open, self.entered = threading.Event(), threading.Event()
        self.fits = 0
        inner = p.study.sampler.sample_relative

        def gated(*args: Any) -> Any:
            self.fits += 1
            if self.fits > through:
                self.entered.set()
                assert self.open.wait(timeout=30), "the gate was never opened"
            return inner(*args)

        p.study.sampler.sample_relative = gated  # type: ignore[method-assign]


@contextmanager
def _quick(what: str) -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    took = time.perf_counter() - t0
    assert took < QUICK_S, f"{what} took {1000 * took:.1f} ms while a fit was running"


def _past_startup(p: OptunaGpProposer) -> SearchState:
    """Results for the GP's startup trials, so that its next ask fits."""
    configs = TOY_SPACE.valid(PROBLEM)[::41][:p.n_startup + 1]
    results = [ok_result(c) for c in configs]
    p.observe(results)
    return SearchState(results={r.config: r for r in results})


# ---- the proposer contract -----------------------------------------------------------------------
class TestGpContractInline:
    """The contract tests of tests/test_proposers.py, on `optuna-gp` asking inline."""

    contract = contract.TestProposerContract

    def make(self, name: str, **kw: Any) -> OptunaGpProposer:
        return make(INLINE, **kw)

    def test_batches_are_new_distinct_and_explained(self) -> None:
        self.contract.test_batches_are_new_distinct_and_explained(self, "optuna-gp")  # type: ignore[arg-type]

    def test_zero_asked_gives_nothing(self) -> None:
        self.contract.test_zero_asked_gives_nothing(self, "optuna-gp")  # type: ignore[arg-type]

    def test_same_seed_same_proposals(self) -> None:
        self.contract.test_same_seed_same_proposals(self, "optuna-gp")  # type: ignore[arg-type]

    def test_survives_results_of_every_status(self) -> None:
        self.contract.test_survives_results_of_every_status(self, "optuna-gp")  # type: ignore[arg-type]

    def test_exhausts_a_tiny_space_gracefully(self) -> None:
        self.contract.test_exhausts_a_tiny_space_gracefully(self, "optuna-gp")  # type: ignore[arg-type]

    def test_observe_accepts_results_it_did_not_propose(self) -> None:
        self.contract.test_observe_accepts_results_it_did_not_propose(self, "optuna-gp")  # type: ignore[arg-type]


class TestGpContractAhead(TestGpContractInline):
    """The same, asking ahead in the background as a campaign runs it (what it hands out depends on
    how far the thread got, so the same seed need not give the same proposals)."""

    def make(self, name: str, **kw: Any) -> OptunaGpProposer:
        return make(GpSettings(), **kw)

    def test_same_seed_same_proposals(self) -> None:
        pytest.skip("asking ahead is not deterministic: INLINE is (TestGpContractInline)")

    def test_observe_accepts_results_it_did_not_propose(self) -> None:
        """As in the contract, but six configs over as many calls as it takes (a call hands out what is
        ready, at least one)."""
        p = self.make("optuna-gp")
        outside = TOY_SPACE.valid(PROBLEM)[::97]
        results = [ok_result(c) if i % 2 else failed_result(c, Status.COMPILE_ERROR) for i, c in enumerate(outside)]
        state = SearchState(results={r.config: r for r in results})
        p.observe(results)
        got = 0
        while got < 6:
            batch = p.propose(state, 6 - got)
            contract._check_batch(p, state, batch, 6 - got)
            assert batch
            got += len(batch)
            state.pending.update(c.config for c in batch)
        p.close()


def test_registered_and_refused_without_scipy(monkeypatch: pytest.MonkeyPatch) -> None:
    assert get_proposer("optuna-gp") is OptunaGpProposer
    assert OptunaGpProposer(context()).settings == GpSettings()  # asks ahead by default
    real = __import__("importlib.util").util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "scipy" else real(name, *a))
    with pytest.raises(InputError, match="'optuna-gp' needs scipy"):
        get_proposer("optuna-gp")


# ---- telling -------------------------------------------------------------------------------------
@pytest.mark.parametrize("settings", [INLINE, GpSettings()], ids=["inline", "ahead"])
def test_infeasible_configs_are_never_proposed_twice(settings: GpSettings) -> None:
    """A quarter of the toy space breaks its constraints, and BLOCK_N=256 never compiles."""
    proposed: list[Config] = []

    def answer(c: Config) -> Result:
        proposed.append(c)
        if TOY_SPACE.check(c, PROBLEM) is None and c["BLOCK_N"] == 256:
            return failed_result(c, Status.COMPILE_ERROR)
        return evaluate(TOY_SPACE, c)

    p = make(settings, seed=5, budget=24)
    drive(p, budget=24, batch=4, answer=answer)
    p.close()
    assert len(proposed) == len(set(proposed)) >= 24
    assert all(TOY_SPACE.check(c, PROBLEM) is None for c in proposed)
    infeasible = [t for t in p.study.trials if t.user_attrs.get("status") in ("invalid", "compile_error")]
    assert infeasible, "the GP's suggestions hit the invalid quarter or BLOCK_N=256"
    assert all(t.state is TrialState.COMPLETE and t.constraints == {"runs": 1.0} for t in infeasible)


def test_infeasible_results_wait_for_the_first_timing() -> None:
    """The GP fits the values of infeasible trials: they carry the worst timing so far, once there is one."""
    p = make(seed=1)
    configs = TOY_SPACE.valid(PROBLEM)
    p.observe([failed_result(configs[0], Status.COMPILE_ERROR), failed_result(configs[1], Status.TIMEOUT)])
    assert [t.state for t in p.study.trials] == [TrialState.FAIL]  # the timeout; the compile error is held
    slow, fast = ok_result(configs[2], ms=4.0), ok_result(configs[3], ms=2.0)
    p.observe([slow, fast])
    by_config = {_config(t, p): t for t in p.study.trials}
    assert by_config[configs[0]].constraints == {"runs": 1.0}
    assert by_config[configs[0]].value == pytest.approx(by_config[configs[2]].value)  # log 4 ms, the worst
    assert by_config[configs[2]].value > by_config[configs[3]].value


def test_held_infeasible_suggestions_are_told_at_close() -> None:
    """One valid config of eight and no result: the invalid suggestions are held, then told at close."""
    space = SearchSpace((Param("a", tuple(range(1, 9))),), constraints=(lambda c, pb: None if c["a"] == 8 else "no",))
    p = make(space=space, budget=8)
    assert [c.config for c in p.propose(SearchState(), 2)] == [Config.of({"a": 8})]
    held = [t.number for t in p._held]
    assert held, "the first suggestion was invalid"
    assert all(t.state is TrialState.RUNNING for t in p.study.trials)
    p.close()
    for t in p.study.trials:
        assert t.state is (TrialState.COMPLETE if t.number in held else TrialState.FAIL)
        assert t.constraints == ({"runs": 1.0} if t.number in held else {})


def test_a_seen_suggestion_gives_the_nearest_unseen_config() -> None:
    p = make()
    best = Config.of({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3})
    near = Config.of({**best.as_dict(), "BLOCK_K": 32})
    far = Config.of({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 8, "num_stages": 5})
    config, how = p._fallback_config([far, near], best)
    assert config == near and "nearest to its suggestion" in how


def test_categorical_parameters_reach_the_gp() -> None:
    space = SearchSpace((Param("kind", ("a", "b", "c")), Param("BLOCK", (16, 32, 64, 128, 256))))
    p = make(space=space, budget=8)  # 2 startup trials, then fits
    sampled: list[dict[str, Any]] = []
    inner = p.study.sampler.sample_relative

    def recorded(*args: Any) -> dict[str, Any]:
        sampled.append(inner(*args))
        return sampled[-1]

    p.study.sampler.sample_relative = recorded  # type: ignore[method-assign]

    def answer(c: Config) -> Result:
        return ok_result(c, ms={"a": 3.0, "b": 1.0, "c": 2.0}[str(c["kind"])] * (1 + int(c["BLOCK"]) / 256))

    state = drive(p, budget=8, batch=2, answer=answer)
    p.close()
    assert len(state.results) == 8
    fitted = [s for s in sampled if s]
    assert fitted and all(s["kind"] in ("a", "b", "c") for s in fitted), sampled


# ---- asking ahead --------------------------------------------------------------------------------
def test_propose_and_observe_never_wait_for_a_fit() -> None:
    p = make(GpSettings(ahead=2, wait_when_empty=False), budget=8)
    state = _past_startup(p)
    gate = Gate(p)
    with _quick("the first propose"):
        assert p.propose(state, 3) == []  # nothing ready yet; the thread starts its first fit
    assert gate.entered.wait(timeout=30)
    late = ok_result(TOY_SPACE.valid(PROBLEM)[7])  # arrives while the fit runs
    with _quick("observe"):
        p.observe([late])
    with _quick("propose"):
        assert p.propose(state, 3) == []
    gate.open.set()
    deadline = time.monotonic() + 30
    got: list = []
    while not got and time.monotonic() < deadline:  # polled as a driver would, not in a spin that
        got = p.propose(state, 3)  # starves the fit's thread of the GIL (its first fit imports torch)
        time.sleep(0.01)
    assert got and "GP model of" in got[0].rationale
    p.close()
    told = {_config(t, p): t for t in p.study.trials}
    assert told[late.config].state is TrialState.COMPLETE, "a result that arrived during a fit was lost"
    assert told[late.config].user_attrs["origin"] == "observed"


def test_ready_configs_are_handed_out_while_the_next_fit_runs() -> None:
    p = make(GpSettings(ahead=2), budget=8)  # alone: waits when nothing is ready
    state = _past_startup(p)
    gate = Gate(p, through=2)
    first = p.propose(state, 1)  # waits for the first fit
    assert len(first) == 1
    assert gate.entered.wait(timeout=30), "the thread asks ahead: two fits pass, the third is held"
    state.pending.update(c.config for c in first)
    with _quick("propose with a fit in flight"):
        second = p.propose(state, 2)
    assert len(second) == 1 and second[0].config != first[0].config
    gate.open.set()
    p.close()


def test_close_stops_the_thread_and_leaves_no_running_trial() -> None:
    p = make(GpSettings(ahead=2), budget=8)
    state = _past_startup(p)
    assert p.propose(state, 2)
    thread = p._thread
    assert thread is not None and thread.is_alive()
    p.close()
    assert not thread.is_alive()
    assert p.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) == []


def test_a_failure_in_the_thread_raises_in_the_caller() -> None:
    p = make(GpSettings(wait_when_empty=True), budget=8)
    state = _past_startup(p)

    def broken(*args: Any) -> Any:
        raise ZeroDivisionError("synthetic failure of a fit")

    p.study.sampler.sample_relative = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="background thread failed: ZeroDivisionError"):
        p.propose(state, 1)
    p.close()  # already raised: close does not raise it again


def test_a_dropped_config_has_its_trial_failed() -> None:
    p = make(GpSettings(ahead=2), budget=8)
    state = SearchState()
    batch = p.propose(state, 2)
    assert batch
    state.dropped.add(batch[0].config)
    p.propose(state, 1)
    p.close()
    dropped = [t for t in p.study.trials if _config(t, p) == batch[0].config]
    assert [t.user_attrs["origin"] for t in dropped] == ["dropped"]
    assert dropped[0].state is TrialState.FAIL


# ---- in the portfolio ----------------------------------------------------------------------------
def test_a_busy_gp_member_gives_its_slots_to_the_others() -> None:
    p = PortfolioProposer(context(budget=8), PortfolioSettings(members=("optuna-gp", "random"), floor=0.5))
    gp = p.members[0].proposer
    assert isinstance(gp, OptunaGpProposer) and not gp.settings.synchronous
    assert not gp.settings.wait_when_empty
    _fast(gp)
    state = _past_startup(gp)
    p.observe(list(state.results.values()))
    gate = Gate(gp)
    try:
        with _quick("a portfolio round"):
            batch = p.propose(state, 4)
        assert len(batch) == 4 and all("via random" in c.rationale for c in batch)
    finally:  # a failure here leaves no held fit thread behind for the next test
        gate.open.set()
        p.close()


def test_a_gp_alone_in_the_portfolio_is_waited_for() -> None:
    p = PortfolioProposer(context(budget=8), PortfolioSettings(members=("optuna-gp",)))
    _fast(p.members[0].proposer)  # type: ignore[arg-type]
    assert p.propose(SearchState(), 0) == []
    batch = p.propose(SearchState(), 2)
    assert batch and all("via optuna-gp" in c.rationale for c in batch)
    p.close()


# ---- in a campaign -------------------------------------------------------------------------------
def test_replay_campaign_with_the_gp_spends_its_budget(tmp_path: Path) -> None:
    """The driver's loop with the GP asking ahead (the campaign's proposer is `optuna-gp`)."""
    campaign = write_campaign(tmp_path / "c.toml", proposer="optuna-gp", budget=8)
    out = tune(TuneOptions(campaign=campaign, backend="replay", dataset=write_dataset(tmp_path / "d.jsonl"),
                           db=tmp_path / "t.db"))
    store = Store(tmp_path / "t.db")
    try:
        results = store.campaign_results(out.campaign_id)
    finally:
        store.close()
    for problem in PROBLEMS:
        mine = [r for _, r in results if dict(r.problem) == problem]
        assert sum(r.status.counts_against_budget for r in mine) == 8
        assert len({r.config for r in mine}) == len(mine)
    assert not [t for t in threading.enumerate() if t.name.startswith("tilepilot-gp")], "closed with the campaign"
