"""`Store`: the one facade through which tilepilot writes its SQLite database."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any

import sqlite_utils
from sqlite_utils.utils import dedupe_keys

from tilepilot.experiments import (
    Campaign,
    Candidate,
    Config,
    DeviceCeilings,
    GpuSample,
    InputError,
    Problem,
    Result,
    experiment_key,
)
from tilepilot.experiments.hypothesis import (
    EVIDENCE_RELATIONS,
    Evidence,
    Hypothesis,
    HypothesisState,
    Learning,
    Verdict,
)
from tilepilot.experiments.llm_call import LlmCall
from tilepilot.storage.checkpoint import FALLBACK_PAGES, WalCheckpointer
from tilepilot.storage.ledger import (
    HypothesisRow,
    LearningRow,
    hypothesis_columns,
    select_hypotheses,
    select_learnings,
    verdict_columns,
)
from tilepilot.storage.llm_calls import LlmCallRow, llm_call_columns, select_llm_calls
from tilepilot.storage.rows import (
    RESULT_FIELDS,
    RESULT_JOIN,
    CampaignRow,
    QueueRow,
    TrialRow,
    TrialWrite,
    WinnerRow,
    campaign_from_row,
    ceilings_columns,
    ceilings_from_row,
    dumps,
    in_chunks,
    loads,
    queue_from_row,
    result_columns,
    result_from_row,
    trial_from_row,
)
from tilepilot.storage.schema import CAMPAIGN_STATES, QUEUE_STATES, open_database

log = logging.getLogger(__name__)

CONTROLS = ("", "pause", "stop")  # campaigns.control
QUEUE_REQUESTS = ("promote", "drop", "pin")
REQUESTS = ("pause", "resume", "stop", *QUEUE_REQUESTS)
_STARTED = ("compiling", "running")
_ENDED = ("done", "dropped")
_WINNER_COLUMNS = tuple(f.name for f in fields(WinnerRow))
_EXPERIMENT_UPSERT = (
    "INSERT INTO experiments (key, kernel, kernel_version, problem, problem_key, config, config_key, backend, "
    "device, torch, triton, driver, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(key) DO UPDATE SET driver = excluded.driver")
# A trial's seq is the highest of its campaign and problem so far plus one, found by the statement itself (a
# look-up at the end of the (campaign_id, problem_key, seq) index), so that one executemany numbers a whole
# batch; a trial the campaign has already is left as it is.
_TRIAL_INSERT = (
    "INSERT INTO trials (campaign_id, problem_key, experiment_key, seq, proposer, rationale, predicted_ms, "
    "hypothesis_id, reused, created_at) VALUES (?, ?, ?, COALESCE((SELECT MAX(seq) FROM trials "
    "WHERE campaign_id = ? AND problem_key = ?), 0) + 1, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(campaign_id, experiment_key) DO NOTHING")
_EVENT_INSERT = "INSERT INTO events (ts, campaign_id, kind, message, data) VALUES (?, ?, ?, ?, ?)"
_QUEUE_INSERT = (
    "INSERT INTO queue (campaign_id, problem_key, problem, config, config_key, proposer, rationale, predicted_ms, "
    "hypothesis_id, priority, reason, state, enqueued_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'queued', ?) "
    "ON CONFLICT(campaign_id, problem_key, config_key) DO NOTHING")
# set_queue_states: a non-empty worker or experiment key replaces the stored one (the first ? of each CASE)
_KEEP_OR_SET = ("worker = CASE WHEN ? = '' THEN worker ELSE ? END, "
                "experiment_key = CASE WHEN ? = '' THEN experiment_key ELSE ? END")
_QUEUE_STATE_SQL = {
    "started": f"UPDATE queue SET state = ?, {_KEEP_OR_SET}, "
               "started_at = CASE WHEN started_at THEN started_at ELSE ? END WHERE id = ?",
    "ended": f"UPDATE queue SET state = ?, {_KEEP_OR_SET}, finished_at = ? WHERE id = ?",
    "queued": "UPDATE queue SET state = ?, worker = ?, experiment_key = CASE WHEN ? = '' THEN experiment_key "
              "ELSE ? END, started_at = NULL, finished_at = NULL WHERE id = ?",
}


def _trial_row(campaign_id: int, key: str, c: Candidate, reused: bool, now: float) -> tuple[Any, ...]:
    """The parameters of _TRIAL_INSERT for one trial."""
    problem_key = c.problem.key()
    return (campaign_id, problem_key, key, campaign_id, problem_key, c.proposer, c.rationale, c.predicted_ms,
            c.hypothesis_id, int(reused), now)


class Store:
    """The SQLite store of campaigns, experiments, results, trials, the queue, events, GPU
    samples, winners, the hypothesis ledger (hypotheses, verdicts, evidence, learnings) and the
    calls of the `llm` proposer.
    One writer per database: the campaign driver.

    Contract:
    - Opening: `Store(path)` creates the file if needed, turns WAL on and migrates the schema;
      `Store.open_readonly(path)` opens an existing file through a `mode=ro` URI and never
      creates, migrates or writes it. Nothing is opened at import time.
    - Thread safety: every method may be called from any thread; calls are serialised by a
      re-entrant lock. `transaction()` holds that lock for its whole body, so the calls
      inside it are atomic together and no other thread's call interleaves.
    - Atomicity: each write method is one transaction. Inside `with store.transaction():`
      they all commit together or not at all (an exception rolls everything back, and a
      kill -9 leaves the state before the block).
    - Batches: `record_trials`, `set_queue_states`, `log_events` and `lookup_results` write
      (or read) what the one-row methods do for each row, with one statement per table, and
      check the whole batch before writing any of it.
    - Durability: a commit is in the write-ahead log when it returns; a writer's own thread
      (`storage.checkpoint`) copies the log into the database file, outside its commits.
    - Returned records (`CampaignRow`, `TrialRow`, `QueueRow`, `Result`) are frozen
      snapshots; they never change when the database does.
    - Values are always bound parameters, never formatted into SQL.
    - Times are epoch seconds (UTC) everywhere.

    Raises:
        InputError: a user mistake: the database file cannot be used (missing, not a tilepilot
            database, newer schema), or a campaign name that already exists.
        ValueError: a caller's bug: an unknown state, a key that does not match its result,
            sequences of different lengths.
        KeyError: a row the caller updates or builds on does not exist (a campaign id in
            `set_campaign_state`, a queue id, the experiment of `add_trial`, the hypothesis of
            `record_verdict` or `add_learning`).
        sqlite3.IntegrityError: an insert that names a campaign or an experiment that does not
            exist (foreign keys are on).
        PermissionError: a write on a store opened with `open_readonly`.
        sqlite3.Error: the database itself failed (locked past the 30 s timeout, disk full).
    """

    def __init__(self, path: str | Path) -> None:
        self._open(Path(path), readonly=False)

    @classmethod
    def open_readonly(cls, path: str | Path) -> Store:
        store = cls.__new__(cls)
        store._open(Path(path), readonly=True)
        return store

    def _open(self, path: Path, *, readonly: bool) -> None:
        self.path = path
        self.readonly = readonly
        self._lock = threading.RLock()
        self.db: sqlite_utils.Database = open_database(path, readonly=readonly)
        self._checkpointer: WalCheckpointer | None = None
        if not readonly:  # the log is copied into the file beside the writer, not in its commits
            self.db.execute(f"PRAGMA wal_autocheckpoint={FALLBACK_PAGES:d}")  # a pragma takes no parameter
            self._checkpointer = WalCheckpointer(path)
            self._stop_checkpointer = weakref.finalize(self, self._checkpointer.close)

    def close(self) -> None:
        with self._lock:
            if self._checkpointer is not None:
                self._stop_checkpointer()
            self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions and helpers ------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group several calls into one transaction (nested blocks become savepoints)."""
        if self.readonly:
            raise PermissionError(f"store {str(self.path)!r} was opened read-only")
        with self._lock:
            conn = self.db.conn
            if conn.in_transaction:
                with self.db.atomic():
                    yield
                return
            conn.execute("BEGIN IMMEDIATE")  # take the write lock now: no upgrade deadlock
            try:
                yield
            except BaseException:
                self.db.rollback()
                raise
            try:
                conn.execute("COMMIT")
            except BaseException:
                self.db.rollback()
                raise
            if self._checkpointer is not None:
                self._checkpointer.committed()

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        # On the connection itself: sqlite-utils' query() wraps every read in a savepoint of its own
        # (two statements more), a guard against statements that return no rows; ours are SELECTs.
        with self._lock:
            cur = self.db.conn.execute(sql, list(params))
            keys = dedupe_keys(d[0] for d in cur.description)
            return [dict(zip(keys, row, strict=True)) for row in cur]

    def _one(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any] | None:
        rows = self._rows(sql, params)
        return rows[0] if rows else None

    def _insert(self, table: str, record: Mapping[str, Any], suffix: str = "") -> sqlite3.Cursor:
        # Table and column names come from this module, never from input; values are bound.
        cols = ", ".join(record)
        marks = ", ".join("?" * len(record))
        return self.db.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks}) {suffix}",
                               list(record.values()))

    # -- campaigns -----------------------------------------------------------------------------

    def create_campaign(self, c: Campaign, *, backend: str, dataset: str, device: str) -> int:
        """Insert a campaign in state 'running'; returns its id.

        Raises InputError when a campaign of that name exists.
        """
        now = time.time()
        with self.transaction():
            if self._one("SELECT id FROM campaigns WHERE name = ?", [c.name]):
                raise InputError(
                    f"campaign {c.name!r} already exists in {self.path} "
                    "(use --resume to continue it, or another name)")
            cur = self._insert("campaigns", {
                "name": c.name, "kernel": c.kernel, "proposer": c.proposer, "budget": c.budget,
                "seed": c.seed, "backend": backend, "dataset": dataset, "device": device,
                "state": "running", "source": c.source, "description": c.description,
                "problems": dumps([p.as_dict() for p in c.problems]),
                "created_at": now, "updated_at": now, "finished_at": None,
            })
        assert cur.lastrowid is not None
        return cur.lastrowid

    def get_campaign(self, name: str) -> CampaignRow | None:
        row = self._one("SELECT * FROM campaigns WHERE name = ?", [name])
        return campaign_from_row(row) if row else None

    def campaign_states(self) -> list[tuple[int, str, str]]:
        """(id, name, state) of every campaign, oldest first."""
        return [(int(r["id"]), str(r["name"]), str(r["state"]))
                for r in self._rows("SELECT id, name, state FROM campaigns ORDER BY id")]

    def set_campaign_state(self, campaign_id: int, state: str) -> None:
        """Set the state; a terminal state stamps finished_at, 'running' clears it."""
        _check(state, CAMPAIGN_STATES, "campaign state")
        now = time.time()
        with self.transaction():
            cur = self.db.execute(
                "UPDATE campaigns SET state = ?, updated_at = ?, finished_at = ? WHERE id = ?",
                [state, now, None if state == "running" else now, campaign_id])
            if cur.rowcount == 0:
                raise KeyError(f"no campaign with id {campaign_id}")
        if state != "running":
            # Fresh statistics for the query planner once a campaign's rows are in: without them
            # SQLite chose a plan for the dashboard's recently-done query that took minutes at
            # 100k experiments. Cheap: it analyses only what changed enough.
            self.db.execute("PRAGMA optimize")

    def _touch(self, campaign_id: int, now: float) -> None:
        self.db.execute("UPDATE campaigns SET updated_at = ? WHERE id = ?", [now, campaign_id])

    # -- experiments and results ---------------------------------------------------------------

    def record_result(self, result: Result, *, key: str, kernel: str, kernel_version: str,
                      worker: str = "") -> None:
        """Upsert the experiment and its result (a later measurement replaces the earlier one).

        Raises ValueError when `key` is not `experiment_key(kernel, kernel_version, ...)` of
        this result.
        """
        expected = experiment_key(kernel, kernel_version, result.problem, result.config, result.env)
        if key != expected:
            raise ValueError(f"experiment key {key!r} does not match its result (expected {expected!r})")
        with self.transaction():
            self._upsert_results([(key, result, worker)], kernel=kernel, kernel_version=kernel_version,
                                 now=time.time())

    def _upsert_results(self, results: Sequence[tuple[str, Result, str]], *, kernel: str, kernel_version: str,
                        now: float) -> None:
        """Upsert the experiment and the result of each (key, result, worker): one statement per table."""
        if not results:
            return
        conn = self.db.conn
        conn.executemany(_EXPERIMENT_UPSERT, [
            (key, kernel, kernel_version, dumps(r.problem.as_dict()), r.problem.key(), dumps(r.config.as_dict()),
             r.config.key(), r.env.backend, r.env.device, r.env.torch, r.env.triton, r.env.driver, now)
            for key, r, _ in results])
        records = [{"experiment_key": key, **result_columns(r), "worker": worker, "measured_at": now}
                   for key, r, worker in results]
        cols = list(records[0])
        updates = ", ".join(f"{c} = excluded.{c}" for c in cols if c != "experiment_key")
        conn.executemany(f"INSERT INTO results ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
                         f"ON CONFLICT(experiment_key) DO UPDATE SET {updates}",
                         [tuple(rec.values()) for rec in records])

    def lookup_result(self, key: str) -> Result | None:
        row = self._one(f"SELECT {RESULT_FIELDS} FROM {RESULT_JOIN} WHERE r.experiment_key = ?", [key])
        return result_from_row(row) if row else None

    def lookup_results(self, keys: Sequence[str]) -> dict[str, Result]:
        """The recorded results of these experiment keys (those that have one), by key."""
        out: dict[str, Result] = {}
        for chunk, marks in in_chunks(list(dict.fromkeys(keys))):
            for row in self._rows(f"SELECT r.experiment_key AS found_key, {RESULT_FIELDS} FROM {RESULT_JOIN} "
                                  f"WHERE r.experiment_key IN ({marks})", chunk):
                out[row["found_key"]] = result_from_row(row)
        return out

    # -- trials --------------------------------------------------------------------------------

    def add_trial(self, campaign_id: int, key: str, candidate: Candidate, *, reused: bool) -> int:
        """Record that the campaign tried experiment `key`; returns the trial id.

        Idempotent: a second call with the same campaign and key returns the first trial's
        id and changes nothing. `seq` counts the trials of the campaign for this problem.
        Raises KeyError when the experiment is not recorded, ValueError when it is of
        another problem than the candidate.
        """
        now = time.time()
        with self.transaction():
            found = self._one("SELECT id FROM trials WHERE campaign_id = ? AND experiment_key = ?",
                              [campaign_id, key])
            if found:
                return int(found["id"])
            self._check_experiments([(key, candidate)])
            cur = self.db.conn.execute(_TRIAL_INSERT, _trial_row(campaign_id, key, candidate, reused, now))
            self._touch(campaign_id, now)
        assert cur.lastrowid is not None
        return cur.lastrowid

    def record_trials(self, campaign_id: int, trials: Sequence[TrialWrite], *, kernel: str,
                      kernel_version: str) -> int:
        """Record a batch of trials of the campaign in one transaction, one statement per table: for
        each trial, in order, what `record_result` (unless `reused`), `add_trial` and, for one with a
        queue row, `set_queue_state(queue_id, "done", worker=..., experiment_key=key)` write, with the
        same rows; the campaign's updated_at is stamped once. Returns how many trials were new (one
        the campaign has already is left as it is, as `add_trial` does).

        Everything is checked before anything is written. Raises ValueError when a key is not the
        experiment key of its result or a candidate is of another problem than its experiment,
        KeyError when a reused trial's experiment is not recorded or a queue row does not exist.
        """
        if not trials:
            return 0
        self._check_trials(trials, kernel=kernel, kernel_version=kernel_version)
        now = time.time()
        with self.transaction():
            self._check_experiments([(t.key, t.candidate) for t in trials if t.reused])
            self._upsert_results([(t.key, t.result, t.worker) for t in trials if not t.reused],
                                 kernel=kernel, kernel_version=kernel_version, now=now)
            rows = [_trial_row(campaign_id, t.key, t.candidate, t.reused, now) for t in trials]
            added = self.db.conn.executemany(_TRIAL_INSERT, rows).rowcount
            if added:
                self._touch(campaign_id, now)
            self._queue_states([(t.queue_id, t.worker, t.key) for t in trials if t.queue_id is not None],
                               "done", now)
        return added

    @staticmethod
    def _check_trials(trials: Sequence[TrialWrite], *, kernel: str, kernel_version: str) -> None:
        for t in trials:
            r = t.result
            if t.reused:
                continue
            expected = experiment_key(kernel, kernel_version, r.problem, r.config, r.env)
            if t.key != expected:
                raise ValueError(f"experiment key {t.key!r} does not match its result (expected {expected!r})")
            if r.problem.key() != t.candidate.problem.key():
                raise ValueError(f"experiment {t.key!r} is of problem {r.problem.key()}, "
                                 f"not the candidate's {t.candidate.problem.key()}")

    def _check_experiments(self, tried: Sequence[tuple[str, Candidate]]) -> None:
        """The experiment of each (key, candidate) is recorded and of the candidate's problem."""
        if not tried:
            return
        found: dict[str, str] = {}
        for chunk, marks in in_chunks(list(dict.fromkeys(key for key, _ in tried))):
            found.update((r["key"], r["problem_key"]) for r in self._rows(
                f"SELECT key, problem_key FROM experiments WHERE key IN ({marks})", chunk))
        for key, candidate in tried:
            problem_key = found.get(key)
            if problem_key is None:
                raise KeyError(f"no experiment {key!r}: record its result first")
            if problem_key != candidate.problem.key():
                raise ValueError(f"experiment {key!r} is of problem {problem_key}, "
                                 f"not the candidate's {candidate.problem.key()}")

    def campaign_results(self, campaign_id: int) -> list[tuple[TrialRow, Result]]:
        """Every trial of the campaign with its result, in trial order."""
        rows = self._rows(
            f"SELECT t.*, {RESULT_FIELDS} FROM trials t "
            "JOIN results r ON r.experiment_key = t.experiment_key "
            "JOIN experiments e ON e.key = t.experiment_key "
            "WHERE t.campaign_id = ? ORDER BY t.id", [campaign_id])
        return [(trial_from_row(r), result_from_row(r)) for r in rows]

    # -- queue ---------------------------------------------------------------------------------

    def enqueue(self, campaign_id: int, candidates: Sequence[Candidate], *,
                priorities: Sequence[float], reasons: Sequence[str]) -> list[int]:
        """Queue candidates in state 'queued'; returns the ids of the rows inserted.

        A candidate whose (problem, config) the campaign has queued before, in any state, is
        skipped.
        """
        if not len(candidates) == len(priorities) == len(reasons):
            raise ValueError(f"{len(candidates)} candidates, {len(priorities)} priorities and "
                             f"{len(reasons)} reasons: one of each per candidate")
        now = time.time()
        ids: list[int] = []
        problems: dict[Problem, str] = {}  # a batch's candidates share a few problems: each serialised once
        with self.transaction():
            for c, priority, reason in zip(candidates, priorities, reasons, strict=True):
                problem = problems.get(c.problem)
                if problem is None:
                    problem = problems[c.problem] = dumps(c.problem.as_dict())
                cur = self.db.conn.execute(_QUEUE_INSERT, (
                    campaign_id, c.problem.key(), problem, dumps(c.config.as_dict()), c.config.key(), c.proposer,
                    c.rationale, c.predicted_ms, c.hypothesis_id, float(priority), reason, now))
                if cur.rowcount == 1 and cur.lastrowid is not None:
                    ids.append(cur.lastrowid)
        return ids

    def queued(self, campaign_id: int, *, states: Sequence[str] = ("queued",),
               limit: int | None = None, problem_key: str | None = None) -> list[QueueRow]:
        """Queue rows of the campaign in these states (of one problem, given its key): pinned
        first, then highest priority, then oldest."""
        for s in states:
            _check(s, QUEUE_STATES, "queue state")
        marks = ", ".join("?" * len(states))
        cond, params = ("AND problem_key = ? ", [problem_key]) if problem_key is not None else ("", [])
        rows = self._rows(
            f"SELECT * FROM queue WHERE campaign_id = ? AND state IN ({marks}) {cond}"
            "ORDER BY pinned DESC, priority DESC, id ASC LIMIT ?",
            [campaign_id, *states, *params, -1 if limit is None else limit])
        return [queue_from_row(r) for r in rows]

    def queue_heads(self, campaign_id: int, *, limit: int) -> list[tuple[int, str]]:
        """(id, problem_key) of the first `limit` queued rows of the campaign, in `queued`'s order:
        what the driver needs to pick the next batch, without parsing the rows."""
        rows = self._rows(
            "SELECT id, problem_key FROM queue WHERE campaign_id = ? AND state = 'queued' "
            "ORDER BY pinned DESC, priority DESC, id ASC LIMIT ?", [campaign_id, limit])
        return [(int(r["id"]), str(r["problem_key"])) for r in rows]

    def queue_slots(self, campaign_id: int, problem_key: str) -> list[tuple[int, float, str]]:
        """(id, priority, reason) of the campaign's queued rows of one problem, in `queued`'s order: what
        re-scoring a problem's queue reads, without parsing the rows."""
        rows = self._rows(
            "SELECT id, priority, reason FROM queue WHERE campaign_id = ? AND state = 'queued' AND problem_key = ? "
            "ORDER BY pinned DESC, priority DESC, id ASC", [campaign_id, problem_key])
        return [(int(r["id"]), float(r["priority"]), str(r["reason"])) for r in rows]

    def set_queue_state(self, queue_id: int, state: str, *, worker: str = "",
                        experiment_key: str = "") -> None:
        """Move a queue row to `state`; a non-empty worker or experiment_key is stored too.

        'compiling'/'running' stamp started_at (once), 'done'/'dropped' stamp finished_at,
        'queued' clears both and the worker.
        """
        _check(state, QUEUE_STATES, "queue state")
        with self.transaction():
            self._queue_states([(queue_id, worker, experiment_key)], state, time.time())

    def set_queue_states(self, queue_ids: Sequence[int], state: str) -> None:
        """`set_queue_state(queue_id, state)` for every row, in one transaction and one statement.
        Raises KeyError (and changes nothing) when a row does not exist."""
        _check(state, QUEUE_STATES, "queue state")
        with self.transaction():
            self._queue_states([(qid, "", "") for qid in queue_ids], state, time.time())

    def _queue_states(self, rows: Sequence[tuple[int, str, str]], state: str, now: float) -> None:
        """Move each (queue id, worker, experiment key) row to `state` (see `set_queue_state`)."""
        if not rows:
            return
        if state in _STARTED or state in _ENDED:
            sql = _QUEUE_STATE_SQL["started" if state in _STARTED else "ended"]
            params = [(state, w, w, k, k, now, qid) for qid, w, k in rows]
        else:
            sql = _QUEUE_STATE_SQL["queued"]
            params = [(state, w, k, k, qid) for qid, w, k in rows]
        if self.db.conn.executemany(sql, params).rowcount != len(rows):
            self._missing_queue_rows([qid for qid, _, _ in rows])

    def _missing_queue_rows(self, ids: Sequence[int]) -> None:
        """Raise KeyError for the first of `ids` that is not a queue row (a statement changed fewer rows)."""
        known: set[int] = set()
        for chunk, marks in in_chunks(list(ids)):
            known.update(int(r["id"]) for r in self._rows(f"SELECT id FROM queue WHERE id IN ({marks})", chunk))
        missing = [qid for qid in ids if qid not in known]
        raise KeyError(f"no queue row with id {missing[0] if missing else ids[0]}")

    def reprioritise(self, updates: Sequence[tuple[int, float, str]]) -> None:
        """Set (queue_id, priority, reason) for each row; raises KeyError if an id is unknown."""
        with self.transaction():
            changed = self.db.conn.executemany("UPDATE queue SET priority = ?, reason = ? WHERE id = ?",
                                               [(float(priority), reason, qid) for qid, priority, reason in updates])
            if changed.rowcount != len(updates):
                self._missing_queue_rows([qid for qid, _, _ in updates])

    def requeue_unfinished(self, campaign_id: int) -> int:
        """Put 'compiling'/'running' rows back to 'queued' (resume after a kill); returns the count."""
        with self.transaction():
            cur = self.db.execute(
                "UPDATE queue SET state = 'queued', worker = '', started_at = NULL "
                "WHERE campaign_id = ? AND state IN (?, ?)", [campaign_id, *_STARTED])
        return cur.rowcount

    def drop_queued(self, drops: Sequence[tuple[int, str]]) -> None:
        """Take queued rows off the queue unmeasured: state 'dropped', the reason why, finished_at now.

        Raises KeyError for an unknown id, ValueError for a row that is not in state 'queued'.
        """
        now = time.time()
        with self.transaction():
            for queue_id, reason in drops:
                row = self._one("SELECT state FROM queue WHERE id = ?", [queue_id])
                if row is None:
                    raise KeyError(f"no queue row with id {queue_id}")
                if row["state"] != "queued":
                    raise ValueError(f"queue row {queue_id} is {row['state']}, not queued")
                self.db.execute("UPDATE queue SET state = 'dropped', reason = ?, finished_at = ? WHERE id = ?",
                                [reason, now, queue_id])

    def pin_queued(self, queue_id: int, *, priority: float, reason: str, pinned: bool = True) -> None:
        """Pin a row at the head of its campaign's queue (or unpin it), with its priority and reason.
        Raises KeyError for an unknown id."""
        with self.transaction():
            cur = self.db.execute("UPDATE queue SET pinned = ?, priority = ?, reason = ? WHERE id = ?",
                                  [int(pinned), float(priority), reason, queue_id])
            if cur.rowcount == 0:
                raise KeyError(f"no queue row with id {queue_id}")

    def pinned_ids(self, campaign_id: int | None = None) -> set[int]:
        """Ids of the pinned rows still queued or running (of one campaign, or of all)."""
        cond, params = ("AND campaign_id = ? ", [campaign_id]) if campaign_id is not None else ("", [])
        return {int(r["id"]) for r in self._rows(
            f"SELECT id FROM queue WHERE pinned = 1 {cond}AND state IN ('queued', 'compiling', 'running')", params)}

    def queue_row(self, queue_id: int) -> QueueRow | None:
        row = self._one("SELECT * FROM queue WHERE id = ?", [queue_id])
        return queue_from_row(row) if row else None

    def queue_listing(self, campaign_id: int | None = None) -> list[QueueRow]:
        """What runs now (oldest start first), then what runs next in dispatch order, of one
        campaign or of all (by campaign id)."""
        cond, params = ("campaign_id = ? AND ", [campaign_id]) if campaign_id is not None else ("", [])
        rows = self._rows(
            f"SELECT * FROM queue WHERE {cond}state IN ('queued', 'compiling', 'running') ORDER BY campaign_id, "
            "state = 'queued', started_at, pinned DESC, priority DESC, id", params)
        return [queue_from_row(r) for r in rows]

    # -- a person's controls -----------------------------------------------------------------------

    def set_control(self, campaign_id: int, control: str) -> None:
        """Set the campaign's control ("" | "pause" | "stop"), honoured by its driver at its next step.
        Raises KeyError for an unknown campaign, ValueError for an unknown control."""
        _check(control, CONTROLS, "control")
        with self.transaction():
            cur = self.db.execute("UPDATE campaigns SET control = ? WHERE id = ?", [control, campaign_id])
            if cur.rowcount == 0:
                raise KeyError(f"no campaign with id {campaign_id}")

    def clear_control(self, campaign_id: int, control: str) -> bool:
        """Clear the control if it is still `control` (a newer request is kept); True when cleared."""
        with self.transaction():
            cur = self.db.execute("UPDATE campaigns SET control = '' WHERE id = ? AND control = ?",
                                  [campaign_id, control])
        return cur.rowcount == 1

    def control(self, campaign_id: int) -> str:
        row = self._one("SELECT control FROM campaigns WHERE id = ?", [campaign_id])
        if row is None:
            raise KeyError(f"no campaign with id {campaign_id}")
        return str(row["control"])

    def add_request(self, campaign_id: int, action: str, *, queue_id: int | None = None, message: str = "") -> int:
        """Record a person's request (event `control_request`) for the campaign's driver; returns its id."""
        _check(action, REQUESTS, "request")
        with self.transaction():
            cur = self._insert("events", {
                "ts": time.time(), "campaign_id": campaign_id, "kind": "control_request",
                "message": message or f"a person asked to {action}" + (f" queue entry {queue_id}" if queue_id else ""),
                "data": dumps({"action": action, "queue_id": queue_id})})
        assert cur.lastrowid is not None
        return cur.lastrowid

    def requests(self, campaign_id: int, *, after: int = 0) -> list[ControlRequest]:
        """The campaign's requests with an id above `after`, oldest first."""
        rows = self._rows("SELECT id, ts, data FROM events WHERE kind = 'control_request' AND campaign_id = ? "
                          "AND id > ? ORDER BY id", [campaign_id, after])
        out = []
        for r in rows:
            data = loads(r["data"])
            qid = data.get("queue_id")
            out.append(ControlRequest(int(r["id"]), float(r["ts"]), str(data.get("action", "")),
                                      None if qid is None else int(qid)))
        return out

    def last_answered_request(self, campaign_id: int) -> int:
        """The highest request id the campaign's driver has answered (events `control` carry it), or 0."""
        row = self._one("SELECT MAX(CAST(json_extract(data, '$.request') AS INTEGER)) AS n FROM events "
                        "WHERE kind = 'control' AND campaign_id = ?", [campaign_id])
        return int(row["n"]) if row and row["n"] is not None else 0

    # -- warm start --------------------------------------------------------------------------------

    def winners_of(self, kernel: str, device: str) -> list[WinnerSource]:
        """Every declared winner of `kernel` measured on `device` (exactly that name), newest first."""
        rows = self._rows(
            "SELECT e.problem, e.config, w.median_ms, c.name AS campaign, e.torch, e.triton, w.decided_at "
            "FROM winners w JOIN experiments e ON e.key = w.experiment_key JOIN campaigns c ON c.id = w.campaign_id "
            "WHERE e.kernel = ? AND e.device = ? ORDER BY w.decided_at DESC, w.campaign_id DESC", [kernel, device])
        return [WinnerSource(Problem.of(loads(r["problem"])), Config.of(loads(r["config"])), float(r["median_ms"]),
                             r["campaign"], r["torch"], r["triton"], float(r["decided_at"])) for r in rows]

    def devices(self, kernel: str) -> list[str]:
        """The devices with at least one `ok` result of `kernel`, by name."""
        rows = self._rows(
            "SELECT DISTINCT e.device FROM experiments e JOIN results r ON r.experiment_key = e.key "
            "WHERE e.kernel = ? AND r.status = ? AND r.median_ms IS NOT NULL ORDER BY e.device", [kernel, "ok"])
        return [str(r["device"]) for r in rows]

    def measured_problems(self, kernel: str, device: str) -> list[Problem]:
        """The problems of `kernel` with at least one `ok` result measured on `device`, by key."""
        rows = self._rows(
            "SELECT e.problem_key, MIN(e.problem) AS problem FROM experiments e "
            "JOIN results r ON r.experiment_key = e.key WHERE e.kernel = ? AND e.device = ? AND r.status = ? "
            "AND r.median_ms IS NOT NULL GROUP BY e.problem_key ORDER BY e.problem_key", [kernel, device, "ok"])
        return [Problem.of(loads(r["problem"])) for r in rows]

    def measured(self, kernel: str, device: str, problem: Problem) -> list[tuple[Config, float]]:
        """Every config of `kernel` with an `ok` result for `problem` on `device` and its median time;
        a config measured more than once (another toolchain or kernel version) by its latest result."""
        rows = self._rows(
            "SELECT e.config, e.config_key, r.median_ms FROM experiments e "
            "JOIN results r ON r.experiment_key = e.key WHERE e.kernel = ? AND e.device = ? AND e.problem_key = ? "
            "AND r.status = ? AND r.median_ms IS NOT NULL ORDER BY r.measured_at, e.key",
            [kernel, device, problem.key(), "ok"])
        latest = {r["config_key"]: (Config.of(loads(r["config"])), float(r["median_ms"])) for r in rows}
        return [latest[k] for k in sorted(latest)]

    def kernel_versions(self, kernel: str, device: str, problem: Problem) -> frozenset[str]:
        """The kernel versions that measured an `ok` result of `kernel` for `problem` on `device`."""
        rows = self._rows(
            "SELECT DISTINCT e.kernel_version FROM experiments e JOIN results r ON r.experiment_key = e.key "
            "WHERE e.kernel = ? AND e.device = ? AND e.problem_key = ? AND r.status = ? AND r.median_ms IS NOT NULL",
            [kernel, device, problem.key(), "ok"])
        return frozenset(str(r["kernel_version"]) for r in rows)

    # -- events, GPU samples, winners ----------------------------------------------------------

    def log_event(self, kind: str, message: str, *, campaign_id: int | None = None,
                  data: Mapping[str, Any] | None = None) -> None:
        self.log_events([(kind, message, data)], campaign_id=campaign_id)

    def log_events(self, events: Sequence[tuple[str, str, Mapping[str, Any] | None]], *,
                   campaign_id: int | None = None) -> None:
        """`log_event(kind, message, data=data)` for each (kind, message, data), in order, in one
        transaction and one statement."""
        if not events:
            return
        now = time.time()
        with self.transaction():
            self.db.conn.executemany(_EVENT_INSERT, [(now, campaign_id, kind, message, dumps(dict(data or {})))
                                                     for kind, message, data in events])

    def add_gpu_samples(self, samples: Sequence[GpuSample]) -> None:
        with self.transaction():
            self.db.conn.executemany(
                "INSERT INTO gpu_samples (ts, node, gpu_uuid, gpu_index, name, util_pct, mem_used_mb, "
                "mem_total_mb, sm_clock_mhz, power_w, temp_c, throttle, worker, running) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(s.ts, s.node, s.uuid, s.index, s.name, s.util_pct, s.mem_used_mb, s.mem_total_mb,
                  s.sm_clock_mhz, s.power_w, s.temp_c, s.throttle, s.worker, s.running)
                 for s in samples])

    def prune_gpu_samples(self, older_than_s: float, *, now: float | None = None) -> int:
        """Delete samples older than `older_than_s` seconds; returns how many were deleted."""
        cutoff = (time.time() if now is None else now) - older_than_s
        with self.transaction():
            cur = self.db.execute("DELETE FROM gpu_samples WHERE ts < ?", [cutoff])
        return cur.rowcount

    def set_winner(self, row: WinnerRow) -> None:
        """Upsert the winner of (campaign, problem); decided_at defaults to now."""
        values = list(astuple(row))
        values[_WINNER_COLUMNS.index("decided_at")] = row.decided_at or time.time()
        record = dict(zip(_WINNER_COLUMNS, values, strict=True))
        record["tie"] = int(row.tie)
        record["recheck_passed"] = None if row.recheck_passed is None else int(row.recheck_passed)
        updates = ", ".join(f"{c} = excluded.{c}" for c in _WINNER_COLUMNS[2:])
        with self.transaction():
            self._insert("winners", record, f"ON CONFLICT(campaign_id, problem_key) DO UPDATE SET {updates}")


    # -- device ceilings ---------------------------------------------------------------------------

    def set_ceilings(self, c: DeviceCeilings) -> None:
        """Upsert the ceilings of (device, driver); measured_at defaults to now."""
        record = ceilings_columns(c)
        record["measured_at"] = c.measured_at or time.time()
        updates = ", ".join(f"{k} = excluded.{k}" for k in record if k not in ("device", "driver"))
        with self.transaction():
            self._insert("devices", record, f"ON CONFLICT(device, driver) DO UPDATE SET {updates}")

    def ceilings(self, device: str, driver: str) -> DeviceCeilings | None:
        """The ceilings measured for exactly this device and driver, or None."""
        row = self._one("SELECT * FROM devices WHERE device = ? AND driver = ?", [device, driver])
        return ceilings_from_row(row) if row else None

    def all_ceilings(self) -> list[DeviceCeilings]:
        """Every device's ceilings, newest first."""
        return [ceilings_from_row(r) for r in self._rows("SELECT * FROM devices ORDER BY measured_at DESC")]

    # -- the hypothesis ledger -------------------------------------------------------------------

    def add_hypothesis(self, campaign_id: int, h: Hypothesis) -> bool:
        """Insert a hypothesis in state 'proposed'; returns False (and changes nothing) when its id exists."""
        now = time.time()
        with self.transaction():
            cur = self._insert("hypotheses", {
                **hypothesis_columns(h), "campaign_id": campaign_id, "state": HypothesisState.PROPOSED.value,
                "created_at": now, "updated_at": now,
            }, "ON CONFLICT(id) DO NOTHING")
        return cur.rowcount == 1

    def record_verdict(self, verdict: Verdict, evidence: Sequence[Evidence] = ()) -> bool:
        """Set the hypothesis' latest verdict and upsert its evidence; returns True when the state
        changed (the change is appended to `verdicts`). A validated or ruled-out state stamps
        decided_at. Raises KeyError for an unknown hypothesis, ValueError for evidence of another
        hypothesis or an unknown relation.
        """
        for e in evidence:
            if e.hypothesis_id != verdict.hypothesis_id:
                raise ValueError(f"evidence of {e.hypothesis_id} given with a verdict on {verdict.hypothesis_id}")
            _check(e.relation, EVIDENCE_RELATIONS, "evidence relation")
        now = time.time()
        cols = verdict_columns(verdict)
        with self.transaction():
            row = self._one("SELECT state, decided_at FROM hypotheses WHERE id = ?", [verdict.hypothesis_id])
            if row is None:
                raise KeyError(f"no hypothesis {verdict.hypothesis_id!r}")
            decided = (row["decided_at"] or now) if verdict.state.decided else None
            sets = ", ".join(f"{c} = ?" for c in cols)
            self.db.execute(f"UPDATE hypotheses SET {sets}, updated_at = ?, decided_at = ? WHERE id = ?",
                            [*cols.values(), now, decided, verdict.hypothesis_id])
            changed = row["state"] != verdict.state.value
            if changed:
                self._insert("verdicts", {"hypothesis_id": verdict.hypothesis_id, **cols, "decided_at": now})
            self.db.conn.executemany(
                "INSERT INTO evidence (hypothesis_id, experiment_a, experiment_b, problem_key, ratio, relation, "
                "recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(hypothesis_id, experiment_a, experiment_b) "
                "DO UPDATE SET ratio = excluded.ratio, relation = excluded.relation, "
                "recorded_at = excluded.recorded_at",
                [(e.hypothesis_id, e.experiment_a, e.experiment_b, e.problem_key, e.ratio, e.relation, now)
                 for e in evidence])
        return changed

    def add_learning(self, learning: Learning) -> bool:
        """Insert a learning; returns False when its hypothesis has one already. Its evidence is the
        hypothesis' supporting pairs. Raises KeyError for an unknown hypothesis."""
        with self.transaction():
            if self._one("SELECT id FROM hypotheses WHERE id = ?", [learning.hypothesis_id]) is None:
                raise KeyError(f"no hypothesis {learning.hypothesis_id!r}")
            cur = self._insert("learnings", {
                "id": learning.id, "hypothesis_id": learning.hypothesis_id, "kernel": learning.kernel,
                "device": learning.device, "torch": learning.torch, "triton": learning.triton,
                "scope": dumps(learning.scope.as_list()), "text": learning.text, "effect": learning.effect,
                "pairs": learning.pairs, "created_at": time.time(),
            }, "ON CONFLICT DO NOTHING")
        return cur.rowcount == 1

    def hypotheses(self, *, kernel: str | None = None, device: str | None = None,
                   campaign_id: int | None = None) -> list[HypothesisRow]:
        """Hypotheses with their latest verdict, oldest first (`device`: a case-insensitive part of the name)."""
        return select_hypotheses(self._rows, kernel=kernel, device=device, campaign_id=campaign_id)

    def learnings(self, *, kernel: str | None = None, device: str | None = None) -> list[LearningRow]:
        return select_learnings(self._rows, kernel=kernel, device=device)

    # -- calls to a language model ---------------------------------------------------------------

    def add_llm_call(self, campaign_id: int, call: LlmCall) -> int:
        """Record one call of the `llm` proposer; returns the row id."""
        with self.transaction():
            cur = self._insert("llm_calls", llm_call_columns(campaign_id, call))
        assert cur.lastrowid is not None
        return cur.lastrowid

    def llm_calls(self, campaign_id: int | None = None) -> list[LlmCallRow]:
        """Calls of one campaign (or all), newest first."""
        return select_llm_calls(self._rows, campaign_id=campaign_id)

@dataclass(frozen=True)
class ControlRequest:
    """A person's request to a campaign's driver (`tilepilot queue promote|drop|pin`, `pause|resume|stop`)."""

    id: int  # the event's id: requests are answered in this order
    ts: float
    action: str  # one of REQUESTS
    queue_id: int | None  # the queue row, for promote, drop and pin


@dataclass(frozen=True)
class WinnerSource:
    """A declared winner a new campaign may start from."""

    problem: Problem
    config: Config
    median_ms: float
    campaign: str
    torch: str
    triton: str
    decided_at: float


def _check(value: str, allowed: Sequence[str], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r} (allowed: {', '.join(allowed)})")
