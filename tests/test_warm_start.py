"""Warm start: a new campaign begins with the winners of nearby problems and what the learnings imply.

SYNTHETIC data where a campaign runs: the timings come from tests/replay_fixture.py's formula.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from tests.replay_fixture import GRID, synthetic_ms
from tilepilot.cli import main
from tilepilot.experiments import Config, Hypothesis, Learning, Problem, Scope
from tilepilot.kernels.registry import get_family
from tilepilot.orchestrator.replay import load_dataset
from tilepilot.orchestrator.tune import TuneOptions, tune
from tilepilot.orchestrator.warm_start import Rule, distance, limit, nearest_winners, warm_candidates
from tilepilot.storage.store import Store, WinnerSource

P1 = {"M": 512, "N": 512, "K": 512, "dtype": "fp16"}
P2 = {"M": 64, "N": 1024, "K": 2048, "dtype": "bf16"}
P3 = {"M": 1024, "N": 512, "K": 512, "dtype": "fp16"}  # nearest to P1


def problem(d: dict) -> Problem:
    return Problem.of(d)


def cfg(**kw: int) -> Config:
    base = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8, "num_warps": 4,
            "num_stages": 3}
    return Config.of({**base, **kw})


def source(p: dict, config: Config, *, campaign: str = "a", triton: str = "3.6.0", at: float = 1.0) -> WinnerSource:
    return WinnerSource(problem(p), config, 0.5, campaign, "2.11.0", triton, at)


def test_distance_is_log_shape_with_a_step_per_other_difference():
    a = problem({"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"})
    assert distance(a, a) == 0
    assert distance(a, problem({"M": 1024, "N": 4096, "K": 4096, "dtype": "bf16"})) == pytest.approx(2.0)
    assert distance(a, problem({"M": 4096, "N": 4096, "K": 4096, "dtype": "fp16"})) == pytest.approx(1.0)
    assert distance(a, problem({"M": 2048, "N": 2048, "K": 4096, "dtype": "bf16"})) == pytest.approx(math.sqrt(2))


def test_nearest_winners_take_one_winner_per_problem_same_toolchain_first():
    target = problem(P3)
    winners = [source(P2, cfg(num_warps=8)),
               source(P1, cfg(BLOCK_SIZE_M=128), triton="3.5.0", at=9.0),  # newer, other toolchain
               source(P1, cfg(BLOCK_SIZE_N=128), at=2.0),
               source(P3, cfg(num_stages=4))]
    got = nearest_winners(target, winners, torch="2.11.0", triton="3.6.0")
    assert [(dict(w.problem), w.config) for w, _ in got] == [
        (P3, cfg(num_stages=4)), (P1, cfg(BLOCK_SIZE_N=128)), (P2, cfg(num_warps=8))]
    assert [w.problem for w, _ in nearest_winners(target, winners, exclude_self=True, n=1)] == [problem(P1)]


def test_warm_candidates_fit_the_space_apply_learnings_and_respect_the_budget():
    space = get_family("matmul").space().narrowed({"num_warps": [4, 8], "BLOCK_SIZE_M": [32, 64, 128]})
    target = problem(P3)
    h = Hypothesis("H-1", "matmul", "synthetic device", "num_stages", 4, 3, Scope.parse("M>=256"), "stages")
    learning = Learning("L-1", "H-1", "matmul", "synthetic device", "2.11.0", "3.6.0", Scope.parse("M>=256"),
                        "num_stages=4 is 1.2x as fast", 1.2, 6)
    winners = [source(P1, cfg()), source(P2, cfg(BLOCK_SIZE_M=256)),  # BLOCK_SIZE_M=256 is not in the space
               source({"M": 4096, "N": 512, "K": 512, "dtype": "fp16"}, cfg(num_warps=8, num_stages=4))]
    got = warm_candidates(target, space, winners, [Rule(learning, h)], budget=40)

    def full(c: Config) -> Config:  # as matmul's space writes it: the grouped kernel's defaults filled in
        return space.parse(c.as_dict())

    assert [c.config for c in got] == [full(cfg()), full(cfg(num_stages=4)), full(cfg(num_warps=8, num_stages=4))]
    assert all(c.proposer == "warm-start" for c in got)
    assert got[0].rationale.startswith("warm start: winner of M=512 N=512 K=512 fp16 in campaign a (0.5 ms, "
                                       "log-distance 1.00")
    assert "with num_stages=4 instead of 3, as learning L-1 says (1.20x when M ≥ 256)" in got[1].rationale
    small = problem({"M": 64, "N": 512, "K": 512, "dtype": "fp16"})  # outside the learning's scope
    assert [c.config for c in warm_candidates(small, space, winners, [Rule(learning, h)], budget=40)] == [
        full(cfg()), full(cfg(num_warps=8, num_stages=4))]
    assert len(warm_candidates(target, space, winners, [Rule(learning, h)], budget=4)) == limit(4) == 1
    assert warm_candidates(target, space, winners, budget=40, skip={full(cfg())})[0].config == full(
        cfg(num_warps=8, num_stages=4))


# ---- campaigns -----------------------------------------------------------------------------------
def three_ms(p: dict, c: dict) -> float:
    """The synthetic time of write_three's grid. P1 fits 64- and 128-row tiles alike in the formula:
    its 128-row ones run 1% faster here, so that its best differs from P2's (a 64-row tile) whichever
    order a proposer measures them in."""
    return round(synthetic_ms(p, c) * (0.99 if p == P1 and c["BLOCK_SIZE_M"] == 128 else 1.0), 6)


def write_three(path: Path, device: str = "synthetic device") -> Path:
    lines = []
    for p in (P1, P2, P3):
        for values in itertools.product(*GRID.values()):
            c = dict(zip(GRID, values, strict=True))
            lines.append(json.dumps({"kernel": "matmul", "problem": p, "config": c, "status": "ok",
                                     "median_ms": three_ms(p, c), "device": device,
                                     "torch": "0.0", "triton": "0.0"}))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_campaign(path: Path, name: str, problems: list[dict], *, proposer: str = "random", budget: int = 8,
                   seed: int = 3) -> Path:
    tables = "".join("\n[[problems]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in p.items()) for p in problems)
    path.write_text(f'[campaign]\nname = "{name}"\nkernel = "matmul"\nproposer = "{proposer}"\nbudget = {budget}\n'
                    f"seed = {seed}\nhypothesis_share = 0\n{tables}")
    return path


@pytest.fixture()
def setup(tmp_path: Path) -> dict[str, Path]:
    dataset = write_three(tmp_path / "three.jsonl")
    db = tmp_path / "t.db"
    # one cold campaign a problem: each runs two batches ahead, as a campaign of one problem does, and
    # the two winners differ (see write_three); neither reads the other
    for name, p in (("a", P1), ("a2", P2)):
        tune(TuneOptions(campaign=write_campaign(tmp_path / f"{name}.toml", name, [p], proposer="rules"),
                         backend="replay", dataset=dataset, db=db, cold=True))
    return {"dataset": dataset, "db": db, "root": tmp_path}


def trials(db: Path, campaign: str) -> list[tuple[str, str, dict]]:
    with Store(db) as store:
        row = store.get_campaign(campaign)
        assert row is not None
        return [(t.proposer, t.rationale, dict(r.config)) for t, r in store.campaign_results(row.id)]


def winner_of(db: Path, p: dict) -> dict:
    with Store(db) as store:
        return next(dict(w.config) for w in store.winners_of("matmul", "synthetic device") if dict(w.problem) == p)


def test_new_campaign_starts_from_the_winners_of_nearby_problems(setup):
    db = setup["db"]
    out = tune(TuneOptions(campaign=write_campaign(setup["root"] / "b.toml", "b", [P3]), backend="replay",
                           dataset=setup["dataset"], db=db))
    got = trials(db, "b")
    warm = [t for t in got if t[0] == "warm-start"]
    assert got[: len(warm)] == warm and len(warm) == limit(8) == 2  # first, and within the budget
    assert warm[0][2] == winner_of(db, P1) and "winner of M=512 N=512 K=512 fp16 in campaign a" in warm[0][1]
    assert len(got) == 8  # they count against the budget like any trial
    with Store(db) as store:
        events = [e for e in store.db.execute("SELECT message FROM events WHERE kind = 'warm_start' "
                                              "AND campaign_id = ?", [out.campaign_id])]
    assert len(events) == 1 and events[0][0].startswith("M=1024 N=512 K=512 fp16: 2 config(s) first")


def test_learnings_in_scope_add_their_variant_of_a_winner(setup):
    db = setup["db"]
    best = winner_of(db, P1)
    other = 8 if best["num_warps"] == 4 else 4
    h = Hypothesis("H-w", "matmul", "synthetic device", "num_warps", other, best["num_warps"], Scope.parse("M>=256"),
                   f"num_warps={other} beats num_warps={best['num_warps']} when M ≥ 256")
    with Store(db) as store:
        store.add_hypothesis(1, h)
        store.add_learning(Learning("L-w", "H-w", "matmul", "synthetic device", "0.0", "0.0", h.scope, h.text, 1.1, 6))
    tune(TuneOptions(campaign=write_campaign(setup["root"] / "b.toml", "b", [P3], budget=16), backend="replay",
                     dataset=setup["dataset"], db=db))
    warm = [t for t in trials(db, "b") if t[0] == "warm-start"]
    assert warm[1][2] == {**best, "num_warps": other} and "as learning L-w says" in warm[1][1]


def test_cold_and_resumed_campaigns_start_without_warm_start(setup, capsys):
    db, root = setup["db"], setup["root"]
    code = main(["tune", str(write_campaign(root / "b.toml", "b", [P3])), "--backend", "replay", "--dataset",
                 str(setup["dataset"]), "--db", str(db), "--cold"])
    assert code == 0, capsys.readouterr().err
    assert not [t for t in trials(db, "b") if t[0] == "warm-start"]

    campaign = write_campaign(root / "c.toml", "c", [P3], seed=11)  # configs b has not measured, mostly

    def interrupt(p):
        raise KeyboardInterrupt  # after the first batch measured

    opts = TuneOptions(campaign=campaign, backend="replay", dataset=setup["dataset"], db=db, cold=True)
    with pytest.raises(KeyboardInterrupt):
        tune(opts, on_progress=interrupt)
    tune(TuneOptions(campaign=campaign, backend="replay", dataset=setup["dataset"], db=db, resume=True))
    got = trials(db, "c")
    with Store(db) as store:
        row = store.get_campaign("c")
        assert row is not None
        measured = [t for t, _ in store.campaign_results(row.id) if not t.reused]
    assert len(measured) == 8 and not [t for t in got if t[0] == "warm-start"]  # b's results, reused, are free


def test_warm_candidates_go_in_the_order_the_proposer_predicts_when_it_predicts_them_all():
    from tilepilot.agents.base import ProposerContext
    from tilepilot.agents.rules import RulesProposer
    from tilepilot.orchestrator.warm_start import by_prediction

    space = get_family("matmul").space()
    target = problem({"M": 6144, "N": 1536, "K": 4096, "dtype": "bf16"})
    winners = [source({"M": 4096, "N": 1536, "K": 4096, "dtype": "bf16"}, cfg()),  # nearest: a 64x64 tile
               source({"M": 8192, "N": 2048, "K": 4096, "dtype": "bf16"},
                      cfg(BLOCK_SIZE_M=128, BLOCK_SIZE_N=256, BLOCK_SIZE_K=64, num_warps=8))]
    cands = warm_candidates(target, space, winners, budget=40)
    assert [c.config["BLOCK_SIZE_N"] for c in cands] == [64, 256]  # nearest problem first
    rules = RulesProposer(ProposerContext("matmul", target, space, seed=0, budget=40))
    ranked = by_prediction(cands, rules.score)
    assert [c.config["BLOCK_SIZE_N"] for c in ranked] == [256, 64]  # the tile model's order
    assert ranked[0].predicted_ms is not None and ranked[0].predicted_ms < (ranked[1].predicted_ms or 0)
    assert "; queued 1 of 2: rules predicts" in ranked[0].rationale
    # a proposer that predicts nothing (random), or not every config, leaves the order alone
    assert by_prediction(cands, lambda cs: [(None, "")] * len(cs)) == cands
    assert by_prediction(cands, lambda cs: [(1.0, "a"), (None, "")]) == cands


def test_the_store_hands_a_rules_campaign_the_results_of_nearby_problems_unless_cold(setup, capsys):
    db, root = setup["db"], setup["root"]
    with Store(db) as store:
        assert sorted(p.label() for p in store.measured_problems("matmul", "synthetic device")) == sorted(
            problem(p).label() for p in (P1, P2))
        assert store.measured_problems("matmul", "another device") == []
        assert store.devices("matmul") == ["synthetic device"] and store.devices("softmax") == []
        measured = store.measured("matmul", "synthetic device", problem(P1))
        assert len(measured) == 8 and all(ms == three_ms(P1, dict(c)) for c, ms in measured)
        identity = load_dataset(setup["dataset"], get_family("matmul")).identity  # replay's kernel version
        assert store.kernel_versions("matmul", "synthetic device", problem(P1)) == {identity}
        assert store.kernel_versions("matmul", "another device", problem(P1)) == frozenset()
    tune(TuneOptions(campaign=write_campaign(root / "b.toml", "b", [P3], proposer="rules"), backend="replay",
                     dataset=setup["dataset"], db=db))
    own = [t for t in trials(db, "b") if t[0] == "rules"]
    assert own and any("by the results of M=512 N=512 K=512 fp16" in t[1] for t in own)
    with Store(db) as store:
        notes = [m for (m,) in store.db.execute("SELECT message FROM events WHERE kind = 'proposer'")]
    assert notes == ["rules: the tile model for M=1024 N=512 K=512 fp16 corrected by 8 results of "
                     "M=512 N=512 K=512 fp16, the nearest problem the store holds with vectorised operands, and by "
                     "8 of M=64 N=1024 K=2048 bf16 (the mean of their corrections, weighed by 1/distance²)"]
    code = main(["tune", str(write_campaign(root / "c.toml", "c", [P3], proposer="rules")), "--backend", "replay",
                 "--dataset", str(setup["dataset"]), "--db", str(db), "--cold"])
    assert code == 0, capsys.readouterr().err
    assert not [t for t in trials(db, "c") if "by the results of" in t[1]]


def test_a_campaign_on_an_h200_reads_the_h100s_results_and_one_on_another_chip_does_not(tmp_path: Path):
    h100 = "NVIDIA H100 80GB HBM3"
    db = tmp_path / "t.db"
    tune(TuneOptions(campaign=write_campaign(tmp_path / "a.toml", "a", [P1], proposer="rules"), backend="replay",
                     dataset=write_three(tmp_path / "h100.jsonl", h100), db=db, cold=True))
    for name, device, read in (("b", "NVIDIA H200", True), ("c", "NVIDIA A100-SXM4-80GB", False)):
        tune(TuneOptions(campaign=write_campaign(tmp_path / f"{name}.toml", name, [P3], proposer="rules"),
                         backend="replay", dataset=write_three(tmp_path / f"{name}.jsonl", device), db=db))
        with Store(db) as store:
            row = store.get_campaign(name)
            assert row is not None
            notes = [m for (m,) in store.db.execute(
                "SELECT message FROM events WHERE kind = 'proposer' AND campaign_id = ?", [row.id])]
        version = load_dataset(tmp_path / f"{name}.jsonl", get_family("matmul")).identity  # another dataset's
        assert notes == ([f"rules: the tile model for M=1024 N=512 K=512 fp16 corrected by 8 results of "
                          f"M=512 N=512 K=512 fp16 on the {h100}, the nearest problem the store holds with "
                          f"vectorised operands (measured by another version of the kernel than {version})"]
                         if read else []), name
        assert not [t for t in trials(db, name) if t[0] == "warm-start"]  # winners: the device's own only


def test_a_proposer_that_predicts_takes_first_only_the_winners_it_predicts_no_slower_than_its_own_pick():
    from tilepilot.orchestrator.warm_start import by_prediction

    cands = warm_candidates(problem(P1), get_family("matmul").space(),
                            [source(P3, cfg()), source(P2, cfg(BLOCK_SIZE_N=128))], budget=40)
    times = {64: 2.0, 128: 1.0}
    score = lambda cs: [(times[c["BLOCK_SIZE_N"]], "model") for c in cs]  # noqa: E731
    assert [c.config["BLOCK_SIZE_N"] for c in by_prediction(cands, score)] == [128, 64]
    assert [c.config["BLOCK_SIZE_N"] for c in by_prediction(cands, score, best=1.5)] == [128]
    kept = by_prediction(cands, score, best=1.0)
    assert len(kept) == 1 and "queued 1 of 1" in kept[0].rationale
    assert by_prediction(cands, score, best=0.5) == []
    assert by_prediction(cands[:1], score, best=1.5) == []  # one candidate is checked too


def test_a_rules_campaign_queues_first_only_the_winners_its_model_puts_level_with_its_own_pick(setup):
    db = setup["db"]
    with Store(db) as store:
        fit = warm_candidates(problem(P3), get_family("matmul").space(), store.winners_of("matmul", "synthetic device"),
                              budget=8)
    assert len(fit) == 2  # the winners of P1 and P2 both fit
    out = tune(TuneOptions(campaign=write_campaign(setup["root"] / "b.toml", "b", [P3], proposer="rules"),
                           backend="replay", dataset=setup["dataset"], db=db))
    with Store(db) as store:
        events = [m for (m,) in store.db.execute("SELECT message FROM events WHERE kind = 'warm_start' "
                                                 "AND campaign_id = ?", [out.campaign_id])]
    warm = [t for t in trials(db, "b") if t[0] == "warm-start"]
    assert len(warm) == 1 and "queued 1 of 1: rules predicts" in warm[0][1]
    assert len(events) == 1 and events[0].startswith("M=1024 N=512 K=512 fp16: 1 config(s) first")
