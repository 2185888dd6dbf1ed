"""The SQLite store and its read-only queries, on real database files."""

from __future__ import annotations

import itertools
import math
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tilepilot.experiments import (
    Campaign,
    Candidate,
    Config,
    Environment,
    GpuSample,
    InputError,
    Problem,
    Result,
    Status,
    Telemetry,
    Timing,
    experiment_key,
)
from tilepilot.storage import SCHEMA_VERSION, Store, WinnerRow, open_db, queries

ENV = Environment("gpu", "NVIDIA H100 80GB HBM3", "2.11.0", "3.6.0", "570.86")
KERNEL, VERSION = "matmul", "1+abc123"
P1 = Problem.of({"M": 128, "N": 256, "K": 64, "dtype": "fp16"})
P2 = Problem.of({"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"})
CAMPAIGN = Campaign("mm-1", KERNEL, "random", 4, 7, (P1, P2), "two shapes",
                    "[campaign]\nname = 'mm-1'\n")


def cfg(bm: int, warps: int = 4) -> Config:
    return Config.of({"BLOCK_M": bm, "num_warps": warps})


def ok(problem: Problem, config: Config, ms: float) -> Result:
    return Result(problem, config, Status.OK, ENV, Timing(ms, ms * 0.95, ms * 1.05, ms * 0.9, 50, True))


def failed(problem: Problem, config: Config, status: Status = Status.COMPILE_ERROR) -> Result:
    return Result(problem, config, status, ENV, message=f"{status}: boom")


def key_of(r: Result) -> str:
    return experiment_key(KERNEL, VERSION, r.problem, r.config, r.env)


def put(store: Store, cid: int, r: Result, *, proposer: str = "random", reused: bool = False,
        rationale: str = "because") -> str:
    key = key_of(r)
    with store.transaction():
        store.record_result(r, key=key, kernel=KERNEL, kernel_version=VERSION)
        store.add_trial(cid, key, Candidate(r.problem, r.config, proposer, rationale), reused=reused)
    return key


@pytest.fixture()
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "tilepilot.db"


@pytest.fixture()
def store(db_path: Path):
    s = Store(db_path)
    yield s
    s.close()


@pytest.fixture()
def cid(store: Store) -> int:
    return store.create_campaign(CAMPAIGN, backend="gpu", dataset="", device=ENV.device)


# -- results ---------------------------------------------------------------------------------------

def _full_result(status: Status) -> Result:
    problem = Problem.of({"M": 128, "N": 256, "K": 64, "dtype": "fp16", "trans_b": True})
    config = Config.of({"BLOCK_M": 64, "num_warps": 8, "scale": 0.5, "order": "row"})
    timing = (Timing(0.0123, 0.0119, 0.0131, 0.0117, 321, False, "cuda-graph", 0.02, 15.0, "cap", 15.25)
              if status is Status.OK else None)
    return Result(problem, config, status, ENV, timing=timing,
                  message="" if status is Status.OK else f"{status} happened",
                  max_rel_err=math.inf if status is Status.WRONG_RESULT else 1.5e-3,
                  compile_ms=812.5, telemetry=Telemetry(1980.0, 412.5, 61.0),
                  extra={"n_regs": 128, "shared_bytes": 65536, "note": "x", "list": [1, 2]})


@pytest.mark.parametrize("status", list(Status))
def test_result_round_trip_keeps_every_field(store, status):
    r = _full_result(status)
    key = key_of(r)
    store.record_result(r, key=key, kernel=KERNEL, kernel_version=VERSION, worker="gpu-0")
    got = store.lookup_result(key)
    assert got == r
    assert list(got.problem) == list(r.problem) and list(got.config) == list(r.config)  # order kept
    assert type(got.problem["trans_b"]) is bool and type(got.config["scale"]) is float
    if got.timing is not None:
        assert type(got.timing.reps) is int and got.timing.l2_flushed is False


def test_result_without_telemetry_or_extras_round_trips(store):
    r = Result(P1, cfg(32), Status.TIMEOUT, Environment("replay", "cpu", "", ""), message="too slow")
    store.record_result(r, key=key_of(r), kernel=KERNEL, kernel_version=VERSION)
    assert store.lookup_result(key_of(r)) == r


def test_lookup_of_an_unknown_key_is_none(store):
    assert store.lookup_result("0" * 32) is None


