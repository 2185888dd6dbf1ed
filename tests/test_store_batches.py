"""The store's batch writes: a batch of trials, queue states and events in one statement per table,
with the same rows as the calls one at a time, all of a batch or none of it; and the thread that
checkpoints the write-ahead log beside the writer."""

from __future__ import annotations

import gc
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.test_storage import CAMPAIGN, ENV, KERNEL, P1, P2, VERSION, cfg, failed, key_of, ok
from tilepilot.experiments import Campaign, Candidate, Environment, Result
from tilepilot.storage import Store, checkpoint
from tilepilot.storage.rows import TrialWrite

TIMES = {"ts", "created_at", "updated_at", "finished_at", "started_at", "enqueued_at", "measured_at"}


def _rows(db: Path, table: str) -> list[dict[str, Any]]:
    """A table's rows in id order, their times replaced by whether they are set."""
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        rows = con.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()
        return [{k: (r[k] is not None if k in TIMES else r[k]) for k in r.keys()} for r in rows]
    finally:
        con.close()


def _setup(path: Path) -> tuple[Store, int, int, list[int]]:
    """A store with a finished campaign (one result to reuse) and a running one with four queue rows."""
    store = Store(path)
    old = store.create_campaign(Campaign("old", KERNEL, "grid", 4, 0, (P1,)), backend="gpu", dataset="",
                                device=ENV.device)
    reused = ok(P1, cfg(128), 0.5)
    store.record_result(reused, key=key_of(reused), kernel=KERNEL, kernel_version=VERSION)
    store.add_trial(old, key_of(reused), Candidate(P1, cfg(128), "grid", ""), reused=False)
    cid = store.create_campaign(CAMPAIGN, backend="gpu", dataset="", device=ENV.device)
    ids = store.enqueue(cid, [Candidate(r.problem, r.config, "random", f"try {i}", 1.0 + i, "H1" if i else None)
                              for i, r in enumerate(_measured())], priorities=[4, 3, 2, 1], reasons=["r"] * 4)
    store.set_queue_states(ids, "running")
    return store, old, cid, ids


def _measured() -> list[Result]:
    return [ok(P1, cfg(16), 3.0), ok(P2, cfg(16), 9.0), failed(P1, cfg(32)), ok(P1, cfg(64), 1.0)]


def _batch(ids: list[int]) -> list[TrialWrite]:
    """The four measured results of the queue rows, a reused one, and the first again (a trial the
    campaign has already)."""
    out = [TrialWrite(key_of(r), Candidate(r.problem, r.config, "random", f"try {i}", 1.0 + i, "H1" if i else None),
                      r, queue_id=qid, worker=f"gpu-{i}")
           for i, (r, qid) in enumerate(zip(_measured(), ids, strict=True))]
    reused = ok(P1, cfg(128), 0.5)
    out.append(TrialWrite(key_of(reused), Candidate(P1, cfg(128), "random", "from the store"), reused, reused=True))
    out.append(out[0])
    return out


def test_record_trials_writes_the_rows_the_calls_one_at_a_time_write(tmp_path):
    one, _, cid, ids = _setup(tmp_path / "one.db")
    for t in _batch(ids):
        if not t.reused:
            one.record_result(t.result, key=t.key, kernel=KERNEL, kernel_version=VERSION, worker=t.worker)
        one.add_trial(cid, t.key, t.candidate, reused=t.reused)
        if t.queue_id is not None:
            one.set_queue_state(t.queue_id, "done", worker=t.worker, experiment_key=t.key)
    one.close()
    batch, _, cid, ids = _setup(tmp_path / "batch.db")
    assert batch.record_trials(cid, _batch(ids), kernel=KERNEL, kernel_version=VERSION) == 5  # the repeat is not new
    assert batch.record_trials(cid, _batch(ids)[-1:], kernel=KERNEL, kernel_version=VERSION) == 0
    batch.close()
    for table in ("experiments", "results", "trials", "queue", "campaigns"):
        assert _rows(tmp_path / "one.db", table) == _rows(tmp_path / "batch.db", table), table
    seqs = [(t["problem_key"], t["seq"]) for t in _rows(tmp_path / "batch.db", "trials")[1:]]
    assert seqs == [(P1.key(), 1), (P2.key(), 1), (P1.key(), 2), (P1.key(), 3), (P1.key(), 4)]


