"""Read-only queries for the command line and the dashboard.

Open a handle with `open_db(path)`; every function takes it first. Filters are checked here
(a bad one raises InputError naming the allowed values) and always bound as parameters.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import sqlite_utils

from tilepilot.experiments import DeviceCeilings, InputError, Status, canonical_json
from tilepilot.storage.filters import Filters, conditions, parse_filters
from tilepilot.storage.roofline import roofline_pcts
from tilepilot.storage.rows import ceilings_from_row, loads, queue_from_row
from tilepilot.storage.schema import open_database
from tilepilot.storage.views import (
    BestRow,
    CampaignSummary,
    ConvergencePoint,
    EventRow,
    GpuSampleRow,
    HistoryRow,
    ProblemProgress,
    QueueDone,
    QueueView,
)

_NOT_COUNTED = tuple(s.value for s in Status if not s.counts_against_budget)


class ReadOnlyDB:
    """A read-only handle on a tilepilot database (a `mode=ro` connection), safe to share
    between threads (e.g. in Streamlit's `cache_resource`): queries are serialised."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.db: sqlite_utils.Database = open_database(path, readonly=True)
        self._lock = threading.Lock()

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.db.query(sql, list(params)))

    def close(self) -> None:
        with self._lock:
            self.db.close()

    def __enter__(self) -> ReadOnlyDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_db(path: str | Path) -> ReadOnlyDB:
    """Raises InputError when there is no tilepilot database at `path` (never creates one)."""
    return ReadOnlyDB(Path(path))


# -- history -----------------------------------------------------------------------------------

_HISTORY = """
SELECT c.name AS campaign, c.id AS campaign_id, t.id AS trial_id, t.seq, e.key AS experiment_key,
       e.kernel, e.problem, e.problem_key, e.config, e.config_key, r.status, r.median_ms,
       r.rel_spread, r.max_rel_err, r.compile_ms, t.proposer, t.rationale, t.predicted_ms,
       t.hypothesis_id, COALESCE(t.reused, 0) AS reused, r.measured_at, e.device, e.backend,
       r.message
FROM experiments e JOIN results r ON r.experiment_key = e.key
LEFT JOIN trials t ON t.experiment_key = e.key
LEFT JOIN campaigns c ON c.id = t.campaign_id
"""


def history(db: ReadOnlyDB, *, campaign: str | int | None = None, kernel: str | None = None,
            problem: Mapping[str, Any] | Sequence[str] | str | None = None,
            status: str | Sequence[str] | None = None, proposer: str | None = None,
            limit: int | None = None, device: str | None = None, backend: str | None = None,
            torch: str | None = None, triton: str | None = None, since: str | float | None = None,
            until: str | float | None = None) -> list[HistoryRow]:
    """Trials with their results, newest first (experiments measured here; `storage.imports.imported`
    gives the imported ones).

    `campaign` is a name or an id; `problem` a dict whose items must all match (values of the
    problem's own types), filter texts such as "M<=64,K>=4096", or a problem key (canonical JSON);
    `status` one status or several; `device` a case-insensitive part of the device name; `torch`
    and `triton` a version or its prefix; `since` / `until` epoch seconds or text (see
    `filters.when`). Raises InputError naming a bad filter and what is allowed.
    """
    f = history_filters(db, campaign=campaign, kernel=kernel, problem=problem, status=status, proposer=proposer,
                        device=device, backend=backend, torch=torch, triton=triton, since=since, until=until)
    lim = _limit(limit)
    if not f.wants_measured:
        return []
    where, params = conditions(f)
    sql = _HISTORY + (" WHERE " + " AND ".join(where) if where else "")
    sql += " ORDER BY COALESCE(t.created_at, r.measured_at) DESC, t.id DESC LIMIT ?"
    rows = db.rows(sql, [*params, lim])
    return [_history_row(r) for r in rows]


def history_filters(db: ReadOnlyDB, *, campaign: str | int | None = None, **given: Any) -> Filters:
    """`Filters` from the keyword arguments of `history` (the campaign resolved by name or id)."""
    cid = _campaign_id(db, campaign) if campaign is not None else None
    f = parse_filters(campaign_id=cid, **given)
    _check_fields(db, f)
    return f


# One stored problem of each (kernel, problem key), through the index on them, and its field names.
_FIELDS = """
SELECT DISTINCT j.key AS name
FROM (SELECT problem FROM experiments {where} GROUP BY kernel, problem_key) p, json_each(p.problem) j
"""


