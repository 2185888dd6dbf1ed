"""The campaign loop on the replay backend: budgets, winners, resume, reuse."""

from __future__ import annotations

import re
import sqlite3

import pytest

from tests.replay_fixture import GRID, PROBLEMS, write_campaign, write_dataset
from tilepilot.experiments import InputError
from tilepilot.orchestrator.tune import TuneOptions, tune
from tilepilot.storage.store import Store

GRID_SIZE = 32


@pytest.fixture()
def dataset(tmp_path):
    return write_dataset(tmp_path / "matmul-synthetic.jsonl")


def _opts(tmp_path, dataset, campaign, **kw):
    return TuneOptions(campaign=campaign, backend="replay", dataset=dataset, db=tmp_path / "t.db", **kw)


def _trials(db):
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT campaign_id, problem_key, experiment_key, reused FROM trials").fetchall()
    finally:
        con.close()


@pytest.mark.parametrize("proposer", ["random", "grid", "optuna"])
def test_replay_campaign_spends_budget_and_declares_winners(tmp_path, dataset, proposer):
    campaign = write_campaign(tmp_path / "c.toml", proposer=proposer, budget=6)
    out = tune(_opts(tmp_path, dataset, campaign))
    assert len(out.winners) == len(PROBLEMS)
    rows = _trials(tmp_path / "t.db")
    assert len({r[2] for r in rows}) == len(rows)  # every experiment once
    store = Store(tmp_path / "t.db")
    try:
        results = store.campaign_results(out.campaign_id)
    finally:
        store.close()
    for problem in PROBLEMS:
        mine = [r for _, r in results if dict(r.problem) == problem]
        assert sum(r.status.counts_against_budget for r in mine) == 6
        assert all(r.env.backend == "replay" for r in mine)
    for w in out.winners:
        ok = [r.median_ms for _, r in results if r.problem.key() == w.problem_key and r.median_ms]
        assert w.median_ms == min(ok)


def test_budget_larger_than_space_ends_when_space_is_exhausted(tmp_path, dataset):
    campaign = write_campaign(tmp_path / "c.toml", proposer="grid", budget=1000)
    tune(_opts(tmp_path, dataset, campaign))
    assert len(_trials(tmp_path / "t.db")) == GRID_SIZE * len(PROBLEMS)


def test_interrupted_campaign_resumes_without_measuring_twice(tmp_path, dataset):
    campaign = write_campaign(tmp_path / "c.toml", proposer="optuna", budget=10)
    seen = []

    def stop_after_five(p):
        seen.append(p.done)
        if p.done >= 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tune(_opts(tmp_path, dataset, campaign), on_progress=stop_after_five)
    before = _trials(tmp_path / "t.db")
    assert 5 <= len(before) < 20
    store = Store(tmp_path / "t.db")
    assert store.get_campaign("t").state == "interrupted"
    store.close()
    with pytest.raises(InputError, match="already exists"):
        tune(_opts(tmp_path, dataset, campaign))
    tune(_opts(tmp_path, dataset, campaign, resume=True))
    after = _trials(tmp_path / "t.db")
    assert set(before) <= set(after)
    assert len({r[2] for r in after}) == len(after)
    counted = {}
    store = Store(tmp_path / "t.db")
    for _, r in store.campaign_results(1):
        counted[r.problem.key()] = counted.get(r.problem.key(), 0) + r.status.counts_against_budget
    assert store.get_campaign("t").state == "finished"
    store.close()
    assert all(v == 10 for v in counted.values())


def test_second_campaign_reuses_experiments_from_the_store(tmp_path, dataset):
    tune(_opts(tmp_path, dataset, write_campaign(tmp_path / "a.toml", name="a", proposer="grid", budget=8)))
    tune(_opts(tmp_path, dataset, write_campaign(tmp_path / "b.toml", name="b", proposer="grid", budget=8)))
    rows = _trials(tmp_path / "t.db")
    first = {r[2] for r in rows if r[0] == 1}
    second = [r for r in rows if r[0] == 2]
    shared = [r for r in second if r[2] in first]
    assert len(shared) >= 8  # the grid proposer walks the same configs again
    assert all(r[3] == 1 for r in shared)  # reused from the store, not re-measured
    assert all(r[3] == 0 for r in second if r[2] not in first)
    con = sqlite3.connect(tmp_path / "t.db")
    assert con.execute("SELECT COUNT(*) FROM experiments").fetchone()[0] == len({r[2] for r in rows})
    con.close()


