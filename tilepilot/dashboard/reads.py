"""The dashboard's own read-only queries: shaped for what a page shows, and fast at 100k experiments.

`storage.queries` answers the command line; the pages need other cuts (one campaign's trials
with nothing but their status and times, the newest trials by id, the queue with its pinned
flag, the ceilings), and need them in milliseconds, because every open page re-reads the
store every few seconds. Every function takes a `ReadOnlyDB` (a `mode=ro` connection) and binds
its values; nothing here writes. Records are frozen; problems and configs are plain dicts.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tilepilot.storage.queries import ReadOnlyDB
from tilepilot.storage.rows import in_chunks, loads

QUEUE_EVENT_KINDS = ("reordered", "dropped", "control", "control_request", "pinned", "promoted")


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("?" * len(values))


class DashboardDB(ReadOnlyDB):
    """The read-only handle, with plain tuples for the few reads of a whole table: a dict per row
    costs as much as the read itself at 100k rows."""

    def tuples(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self.db.execute(sql, list(params)).fetchall()


def open_db(path: str | Path) -> DashboardDB:
    """Raises InputError when there is no tilepilot database at `path` (never creates one)."""
    return DashboardDB(Path(path))


# ---- campaigns -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class CampaignInfo:
    """A campaign row with its queue counts: what every page needs to name and pick campaigns."""

    id: int
    name: str
    kernel: str
    proposer: str
    backend: str
    device: str
    dataset: str
    state: str
    budget: int  # per problem
    description: str
    problems: tuple[dict[str, Any], ...]  # as listed in the campaign (may be empty: a whole dataset)
    created_at: float
    updated_at: float
    finished_at: float | None
    gpu_seconds: float  # recorded by the driver (0 where it recorded none)
    llm_cost_usd: float
    control: str
    queued: int
    running: int  # compiling or running


def campaigns(db: ReadOnlyDB) -> list[CampaignInfo]:
    """Every campaign, newest first, with its queue counts (one indexed pass over the queue)."""
    counts: dict[tuple[int, str], int] = {
        (r["campaign_id"], r["state"]): r["n"] for r in db.rows(
            "SELECT campaign_id, state, COUNT(*) AS n FROM queue "
            "WHERE state IN ('queued', 'compiling', 'running') GROUP BY campaign_id, state")}
    out = []
    for c in db.rows("SELECT id, name, kernel, proposer, backend, device, dataset, state, budget, description, "
                     "problems, created_at, updated_at, finished_at, gpu_seconds, llm_cost_usd, control "
                     "FROM campaigns ORDER BY id DESC"):
        cid = c["id"]
        out.append(CampaignInfo(
            cid, c["name"], c["kernel"], c["proposer"], c["backend"], c["device"], c["dataset"], c["state"],
            c["budget"], c["description"], tuple(loads(c["problems"]) or ()), c["created_at"], c["updated_at"],
            c["finished_at"], float(c["gpu_seconds"] or 0.0), float(c["llm_cost_usd"] or 0.0), c["control"] or "",
            counts.get((cid, "queued"), 0), counts.get((cid, "compiling"), 0) + counts.get((cid, "running"), 0)))
    return out


class TrialPoint(NamedTuple):
    """One trial of a campaign with the few result fields the overview needs (a tuple: a busy
    store holds 100k of them in memory, and they are made in bulk)."""

    trial_id: int
    problem_key: str
    experiment_key: str
    config: str  # the config as stored (JSON text): parsed only where a page needs it
    seq: int
    proposer: str
    reused: bool
    created_at: float
    status: str
    median_ms: float | None
    reps: int | None
    timed_ms: float | None  # GPU time spent timing it (adaptive timing only)
    compile_ms: float | None


_RESULT_FIELDS = "r.status, r.median_ms, r.reps, r.timed_ms, r.compile_ms"


def all_trials(db: DashboardDB) -> tuple[dict[int, list[TrialPoint]], int]:
    """Every trial of every campaign, in trial order, per campaign id; and the highest trial id.

    Three scans joined here by key: at 100k trials that is twice as fast as SQLite's join, which
    looks every key up in two indexes. The trials are read first: a driver writes a trial's
    result before or with the trial, so every trial read has its result in the later scans
    (read the other way round, a trial committed between the scans would be missed for good:
    the highest id returned is where the next read starts). A trial whose result is missing is
    left out (as a join would)."""
    intern = sys.intern  # problems, configs, proposers and statuses repeat: one string each
    trials = db.tuples("SELECT id, campaign_id, problem_key, experiment_key, seq, proposer, reused, created_at "
                       "FROM trials ORDER BY id")
    results = {k: (intern(status), *rest) for k, status, *rest in db.tuples(
        f"SELECT r.experiment_key, {_RESULT_FIELDS} FROM results r")}
    configs = {k: intern(c) for k, c in db.tuples("SELECT key, config FROM experiments")}
    out: dict[int, list[TrialPoint]] = {}
    last = 0
    for tid, cid, pkey, ekey, seq, proposer, reused, created in trials:
        last = tid
        r = results.get(ekey)
        if r is not None:
            out.setdefault(cid, []).append(TrialPoint(tid, intern(pkey), ekey, configs.get(ekey, "{}"), seq,
                                                      intern(proposer), bool(reused), created, *r))
    return out, last


def trials_after(db: DashboardDB, after: int) -> list[tuple[int, TrialPoint]]:
    """(campaign id, trial) of the trials with an id above `after`, in trial order."""
    return [(cid, TrialPoint(tid, pkey, ekey, config, seq, proposer, bool(reused), created, *r))
            for cid, tid, pkey, ekey, config, seq, proposer, reused, created, *r in db.tuples(
                "SELECT t.campaign_id, t.id, t.problem_key, t.experiment_key, e.config, t.seq, t.proposer, t.reused, "
                f"t.created_at, {_RESULT_FIELDS} FROM trials t CROSS JOIN results r ON r.experiment_key = "
                "t.experiment_key CROSS JOIN experiments e ON e.key = t.experiment_key WHERE t.id > ? ORDER BY t.id",
                [after])]


@dataclass(frozen=True)
class Winner:
    problem_key: str
    experiment_key: str
    median_ms: float
    tie: bool
    median_config_ms: float | None
    baseline_ms: float | None
    baseline_name: str


def winners(db: ReadOnlyDB, campaign_id: int) -> dict[str, Winner]:
    """Problem key -> the declared winner of that problem in the campaign."""
    return {r["problem_key"]: Winner(r["problem_key"], r["experiment_key"], r["median_ms"], bool(r["tie"]),
                                     r["median_config_ms"], r["baseline_ms"], r["baseline_name"] or "")
            for r in db.rows("SELECT problem_key, experiment_key, median_ms, tie, median_config_ms, baseline_ms, "
                             "baseline_name FROM winners WHERE campaign_id = ?", [campaign_id])}


@dataclass(frozen=True)
class ExperimentBrief:
    key: str
    problem: dict[str, Any]
    config: dict[str, Any]
    device: str
    driver: str
    extra: dict[str, Any]


def experiments(db: ReadOnlyDB, keys: Sequence[str]) -> dict[str, ExperimentBrief]:
    """Key -> problem, config, device, driver and the result's extra data, for the keys given."""
    out: dict[str, ExperimentBrief] = {}
    for part, marks in in_chunks(sorted(set(keys))):
        for r in db.rows("SELECT e.key, e.problem, e.config, e.device, e.driver, r.extra FROM experiments e "
                         f"LEFT JOIN results r ON r.experiment_key = e.key WHERE e.key IN ({marks})", part):
            out[r["key"]] = ExperimentBrief(r["key"], loads(r["problem"]), loads(r["config"]), r["device"],
                                            r["driver"], loads(r["extra"]))
    return out