def problem_fields(db: ReadOnlyDB, kernel: str | None = None) -> list[str]:
    """The field names of the stored problems (of `kernel`, else of every kernel), sorted."""
    where, params = ("WHERE kernel = ?", [kernel]) if kernel else ("", [])
    return sorted({str(r["name"]) for r in db.rows(_FIELDS.format(where=where), params)})


def _check_fields(db: ReadOnlyDB, f: Filters) -> None:
    """Raises InputError when a problem bound names a field no stored problem (of the kernel asked
    for) has: "Q>=5" or "m<=64" would otherwise match nothing without a word. A store without
    problems (of that kernel) has nothing to name, and is let through."""
    names = sorted({b.param for b in f.scope.bounds})
    if not names:
        return
    fields = problem_fields(db, f.kernel)
    unknown = [n for n in names if n not in fields]
    if fields and unknown:
        of = f" of kernel {f.kernel!r}" if f.kernel else ""
        raise InputError(f"--problem: no problem{of} in the store has a field {unknown[0]!r} "
                         f"(its problems' fields: {', '.join(fields)})")


def _history_row(r: dict[str, Any]) -> HistoryRow:
    r = dict(r, problem=loads(r["problem"]), config=loads(r["config"]), status=Status(r["status"]),
             reused=bool(r["reused"]))
    return HistoryRow(**r)


def campaign_id_of(db: ReadOnlyDB, campaign: str | int) -> int:
    """The id of a campaign given by name or id; raises InputError naming the known ones."""
    return _campaign_id(db, campaign)


def _campaign_id(db: ReadOnlyDB, campaign: str | int) -> int:
    column = "id" if isinstance(campaign, int) else "name"
    found = db.rows(f"SELECT id FROM campaigns WHERE {column} = ?", [campaign])
    if found:
        return int(found[0]["id"])
    names = [r["name"] for r in db.rows("SELECT name FROM campaigns ORDER BY id")]
    raise InputError(f"no campaign {campaign!r} (known: {', '.join(names) or 'none'})")


def _limit(limit: int | None) -> int:
    if limit is None:
        return -1
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit < 2**63:
        raise InputError(f"limit={limit!r} is not a positive integer (below 2**63)")
    return limit


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("?" * len(values))


# -- best ----------------------------------------------------------------------------------------

_TRIALS = """
SELECT t.id AS trial_id, t.campaign_id, c.name AS campaign, c.kernel, t.problem_key, t.seq,
       t.proposer, t.reused, t.experiment_key, e.problem, e.config, e.device, e.backend, r.status,
       r.median_ms, r.rel_spread
FROM trials t JOIN campaigns c ON c.id = t.campaign_id
JOIN experiments e ON e.key = t.experiment_key
JOIN results r ON r.experiment_key = t.experiment_key
"""


def best(db: ReadOnlyDB, *, campaign: str | int | None = None, kernel: str | None = None,
         problem: Mapping[str, Any] | Sequence[str] | str | None = None, device: str | None = None,
         backend: str | None = None, torch: str | None = None, triton: str | None = None,
         proposer: str | None = None, since: str | float | None = None,
         until: str | float | None = None) -> list[BestRow]:
    """Per campaign and problem with an ok result: the declared winner, else the fastest.

    The filters are those of `history` (without status); a trial left out by them is not a
    candidate, and a declared winner left out gives way to the fastest trial kept.
    """
    f = history_filters(db, campaign=campaign, kernel=kernel, problem=problem, device=device, backend=backend,
                        torch=torch, triton=triton, proposer=proposer, since=since, until=until)
    where, params = conditions(f)
    cond = " WHERE " + " AND ".join(where) if where else ""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in db.rows(_TRIALS + cond + " ORDER BY t.id", params):
        groups.setdefault((r["campaign_id"], r["problem_key"]), []).append(r)
    winners = {(w["campaign_id"], w["problem_key"]): w for w in db.rows("SELECT * FROM winners")}
    out = []
    for gkey, trials in groups.items():
        row = _best_of(trials, winners.get(gkey))
        if row is not None:
            out.append(row)
    pcts = roofline_pcts(db.rows, [(b.experiment_key, b.median_ms) for b in out], ceilings(db))
    return [dataclasses.replace(b, roofline_pct=pcts.get(b.experiment_key)) for b in out]