def test_record_result_refuses_a_key_of_another_experiment(store):
    r = ok(P1, cfg(32), 1.0)
    with pytest.raises(ValueError, match="does not match"):
        store.record_result(r, key=key_of(ok(P1, cfg(64), 1.0)), kernel=KERNEL, kernel_version=VERSION)


def test_recording_a_result_again_replaces_it(store):
    first, second = failed(P1, cfg(32), Status.TIMEOUT), ok(P1, cfg(32), 2.0)
    store.record_result(first, key=key_of(first), kernel=KERNEL, kernel_version=VERSION)
    store.record_result(second, key=key_of(second), kernel=KERNEL, kernel_version=VERSION)
    assert store.lookup_result(key_of(first)) == second


# -- campaigns -------------------------------------------------------------------------------------

def test_campaign_row_holds_every_column_and_rebuilds_the_campaign(store, cid, db_path):
    row = store.get_campaign("mm-1")
    assert row is not None and row.id == cid
    assert (row.backend, row.dataset, row.device, row.state) == ("gpu", "", ENV.device, "running")
    assert row.as_campaign() == CAMPAIGN
    assert row.finished_at is None and row.created_at <= row.updated_at
    assert store.get_campaign("nope") is None


def test_duplicate_campaign_name_is_an_input_error(store, cid, db_path):
    with pytest.raises(InputError) as e:
        store.create_campaign(CAMPAIGN, backend="gpu", dataset="", device="x")
    assert str(e.value) == (f"campaign 'mm-1' already exists in {db_path} "
                            "(use --resume to continue it, or another name)")


def test_campaign_state_stamps_finished_at_and_resume_clears_it(store, cid):
    store.set_campaign_state(cid, "interrupted")
    assert store.get_campaign("mm-1").finished_at is not None
    store.set_campaign_state(cid, "running")
    assert store.get_campaign("mm-1").finished_at is None
    with pytest.raises(ValueError, match="allowed: running, finished, interrupted, failed"):
        store.set_campaign_state(cid, "paused")
    with pytest.raises(KeyError):
        store.set_campaign_state(999, "finished")


# -- trials ----------------------------------------------------------------------------------------

def test_trial_seq_counts_per_problem(store, cid):
    for r in [ok(P1, cfg(16), 3.0), ok(P2, cfg(16), 9.0), ok(P1, cfg(32), 2.0), failed(P2, cfg(32)),
              ok(P1, cfg(64), 1.0)]:
        put(store, cid, r)
    got = [(t.problem_key, t.seq) for t, _ in store.campaign_results(cid)]
    assert got == [(P1.key(), 1), (P2.key(), 1), (P1.key(), 2), (P2.key(), 2), (P1.key(), 3)]


def test_add_trial_is_idempotent(store, cid):
    r = ok(P1, cfg(16), 3.0)
    key = put(store, cid, r)
    first = store.campaign_results(cid)[0][0]
    again = store.add_trial(cid, key, Candidate(P1, cfg(16), "other", "again"), reused=True)
    assert again == first.id
    assert store.campaign_results(cid) == [(first, r)]
    put(store, cid, ok(P1, cfg(32), 2.0))
    assert [t.seq for t, _ in store.campaign_results(cid)] == [1, 2]


def test_a_result_reused_by_another_campaign_is_a_trial_of_both(store, cid):
    r = ok(P1, cfg(16), 3.0)
    put(store, cid, r)
    other = store.create_campaign(Campaign("mm-2", KERNEL, "grid", 4, 0, (P1,)), backend="gpu",
                                  dataset="", device=ENV.device)
    put(store, other, r, proposer="grid", reused=True)
    (trial, result), = store.campaign_results(other)
    assert trial.reused and trial.proposer == "grid" and trial.seq == 1 and result == r
    assert not store.campaign_results(cid)[0][0].reused


def test_add_trial_of_an_unrecorded_experiment_raises(store, cid):
    with pytest.raises(KeyError, match="record its result first"):
        store.add_trial(cid, "f" * 32, Candidate(P1, cfg(16), "random", ""), reused=False)