@pytest.mark.parametrize("spoil", ["key", "problem", "queue row", "unrecorded reuse", "reuse of another problem"])
def test_record_trials_checks_the_whole_batch_before_writing_any_of_it(tmp_path, spoil):
    store, _, cid, ids = _setup(tmp_path / "t.db")
    batch = _batch(ids)
    r = batch[2].result
    if spoil == "key":
        batch[2] = TrialWrite("0" * 32, batch[2].candidate, r, queue_id=ids[2])
    elif spoil == "problem":
        batch[2] = TrialWrite(batch[2].key, Candidate(P2, r.config, "random", ""), r, queue_id=ids[2])
    elif spoil == "queue row":
        batch[2] = TrialWrite(batch[2].key, batch[2].candidate, r, queue_id=9999)
    elif spoil == "unrecorded reuse":
        batch[2] = TrialWrite("f" * 32, batch[2].candidate, r, reused=True)
    else:
        batch[2] = TrialWrite(batch[4].key, Candidate(P2, cfg(128), "random", ""), batch[4].result, reused=True)
    before = {t: _rows(tmp_path / "t.db", t) for t in ("experiments", "results", "trials", "queue")}
    error = KeyError if spoil in ("queue row", "unrecorded reuse") else ValueError
    with pytest.raises(error):
        store.record_trials(cid, batch, kernel=KERNEL, kernel_version=VERSION)
    assert {t: _rows(tmp_path / "t.db", t) for t in before} == before
    store.close()


def test_set_queue_states_stamps_as_set_queue_state_and_refuses_unknown_rows(tmp_path):
    one, _, _, ids = _setup(tmp_path / "one.db")
    for state in ("queued", "compiling", "running", "dropped", "queued"):
        for qid in ids[:3]:
            one.set_queue_state(qid, state)
    one.close()
    batch, _, _, ids = _setup(tmp_path / "batch.db")
    for state in ("queued", "compiling", "running", "dropped", "queued"):
        batch.set_queue_states(ids[:3], state)
    with pytest.raises(KeyError, match="9999"):
        batch.set_queue_states([ids[3], 9999], "done")
    assert batch.queue_row(ids[3]).state == "running"  # nothing of the refused call was written
    with pytest.raises(ValueError, match="unknown queue state"):
        batch.set_queue_states(ids, "paused")
    batch.close()
    assert _rows(tmp_path / "one.db", "queue") == _rows(tmp_path / "batch.db", "queue")


def test_log_events_writes_them_in_order(tmp_path):
    store = Store(tmp_path / "t.db")
    cid = store.create_campaign(CAMPAIGN, backend="gpu", dataset="", device=ENV.device)
    store.log_event("first", "one at a time", campaign_id=cid, data={"n": 0})
    store.log_events([("finished", "a", {"n": 1}), ("failed", "b", None), ("finished", "c", {"n": [3]})],
                     campaign_id=cid)
    store.log_events([])
    rows = [(r["kind"], r["message"], r["data"]) for r in store.db.query("SELECT * FROM events ORDER BY id")]
    assert rows == [("first", "one at a time", '{"n": 0}'), ("finished", "a", '{"n": 1}'), ("failed", "b", "{}"),
                    ("finished", "c", '{"n": [3]}')]
    store.close()


def test_lookup_results_finds_what_lookup_result_finds(tmp_path):
    store, _, _, _ = _setup(tmp_path / "t.db")
    recorded = ok(P1, cfg(128), 0.5)
    keys = [key_of(recorded), "0" * 32, key_of(recorded)]
    assert store.lookup_results(keys) == {key_of(recorded): store.lookup_result(key_of(recorded))}
    assert store.lookup_results([]) == {}
    store.close()


