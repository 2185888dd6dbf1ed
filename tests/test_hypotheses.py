"""The hypothesis ledger: scopes, the judge, the miner, the lab, storage and the driver hook.

The data with a known truth is SYNTHETIC (tests/hypothesis_fixture.py): planted effects plus
seeded noise, not GPU measurements.
"""

from __future__ import annotations

import dataclasses
import math
import random
import sqlite3

import pytest

from tests import hypothesis_fixture as fx
from tests.replay_fixture import write_campaign
from tilepilot.agents.hypotheses import HypothesisLab, LedgerEntry, check_verdict, find_pairs, judge
from tilepilot.agents.miner import HypothesisMiner, candidate_scopes
from tilepilot.agents.pairs import Observation
from tilepilot.experiments import (
    Campaign,
    Candidate,
    Config,
    Environment,
    Evidence,
    Hypothesis,
    HypothesisState,
    InputError,
    Learning,
    Param,
    Problem,
    Result,
    Scope,
    SearchSpace,
    Status,
    Timing,
    Verdict,
    experiment_key,
)
from tilepilot.orchestrator.tune import TuneOptions, tune
from tilepilot.storage import Store, ledger, open_db

SHARE = "hypothesis_share = 0.25\n"  # a quarter of each small budget tests hypotheses
ENV = Environment("replay", fx.DEVICE, "0.0", "0.0")
PROBLEMS = [Problem.of(p) for p in fx.PROBLEMS]
SPACE = SearchSpace(tuple(Param(k, v) for k, v in fx.GRID.items()))
SPACES = {p: SPACE for p in PROBLEMS}
GRID = fx.grid_observations()


def hyp(param: str, a: object, b: object, scope: str = "", origin: str = "t") -> Hypothesis:
    return Hypothesis.new(origin=origin, kernel="matmul", device=fx.DEVICE, param=param, a=a, b=b,
                          scope=Scope.parse(scope))


def sample(n_per_problem: int, seed: int = 0) -> list[Observation]:
    rng = random.Random(seed)
    out = []
    for p in PROBLEMS:
        mine = [o for o in GRID if o.problem == p]
        out.extend(rng.sample(mine, n_per_problem))
    return out


def drawn(obs: list[Observation], h: Hypothesis) -> list[Observation]:
    """The observations as if each had been queued to test `h` (so every pair is its evidence)."""
    return [dataclasses.replace(o, tests=h.id) for o in obs]


def noise_pairs(h: Hypothesis, n_pairs: int, sd: float, seed: int = 0) -> list[Observation]:
    """n pairs on num_warps (8 vs 4) whose ratios are pure noise of `sd` (log scale), drawn for h."""
    rng = random.Random(seed)
    p = PROBLEMS[3]
    out = []
    for i in range(n_pairs):
        out.append(Observation(f"a{i}", p, Config.of({"i": i, "num_warps": 8}), 1.0, 0.01, h.id))
        out.append(Observation(f"b{i}", p, Config.of({"i": i, "num_warps": 4}), math.exp(rng.gauss(0.0, sd)), 0.01,
                               h.id))
    return out


# ---- scopes --------------------------------------------------------------------------------------

def test_scope_parses_bounds_and_tests_problems():
    s = Scope.parse("M<=64, K ≥ 4096 and dtype=bf16")
    assert s.text() == "K ≥ 4096 and M ≤ 64 and dtype = bf16"
    assert s.contains({"M": 64, "N": 1, "K": 4096, "dtype": "bf16"})
    assert not s.contains({"M": 65, "N": 1, "K": 4096, "dtype": "bf16"})
    assert not s.contains({"M": 16, "N": 1, "K": 4096, "dtype": "fp16"})
    assert Scope.parse("all") == Scope() and Scope().contains({"M": 1})
    assert Scope.from_list(s.as_list()) == s


@pytest.mark.parametrize("text,match", [
    ("M<=abc", "'abc' is not a number"), ("M", "expected NAME OP VALUE"), ("<=3", "expected NAME OP VALUE"),
    ("M=>3", "unknown operator"), ("M<<3", "unknown operator"),
])
def test_bad_scope_filter_is_one_line_input_error(text, match):
    with pytest.raises(InputError, match=match) as e:
        Scope.parse(text)
    assert "\n" not in str(e.value)


