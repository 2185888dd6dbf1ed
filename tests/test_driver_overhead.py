"""The driver's per-batch work is proportional to what arrived, and changes no decision.

The equivalence tests run the same replay campaign on the shipped H100 matmul recording twice:
as it runs, and with every shortcut turned off (the hook re-reads every result and always
steps the lab, the miner refits every problem, the queue is read and re-scored after every
batch, the lab pairs every hypothesis' observations from scratch and recomputes every spread,
`random` samples from the list of every unseen valid config, `SearchState.seen` is a new set
each time), and compare what each stored: the queue with its priorities and reasons, the events,
the hypotheses and verdicts, the trials and the winners.
"""

from __future__ import annotations

import json
import math
import sqlite3
import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.replay_fixture import write_campaign
from tests.test_queue_rescore import write_twins
from tilepilot.agents import base as base_mod
from tilepilot.agents import hypotheses as hyp_mod
from tilepilot.agents.hypotheses import HypothesisLab
from tilepilot.agents.miner import HypothesisMiner
from tilepilot.agents.pairs import find_pairs
from tilepilot.agents.random import RandomProposer
from tilepilot.experiments import Campaign, Candidate, Config, Param, Problem, SearchSpace, experiment_key
from tilepilot.orchestrator import driver as driver_mod
from tilepilot.orchestrator.driver import Driver, ListedSpace, pending_limit
from tilepilot.orchestrator.executor import Batch
from tilepilot.orchestrator.hypothesis_hook import HypothesisHook
from tilepilot.orchestrator.tune import TuneOptions, tune
from tilepilot.storage.store import Store

ROOT = Path(__file__).resolve().parents[1]
DATASET = ROOT / "data" / "replay" / "matmul-h100.jsonl.gz"
# three recorded problems: enough results for the miner to state, test and decide hypotheses
PROBLEMS = [{"M": 16, "N": 4096, "K": 4096, "dtype": "bf16"}, {"M": 4096, "N": 4096, "K": 4096, "dtype": "fp16"},
            {"M": 32, "N": 8192, "K": 8192, "dtype": "bf16"}]


def _campaign(path: Path, proposer: str, budget: int, share: float) -> Path:
    rows = "".join("\n[[problems]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in p.items()) for p in PROBLEMS)
    path.write_text(f'[campaign]\nname = "overhead"\nkernel = "matmul"\nproposer = "{proposer}"\nbudget = {budget}\n'
                    f"seed = 2\nhypothesis_share = {share}\n{rows}")
    return path


def _run(tmp: Path, proposer: str, budget: int, share: float) -> dict[str, Any]:
    tmp.mkdir()
    db = tmp / "t.db"
    tune(TuneOptions(campaign=_campaign(tmp / "c.toml", proposer, budget, share), backend="replay",
                     dataset=DATASET, db=db, cold=True))
    con = sqlite3.connect(db)
    try:
        def q(sql: str) -> list[tuple[Any, ...]]:
            return con.execute(sql).fetchall()
        return {
            "queue": q("SELECT id, problem_key, config_key, priority, reason, state, hypothesis_id FROM queue "
                       "ORDER BY id"),
            "trials": q("SELECT experiment_key, hypothesis_id, reused FROM trials ORDER BY id"),
            "events": q("SELECT kind, message, data FROM events WHERE kind != 'campaign_started' ORDER BY id"),
            "hypotheses": q("SELECT id, param, text, rationale FROM hypotheses ORDER BY rowid"),
            "verdicts": q("SELECT hypothesis_id, state, pairs, wins, losses, effect, reason FROM verdicts "
                          "ORDER BY rowid"),
            "winners": q("SELECT problem_key, experiment_key, runner_up_key, margin FROM winners ORDER BY problem_key"),
        }
    finally:
        con.close()


def _without_shortcuts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Driver, "_rescore_changes_nothing", lambda self, run, statuses, queued: False)
    monkeypatch.setattr(HypothesisHook, "_idle", lambda self: False)
    monkeypatch.setattr(HypothesisMiner, "_fitted", lambda self, problem, obs: self._effects(obs))
    incremental = HypothesisHook._observations

    def every_result(self: HypothesisHook) -> list[Any]:
        self._obs = {p: [] for p in self._obs}
        self._read = dict.fromkeys(self._read, 0)
        return incremental(self)

    monkeypatch.setattr(HypothesisHook, "_observations", every_result)
    _judge_from_scratch(monkeypatch)
    monkeypatch.setattr(RandomProposer, "_unseen", lambda self, state: [
        c for c in self._listing() if c not in set(state.results) | state.pending | state.dropped])
    monkeypatch.setattr(base_mod.SearchState, "seen",
                        property(lambda self: set(self.results) | self.pending | self.dropped))
    monkeypatch.setattr(Driver, "_dispatch_batches", _dispatch_reading_the_head_each_time)
    monkeypatch.setattr(Driver, "_key", lambda self, problem, config: experiment_key(
        self.campaign.kernel, self.executor.kernel_version, problem, config, self.executor.environment))
    statuses = Driver._hypothesis_statuses

    def statuses_read_each_time(self: Driver) -> list[Any]:
        self._statuses = (-1, [])
        return statuses(self)

    monkeypatch.setattr(Driver, "_hypothesis_statuses", statuses_read_each_time)