def _best_of(trials: list[dict[str, Any]], winner: dict[str, Any] | None) -> BestRow | None:
    ok = [t for t in trials if t["status"] == Status.OK.value]
    by_key = {t["experiment_key"]: t for t in trials}
    if winner is not None and winner["experiment_key"] in by_key:
        pick, median_ms = by_key[winner["experiment_key"]], winner["median_ms"]
    elif ok:
        pick = min(ok, key=lambda t: t["median_ms"])
        median_ms, winner = pick["median_ms"], None
    else:
        return None
    w = winner or {}
    median_cfg = w.get("median_config_ms")
    if median_cfg is None and ok:
        median_cfg = statistics.median(t["median_ms"] for t in ok)
    baseline_ms = w.get("baseline_ms")
    return BestRow(
        campaign=pick["campaign"], campaign_id=pick["campaign_id"], kernel=pick["kernel"],
        problem=loads(pick["problem"]), problem_key=pick["problem_key"],
        experiment_key=pick["experiment_key"], config=loads(pick["config"]), median_ms=median_ms,
        rel_spread=w.get("rel_spread", pick["rel_spread"]), proposer=pick["proposer"],
        decided=winner is not None, tie=bool(w.get("tie", 0)), margin=w.get("margin"),
        runner_up_ms=w.get("runner_up_ms"),
        recheck_passed=None if w.get("recheck_passed") is None else bool(w["recheck_passed"]),
        median_config_ms=median_cfg, speedup_vs_median=_ratio(median_cfg, median_ms),
        baseline_name=w.get("baseline_name", ""), baseline_ms=baseline_ms,
        speedup_vs_baseline=_ratio(baseline_ms, median_ms), ok=len(ok), trials=len(trials),
        device=pick["device"], backend=pick["backend"])


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


# -- campaigns and convergence -------------------------------------------------------------------

_PROGRESS = f"""
SELECT t.campaign_id, t.problem_key, MIN(e.problem) AS problem, COUNT(*) AS trials,
       SUM(r.status NOT IN ({_marks(_NOT_COUNTED)}) AND t.reused = 0) AS counted, SUM(r.status = 'ok') AS ok,
       SUM(r.status != 'ok') AS failed, SUM(t.reused) AS reused,
       MIN(CASE WHEN r.status = 'ok' THEN r.median_ms END) AS best_ms, MIN(t.id) AS first
FROM trials t JOIN results r ON r.experiment_key = t.experiment_key
JOIN experiments e ON e.key = t.experiment_key
GROUP BY t.campaign_id, t.problem_key ORDER BY first
"""


def campaigns(db: ReadOnlyDB) -> list[CampaignSummary]:
    """Every campaign, newest first, with its progress per problem and its queue."""
    progress: dict[int, dict[str, ProblemProgress]] = {}
    for r in db.rows(_PROGRESS, _NOT_COUNTED):
        progress.setdefault(r["campaign_id"], {})[r["problem_key"]] = ProblemProgress(
            loads(r["problem"]), r["problem_key"], r["trials"], r["counted"], r["ok"], r["failed"],
            r["reused"], r["best_ms"])
    queue: dict[tuple[int, str], int] = {
        (r["campaign_id"], r["state"]): r["n"]
        for r in db.rows("SELECT campaign_id, state, COUNT(*) AS n FROM queue GROUP BY campaign_id, state")}
    return [_summary(c, progress.get(c["id"], {}), queue)
            for c in db.rows("SELECT * FROM campaigns ORDER BY id DESC")]


def _summary(c: dict[str, Any], done: dict[str, ProblemProgress],
             queue: dict[tuple[int, str], int]) -> CampaignSummary:
    problems: list[ProblemProgress] = []
    for p in loads(c["problems"]) or []:
        key = canonical_json(p)
        problems.append(done.pop(key, ProblemProgress(p, key, 0, 0, 0, 0, 0, None)))
    problems.extend(done.values())  # problems not listed in the campaign (replay datasets)
    cid = c["id"]
    return CampaignSummary(
        id=cid, name=c["name"], kernel=c["kernel"], proposer=c["proposer"], backend=c["backend"],
        device=c["device"], dataset=c["dataset"], state=c["state"], budget=c["budget"],
        description=c["description"], problems=tuple(problems),
        trials=sum(p.trials for p in problems), ok=sum(p.ok for p in problems),
        failed=sum(p.failed for p in problems), queued=queue.get((cid, "queued"), 0),
        running=queue.get((cid, "compiling"), 0) + queue.get((cid, "running"), 0),
        created_at=c["created_at"], updated_at=c["updated_at"], finished_at=c["finished_at"])