def test_a_result_reused_from_the_store_is_free_of_the_budget(tmp_path, dataset):
    """A second campaign of the same proposer and seed proposes what the first measured: reused, told
    to the proposer and a candidate winner, but not counted: it measures its budget beside them."""
    tune(_opts(tmp_path, dataset, write_campaign(tmp_path / "a.toml", name="a", proposer="rules", budget=6)))
    out = tune(_opts(tmp_path, dataset, write_campaign(tmp_path / "b.toml", name="b", proposer="rules", budget=6),
                     cold=True))
    rows = _trials(tmp_path / "t.db")
    first = {r[2] for r in rows if r[0] == 1}
    for problem in {r[1] for r in rows}:
        second = [r for r in rows if r[0] == 2 and r[1] == problem]
        assert sum(r[3] == 0 for r in second) == 6  # the budget, measured anew
        assert {r[2] for r in second if r[3] == 1} == {r[2] for r in second} & first  # the first's, reused
        assert len(second) > 6  # cold, rules walks its first campaign's picks again: the reused come on top
    store = Store(tmp_path / "t.db")
    try:
        best = {}
        for _, r in store.campaign_results(1):
            if r.median_ms is not None:
                best[r.problem.key()] = min(best.get(r.problem.key(), r.median_ms), r.median_ms)
    finally:
        store.close()
    assert all(w.median_ms <= best[w.problem_key] for w in out.winners)  # never worse than the first found


def test_a_resumed_campaign_still_counts_its_reused_results_free(tmp_path, dataset):
    tune(_opts(tmp_path, dataset, write_campaign(tmp_path / "a.toml", name="a", proposer="rules", budget=6)))
    campaign = write_campaign(tmp_path / "b.toml", name="b", proposer="rules", budget=6)

    def interrupt(progress):
        raise KeyboardInterrupt  # after the first measured batch: a's picks, proposed again, are reused by then

    with pytest.raises(KeyboardInterrupt):
        tune(_opts(tmp_path, dataset, campaign, cold=True), on_progress=interrupt)
    tune(_opts(tmp_path, dataset, campaign, resume=True))
    second = [r for r in _trials(tmp_path / "t.db") if r[0] == 2]
    for problem in {r[1] for r in second}:
        mine = [r for r in second if r[1] == problem]
        assert sum(r[3] == 1 for r in mine) >= 6 and sum(r[3] == 0 for r in mine) == 6


def test_space_table_narrows_and_configs_go_first(tmp_path, dataset):
    extra = ('\n[space]\nnum_warps = [4]\n\n[[configs]]\nBLOCK_SIZE_M = 64\nBLOCK_SIZE_N = 64\nBLOCK_SIZE_K = 32\n'
             "GROUP_SIZE_M = 8\nnum_warps = 8\nnum_stages = 3\n")
    out = tune(_opts(tmp_path, dataset, write_campaign(tmp_path / "c.toml", proposer="random", budget=5,
                                                      extra=extra)))
    store = Store(tmp_path / "t.db")
    results = store.campaign_results(out.campaign_id)
    store.close()
    for problem in PROBLEMS:
        trials = [(t, r) for t, r in results if dict(r.problem) == problem]
        first = min(trials, key=lambda tr: tr[0].seq)
        assert first[0].proposer == "campaign" and first[1].config["num_warps"] == 8
        assert all(r.config["num_warps"] == 4 for t, r in trials if t.proposer != "campaign")


def test_unrecorded_problem_is_one_line_error(tmp_path, dataset):
    extra = '\n[[problems]]\nM = 7\nN = 7\nK = 7\ndtype = "fp16"\n'
    with pytest.raises(InputError, match="is not in the dataset"):
        tune(_opts(tmp_path, dataset, write_campaign(tmp_path / "c.toml", extra=extra)))
    assert not (tmp_path / "t.db").exists()


def test_grid_fixture_matches_declared_size():
    n = 1
    for v in GRID.values():
        n *= len(v)
    assert n == GRID_SIZE


@pytest.mark.parametrize(("share", "tested"), [("0", 0), ("0.25", 4)])
def test_hypothesis_share_sets_the_experiments_held_back_for_hypotheses(tmp_path, dataset, share, tested):
    campaign = write_campaign(tmp_path / "c.toml", proposer="random", budget=16,
                              extra=f"hypothesis_share = {share}\n")
    out = tune(_opts(tmp_path, dataset, campaign))
    store = Store(tmp_path / "t.db")
    results = store.campaign_results(out.campaign_id)
    store.close()
    by_hypotheses = [t for t, _ in results if t.proposer == "hypotheses"]
    assert len(results) == 16 * len(PROBLEMS)  # the budget is spent in full either way
    assert len(by_hypotheses) <= tested * len(PROBLEMS)
    assert (len(by_hypotheses) > 0) == (tested > 0)


def test_problems_searched_together_pick_their_second_batch_after_their_first_results(tmp_path, dataset):
    # Two problems keep the executor busy between them, so neither runs two batches ahead: the
    # rules' picks 5-8 of each problem are made with its first four results in (their rationale
    # says after how many measured), not blind.
    campaign = write_campaign(tmp_path / "c.toml", proposer="rules", budget=8)
    out = tune(_opts(tmp_path, dataset, campaign, cold=True))
    con = sqlite3.connect(tmp_path / "t.db")
    try:
        rows = con.execute("SELECT problem_key, seq, rationale FROM trials WHERE campaign_id = ? "
                           "AND proposer = 'rules' ORDER BY problem_key, seq", [out.campaign_id]).fetchall()
    finally:
        con.close()
    for key in {r[0] for r in rows}:
        mine = [r[2] for r in rows if r[0] == key]
        assert len(mine) == 8
        assert not any(" measured" in why for why in mine[:4]), mine[:4]
        assert all(re.search(r"after \d+ measured", why) for why in mine[4:]), mine[4:]