def test_scope_overlap_and_cover_follow_the_intervals():
    small, large = Scope.parse("M<=64"), Scope.parse("M>=128")
    assert not small.overlaps(large) and small.overlaps(Scope.parse("M>=64"))
    assert not Scope.parse("M<64").overlaps(Scope.parse("M>=64"))
    assert Scope.parse("M<=128").covers(small) and not small.covers(Scope.parse("M<=128"))
    assert Scope().covers(small) and not small.covers(Scope())
    assert not Scope.parse("dtype=bf16").overlaps(Scope.parse("dtype=fp16"))
    assert Scope.parse("dtype=bf16").covers(Scope.parse("dtype=bf16, M<=4"))


def test_hypothesis_id_depends_on_origin_statement_key_does_not():
    a, b = hyp("num_stages", 4, 3, "K>=4096", "c1"), hyp("num_stages", 4, 3, "K>=4096", "c2")
    assert a.id != b.id and a.statement_key == b.statement_key
    assert a.text == "num_stages=4 beats num_stages=3 when K ≥ 4096"
    assert hyp("BLOCK_SIZE_N", 128, 64).text.endswith("on every problem")
    with pytest.raises(ValueError, match="two different values"):
        hyp("num_stages", 4, 4)


# ---- the judge -----------------------------------------------------------------------------------

def test_pairs_differ_only_in_the_parameter_and_lie_in_scope():
    pairs = find_pairs(hyp("num_stages", 4, 3, "K>=4096"), GRID)
    assert len(pairs) == 16 * 4  # 16 configs with num_stages=4 on 4 problems with K >= 4096
    for p in pairs:
        assert p.a.config["num_stages"] == 4 and p.b.config["num_stages"] == 3
        assert {k: v for k, v in p.a.config.items() if k != "num_stages"} == \
               {k: v for k, v in p.b.config.items() if k != "num_stages"}
        assert p.a.problem == p.b.problem and p.a.problem["K"] >= 4096


def test_judge_validates_a_real_effect():
    h = hyp("num_stages", 4, 3, "K>=4096")
    v, evidence = judge(h, drawn(sample(12, seed=3), h))
    assert v.state is HypothesisState.VALIDATED
    assert 1.08 < v.effect < 1.16 and v.ci_low > 1.0 and v.pairs >= 3
    assert len(evidence) == v.pairs and all(e.relation == "supports" for e in evidence)


def test_judge_rules_out_the_reversed_effect():
    h = hyp("num_stages", 3, 4, "K>=4096")
    v, evidence = judge(h, drawn(sample(12, seed=3), h))
    assert v.state is HypothesisState.RULED_OUT and v.effect < 0.95
    assert "other way" in v.reason and all(e.relation == "refutes" for e in evidence)


def test_judge_counts_only_pairs_drawn_to_test_the_hypothesis():
    h = hyp("num_stages", 4, 3, "K>=4096")
    obs = sample(12, seed=3)
    assert judge(h, obs)[0].pairs == 0  # the proposer's configs are not a fair sample of the scope
    one = next(p for p in find_pairs(h, obs))
    marked = [dataclasses.replace(o, tests=h.id) if o is one.b else o for o in obs]
    v, evidence = judge(h, marked)
    assert v.pairs == 1 and (evidence[0].experiment_a, evidence[0].experiment_b) == (one.a.key, one.b.key)
    other = hyp("num_stages", 4, 3, "K>=8192")
    assert judge(other, drawn(obs, h))[0].pairs == 0  # drawn for another hypothesis


def test_judge_stays_undecided_on_noise_with_few_pairs():
    h = hyp("num_warps", 8, 4)
    obs = noise_pairs(h, 6, sd=0.02)
    assert judge(h, obs)[0].state is HypothesisState.TESTING
    final, _ = judge(h, obs, final=True)
    assert final.state is HypothesisState.INCONCLUSIVE