def _dispatch_reading_the_head_each_time(self: Driver) -> list[tuple[str, str, None]]:
    """The dispatch as it was: the head of the queue (its first HEADS rows) read again for every batch."""
    while self.executor.free_slots() > 0:
        heads = self.store.queue_heads(self.campaign_id, limit=driver_mod.HEADS)
        if not heads:
            break
        picked = [qid for qid, problem_key in heads if problem_key == heads[0][1]][: self.batch_size]
        problem = self.candidates[picked[0]].problem
        batch = Batch(self._next_batch, problem, tuple(self.candidates[qid].config for qid in picked), tuple(picked))
        self._next_batch += 1
        for qid in picked:
            self.store.set_queue_state(qid, "running")
        self.store.log_event("started", f"{len(picked)} config(s) of {problem.label()} started",
                             campaign_id=self.campaign_id)
        self._running.update(picked)
        self.executor.submit(batch)
    return []


class _ScratchIndex:
    """The lab's pair index as it was: every hypothesis' drawn pairs found anew over every observation."""

    def __init__(self, observations: list[Any]) -> None:
        self.observations = observations

    def drawn(self, h: Any) -> list[Any]:
        return find_pairs(h, self.observations, drawn=True)


def _judge_from_scratch(monkeypatch: pytest.MonkeyPatch) -> None:
    def feed(self: HypothesisLab, observations: list[Any]) -> None:
        self._index = _ScratchIndex(list(observations))

    def spread(self: HypothesisLab, observations: list[Any]) -> float:
        sds = []
        for h in self.hypotheses.values():
            x = [math.log(p.ratio) for p in find_pairs(h, observations, drawn=True)]
            if len(x) >= hyp_mod.MIN_PAIRS:
                sds.append(statistics.stdev(x))
        return statistics.median(sds) if sds else hyp_mod.SPREAD_FLOOR

    monkeypatch.setattr(HypothesisLab, "_feed", feed)
    monkeypatch.setattr(HypothesisLab, "_spread", spread)


@pytest.mark.parametrize(("proposer", "budget", "share", "shows"), [
    ("random", 60, 0.25, ("verdict", "reordered")),  # hypotheses move the queue
    ("rules", 40, 0.3, ("reordered",)),  # predictions move it
    ("random", 30, 0.0, ()),
])
def test_shortcuts_change_no_proposal_order_verdict_or_winner(tmp_path, monkeypatch, proposer, budget, share, shows):
    fast = _run(tmp_path / "fast", proposer, budget, share)
    _without_shortcuts(monkeypatch)
    slow = _run(tmp_path / "slow", proposer, budget, share)
    for part in fast:
        assert fast[part] == slow[part], part
    kinds = {kind for kind, _, _ in fast["events"]}
    assert set(shows) <= kinds, "the campaign did not exercise what the comparison is about"


@pytest.mark.parametrize("share", [0.0, 0.25])
def test_shortcuts_change_no_drop_for_a_failure_region(tmp_path, monkeypatch, share):
    """Two synthetic problems of one specialisation whose biggest tiles run out of shared memory:
    queued configs in that region are dropped unmeasured."""
    dataset = write_twins(tmp_path / "twins.jsonl")

    def run(name: str) -> list[tuple[Any, ...]]:
        (tmp_path / name).mkdir()
        campaign = write_campaign(tmp_path / name / "c.toml", proposer="random", budget=64,
                                  extra=f"hypothesis_share = {share}\n")
        tune(TuneOptions(campaign=campaign, backend="replay", dataset=dataset, db=tmp_path / name / "t.db", cold=True))
        con = sqlite3.connect(tmp_path / name / "t.db")
        try:
            return (con.execute("SELECT id, config_key, priority, reason, state FROM queue ORDER BY id").fetchall()
                    + con.execute("SELECT kind, message FROM events WHERE kind != 'campaign_started' "
                                  "ORDER BY id").fetchall())
        finally:
            con.close()

    fast = run("fast")
    _without_shortcuts(monkeypatch)
    assert fast == run("slow")
    assert any(row[0] == "dropped" for row in fast)