def test_add_trial_of_another_problem_raises(store, cid):
    key = put(store, cid, ok(P1, cfg(16), 3.0))
    other = store.create_campaign(Campaign("mm-2", KERNEL, "grid", 4, 0, (P2,)), backend="gpu",
                                  dataset="", device=ENV.device)
    with pytest.raises(ValueError, match="not the candidate's"):
        store.add_trial(other, key, Candidate(P2, cfg(16), "random", ""), reused=False)


def test_trial_keeps_the_candidates_prediction_and_hypothesis(store, cid):
    r = ok(P1, cfg(16), 3.0)
    store.record_result(r, key=key_of(r), kernel=KERNEL, kernel_version=VERSION)
    store.add_trial(cid, key_of(r), Candidate(P1, cfg(16), "llm", "wider tiles", 2.5, "H7"), reused=False)
    trial = store.campaign_results(cid)[0][0]
    assert (trial.proposer, trial.rationale, trial.predicted_ms, trial.hypothesis_id) == (
        "llm", "wider tiles", 2.5, "H7")


# -- queue -----------------------------------------------------------------------------------------

def _cands(*bms: int, problem: Problem = P1) -> list[Candidate]:
    return [Candidate(problem, cfg(bm), "rules", f"try {bm}", float(bm)) for bm in bms]


def test_queue_orders_by_priority_then_age_and_skips_duplicates(store, cid):
    ids = store.enqueue(cid, _cands(16, 32, 64), priorities=[1.0, 5.0, 1.0], reasons=["a", "b", "c"])
    assert len(ids) == 3
    again = store.enqueue(cid, _cands(32, 128, 128), priorities=[9.0, 2.0, 3.0], reasons=["x"] * 3)
    assert len(again) == 1  # 32 is queued already; the second 128 repeats the first
    rows = store.queued(cid)
    assert [r.config["BLOCK_M"] for r in rows] == [32, 128, 16, 64]
    assert rows[0].candidate == _cands(32)[0] and rows[0].reason == "b"
    assert [r.id for r in store.queued(cid, limit=2)] == [ids[1], again[0]]


def test_enqueue_needs_one_priority_and_reason_per_candidate(store, cid):
    with pytest.raises(ValueError, match="one of each"):
        store.enqueue(cid, _cands(16, 32), priorities=[1.0], reasons=["a", "b"])


def test_reprioritise_changes_order_and_reason(store, cid):
    a, b = store.enqueue(cid, _cands(16, 32), priorities=[2.0, 1.0], reasons=["first", "second"])
    store.reprioritise([(b, 3.0, "rules: fits shared memory better")])
    rows = store.queued(cid)
    assert [r.id for r in rows] == [b, a]
    assert rows[0].priority == 3.0 and rows[0].reason == "rules: fits shared memory better"
    with pytest.raises(KeyError):
        store.reprioritise([(a, 9.0, "x"), (12345, 1.0, "y")])
    assert store.queued(cid)[1].priority == 2.0  # the whole batch was rolled back


def test_queue_states_stamp_times_and_requeue_unfinished_resets_them(store, cid):
    a, b, c, d = store.enqueue(cid, _cands(16, 32, 64, 128), priorities=[4, 3, 2, 1], reasons=["r"] * 4)
    store.set_queue_state(a, "compiling", worker="w0")
    store.set_queue_state(b, "running", worker="w1")
    store.set_queue_state(c, "running", worker="w1")
    store.set_queue_state(c, "done", experiment_key="k" * 32)
    rows = {r.id: r for r in store.queued(cid, states=("compiling", "running", "done"))}
    assert rows[a].started_at is not None and rows[a].worker == "w0"
    assert rows[c].finished_at >= rows[c].started_at and rows[c].experiment_key == "k" * 32
    assert rows[c].worker == "w1"  # kept when not given
    assert store.requeue_unfinished(cid) == 2
    queued = store.queued(cid)
    assert [r.id for r in queued] == [a, b, d]
    assert all(r.worker == "" and r.started_at is None for r in queued)
    assert store.queued(cid, states=("done",))[0].id == c
    with pytest.raises(ValueError, match="unknown queue state"):
        store.set_queue_state(a, "paused")
    with pytest.raises(KeyError):
        store.set_queue_state(999, "done")


# -- consistency -----------------------------------------------------------------------------------