def test_judge_rules_out_an_effect_within_noise_only_with_many_pairs():
    h = hyp("num_warps", 8, 4)
    assert judge(h, noise_pairs(h, 12, sd=0.003))[0].state is not HypothesisState.RULED_OUT
    v, _ = judge(h, noise_pairs(h, 600, sd=0.003))
    assert v.state is HypothesisState.RULED_OUT and "within the noise" in v.reason


def test_judge_never_decides_on_fewer_than_three_pairs():
    h = hyp("BLOCK_SIZE_M", 64, 128, "M<=64")
    two = find_pairs(h, GRID)[:2]
    v, _ = judge(h, drawn([o for p in two for o in (p.a, p.b)], h), final=True)
    assert v.pairs == 2 and v.state is HypothesisState.INCONCLUSIVE


def test_judge_does_not_validate_when_one_problem_in_scope_goes_the_other_way():
    # the geometric mean over M <= 4096 favours 64, but on M = 4096 128 is faster
    h = hyp("BLOCK_SIZE_M", 64, 128, "M<=4096")
    v, _ = judge(h, drawn(GRID, h))
    assert v.state is not HypothesisState.VALIDATED and "is faster on" in v.reason


def test_noise_threshold_comes_from_the_measured_spread():
    h = hyp("num_stages", 4, 3, "K>=4096")
    wide = [Observation(o.key, o.problem, o.config, o.median_ms, 0.30, h.id) for o in sample(12, seed=3)]
    v, _ = judge(h, wide)
    assert v.noise == pytest.approx(0.30) and v.state is not HypothesisState.VALIDATED


def test_check_verdict_scores_against_the_full_grid():
    good = Verdict("x", HypothesisState.VALIDATED, 5, 5, 0, 1.1, 1.05, 1.15, 0.02, "")
    bad = Verdict("x", HypothesisState.RULED_OUT, 5, 5, 0, 1.1, 1.05, 1.15, 0.02, "")
    c = check_verdict(hyp("num_stages", 4, 3, "K>=4096"), good, GRID)
    assert c.agrees and c.same_direction and c.grid_pairs == 64 and 1.10 < c.grid_effect < 1.14
    assert check_verdict(hyp("num_stages", 4, 3, "K>=4096"), bad, GRID).agrees is False
    assert check_verdict(hyp("num_warps", 8, 4), bad, GRID).agrees is True  # no effect: ruled out is right
    undecided = Verdict("x", HypothesisState.INCONCLUSIVE, 1, 1, 0, 1.1, None, None, 0.02, "")
    assert check_verdict(hyp("num_warps", 8, 4), undecided, GRID).agrees is None


# ---- the miner -----------------------------------------------------------------------------------

def miner(origin: str = "t") -> HypothesisMiner:
    return HypothesisMiner(kernel="matmul", device=fx.DEVICE, origin=origin, spaces=SPACES, seed=1)


def test_candidate_scopes_are_thresholds_between_the_problems():
    texts = [s.text() for s, _ in candidate_scopes(PROBLEMS)]
    assert texts[0] == "every problem"
    assert "M ≤ 64" in texts and "M ≥ 2048" in texts and "K ≥ 4096" in texts and "dtype = fp16" in texts
    sets = [frozenset(p.key() for p in members) for _, members in candidate_scopes(PROBLEMS)]
    assert len(sets) == len(set(sets))  # one scope per distinct set of problems


PLANTED = [("BLOCK_SIZE_M", 64, 128, {"M": 16}), ("BLOCK_SIZE_M", 128, 64, {"M": 4096}),
           ("num_stages", 4, 3, {"K": 8192}), ("BLOCK_SIZE_N", 128, 64, {"M": 16})]