_KILL_CHILD = """
import os, signal, sys
from tests.test_store_batches import _batch
from tests.test_storage import CAMPAIGN, KERNEL, VERSION
from tilepilot.storage import Store
store = Store(sys.argv[1])
cid = store.get_campaign(CAMPAIGN.name).id
ids = [int(i) for i in sys.argv[2].split(",")]
batch = _batch(ids)
with store.transaction():  # the first batch commits
    store.record_trials(cid, batch[:2], kernel=KERNEL, kernel_version=VERSION)
    store.log_events([("finished", "first batch", None)], campaign_id=cid)
def die(sql):  # killed in the middle of the second batch: its experiments and results are written, not its trials
    if sql.startswith("INSERT INTO trials"):
        os.kill(os.getpid(), signal.SIGKILL)
store.db.conn.set_trace_callback(die)
with store.transaction():
    store.record_trials(cid, batch[2:4], kernel=KERNEL, kernel_version=VERSION)
    store.log_events([("finished", "second batch", None)], campaign_id=cid)
"""


def test_kill_9_in_the_middle_of_a_batch_leaves_none_of_it(tmp_path):
    db = tmp_path / "t.db"
    store, _, cid, ids = _setup(db)
    store.close()
    child = subprocess.run([sys.executable, "-c", _KILL_CHILD, str(db), ",".join(map(str, ids))],
                           capture_output=True, cwd=Path(__file__).parent.parent, timeout=60)
    assert child.returncode == -9, child.stderr.decode()
    with Store(db) as after:
        first = {t.key for t in _batch(ids)[:2]}
        trials = after.campaign_results(cid)
        assert {t.experiment_key for t, _ in trials} == first
        assert [after.lookup_result(t.key) is not None for t in _batch(ids)[:4]] == [True, True, False, False]
        assert [after.queue_row(qid).state for qid in ids] == ["done", "done", "running", "running"]
        assert [e["message"] for e in after.db.query("SELECT message FROM events")] == ["first batch"]


def test_a_result_of_another_environment_is_refused(tmp_path):
    store, _, cid, ids = _setup(tmp_path / "t.db")
    r = _measured()[0]
    elsewhere = Result(r.problem, r.config, r.status, Environment("gpu", "NVIDIA H200", ENV.torch, ENV.triton),
                       r.timing)
    with pytest.raises(ValueError, match="does not match its result"):
        store.record_trials(cid, [TrialWrite(key_of(r), _batch(ids)[0].candidate, elsewhere, queue_id=ids[0])],
                            kernel=KERNEL, kernel_version=VERSION)
    store.close()


# -- the WAL checkpointer ------------------------------------------------------------------------------

def _checkpoint_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("wal-checkpoint") and t.is_alive()]


def test_the_log_is_copied_into_the_file_beside_the_writer(tmp_path):
    db = tmp_path / "t.db"
    before = _checkpoint_threads()
    store = Store(db)
    assert store.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == checkpoint.FALLBACK_PAGES
    cid = store.create_campaign(CAMPAIGN, backend="gpu", dataset="", device=ENV.device)
    for i in range(2 * checkpoint.EVERY_COMMITS):  # a page of log or more each: under the writer's own threshold
        store.log_event("e", "x" * 4000, campaign_id=cid, data={"i": i})
    copied = checkpoint.EVERY_COMMITS * 4000  # the events of the first EVERY_COMMITS commits, at least
    deadline = time.monotonic() + 10
    while db.stat().st_size < copied and time.monotonic() < deadline:
        time.sleep(0.05)
    assert db.stat().st_size >= copied  # the checkpointer copied them into the database file
    assert len(_checkpoint_threads()) == len(before) + 1
    store.close()
    assert _checkpoint_threads() == before
    with Store.open_readonly(db) as reader:  # a reader starts no checkpointer
        assert len(reader.db.execute("SELECT * FROM events").fetchall()) == 2 * checkpoint.EVERY_COMMITS
        assert _checkpoint_threads() == before


def test_a_store_dropped_without_close_stops_its_checkpointer(tmp_path):
    before = _checkpoint_threads()
    store = Store(tmp_path / "t.db")
    assert len(_checkpoint_threads()) == len(before) + 1
    del store
    gc.collect()
    assert _checkpoint_threads() == before