def test_wal_mode_and_foreign_keys_are_on(store, db_path):
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    with pytest.raises(sqlite3.IntegrityError):
        store.log_event("queued", "x", campaign_id=424242)
    r = ok(P1, cfg(16), 1.0)
    store.record_result(r, key=key_of(r), kernel=KERNEL, kernel_version=VERSION)
    with pytest.raises(sqlite3.IntegrityError):
        store.add_trial(424242, key_of(r), Candidate(P1, cfg(16), "random", ""), reused=False)


def test_exception_inside_transaction_leaves_nothing(store, cid):
    (qid,) = store.enqueue(cid, _cands(16), priorities=[1.0], reasons=["r"])
    r = ok(P1, cfg(16), 1.0)
    with pytest.raises(RuntimeError), store.transaction():
        put(store, cid, r)
        store.set_queue_state(qid, "done", experiment_key=key_of(r))
        store.log_event("finished", "done", campaign_id=cid)
        raise RuntimeError("driver died")
    assert store.lookup_result(key_of(r)) is None
    assert store.campaign_results(cid) == []
    assert store.queued(cid)[0].state == "queued"
    assert store.db.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 0


def test_inner_transaction_rolls_back_alone(store, cid):
    with store.transaction():
        store.log_event("outer", "kept", campaign_id=cid)
        with pytest.raises(RuntimeError), store.transaction():
            store.log_event("inner", "dropped", campaign_id=cid)
            raise RuntimeError
    assert [e["kind"] for e in store.db.query("SELECT kind FROM events")] == ["outer"]