def _states(h: Hypothesis, param: str, a: object, b: object, where: dict) -> bool:
    probe = {"M": 64, "N": 4096, "K": 4096, "dtype": "bf16", **where}
    return (h.param, h.a, h.b) == (param, a, b) and h.scope.contains(probe)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_miner_proposes_true_nontrivial_hypotheses_on_synthetic_data(seed):
    obs = sample(8, seed=seed)
    found = miner().mine(obs, known=[], room={p: 2 for p in PROBLEMS}, max_new=6)
    true = []
    for h in found:
        truth = check_verdict(h, Verdict(h.id, HypothesisState.VALIDATED, 0, 0, 0, None, None, None, 0.0, ""), GRID)
        true.append(truth.grid_effect > 1.0)
        assert h.a != h.b and h.rationale
    assert sum(true) >= 0.75 * len(found)  # a hypothesis may be wrong (the judge is there for that), most are not
    assert sum(any(_states(h, *p) for h in found) for p in PLANTED) >= 3  # the planted effects, with their scopes
    questions = [(h.param, frozenset((h.a, h.b))) for h in found]
    for i, h in enumerate(found):  # no two on the same question over overlapping problems
        for j, g in enumerate(found):
            if i < j and questions[i] == questions[j]:
                assert not h.scope.overlaps(g.scope)


def test_miner_does_not_repropose_what_the_ledger_decided():
    obs = sample(8, seed=0)
    first = miner().mine(obs, known=[], room={p: 2 for p in PROBLEMS}, max_new=6)
    decided = [LedgerEntry(h, HypothesisState.VALIDATED) for h in first]
    again = miner("another campaign").mine(obs, known=decided, room={p: 2 for p in PROBLEMS}, max_new=6)
    for h in again:
        assert all(h.statement_key != d.hypothesis.statement_key for d in decided)
        assert not any(d.hypothesis.same_question(h) and d.hypothesis.scope.overlaps(h.scope) for d in decided)


def _scan_blocked(h: Hypothesis, entries: list[LedgerEntry]) -> bool:
    """The ledger rule written out as a scan, independently of the miner's index: already stated,
    or the same question asked of overlapping problems by an entry of this campaign or by one
    that is not inconclusive."""
    for e in entries:
        g = e.hypothesis
        if not g.same_question(h):
            continue
        if g.statement_key == h.statement_key:
            return True
        if (e.here or e.state is not HypothesisState.INCONCLUSIVE) and g.scope.overlaps(h.scope):
            return True
    return False


def test_the_miners_question_index_blocks_exactly_what_the_ledger_scan_blocks():
    from tilepilot.agents.miner import _blocked, _Questions

    rng = random.Random(3)
    scopes = ["all", "M<=64", "M>=128", "K>=4096", "M<=64, K>=4096", "dtype=bf16"]
    params = [("num_stages", (2, 3, 4)), ("BLOCK_SIZE_N", (64, 128)), ("VARIANT", ("grouped", "tma"))]

    def random_hyp() -> Hypothesis:
        name, values = rng.choice(params)
        a, b = rng.sample(values, 2)
        return hyp(name, a, b, rng.choice(scopes), rng.choice(["c1", "c2"]))

    for _ in range(20):
        entries = [LedgerEntry(random_hyp(), rng.choice(list(HypothesisState)), here=rng.random() < 0.3)
                   for _ in range(rng.randrange(0, 12))]
        index = _Questions(entries)
        for _ in range(30):
            h = random_hyp()
            expected = _scan_blocked(h, entries)
            assert index.blocks(h.kernel, h.device, h.param, h.a, h.b, h.scope) == expected, h.text
            assert _blocked(h, entries) == expected, h.text


def test_miner_proposes_nothing_without_budget_or_enough_results():
    assert miner().mine(sample(3), known=[], room={p: 2 for p in PROBLEMS}, max_new=3) == []
    obs = sample(6, seed=1)
    found = miner().mine(obs, known=[], room={p: 0 for p in PROBLEMS}, max_new=3)
    assert all(len(find_pairs(h, obs)) >= 3 for h in found)