@dataclass(frozen=True)
class LlmSpend:
    calls: int
    failed: int
    input_tokens: int
    output_tokens: int
    cache_tokens: int  # read from and written to the prompt cache
    cost_usd: float  # over the calls with a known price
    unpriced: int  # answered calls whose model has no known price


def llm_spend(db: ReadOnlyDB) -> dict[int, LlmSpend]:
    """Campaign id -> what its calls to a language model used and cost."""
    return {r["campaign_id"]: LlmSpend(r["calls"], r["failed"] or 0, r["tin"] or 0, r["tout"] or 0, r["tcache"] or 0,
                                       r["cost"] or 0.0, r["unpriced"] or 0)
            for r in db.rows(
                "SELECT campaign_id, COUNT(*) AS calls, SUM(error != '') AS failed, SUM(input_tokens) AS tin, "
                "SUM(output_tokens) AS tout, SUM(COALESCE(cache_read_tokens, 0) + COALESCE(cache_creation_tokens, 0)) "
                "AS tcache, SUM(cost_usd) AS cost, SUM(cost_usd IS NULL AND input_tokens IS NOT NULL) AS unpriced "
                "FROM llm_calls GROUP BY campaign_id")}


# ---- experiments -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrialListRow:
    """One trial with its result, for the Experiments table."""

    campaign: str
    campaign_id: int
    seq: int
    experiment_key: str
    problem: dict[str, Any]
    config: dict[str, Any]
    status: str
    median_ms: float | None
    rel_spread: float | None
    max_rel_err: float | None
    compile_ms: float | None
    proposer: str
    rationale: str
    predicted_ms: float | None
    hypothesis_id: str | None
    reused: bool
    measured_at: float
    device: str
    backend: str
    message: str