def test_batches_picked_from_the_head_read_before_are_those_a_fresh_read_picks(tmp_path, monkeypatch):
    """The dispatch picks several batches from one read of the queue's head, and reads it again
    when what is left of it cannot fill one: a head of 5 rows makes it read again often."""
    monkeypatch.setattr(driver_mod, "HEADS", 5)
    short = _run(tmp_path / "short", "random", 30, 0.25)
    monkeypatch.setattr(Driver, "_dispatch_batches", _dispatch_reading_the_head_each_time)
    fresh = _run(tmp_path / "fresh", "random", 30, 0.25)
    for part in short:
        assert short[part] == fresh[part], part


def test_progress_reports_the_best_so_far_kept_as_results_come(tmp_path, monkeypatch):
    """The best time of each problem in a progress report, kept by the driver as results come, is
    the fastest of the problem's results at that moment (as `SearchState.best` finds it)."""
    seen: list[tuple[dict[Problem, float], dict[Problem, float]]] = []
    collect = Driver._collect

    def checked(self: Driver, timeout_s: float) -> None:
        report = self.on_progress

        def on_progress(progress: driver_mod.Progress) -> None:
            bests = {p: run.state.best() for p, run in self.runs.items()}
            seen.append((progress.best_ms, {p: b.median_ms for p, b in bests.items()
                                            if b is not None and b.median_ms is not None}))
            if report:
                report(progress)

        self.on_progress = on_progress
        try:
            collect(self, timeout_s)
        finally:
            self.on_progress = report

    monkeypatch.setattr(Driver, "_collect", checked)
    _run(tmp_path / "c", "random", 20, 0.25)
    assert seen and all(kept == scanned for kept, scanned in seen)
    assert len(seen[-1][0]) == len(PROBLEMS)


def test_share_zero_never_steps_the_lab(tmp_path, monkeypatch):
    steps: list[int] = []
    step = HypothesisLab.step
    monkeypatch.setattr(HypothesisLab, "step", lambda self, *a, **kw: steps.append(1) or step(self, *a, **kw))
    _run(tmp_path / "zero", "random", 20, 0.0)
    assert steps == []
    _run(tmp_path / "share", "random", 20, 0.25)
    assert steps


def test_queue_is_not_read_to_rescore_when_nothing_can_move(tmp_path, monkeypatch):
    reads: list[str] = []
    slots = Store.queue_slots

    def counted(self: Store, campaign_id: int, problem_key: str) -> Any:
        reads.append(problem_key)
        return slots(self, campaign_id, problem_key)

    monkeypatch.setattr(Store, "queue_slots", counted)
    _run(tmp_path / "random", "random", 20, 0.0)  # no predictions, no hypotheses
    assert reads == []
    _run(tmp_path / "rules", "rules", 20, 0.0)  # its predictions change with every result
    assert reads


def test_valid_configs_listed_once_per_problem(tmp_path, monkeypatch):
    listed: list[Problem] = []
    valid = SearchSpace.valid
    monkeypatch.setattr(SearchSpace, "valid", lambda self, problem: listed.append(problem) or valid(self, problem))
    _run(tmp_path / "c", "random", 30, 0.25)  # the estimate, the proposer and the miner's draws all list them
    assert sorted(p.key() for p in listed) == sorted(Problem.of(p).key() for p in PROBLEMS)


def test_listed_space_hands_out_copies_of_one_listing():
    space = SearchSpace((Param("a", (1, 2, 3)), Param("b", (1, 2))),
                        (lambda c, p: "too big" if c["a"] * c["b"] > 4 else None,))
    listed = ListedSpace.of(space)
    problem = Problem.of({"M": 1})
    first = listed.valid(problem)
    first.clear()  # a caller's copy: the listing stays whole
    assert listed.valid(problem) == space.valid(problem) == [Config.of({"a": a, "b": b})
                                                             for a, b in ((1, 1), (1, 2), (2, 1), (2, 2), (3, 1))]
    assert ListedSpace.of(listed) is listed