def test_experiments_are_random_pairs_within_room_and_unseen():
    obs = sample(6, seed=2)
    h = hyp("num_stages", 4, 3, "K>=4096")
    in_scope = [p for p in PROBLEMS if p["K"] >= 4096]
    seen = {p: {o.config for o in obs if o.problem == p} for p in PROBLEMS}
    room = {p: 2 for p in PROBLEMS}
    cands = miner().experiments(h, seen=seen, room=room, pairs=10)
    assert cands
    per_problem: dict = {}
    for c in cands:
        assert c.hypothesis_id == h.id and c.proposer == "hypotheses" and c.problem in in_scope
        assert c.config not in seen[c.problem] and "random pair" in c.rationale
        per_problem.setdefault(c.problem, []).append(c.config)
    for p, configs in per_problem.items():
        assert len(configs) <= 2  # room
        for c in configs:  # each queued config's partner is queued too, or measured already
            partner = Config.of({**c.as_dict(), "num_stages": 7 - c["num_stages"]})
            assert partner in configs or partner in seen[p]
    assert len(per_problem) == len(in_scope)  # the problems in scope take turns


def test_experiments_balance_the_other_parameters():
    h = hyp("num_stages", 4, 3)
    cands = miner().experiments(h, seen={}, room={p: 8 for p in PROBLEMS}, pairs=16)
    bases = [c.config for c in cands if c.config["num_stages"] == 4]
    assert len(bases) == 16
    for name in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_warps"):
        counts = [sum(c[name] == v for c in bases) for v in fx.GRID[name]]
        assert max(counts) - min(counts) <= 1, (name, counts)


# ---- the lab -------------------------------------------------------------------------------------

def run_lab(budget: int, seed: int) -> tuple[HypothesisLab, list, list]:
    """A campaign without a driver: random proposals, then the lab's experiments, from the grid."""
    lab = HypothesisLab(kernel="matmul", origin=f"lab-{seed}", env=ENV, spaces=SPACES, seed=seed)
    rng = random.Random(seed)
    by = {(o.problem, o.config): o for o in GRID}
    measured = {p: rng.sample([o.config for o in GRID if o.problem == p], budget - 4) for p in PROBLEMS}
    obs = [by[(p, c)] for p, cs in measured.items() for c in cs]
    room = {p: 4 for p in PROBLEMS}
    judgements, learnings = [], []
    for _ in range(5):
        step = lab.step(obs, seen={p: set(measured[p]) for p in PROBLEMS}, room=room, pending={})
        judgements += step.judgements
        learnings += step.learnings
        for c in step.candidates:
            room[c.problem] -= 1
            measured[c.problem].append(c.config)
            obs.append(dataclasses.replace(by[(c.problem, c.config)], tests=c.hypothesis_id))
    final = lab.step(obs, seen={}, room=room, pending={}, final=True)
    return lab, judgements + list(final.judgements), learnings


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lab_verdicts_agree_with_the_full_grid(seed):
    lab, judgements, learnings = run_lab(budget=12, seed=seed)
    last = {j.hypothesis.id: j for j in judgements}
    assert last and all(lab.states[h] is j.verdict.state for h, j in last.items())
    assert all(j.verdict.state.terminal for j in last.values())  # nothing left open at the end
    decided = [j for j in last.values() if j.verdict.state.decided]
    assert decided
    for j in decided:
        assert check_verdict(j.hypothesis, j.verdict, GRID).agrees, j.verdict.reason
    assert {lrn.hypothesis_id for lrn in learnings} == \
           {h for h, j in last.items() if j.verdict.state is HypothesisState.VALIDATED}


def test_learning_keeps_the_hypothesis_scope_and_toolchain():
    h = hyp("BLOCK_SIZE_M", 64, 128, "M<=64")
    v, evidence = judge(h, drawn(GRID, h))
    lrn = Learning.from_verdict(h, v, torch="2.11", triton="3.6", evidence=[e.experiment_a for e in evidence])
    assert lrn.scope == h.scope and lrn.hypothesis_id == h.id and "torch 2.11, triton 3.6" in lrn.text
    assert lrn.applies_to("matmul", "synthetic", {"M": 48, "N": 1, "K": 1, "dtype": "bf16"})
    assert not lrn.applies_to("matmul", "synthetic", {"M": 128, "N": 1, "K": 1, "dtype": "bf16"})
    assert not lrn.applies_to("matmul", "H200", {"M": 48, "N": 1, "K": 1, "dtype": "bf16"})
    assert not lrn.applies_to("softmax", "synthetic", {"M": 48})
    with pytest.raises(ValueError, match="only a validated"):
        Learning.from_verdict(h, Verdict(h.id, HypothesisState.RULED_OUT, 3, 0, 3, 0.9, 0.8, 0.95, 0.01, ""),
                              torch="", triton="")