_TRIAL_LIST = """
SELECT c.name AS campaign, t.campaign_id, t.seq, t.experiment_key, e.problem, e.config, r.status, r.median_ms,
       r.rel_spread, r.max_rel_err, r.compile_ms, t.proposer, t.rationale, t.predicted_ms, t.hypothesis_id,
       t.reused, r.measured_at, e.device, e.backend, r.message
FROM trials t JOIN results r ON r.experiment_key = t.experiment_key
JOIN experiments e ON e.key = t.experiment_key JOIN campaigns c ON c.id = t.campaign_id
"""


def trial_list(db: ReadOnlyDB, *, campaign_id: int | None = None, statuses: Sequence[str] = (),
               proposer: str | None = None, limit: int = 500, kernel: str | None = None,
               problem_key: str | None = None) -> list[TrialListRow]:
    """Trials newest first (by trial id: the order they were recorded), filtered.

    The newest rows are found by walking the trials backwards and stopping at `limit` (the `+`
    keeps SQLite from sorting a whole campaign's trials by id instead), except for failure
    statuses without `ok`: those are rare, and their index finds them faster."""
    where: list[str] = []
    params: list[Any] = []
    if campaign_id is not None:
        where.append("+t.campaign_id = ?")
        params.append(campaign_id)
    if statuses:
        column = "+r.status" if "ok" in statuses else "r.status"
        where.append(f"{column} IN ({_marks(statuses)})")
        params.extend(statuses)
    if proposer is not None:
        where.append("t.proposer = ?")
        params.append(proposer)
    if kernel is not None:
        where.append("e.kernel = ?")
        params.append(kernel)
    if problem_key is not None:
        where.append("t.problem_key = ?")
        params.append(problem_key)
    sql = _TRIAL_LIST + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY t.id DESC LIMIT ?"
    return [TrialListRow(**dict(r, problem=loads(r["problem"]), config=loads(r["config"]), reused=bool(r["reused"])))
            for r in db.rows(sql, [*params, limit])]


def proposers(db: ReadOnlyDB, campaign_id: int | None = None) -> list[str]:
    cond, params = (" WHERE campaign_id = ?", [campaign_id]) if campaign_id is not None else ("", [])
    return sorted(r["proposer"] for r in db.rows(f"SELECT DISTINCT proposer FROM trials{cond}", params)
                  if r["proposer"])


@dataclass(frozen=True)
class ExperimentDetail:
    """Everything stored about one experiment and its result."""

    key: str
    kernel: str
    kernel_version: str
    problem: dict[str, Any]
    config: dict[str, Any]
    backend: str
    device: str
    torch: str
    triton: str
    driver: str
    origin: str
    status: str | None  # None: imported, never measured here
    median_ms: float | None
    p20_ms: float | None
    p80_ms: float | None
    min_ms: float | None
    reps: int | None
    rel_spread: float | None
    l2_flushed: bool | None
    timing_method: str | None
    spread_target: float | None
    time_cap_ms: float | None
    stop_reason: str
    timed_ms: float | None
    max_rel_err: float | None
    compile_ms: float | None
    message: str
    sm_clock_mhz: float | None
    power_w: float | None
    temp_c: float | None
    extra: dict[str, Any]
    worker: str
    measured_at: float | None


@dataclass(frozen=True)
class HypothesisLink:
    """A hypothesis an experiment tested (its trial named it) or is evidence for."""

    id: str
    text: str
    state: str
    relation: str  # "tested" (its trial was proposed to test it), "supports" or "refutes" (as a pair)
    ratio: float | None  # median_ms(b) / median_ms(a) of the pair, for evidence
    side: str  # "a" or "b" of the pair; "" for "tested"