_KILL_CHILD = """
import os, signal, sys
from tests.test_storage import CAMPAIGN, P1, cfg, ok, put
from tilepilot.storage import Store
store = Store(sys.argv[1])
cid = store.get_campaign(CAMPAIGN.name).id
store.log_event("before", "committed", campaign_id=cid)
with store.transaction():
    put(store, cid, ok(P1, cfg(16), 1.0))
    store.log_event("inside", "never committed", campaign_id=cid)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_kill_9_inside_a_transaction_leaves_the_state_before_it(db_path, store, cid):
    store.close()
    child = subprocess.run([sys.executable, "-c", _KILL_CHILD, str(db_path)], capture_output=True,
                           cwd=Path(__file__).parent.parent, timeout=60)
    assert child.returncode == -9, child.stderr.decode()
    with Store(db_path) as after:
        assert after.campaign_results(cid) == []
        assert after.lookup_result(key_of(ok(P1, cfg(16), 1.0))) is None
        kinds = [e["kind"] for e in after.db.query("SELECT kind FROM events")]
        assert kinds == ["before"]


def test_values_with_quotes_and_sql_are_stored_verbatim(store, db_path):
    nasty = "it's \"quoted\"; DROP TABLE results; -- ünïcode ✓ %s {0} ?"
    c = Campaign(nasty, KERNEL, "random", 3, 0, (Problem.of({"M": 1, "layout": nasty}),), nasty, nasty)
    cid = store.create_campaign(c, backend="gpu", dataset=nasty, device=ENV.device)
    r = Result(c.problems[0], Config.of({"BLOCK_M": 16, "tag": nasty}), Status.CRASHED, ENV, message=nasty)
    put(store, cid, r, rationale=nasty)
    store.log_event("failed", nasty, campaign_id=cid, data={"why": nasty})
    row = store.get_campaign(nasty)
    assert (row.name, row.description, row.source, row.dataset) == (nasty, nasty, nasty, nasty)
    assert store.lookup_result(key_of(r)) == r
    db = open_db(db_path)
    (h,) = queries.history(db, campaign=nasty, problem={"layout": nasty})
    assert h.message == nasty and h.rationale == nasty and h.config["tag"] == nasty
    assert queries.events(db)[0].data == {"why": nasty}


def test_store_calls_from_several_threads_are_serialised(store, cid):
    def log_many(i: int) -> None:
        for j in range(25):
            store.log_event("tick", f"{i}-{j}", campaign_id=cid)

    threads = [threading.Thread(target=log_many, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.db.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 100


# -- opening ---------------------------------------------------------------------------------------

def test_readonly_open_of_a_missing_file_never_creates_it(tmp_path):
    missing = tmp_path / "none.db"
    msg = f"no tilepilot database at '{missing}' (run `tilepilot tune` first or pass --db)"
    with pytest.raises(InputError) as e:
        open_db(missing)
    assert str(e.value) == msg
    with pytest.raises(InputError):
        Store.open_readonly(missing)
    assert list(tmp_path.iterdir()) == []


def test_readonly_open_refuses_writes(store, cid, db_path):
    reader = Store.open_readonly(db_path)
    with pytest.raises(PermissionError):
        reader.log_event("x", "y")
    assert reader.get_campaign("mm-1").id == cid
    db = open_db(db_path)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        db.db.execute("DELETE FROM campaigns")
    assert store.get_campaign("mm-1") is not None
    reader.close()
    db.close()


def test_reader_sees_what_the_writer_commits_later(store, cid, db_path):
    db = open_db(db_path)
    assert queries.events(db) == []
    store.log_event("queued", "later", campaign_id=cid)
    assert [e.message for e in queries.events(db)] == ["later"]


def test_a_newer_schema_or_a_foreign_file_is_an_input_error(tmp_path):
    newer = tmp_path / "newer.db"
    sqlite3.connect(newer).execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}").connection.close()
    foreign = tmp_path / "foreign.db"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE notes (x)")
    con.close()
    garbage = tmp_path / "garbage.db"
    garbage.write_text("not a database at all " * 100)
    for path, match in [(newer, "newer than this tilepilot"), (foreign, "not a tilepilot database"),
                        (garbage, "not a tilepilot database")]:
        with pytest.raises(InputError, match=match):
            Store(path)
        with pytest.raises(InputError, match=match):
            open_db(path)


def test_reopening_a_store_keeps_its_rows(db_path):
    with Store(db_path) as s:
        cid = s.create_campaign(CAMPAIGN, backend="gpu", dataset="", device=ENV.device)
    with Store(db_path) as s:
        assert s.get_campaign("mm-1").id == cid


def test_simultaneous_first_opens_migrate_the_file_once(db_path):
    barrier, errors = threading.Barrier(6), []

    def open_store() -> None:
        barrier.wait()
        try:
            Store(db_path).close()
        except Exception as e:  # collected for the assertion below
            errors.append(e)

    threads = [threading.Thread(target=open_store) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with Store(db_path) as s:
        assert s.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_store_in_a_missing_folder_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        Store(tmp_path / "no" / "such" / "t.db")


# -- queries ---------------------------------------------------------------------------------------

@pytest.fixture()
def filled(store, cid, db_path):
    """Campaign mm-1 (random + rules, two problems) and mm-2 (another kernel)."""
    put(store, cid, ok(P1, cfg(16), 4.0))
    put(store, cid, ok(P1, cfg(32), 2.0), proposer="rules")
    put(store, cid, failed(P1, cfg(64), Status.OUT_OF_RESOURCES), proposer="rules")
    put(store, cid, ok(P1, cfg(128), 1.0))
    put(store, cid, ok(P2, cfg(16), 8.0))
    other = store.create_campaign(Campaign("mm-2", "softmax", "grid", 2, 0, (P1,)), backend="gpu",
                                  dataset="", device=ENV.device)
    r = Result(P1, cfg(16), Status.OK, ENV, Timing(5.0, 5.0, 5.0, 5.0, 1, True))
    k = experiment_key("softmax", VERSION, P1, cfg(16), ENV)
    store.record_result(r, key=k, kernel="softmax", kernel_version=VERSION)
    store.add_trial(other, k, Candidate(P1, cfg(16), "grid", "first"), reused=False)
    orphan = ok(P2, cfg(256), 7.0)  # recorded, tried by no campaign
    store.record_result(orphan, key=key_of(orphan), kernel=KERNEL, kernel_version=VERSION)
    return open_db(db_path)


def test_history_filters(filled, cid):
    h = queries.history
    assert len(h(filled)) == 7
    assert len(h(filled, campaign="mm-1")) == 5 and len(h(filled, campaign=cid)) == 5
    assert {r.campaign for r in h(filled, kernel="softmax")} == {"mm-2"}
    assert len(h(filled, problem={"M": 128})) == 5
    assert len(h(filled, problem={"M": 128, "dtype": "fp16"}, kernel=KERNEL)) == 4
    assert len(h(filled, problem=P2.key())) == 2
    assert [r.status for r in h(filled, status="out_of_resources")] == [Status.OUT_OF_RESOURCES]
    assert len(h(filled, status=["ok", "out_of_resources"], campaign="mm-1")) == 5
    assert {r.config["BLOCK_M"] for r in h(filled, proposer="rules")} == {32, 64}
    assert h(filled, proposer="rules", status="ok")[0].median_ms == 2.0


def test_history_is_newest_first_and_limited(filled):
    rows = queries.history(filled, campaign="mm-1", limit=2)
    assert [(r.problem["M"], r.config["BLOCK_M"]) for r in rows] == [(4096, 16), (128, 128)]
    orphan = [r for r in queries.history(filled) if r.campaign is None]
    assert len(orphan) == 1 and orphan[0].trial_id is None and orphan[0].config["BLOCK_M"] == 256


def test_history_rejects_bad_filters(filled):
    with pytest.raises(InputError, match=r"unknown status 'fast' \(allowed: ok, compile_error"):
        queries.history(filled, status="fast")
    with pytest.raises(InputError, match=r"no campaign 'mm-9' \(known: mm-1, mm-2\)"):
        queries.history(filled, campaign="mm-9")
    with pytest.raises(InputError, match="not a positive integer"):
        queries.history(filled, limit=0)
    with pytest.raises(InputError, match="bad problem parameter name"):
        queries.history(filled, problem={"M') OR 1=1 --": 1})


def test_best_without_winner_is_the_fastest_ok_with_speedup_over_the_median(filled):
    rows = {(b.campaign, b.problem["M"]): b for b in queries.best(filled)}
    b = rows[("mm-1", 128)]
    assert (b.config, b.median_ms, b.decided) == ({"BLOCK_M": 128, "num_warps": 4}, 1.0, False)
    assert b.median_config_ms == 2.0 and b.speedup_vs_median == 2.0  # median of 4, 2, 1
    assert b.speedup_vs_baseline is None and b.ok == 3 and b.trials == 4
    assert rows[("mm-1", 4096)].speedup_vs_median == 1.0
    assert [b.campaign for b in queries.best(filled, kernel="softmax")] == ["mm-2"]


def test_best_prefers_the_declared_winner(filled, store, cid):
    win = key_of(ok(P1, cfg(128), 1.0))
    store.set_winner(WinnerRow(cid, P1.key(), win, 1.1, 0.01, key_of(ok(P1, cfg(32), 2.0)), 2.2,
                               1.0, False, True, 2e-3, 2.2, 3.3, "torch.matmul"))
    (b,) = queries.best(filled, campaign="mm-1", kernel=KERNEL)[:1]
    assert b.decided and b.median_ms == 1.1 and b.recheck_passed is True and b.margin == 1.0
    assert b.baseline_name == "torch.matmul"
    assert b.speedup_vs_baseline == pytest.approx(3.0) and b.speedup_vs_median == pytest.approx(2.0)
    store.set_winner(WinnerRow(cid, P1.key(), win, 1.2, tie=True))  # upsert
    (b,) = queries.best(filled, campaign="mm-1")[:1]
    assert b.median_ms == 1.2 and b.tie and b.recheck_passed is None and b.speedup_vs_median == 2.0 / 1.2


def test_best_skips_a_problem_with_no_ok_result(store, cid, db_path):
    put(store, cid, failed(P1, cfg(16)))
    assert queries.best(open_db(db_path)) == []


def test_convergence_best_so_far_is_monotone_per_problem(store, cid, db_path):
    times = [5.0, 3.0, 4.0, None, 2.0, 6.0]
    for bm, ms in zip([8, 16, 32, 64, 128, 256], times, strict=True):
        put(store, cid, ok(P1, cfg(bm), ms) if ms else failed(P1, cfg(bm)))
    put(store, cid, failed(P2, cfg(8)))
    put(store, cid, ok(P2, cfg(16), 9.0))
    points = queries.convergence(open_db(db_path), cid)
    p1 = [p for p in points if p.problem_key == P1.key()]
    assert [p.seq for p in p1] == [1, 2, 3, 4, 5, 6]
    assert [p.best_so_far_ms for p in p1] == [5.0, 3.0, 3.0, 3.0, 2.0, 2.0]
    assert [p.improved for p in p1] == [True, True, False, False, True, False]
    assert all(a.best_so_far_ms >= b.best_so_far_ms for a, b in itertools.pairwise(p1))
    p2 = [p.best_so_far_ms for p in points if p.problem_key == P2.key()]
    assert p2 == [None, 9.0]


def test_campaign_summary_counts_progress_against_budget(store, cid, db_path):
    put(store, cid, ok(P1, cfg(16), 2.0))
    put(store, cid, failed(P1, cfg(32), Status.INVALID))
    put(store, cid, failed(P1, cfg(64), Status.CRASHED))
    earlier = store.create_campaign(Campaign("mm-0", KERNEL, "grid", 4, 0, (P1,)), backend="gpu", dataset="",
                                    device=ENV.device)
    put(store, earlier, ok(P1, cfg(8), 2.5))
    put(store, cid, ok(P1, cfg(8), 2.5), reused=True)  # the earlier campaign's result: free of the budget
    (qid, _) = store.enqueue(cid, _cands(128, 256), priorities=[1, 1], reasons=["r", "r"])
    store.set_queue_state(qid, "running", worker="w0")
    s = next(c for c in queries.campaigns(open_db(db_path)) if c.name == "mm-1")
    assert (s.name, s.state, s.budget, s.trials, s.ok, s.failed, s.queued, s.running) == (
        "mm-1", "running", 4, 4, 2, 2, 1, 1)
    p1, p2 = s.problems
    assert (p1.problem, p1.trials, p1.counted, p1.reused, p1.best_ms) == (P1.as_dict(), 4, 2, 1, 2.0)
    assert (p2.problem, p2.trials, p2.best_ms) == (P2.as_dict(), 0, None)
    assert s.progress == 2 / 8


def test_queue_view_shows_running_next_and_done_with_outcomes(store, cid, db_path):
    a, b, c, d = store.enqueue(cid, _cands(16, 32, 64, 128), priorities=[1, 4, 3, 2],
                               reasons=["w", "x", "y", "z"])
    store.set_queue_state(a, "running", worker="gpu-0")
    key = put(store, cid, ok(P1, cfg(32), 1.5))
    store.set_queue_state(b, "done", experiment_key=key)
    store.set_queue_state(d, "dropped")
    view = queries.queue_view(open_db(db_path), cid)
    assert [r.id for r in view.running] == [a] and view.running[0].worker == "gpu-0"
    assert [r.id for r in view.next] == [c] and view.next[0].reason == "y"
    assert [(q.row.id, q.status, q.median_ms) for q in view.done] == [(d, None, None), (b, Status.OK, 1.5)]
    assert (view.queued_total, view.done_total) == (1, 2)
    assert queries.queue_view(open_db(db_path), cid + 1).next == ()


def test_events_are_newest_first_and_filtered(store, cid, db_path):
    store.log_event("campaign_started", "go", campaign_id=cid)
    store.log_event("worker_restarted", "gpu-1 replaced", data={"gpu": 1})
    store.log_event("winner", "found", campaign_id=cid, data={"ms": 1.5})
    db = open_db(db_path)
    assert [e.kind for e in queries.events(db)] == ["winner", "worker_restarted", "campaign_started"]
    assert [e.kind for e in queries.events(db, campaign_id=cid, limit=1)] == ["winner"]
    (e,) = queries.events(db, kinds=["worker_restarted"])
    assert e.data == {"gpu": 1} and e.campaign_id is None and e.ts <= time.time()


def _sample(ts: float, uuid: str, index: int) -> GpuSample:
    return GpuSample(ts, "node-a", uuid, index, "NVIDIA H100", 90.0, 1000.0, 80000.0, 1980.0,
                     500.0, 60.0, "", "w", "mm-1")


def test_gpu_samples_window_and_prune(store, db_path):
    now = 1_800_000_000.0
    store.add_gpu_samples([_sample(now - age, uuid, i) for age in (1000, 100, 10)
                           for i, uuid in enumerate(["GPU-b", "GPU-a"])])
    db = open_db(db_path)
    latest = queries.latest_gpu_samples(db, window_s=300, now=now)
    assert list(latest) == ["GPU-b", "GPU-a"]  # node, then NVML index
    assert [s.ts for s in latest["GPU-a"]] == [now - 100, now - 10]
    assert latest["GPU-a"][0].gpu_index == 1 and latest["GPU-a"][0].running == "mm-1"
    assert store.prune_gpu_samples(500, now=now) == 2
    assert sum(len(v) for v in queries.latest_gpu_samples(db, window_s=1e9, now=now).values()) == 4
