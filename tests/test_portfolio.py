"""The portfolio proposer: credit, the floor, determinism, no duplicates, everyone observes.

The objective is synthetic (tests/proposer_toys.py and functions in this file); nothing here
is a measurement.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.proposer_toys import PROBLEM, TINY_SPACE, TOY_SPACE, context, drive, evaluate, ok_result
from tilepilot.agents.base import SearchState
from tilepilot.agents.portfolio import (
    DEFAULT_PRIOR,
    MODEL_PRIOR,
    PRIOR_IMPROVEMENTS,
    PortfolioProposer,
    PortfolioSettings,
)
from tilepilot.experiments import Config, InputError, Result


def portfolio(members: tuple[str, ...], seed: int = 0, budget: int = 40, **kw: object) -> PortfolioProposer:
    return PortfolioProposer(context(seed=seed, budget=budget), PortfolioSettings(members=members, **kw))  # type: ignore[arg-type]


def member_of(rationale: str) -> str:
    return rationale.removeprefix("portfolio via ").split(",", 1)[0]


def test_an_improving_member_is_credited_and_gets_more_slots() -> None:
    p = portfolio(("grid", "random"), floor=0.0)
    first = p.propose(SearchState(), 4)
    owners = {c.config: member_of(c.rationale) for c in first}
    assert set(owners.values()) == {"grid", "random"}
    # SYNTHETIC answers: random's configs each beat the best so far, grid's are slow.
    state = SearchState()
    ms = 10.0
    for cand in first:
        if owners[cand.config] == "random":
            ms *= 0.5
            r = ok_result(cand.config, ms=ms)
        else:
            r = ok_result(cand.config, ms=100.0)
        state.results[cand.config] = r
        p.observe([r])
    by_name = {m.name: m for m in p.members}
    n_random = sum(v == "random" for v in owners.values())
    # the first timing of the problem counts for its member (it found the first working config)
    assert by_name["random"].improvements == n_random
    assert by_name["grid"].improvements == (owners[first[0].config] == "grid")
    nxt = p.propose(state, 4)
    assert sum(member_of(c.rationale) == "random" for c in nxt) >= 3
    assert f"({by_name['random'].improvements} improvements in {n_random})" in nxt[0].rationale


def test_the_floor_keeps_a_member_that_never_improves() -> None:
    p = portfolio(("random", "grid"), floor=0.25)  # random goes first: the first timing is its

    def answer(c: Config) -> Result:  # SYNTHETIC: grid's choices never beat anything
        return ok_result(c, ms=1000.0 - len(state_configs)) if c in from_random else ok_result(c, ms=2000.0)

    state_configs: list[Config] = []
    from_random: set[Config] = set()
    state = SearchState()
    while len(state_configs) < 40:
        batch = p.propose(state, 4)
        for c in batch:
            if member_of(c.rationale) == "random":
                from_random.add(c.config)
        for c in batch:
            r = answer(c.config)
            state_configs.append(c.config)
            state.results[c.config] = r
            p.observe([r])
    grid = next(m for m in p.members if m.name == "grid")
    assert grid.improvements == 0
    assert grid.given >= 0.25 * 40 - 1
    assert grid.given < 20


def test_a_member_that_predicts_before_any_result_gets_the_model_head_start() -> None:
    modelled = portfolio(("rules", "optuna", "random"))  # a GEMM problem, tile parameters: rules has a model
    assert [m.prior for m in modelled.members] == [MODEL_PRIOR, DEFAULT_PRIOR, DEFAULT_PRIOR]
    bare = PortfolioProposer(context(space=TINY_SPACE), PortfolioSettings(members=("rules", "random")))
    assert [m.prior for m in bare.members] == [PRIOR_IMPROVEMENTS["rules"], DEFAULT_PRIOR]


def test_a_small_budget_is_the_models_and_the_floor_owes_whole_slots() -> None:
    # Three members and a floor of a tenth: no member is owed a slot before the tenth, so an
    # 8-config campaign goes to the member with a model; by 12 slots each other member has had one.
    def owners(budget: int) -> dict[str, int]:
        p = portfolio(("rules", "optuna", "random"), budget=budget)
        drive(p, budget=budget)
        return {m.name: m.given for m in p.members}

    assert owners(8) == {"rules": 8, "optuna": 0, "random": 0}
    twelve = owners(12)
    assert twelve["optuna"] >= 1 and twelve["random"] >= 1 and sum(twelve.values()) == 12


def test_same_seed_same_split_and_configs() -> None:
    runs = []
    for _ in range(2):
        p = portfolio(("rules", "optuna", "random"), seed=3)
        state = drive(p, budget=12)
        runs.append(list(state.results))
        p.close()
    assert runs[0] == runs[1]
    other = portfolio(("rules", "optuna", "random"), seed=4)
    assert list(drive(other, budget=12).results) != runs[0]


def test_members_never_duplicate_each_other() -> None:
    # Without a tile model both members start in space order: the same first config. (A floor of
    # a half owes grid the second slot.)
    p = PortfolioProposer(context(space=TINY_SPACE, budget=3), PortfolioSettings(members=("grid", "rules"), floor=0.5))
    batch = p.propose(SearchState(), 3)
    configs = [c.config for c in batch]
    assert len(configs) == len(set(configs)) == 3
    assert {member_of(c.rationale) for c in batch} == {"grid", "rules"}
    state = SearchState(results={c: evaluate(TINY_SPACE, c) for c in configs})
    assert p.propose(state, 3) == []


def test_every_member_observes_every_result() -> None:
    p = portfolio(("rules", "optuna"))
    state = drive(p, budget=12)
    rules, optuna = (m.proposer for m in p.members)
    assert set(rules._results) == set(state.results)  # type: ignore[attr-defined]
    told = [t for t in optuna.study.trials if t.state.is_finished()]  # type: ignore[attr-defined]
    assert len(told) >= len(state.results)
    p.close()


def test_rationale_says_who_and_how_the_round_was_split() -> None:
    p = portfolio(("rules", "optuna", "random"))
    batch = p.propose(SearchState(), 4)
    for c in batch:
        assert c.proposer == "portfolio"
        assert c.rationale.startswith("portfolio via ")
        assert "4 slots: " in c.rationale and "to rules (0 improvements in 0)" in c.rationale
    rules_cands = [c for c in batch if member_of(c.rationale) == "rules"]
    assert rules_cands and all(c.predicted_ms is not None for c in rules_cands)


@pytest.mark.parametrize("members", [(), ("rules", "rules"), ("portfolio",), ("nope",)])
def test_bad_members_are_refused(members: tuple[str, ...]) -> None:
    with pytest.raises(InputError):
        PortfolioProposer(context(space=TOY_SPACE), PortfolioSettings(members=members))


def test_results_of_other_problems_are_refused() -> None:
    p = portfolio(("random",))
    other = PROBLEM.of({**PROBLEM.as_dict(), "M": 64})
    with pytest.raises(ValueError, match="given to the proposer of"):
        p.observe([ok_result(TOY_SPACE.valid(PROBLEM)[0], problem=other)])


# ---- members chosen by the campaign file ---------------------------------------------------------
H200 = "data/replay/matmul-h200.jsonl.gz"  # recorded measurements (a real H200 grid)


def _campaign(tmp_path: Path, extra: str, proposer: str = "portfolio") -> Path:
    path = tmp_path / "c.toml"
    path.write_text(f'[campaign]\nname = "m"\nkernel = "matmul"\nproposer = "{proposer}"\nbudget = 12\n{extra}\n'
                    '[[problems]]\nM = 96\nN = 12288\nK = 4096\ndtype = "bf16"\n')
    return path


def test_a_campaign_file_chooses_the_portfolio_members(tmp_path: Path) -> None:
    from tilepilot.orchestrator.tune import TuneOptions, tune
    from tilepilot.storage.queries import history, open_db

    campaign = _campaign(tmp_path, 'members = ["rules", "random"]')
    tune(TuneOptions(campaign=campaign, backend="replay", dataset=Path(H200), db=tmp_path / "t.db"))
    with open_db(tmp_path / "t.db") as db:
        rows = history(db, campaign="m")
    owners = {member_of(r.rationale) for r in rows if r.proposer == "portfolio"}
    assert owners == {"rules", "random"}, owners  # optuna, a default member, is not among them


@pytest.mark.parametrize(("line", "message"), [
    ('members = ["rules", "tpe"]', "unknown portfolio member 'tpe' in campaign.members (allowed: "),
    ('members = ["rules", "portfolio"]', "unknown portfolio member 'portfolio'"),
    ('members = ["rules", "rules"]', "portfolio member 'rules' is named twice"),
    ("members = []", "campaign.members=[] is not a non-empty list of proposer names"),
    ('members = "rules"', "is not a non-empty list of proposer names"),
])
def test_a_bad_member_list_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  line: str, message: str) -> None:
    from tilepilot.cli import main

    code = main(["tune", str(_campaign(tmp_path, line)), "--backend", "replay", "--dataset", H200,
                 "--db", str(tmp_path / "t.db")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and "\n" not in err, err
    assert not (tmp_path / "t.db").exists()


def test_members_need_the_portfolio_proposer(tmp_path: Path) -> None:
    from tilepilot.experiments import CampaignError
    from tilepilot.experiments.campaign import load_campaign

    with pytest.raises(CampaignError, match=re.escape("campaign.members is for proposer = \"portfolio\", not 'rules'")):
        load_campaign(_campaign(tmp_path, 'members = ["rules"]', proposer="rules"), kernels={"matmul": dict},
                      proposers=["portfolio", "rules"])