def experiment_detail(db: ReadOnlyDB, key: str) -> ExperimentDetail | None:
    rows = db.rows(
        "SELECT e.key, e.kernel, e.kernel_version, e.problem, e.config, e.backend, e.device, e.torch, e.triton, "
        "e.driver, e.origin, r.status, r.median_ms, r.p20_ms, r.p80_ms, r.min_ms, r.reps, r.rel_spread, "
        "r.l2_flushed, r.timing_method, r.spread_target, r.time_cap_ms, r.stop_reason, r.timed_ms, r.max_rel_err, "
        "r.compile_ms, r.message, r.sm_clock_mhz, r.power_w, r.temp_c, r.extra, r.worker, r.measured_at "
        "FROM experiments e LEFT JOIN results r ON r.experiment_key = e.key WHERE e.key = ?", [key])
    if not rows:
        return None
    r = rows[0]
    return ExperimentDetail(**dict(
        r, problem=loads(r["problem"]), config=loads(r["config"]), extra=loads(r["extra"]),
        l2_flushed=None if r["l2_flushed"] is None else bool(r["l2_flushed"]), stop_reason=r["stop_reason"] or "",
        message=r["message"] or "", worker=r["worker"] or "", origin=r["origin"] or ""))


def tested_hypotheses(db: ReadOnlyDB, key: str) -> list[HypothesisLink]:
    out = [HypothesisLink(r["id"], r["text"] or "", r["state"] or "not in the ledger", "tested", None, "")
           for r in db.rows("SELECT DISTINCT t.hypothesis_id AS id, h.text, h.state FROM trials t "
                            "LEFT JOIN hypotheses h ON h.id = t.hypothesis_id "
                            "WHERE t.experiment_key = ? AND t.hypothesis_id IS NOT NULL ORDER BY t.hypothesis_id",
                            [key])]
    for side, column in (("a", "experiment_a"), ("b", "experiment_b")):
        out.extend(HypothesisLink(r["id"], r["text"], r["state"], r["relation"], r["ratio"], side)
                   for r in db.rows(f"SELECT h.id, h.text, h.state, v.relation, v.ratio FROM evidence v "
                                    f"JOIN hypotheses h ON h.id = v.hypothesis_id WHERE v.{column} = ? ORDER BY h.id",
                                    [key]))
    return out


@dataclass(frozen=True)
class TrialOf:
    campaign: str
    seq: int
    proposer: str
    rationale: str
    predicted_ms: float | None
    reused: bool


def trials_of(db: ReadOnlyDB, key: str) -> list[TrialOf]:
    """The campaigns that tried this experiment, with why."""
    return [TrialOf(r["name"], r["seq"], r["proposer"], r["rationale"], r["predicted_ms"], bool(r["reused"]))
            for r in db.rows("SELECT c.name, t.seq, t.proposer, t.rationale, t.predicted_ms, t.reused FROM trials t "
                             "JOIN campaigns c ON c.id = t.campaign_id WHERE t.experiment_key = ? ORDER BY t.id",
                             [key])]


# ---- the queue -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class QueueEntry:
    id: int
    campaign_id: int
    problem: dict[str, Any]
    config: dict[str, Any]
    proposer: str
    rationale: str
    predicted_ms: float | None
    hypothesis_id: str | None
    priority: float
    reason: str
    state: str
    worker: str
    experiment_key: str
    pinned: bool
    enqueued_at: float
    started_at: float | None
    finished_at: float | None
    status: str | None = None  # the result's, once done
    median_ms: float | None = None


_QUEUE_COLUMNS = ("q.id, q.campaign_id, q.problem, q.config, q.proposer, q.rationale, q.predicted_ms, "
                  "q.hypothesis_id, q.priority, q.reason, q.state, q.worker, q.experiment_key, q.pinned, "
                  "q.enqueued_at, q.started_at, q.finished_at")


def _entry(r: dict[str, Any]) -> QueueEntry:
    return QueueEntry(r["id"], r["campaign_id"], loads(r["problem"]), loads(r["config"]), r["proposer"],
                      r["rationale"], r["predicted_ms"], r["hypothesis_id"], r["priority"], r["reason"], r["state"],
                      r["worker"], r["experiment_key"], bool(r["pinned"]), r["enqueued_at"], r["started_at"],
                      r["finished_at"], r.get("status"), r.get("median_ms"))