# ---- storage -------------------------------------------------------------------------------------

@pytest.fixture()
def store(tmp_path):
    s = Store(tmp_path / "t.db")
    yield s
    s.close()


def _record(store: Store, cid: int, obs: list[Observation]) -> list[Observation]:
    out = []
    for o in obs:
        r = Result(o.problem, o.config, Status.OK, ENV, Timing(o.median_ms, o.median_ms * 0.99, o.median_ms * 1.01,
                                                              o.median_ms * 0.98, 50, True, "replay"))
        key = experiment_key("matmul", "v", o.problem, o.config, ENV)
        store.record_result(r, key=key, kernel="matmul", kernel_version="v")
        store.add_trial(cid, key, Candidate(o.problem, o.config, "random", "why"), reused=False)
        out.append(Observation.of(key, r))
    return out


def test_verdicts_evidence_and_learnings_are_stored_and_read_back(store, tmp_path):
    cid = store.create_campaign(Campaign("c", "matmul", "random", 8, 0, ()), backend="replay", dataset="",
                                device=fx.DEVICE)
    h = hyp("num_stages", 4, 3, "K>=4096")
    obs = drawn(_record(store, cid, sample(12, seed=3)), h)
    assert store.add_hypothesis(cid, h) and not store.add_hypothesis(cid, h)
    testing = judge(h, obs[:6])[0]
    assert testing.state is HypothesisState.TESTING
    assert store.record_verdict(testing, [])
    assert not store.record_verdict(testing, [])  # same state: no new history row
    v, evidence = judge(h, obs)
    assert store.record_verdict(v, evidence)
    store.add_learning(Learning.from_verdict(h, v, torch="0.0", triton="0.0"))
    with open_db(tmp_path / "t.db") as db:
        row = ledger.hypothesis(db, h.id)
        assert row.state is HypothesisState.VALIDATED and row.pairs == v.pairs and row.decided_at
        assert row.hypothesis == h
        assert [x.state for x in ledger.verdicts(db, h.id)] == [HypothesisState.TESTING, HypothesisState.VALIDATED]
        stored = ledger.evidence(db, h.id, relation="supports")
        assert {(e.experiment_a, e.experiment_b) for e in stored} == \
               {(e.experiment_a, e.experiment_b) for e in evidence if e.relation == "supports"}
        assert all(e.config_a["num_stages"] == 4 and e.config_b["num_stages"] == 3 for e in stored)
        lrn = ledger.learnings(db, kernel="matmul", device="SYNTHETIC", problem={"M": 1, "N": 1, "K": 8192,
                                                                                  "dtype": "bf16"})
        assert [x.learning.hypothesis_id for x in lrn] == [h.id] and lrn[0].learning.evidence
        assert ledger.learnings(db, problem={"M": 1, "N": 1, "K": 1024, "dtype": "bf16"}) == []
        assert ledger.hypotheses(db, scope="K<=1024") == [] and len(ledger.hypotheses(db, scope="K>=8192")) == 1
        with pytest.raises(InputError, match="no hypothesis 'H-nope'"):
            ledger.evidence(db, "H-nope")
        with pytest.raises(InputError, match="unknown hypothesis state"):
            ledger.hypotheses(db, state="maybe")


def test_record_verdict_refuses_unknown_hypotheses_and_foreign_evidence(store):
    cid = store.create_campaign(Campaign("c", "matmul", "random", 8, 0, ()), backend="replay", dataset="",
                                device=fx.DEVICE)
    h = hyp("num_warps", 8, 4)
    v = Verdict(h.id, HypothesisState.TESTING, 0, 0, 0, None, None, None, 0.01, "testing")
    with pytest.raises(KeyError):
        store.record_verdict(v)
    store.add_hypothesis(cid, h)
    with pytest.raises(ValueError, match="evidence of"):
        store.record_verdict(v, [Evidence("H-other", "a", "b", "{}", 1.0, "supports")])
    with pytest.raises(sqlite3.IntegrityError):  # evidence must name recorded experiments
        store.record_verdict(v, [Evidence(h.id, "missing-a", "missing-b", "{}", 1.0, "supports")])