def convergence(db: ReadOnlyDB, campaign_id: int) -> list[ConvergencePoint]:
    """Every trial of the campaign, per problem in seq order, with the best time so far."""
    rows = db.rows(_TRIALS + " WHERE t.campaign_id = ? ORDER BY t.problem_key, t.seq", [campaign_id])
    out: list[ConvergencePoint] = []
    best_ms: float | None = None
    for i, r in enumerate(rows):
        if i == 0 or rows[i - 1]["problem_key"] != r["problem_key"]:
            best_ms = None
        median = r["median_ms"] if r["status"] == Status.OK.value else None
        improved = median is not None and (best_ms is None or median < best_ms)
        if improved:
            best_ms = median
        out.append(ConvergencePoint(
            r["problem_key"], loads(r["problem"]), r["seq"], r["experiment_key"], loads(r["config"]),
            r["proposer"], Status(r["status"]), median, best_ms, improved))
    return out


# -- queue, events, GPUs ---------------------------------------------------------------------------

def queue_view(db: ReadOnlyDB, campaign_id: int | None = None, *, next_limit: int = 20,
               done_limit: int = 20) -> QueueView:
    """What runs now, what runs next (in order) and what finished last, for one or all campaigns."""
    cond, params = ("q.campaign_id = ? AND ", [campaign_id]) if campaign_id is not None else ("", [])
    running = db.rows(f"SELECT q.* FROM queue q WHERE {cond}q.state IN ('compiling', 'running') "
                      "ORDER BY q.started_at, q.id", params)
    nxt = db.rows(f"SELECT q.* FROM queue q WHERE {cond}q.state = 'queued' "
                  "ORDER BY q.priority DESC, q.id LIMIT ?", [*params, _limit(next_limit)])
    done = db.rows("SELECT q.*, r.status AS result_status, r.median_ms AS result_ms FROM queue q "
                   "LEFT JOIN results r ON r.experiment_key = q.experiment_key "
                   f"WHERE {cond}q.state IN ('done', 'dropped') "
                   "ORDER BY q.finished_at DESC, q.id DESC LIMIT ?", [*params, _limit(done_limit)])
    counts = {r["state"]: r["n"] for r in db.rows(
        f"SELECT q.state, COUNT(*) AS n FROM queue q WHERE {cond}1 GROUP BY q.state", params)}
    return QueueView(
        running=tuple(queue_from_row(r) for r in running),
        next=tuple(queue_from_row(r) for r in nxt),
        done=tuple(QueueDone(queue_from_row(r),
                             Status(r["result_status"]) if r["result_status"] else None, r["result_ms"])
                   for r in done),
        queued_total=counts.get("queued", 0),
        done_total=counts.get("done", 0) + counts.get("dropped", 0))


def ceilings(db: ReadOnlyDB, device: str | None = None) -> list[DeviceCeilings]:
    """The usable device ceilings (both rates positive), newest first; those of one device if given."""
    where, params = "copy_gbps > 0 AND matmul_tflops > 0", []
    if device is not None:
        where, params = where + " AND device = ?", [device]
    return [ceilings_from_row(r)
            for r in db.rows(f"SELECT * FROM devices WHERE {where} ORDER BY measured_at DESC", params)]


def events(db: ReadOnlyDB, *, campaign_id: int | None = None, kinds: Sequence[str] | None = None,
           limit: int = 200) -> list[EventRow]:
    """Events, newest first."""
    where: list[str] = []
    params: list[Any] = []
    if campaign_id is not None:
        where.append("campaign_id = ?")
        params.append(campaign_id)
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        where.append(f"kind IN ({_marks(kinds)})")
        params.extend(kinds)
    cond = " WHERE " + " AND ".join(where) if where else ""
    rows = db.rows(f"SELECT * FROM events{cond} ORDER BY id DESC LIMIT ?", [*params, _limit(limit)])
    return [EventRow(r["id"], r["ts"], r["campaign_id"], r["kind"], r["message"], loads(r["data"]))
            for r in rows]


def latest_gpu_samples(db: ReadOnlyDB, *, window_s: float = 300,
                       now: float | None = None) -> dict[str, list[GpuSampleRow]]:
    """Samples of the last `window_s` seconds, per GPU uuid (by node and index), oldest first."""
    since = (time.time() if now is None else now) - window_s
    out: dict[str, list[GpuSampleRow]] = {}
    for r in db.rows("SELECT * FROM gpu_samples WHERE ts >= ? ORDER BY node, gpu_index, gpu_uuid, ts",
                     [since]):
        out.setdefault(r["gpu_uuid"], []).append(GpuSampleRow(**r))
    return out


def last_gpu_sample_ts(db: ReadOnlyDB) -> float | None:
    """When the store last saw a GPU (its newest NVML sample), or None when it holds none."""
    return db.rows("SELECT MAX(ts) AS ts FROM gpu_samples")[0]["ts"]