def _campaign_cond(campaign_id: int | None) -> tuple[str, list[Any]]:
    return ("q.campaign_id = ? AND ", [campaign_id]) if campaign_id is not None else ("", [])


def running(db: ReadOnlyDB, campaign_id: int | None = None) -> list[QueueEntry]:
    """Compiling or running now, oldest start first."""
    cond, params = _campaign_cond(campaign_id)
    return [_entry(r) for r in db.rows(
        f"SELECT {_QUEUE_COLUMNS} FROM queue q WHERE {cond}q.state IN ('compiling', 'running') "
        "ORDER BY q.started_at, q.id", params)]


def queued(db: ReadOnlyDB, campaign_id: int | None = None, limit: int = 25) -> list[QueueEntry]:
    """Queued, in the order they will run: pinned first, then by priority, then oldest."""
    cond, params = _campaign_cond(campaign_id)
    return [_entry(r) for r in db.rows(
        f"SELECT {_QUEUE_COLUMNS} FROM queue q WHERE {cond}q.state = 'queued' "
        "ORDER BY q.pinned DESC, q.priority DESC, q.id LIMIT ?", [*params, limit])]


def recently_done(db: ReadOnlyDB, campaign_id: int | None = None, limit: int = 25) -> list[QueueEntry]:
    """Done or dropped, latest first. Done rows are found from the newest trials (the driver records
    the trial as it marks the row done), walked backwards until `limit` are found: no sort over the
    whole queue (CROSS JOIN fixes that order: SQLite would otherwise start from the queue)."""
    cond, params = (" AND +t.campaign_id = ?", [campaign_id]) if campaign_id is not None else ("", [])
    done = db.rows(
        f"SELECT {_QUEUE_COLUMNS}, r.status, r.median_ms FROM trials t "
        "CROSS JOIN experiments e ON e.key = t.experiment_key "
        "CROSS JOIN queue q ON q.campaign_id = t.campaign_id AND q.problem_key = t.problem_key "
        "AND q.config_key = e.config_key "
        "LEFT JOIN results r ON r.experiment_key = t.experiment_key "
        f"WHERE q.state = 'done'{cond} ORDER BY t.id DESC LIMIT ?", [*params, limit])
    qcond, qparams = _campaign_cond(campaign_id)
    dropped = db.rows(f"SELECT {_QUEUE_COLUMNS} FROM queue q WHERE {qcond}q.state = 'dropped' "
                      "ORDER BY q.finished_at DESC, q.id DESC LIMIT ?", [*qparams, limit])
    rows = sorted((_entry(r) for r in (*done, *dropped)), key=lambda q: (-(q.finished_at or 0.0), -q.id))
    return rows[:limit]


def queue_totals(db: ReadOnlyDB, campaign_id: int | None = None) -> dict[str, int]:
    """State -> rows of the queue (of one campaign, or of all)."""
    cond, params = (" WHERE campaign_id = ?", [campaign_id]) if campaign_id is not None else ("", [])
    return {r["state"]: r["n"] for r in db.rows(f"SELECT state, COUNT(*) AS n FROM queue{cond} GROUP BY state",
                                                params)}


@dataclass(frozen=True)
class QueueEvent:
    id: int
    ts: float
    campaign_id: int | None
    kind: str
    message: str
    data: dict[str, Any]


def queue_events(db: ReadOnlyDB, campaign_id: int | None = None, limit: int = 50) -> list[QueueEvent]:
    """Re-orderings, drops and a person's queue controls, newest first."""
    kinds = list(QUEUE_EVENT_KINDS)
    cond, params = (" AND campaign_id = ?", [campaign_id]) if campaign_id is not None else ("", [])
    return [QueueEvent(r["id"], r["ts"], r["campaign_id"], r["kind"], r["message"], loads(r["data"]))
            for r in db.rows(f"SELECT id, ts, campaign_id, kind, message, data FROM events WHERE kind IN "
                             f"({_marks(kinds)}){cond} ORDER BY id DESC LIMIT ?", [*kinds, *params, limit])]


def event_kinds(db: ReadOnlyDB) -> list[str]:
    return sorted(r["kind"] for r in db.rows("SELECT DISTINCT kind FROM events"))


def running_now(db: ReadOnlyDB) -> dict[str, list[QueueEntry]]:
    """Worker name -> the queue rows it compiles or runs now ("" for rows that name no worker)."""
    out: dict[str, list[QueueEntry]] = {}
    for q in running(db):
        out.setdefault(q.worker, []).append(q)
    return out