def test_a_version_1_database_migrates_to_the_ledger_schema(tmp_path):
    from tilepilot.storage import schema

    path = tmp_path / "old.db"
    db = schema.connect(path, readonly=False)
    schema.MIGRATIONS[0](db)
    db.execute("PRAGMA user_version=1")
    db.close()
    with Store(path) as s:
        assert schema.schema_version(s.db) == schema.SCHEMA_VERSION
        assert {"hypotheses", "verdicts", "evidence", "learnings"} <= set(s.db.table_names())


# ---- the driver ----------------------------------------------------------------------------------

def test_replay_campaign_fills_the_ledger_within_its_budget(tmp_path):
    dataset = fx.write_dataset(tmp_path / "matmul-synthetic.jsonl")
    out = tune(TuneOptions(campaign=write_campaign(tmp_path / "c.toml", proposer="random", budget=8, extra=SHARE),
                           backend="replay", dataset=dataset, db=tmp_path / "t.db"))
    with Store.open_readonly(tmp_path / "t.db") as s:
        results = s.campaign_results(out.campaign_id)
        rows = s.hypotheses(campaign_id=out.campaign_id)
        learned = s.learnings(kernel="matmul")
    for p in PROBLEMS:  # the hypothesis experiments counted against the budget, which was spent exactly
        assert sum(1 for _, r in results if r.problem == p) == 8
    assert rows and all(r.state.terminal for r in rows)
    tested = [t for t, _ in results if t.hypothesis_id]
    assert all(t.proposer == "hypotheses" for t in tested)
    assert {t.hypothesis_id for t in tested} <= {r.id for r in rows}
    grid = fx.grid_observations()
    for r in rows:
        if r.state.decided:
            v = Verdict(r.id, r.state, r.pairs, r.wins, r.losses, r.effect, r.ci_low, r.ci_high, r.noise, r.reason)
            assert check_verdict(r.hypothesis, v, grid).agrees, r.reason
    assert {x.learning.hypothesis_id for x in learned} == {r.id for r in rows if r.state is HypothesisState.VALIDATED}
    with open_db(tmp_path / "t.db") as db:
        kinds = [e["kind"] for e in db.rows("SELECT kind FROM events", [])]
        validated = [r for r in rows if r.state is HypothesisState.VALIDATED]
        assert kinds.count("hypothesis") == len(rows) and kinds.count("verdict") == len(rows)
        for r in validated:
            assert ledger.evidence(db, r.id, relation="supports")


def test_resumed_campaign_keeps_its_hypotheses(tmp_path):
    dataset = fx.write_dataset(tmp_path / "matmul-synthetic.jsonl")
    campaign = write_campaign(tmp_path / "c.toml", proposer="random", budget=12, extra=SHARE)

    def stop(p):
        if p.done >= 40:
            raise KeyboardInterrupt

    opts = TuneOptions(campaign=campaign, backend="replay", dataset=dataset, db=tmp_path / "t.db")
    with pytest.raises(KeyboardInterrupt):
        tune(opts, on_progress=stop)
    with Store.open_readonly(tmp_path / "t.db") as s:
        before = {r.id: r.state for r in s.hypotheses()}
    out = tune(TuneOptions(campaign=campaign, backend="replay", dataset=dataset, db=tmp_path / "t.db", resume=True))
    with Store.open_readonly(tmp_path / "t.db") as s:
        after = {r.id: r.state for r in s.hypotheses()}
        results = s.campaign_results(out.campaign_id)
    assert set(before) <= set(after) and all(state.terminal for state in after.values())
    statements = [r.hypothesis.statement_key for r in Store.open_readonly(tmp_path / "t.db").hypotheses()]
    assert len(statements) == len(set(statements))
    for p in PROBLEMS:
        assert sum(1 for _, r in results if r.problem == p) == 12
