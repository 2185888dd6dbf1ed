"""The queue re-scores itself as results arrive: predictions, hypotheses, failure regions, pins.

SYNTHETIC data where a campaign runs: the timings come from tests/replay_fixture.py's formula.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from tests.gated_executor import DriverThread, read, wait_for
from tests.replay_fixture import PROBLEMS, synthetic_ms, write_campaign, write_dataset
from tilepilot.experiments import Config, Environment, Hypothesis, Problem, Result, Scope, Status
from tilepilot.experiments.hypothesis import HypothesisState
from tilepilot.kernels.registry import get_family
from tilepilot.orchestrator.queue_scoring import Entry, FailureRegions, HypothesisStatus, rescore
from tilepilot.storage.store import Store

P = Problem.of({"M": 512, "N": 512, "K": 512, "dtype": "fp16"})
ENV = Environment("replay", "synthetic device", "0.0", "0.0")


def cfg(bm: int = 64, bn: int = 64, bk: int = 32, g: int = 8, warps: int = 4, stages: int = 3) -> Config:
    return Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": g,
                      "num_warps": warps, "num_stages": stages})


def entries(configs: list[Config], tests: dict[int, str] | None = None) -> list[Entry]:
    tests = tests or {}
    return [Entry(i + 1, c, tests.get(i), -float(i + 1), f"in proposal order (p{i})") for i, c in enumerate(configs)]


def predictor(times: dict[Config, float | None]):
    calls: list[list[Config]] = []

    def predict(configs):
        calls.append(list(configs))
        return [(times.get(c), f"model says {times[c]} ms" if times.get(c) else "") for c in configs]

    predict.calls = calls  # type: ignore[attr-defined]
    return predict


def hyp(hid: str, param: str, a: object, b: object, scope: str = "") -> Hypothesis:
    return Hypothesis(hid, "matmul", "synthetic device", param, a, b, Scope.parse(scope), f"{param}={a} beats {b}")


def test_predictions_reorder_entries_within_the_places_they_hold():
    cs = [cfg(bm=64), cfg(bm=128), cfg(bn=128), cfg(stages=4)]
    predict = predictor({cs[0]: 3.0, cs[1]: 1.0, cs[2]: 2.0, cs[3]: None})
    out = rescore(P, entries(cs), predict=predict, hypotheses=[])
    new = {qid: (prio, why) for qid, prio, why in out.updates}
    order = sorted([1, 2, 3, 4], key=lambda q: -new.get(q, (-float(q), ""))[0])
    assert order == [2, 3, 1, 4]  # the unpredicted entry keeps its place
    assert sorted(p for p, _ in new.values()) == sorted([-1.0, -2.0, -3.0])  # the problem's own slots
    assert "1st fastest of 3 predicted" in new[2][1] and "model says 1.0 ms" in new[2][1]
    assert 4 not in new  # nothing changed for it, nothing written
    assert [(m.queue_id, m.before, m.after) for m in out.moves] == [(1, 1, 3), (2, 2, 1), (3, 3, 2)]
    assert out.message(P).startswith(f"queue of {P.label()} re-scored, 3 moved: ")
    assert json.dumps(out.data(P))  # the event's data is JSON


def test_nothing_changes_when_nothing_is_known():
    cs = [cfg(bm=64), cfg(bm=128)]
    out = rescore(P, entries(cs), predict=predictor({}), hypotheses=[])
    assert out.updates == () and out.moves == ()


def test_entries_testing_an_open_hypothesis_hold_their_place():
    cs = [cfg(bm=64), cfg(bm=128), cfg(bn=128)]
    h = HypothesisStatus(hyp("H-open", "num_warps", 8, 4), HypothesisState.TESTING, 1, 1.1, 0.02)
    predict = predictor({c: t for c, t in zip(cs, (3.0, 2.0, 1.0), strict=True)})
    out = rescore(P, entries(cs, {0: "H-open"}), predict=predict, hypotheses=[h])
    assert cs[0] not in predict.calls[0]  # not sorted by speed: it is there for what it teaches
    assert sorted((m.queue_id, m.after) for m in out.moves) == [(2, 3), (3, 2)]


def test_settled_and_likely_hypotheses_move_entries_with_their_reason():
    cs = [cfg(stages=3), cfg(bm=128), cfg(bn=128, stages=4), cfg(bk=64), cfg(warps=8)]
    statuses = [
        HypothesisStatus(hyp("H-out", "num_warps", 8, 4), HypothesisState.RULED_OUT, 8, 1.0, 0.02),
        HypothesisStatus(hyp("H-val", "num_stages", 4, 3, "M>=256"), HypothesisState.VALIDATED, 6, 1.3, 0.02),
        HypothesisStatus(hyp("H-likely", "BLOCK_SIZE_K", 64, 32), HypothesisState.TESTING, 2, 1.25, 0.02),
    ]
    out = rescore(P, entries(cs, {1: "H-out", 3: "H-likely"}), predict=None, hypotheses=statuses)
    after = {m.queue_id: m for m in out.moves}
    reasons = {qid: why for qid, _, why in out.updates}
    # up: the validated statement's faster value, and the test of a hypothesis the results make likely
    assert after[3].after == 1 and "num_stages=4, which validated H-val says beats num_stages=3" in reasons[3]
    assert after[4].after == 2
    assert "tests H-likely, which the last 4 results made likely (1.25x over 2 pairs)" in reasons[4]
    # down: the test of a ruled-out hypothesis, and the validated statement's slower value
    assert "moved down: tests H-out, which the results ruled out" in reasons[2]
    assert "moved down: num_stages=3, which validated H-val says loses to num_stages=4 here" in reasons[1]
    assert (after[1].after, after[2].after) == (3, 4)  # down, in their order
    assert 5 not in after and "which validated H-val says loses" in reasons[5]  # down where it was: last
    small = Problem.of({"M": 64, "N": 512, "K": 512, "dtype": "fp16"})
    outside = rescore(small, entries([cfg(stages=3), cfg(stages=4)]), predict=None, hypotheses=statuses[1:2])
    assert outside.moves == ()  # M=64 lies outside the validated scope


def test_rules_score_follows_its_results_and_changes_nothing_it_proposes():
    from tilepilot.agents.base import ProposerContext, SearchState
    from tilepilot.agents.random import RandomProposer
    from tilepilot.agents.rules import RulesProposer
    from tilepilot.experiments import Timing

    space = get_family("matmul").space().narrowed({k: list(v) for k, v in GRID.items()})
    ctx = ProposerContext("matmul", P, space, seed=0, budget=16)
    scored, plain = RulesProposer(ctx), RulesProposer(ctx)
    queued = [space.parse(c.as_dict()) for c in (cfg(bm=128, bn=128, stages=3), cfg(), cfg(bn=128, bk=64))]
    before = scored.score(queued)
    assert all(ms is not None and "rules predicts" in why and "nothing measured yet" in why for ms, why in before)
    ms = 0.5
    done = Result(P, space.parse(cfg(bm=128).as_dict()), Status.OK, ENV,
                  timing=Timing(ms, ms, ms, ms, 10, True, "replay"))
    for p in (scored, plain):
        p.observe([done])
    after = scored.score(queued)
    assert all("corrected by 1 result" in why for _, why in after) and after != before
    state = SearchState(results={done.config: done})
    assert [c.config for c in scored.propose(state, 4)] == [c.config for c in plain.propose(state, 4)]
    assert RandomProposer(ctx).score(queued) == [(None, "")] * 3  # the default predicts nothing


def _failed(problem: Problem, config: Config, status: Status) -> Result:
    return Result(problem, config, status, ENV, message="out of resource: shared memory")


def test_failure_regions_match_the_same_kernel_and_the_same_resources():
    regions = FailureRegions(get_family("matmul"))
    big = cfg(bm=128, bn=128, bk=64, g=8, stages=4)
    same_spec = Problem.of({"M": 1024, "N": 2048, "K": 4096, "dtype": "fp16"})  # fp16, all dims divisible by 16
    other_dtype = Problem.of({"M": 512, "N": 512, "K": 512, "dtype": "bf16"})
    assert not regions and regions.match(P, big) is None
    assert regions.learn(_failed(P, big, Status.OUT_OF_RESOURCES))
    assert not regions.learn(_failed(P, big, Status.OUT_OF_RESOURCES))  # nothing new
    assert "compiles to the same kernel" in regions.match(same_spec, big)
    assert "needs the same shared memory (128 KiB)" in regions.match(P, cfg(bm=128, bn=128, bk=64, g=1, stages=4))
    assert regions.match(P, cfg(bm=128, bn=128, bk=64, g=1, stages=3)) is None  # less shared memory
    assert regions.match(other_dtype, big) is None  # another specialisation
    assert not regions.learn(_failed(P, cfg(), Status.TIMEOUT))  # may pass on another try: no region
    compile_only = FailureRegions(get_family("matmul"))
    compile_only.learn(_failed(P, big, Status.COMPILE_ERROR))
    assert compile_only.match(same_spec, big) is not None
    assert compile_only.match(P, cfg(bm=128, bn=128, bk=64, g=1, stages=4)) is None  # exact only


# ---- a running campaign --------------------------------------------------------------------------
TWINS = [{"M": 512, "N": 512, "K": 512, "dtype": "fp16"}, {"M": 1024, "N": 512, "K": 256, "dtype": "fp16"}]
GRID = {"BLOCK_SIZE_M": (64, 128), "BLOCK_SIZE_N": (64, 128), "BLOCK_SIZE_K": (32, 64), "GROUP_SIZE_M": (1, 8),
        "num_warps": (4, 8), "num_stages": (3, 4)}


def _fails(config: dict) -> bool:
    return config["BLOCK_SIZE_M"] == config["BLOCK_SIZE_N"] == 128 and config["num_stages"] == 4


def write_twins(path: Path) -> Path:
    """Two problems of one specialisation; the biggest tiles at 4 stages run out of shared memory on both."""
    lines = []
    for problem in TWINS:
        for values in itertools.product(*GRID.values()):
            c = dict(zip(GRID, values, strict=True))
            ms = None if _fails(c) else synthetic_ms(problem, c)
            lines.append(json.dumps({"kernel": "matmul", "problem": problem, "config": c,
                                     "status": "out_of_resources" if ms is None else "ok", "median_ms": ms,
                                     "message": "synthetic: shared memory" if ms is None else "",
                                     "device": "synthetic device", "torch": "0.0", "triton": "0.0"}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "matmul-synthetic.jsonl")


def test_running_campaign_reorders_its_queue_by_prediction_and_logs_why(tmp_path, dataset):
    campaign = write_campaign(tmp_path / "c.toml", proposer="rules", budget=16, extra="hypothesis_share = 0\n")
    run = DriverThread(campaign, dataset, tmp_path / "t.db", gated=False).start()
    try:
        run.join()
        moves = run.events("reordered")
        assert moves, "no re-scoring moved anything"
        for message, data in moves:
            assert message.startswith("queue of ") and data["moves"]
            assert all(m["reason"] and m["from"] != m["to"] for m in data["moves"])
        reasons = [r for (r,) in read(run.db, "SELECT reason FROM queue")]
        assert any("rules predicts" in r and "fastest of" in r for r in reasons)
    finally:
        run.close()


def test_configs_in_a_failed_region_are_dropped_unmeasured(tmp_path):
    data = write_twins(tmp_path / "twins.jsonl")
    campaign = write_campaign(tmp_path / "c.toml", proposer="random", budget=64, extra="hypothesis_share = 0\n")
    run = DriverThread(campaign, data, tmp_path / "t.db", gated=False).start()
    try:
        run.join()
        dropped = read(run.db, "SELECT problem_key, config, reason FROM queue WHERE state = 'dropped'")
        assert dropped, "nothing was dropped"
        measured = {(p, c) for p, c in read(run.db, "SELECT e.problem_key, e.config_key FROM trials t "
                                                       "JOIN experiments e ON e.key = t.experiment_key")}
        for problem_key, config, reason in dropped:
            c = json.loads(config)
            assert _fails(c), f"{c} was dropped but runs"
            assert reason.startswith("dropped: ") and ("same kernel" in reason or "same shared memory" in reason)
            assert (problem_key, Config.of(c).key()) not in measured
        assert len(measured) + len(dropped) == 2 * 64  # every config measured or dropped, none twice
        assert run.events("dropped")
    finally:
        run.close()


def test_a_sweep_drops_nothing(tmp_path):
    data = write_twins(tmp_path / "twins.jsonl")
    campaign = write_campaign(tmp_path / "c.toml", proposer="grid", budget=64, extra="hypothesis_share = 0\n")
    run = DriverThread(campaign, data, tmp_path / "t.db", gated=False).start()
    try:
        run.join()
        assert read(run.db, "SELECT COUNT(*) FROM queue WHERE state = 'dropped'") == [(0,)]
        assert read(run.db, "SELECT COUNT(*) FROM trials") == [(2 * 64,)]
    finally:
        run.close()


def test_pinned_entry_stays_first_through_rescoring(tmp_path, dataset):
    # one problem: it runs two batches ahead, so its second batch waits in the queue while the first runs
    # (the skinny one: its first batch's results move the model's order of the rest, with or without the
    # tile model's order mark)
    one = "".join(f"{k} = {json.dumps(v)}\n" for k, v in PROBLEMS[1].items())
    campaign = write_campaign(tmp_path / "c.toml", proposer="rules", budget=16,
                              extra=f"hypothesis_share = 0\n[[problems]]\n{one}")
    run = DriverThread(campaign, dataset, tmp_path / "t.db").start()
    try:
        wait_for(lambda: len(run.executor.submitted) == 1, what="the first batch")
        first = run.executor.submitted[0].problem
        queued = read(run.db, "SELECT id, problem_key, config FROM queue WHERE state = 'queued' "
                              "ORDER BY priority DESC, id")
        assert len(queued) == 4 and {q[1] for q in queued} == {first.key()}
        last_id, _, last_config = queued[-1]
        with Store(run.db) as person:
            request = person.add_request(run.campaign_id, "pin", queue_id=last_id)
        wait_for(lambda: run.events("control"), what="the pin to be honoured")
        assert run.events("control")[0][1] == {"request": request, "action": "pin", "queue_id": last_id,
                                               "honoured": True}
        run.executor.release()  # the first batch comes back; the first problem's queue is re-scored
        wait_for(lambda: len(run.executor.submitted) == 2, what="the second batch")
        assert run.events("reordered")  # the first problem's entries moved, the pinned one did not
        second = run.executor.submitted[1]
        assert second.queue_ids[0] == last_id and second.configs[0] == Config.of(json.loads(last_config))
        run.executor.open()
        run.join()
    finally:
        run.close()