def test_pending_limit_scales_with_the_compile_pool():
    assert pending_limit(SimpleNamespace(), 4) == 8  # replay, interpret: two batches
    assert pending_limit(SimpleNamespace(pool=None), 4) == 8
    slot = SimpleNamespace(quarantined=False)
    ray_like = SimpleNamespace(pool=SimpleNamespace(capacity=15), slots=[slot, slot, SimpleNamespace(quarantined=True)],
                               per_worker=2)
    from tilepilot.orchestrator.ray_executor import READY_PER_GPU

    # the pool's compiles, READY_PER_GPU compiled batches waiting and per_worker held, per usable GPU, and a batch
    need = 15 + (READY_PER_GPU + 2) * 2 * 4 + 4
    assert pending_limit(ray_like, 4) == need
    assert pending_limit(ray_like, 4, problems=3) == -(-need // 3)  # shared by the problems searching
    assert 3 * pending_limit(ray_like, 4, problems=3) >= need  # which still keep it busy
    assert pending_limit(ray_like, 4, problems=64) == 4  # never below one batch
    assert pending_limit(SimpleNamespace(pool=SimpleNamespace(capacity=0), slots=[], per_worker=2), 4) == 8


def test_problems_sharing_an_executor_run_one_batch_ahead_of_their_results():
    # Two batches keep a worker busy; where several problems search, they share them, so none
    # proposes its next batch before its last one's results are in.
    assert pending_limit(SimpleNamespace(), 4, problems=1) == 8
    assert pending_limit(SimpleNamespace(), 4, problems=2) == 4
    assert pending_limit(SimpleNamespace(), 4, problems=29) == 4
    assert pending_limit(SimpleNamespace(), 4, problems=3) == 4


def test_queue_heads_follow_the_dispatch_order(tmp_path):
    store = Store(tmp_path / "q.db")
    try:
        problems = [Problem.of(p) for p in PROBLEMS[:2]]
        campaign = Campaign(name="q", kernel="matmul", proposer="random", budget=4, seed=0, problems=tuple(problems))
        cid = store.create_campaign(campaign, backend="replay", dataset="", device="d")
        cands = [Candidate(problems[i % 2], Config.of({"BLOCK_SIZE_M": 16 * (i + 1)}), "t", "") for i in range(6)]
        ids = store.enqueue(cid, cands, priorities=[-1.0, -2.0, 5.0, -4.0, -5.0, 5.0], reasons=[""] * 6)
        store.pin_queued(ids[4], priority=0.0, reason="pinned")
        store.set_queue_state(ids[0], "running")
        heads = store.queue_heads(cid, limit=4)
        assert heads == [(r.id, r.problem_key) for r in store.queued(cid, limit=4)]
        assert [qid for qid, _ in heads] == [ids[4], ids[2], ids[5], ids[1]]
        for problem in problems:  # what re-scoring reads of a problem's queue: its rows in the same order
            rows = store.queued(cid, problem_key=problem.key())
            assert store.queue_slots(cid, problem.key()) == [(r.id, r.priority, r.reason) for r in rows]
    finally:
        store.close()


def test_driver_module_keeps_ray_out_of_replay():
    assert "ray" not in vars(driver_mod)


def _effects_from_scratch(miner: HypothesisMiner, obs: list[Any]) -> dict[Any, float]:
    """The miner's fit as it was written before it read incrementally (the reference)."""
    import itertools

    import numpy as np

    from tilepilot.agents.miner import RIDGE
    from tilepilot.experiments import same_value

    cols = [(p, v) for p, values in miner.choices.items() for v in values
            if any(same_value(o.config.get(p), v) for o in obs)]
    x = np.array([[1.0 if same_value(o.config.get(p), v) else 0.0 for p, v in cols] for o in obs])
    y = np.log([o.median_ms for o in obs])
    x -= x.mean(axis=0)
    y -= y.mean()
    beta = np.linalg.solve(x.T @ x + RIDGE * np.eye(len(cols)), x.T @ y)
    index = {(p, repr(v)): i for i, (p, v) in enumerate(cols)}
    out = {}
    for p, values in miner.choices.items():
        for a, b in itertools.pairwise(values):
            ia, ib = index.get((p, repr(a))), index.get((p, repr(b)))
            if ia is not None and ib is not None:
                out[(p, a, b)] = float(beta[ib] - beta[ia])
    return out


def test_incremental_fit_is_bit_identical_to_a_fit_from_scratch():
    import random

    from tests import hypothesis_fixture as fx

    grid = fx.grid_observations()
    problems = list(dict.fromkeys(o.problem for o in grid))
    space = SearchSpace(tuple(Param(k, v) for k, v in fx.GRID.items()))
    miner = HypothesisMiner(kernel="matmul", device=fx.DEVICE, origin="t", spaces={p: space for p in problems})
    rng = random.Random(0)
    for p in problems[:3]:
        mine = [o for o in grid if o.problem == p]
        rng.shuffle(mine)
        grown: list[Any] = []
        assert len(mine) >= 24
        for n in (4, 5, 9, 9, 17, 18, len(mine)):
            grown = grown + mine[len(grown):n]  # a new list each time, as the driver's hook hands over
            assert miner._fitted(p, grown) == _effects_from_scratch(miner, grown) == miner._effects(grown)
        other = mine[2:14]  # not a continuation: read again from scratch
        assert miner._fitted(p, other) == _effects_from_scratch(miner, other)
