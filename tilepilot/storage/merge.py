"""Fold another machine's store into this one (`tilepilot merge OTHER.db`).

What a merge does, table by table:
- experiments: deduplicated by key (the key hashes kernel version, problem, config, device and
  toolchain, so equal keys are the same experiment); results: one per experiment, and an
  experiment measured in both stores keeps this store's result (the count is reported).
- campaigns: a campaign is recognised by what never changes after it is created (kernel,
  created_at, seed, backend, device, proposer, campaign file), not by its name, so one copied
  here before (even under another name) is the same campaign. A new campaign whose name is
  taken here by a different one is renamed `NAME@SOURCE` (SOURCE: the other file's stem; a
  number is added if that is taken too), and the report says so.
- trials, queue rows, winners, events, GPU samples, hypotheses, verdicts, evidence and
  learnings come along with their campaign ids mapped; a trial whose seq is taken in its
  campaign gets the next free one. A hypothesis id is "H-" + a hash of the campaign's name and
  the statement, so two different campaigns of the same name can have the same hypothesis id:
  the incoming one is then renamed `ID@UID8` (UID8: 8 hex digits identifying its campaign),
  and its learning, verdicts, evidence, trials and queue rows follow. Event data is carried
  as written (ids inside it refer to the source store).
- Rows that change while a campaign runs (its state and cost, queue rows, winners, hypotheses) are
  taken from the source when the source's copy of that campaign is newer (`updated_at`), or
  when a winner was decided later there; otherwise this store's rows stay as they are. A
  campaign's `control` request is never carried over to a campaign already here.
- devices: one row per (device, driver); the later measurement (`measured_at`) is kept.
- experiments carry their `origin` and `origin_data` (imported ones stay imported, with no result).
- Provenance: each merge that adds or changes anything writes a `merged_from` event (source
  path, time, rows added per table, renames), and each campaign copied here gets a
  `merged_from` event of its own.

A merge is one transaction: it applies completely or not at all. Merging the same file again
finds everything already here and writes nothing.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlite_utils

from tilepilot.experiments import InputError, canonical_json
from tilepilot.storage.rows import dumps
from tilepilot.storage.schema import SCHEMA_VERSION, TABLES, connect, schema_version
from tilepilot.storage.store import Store

log = logging.getLogger(__name__)

_IDENTITY = ("kernel", "created_at", "seed", "backend", "device", "proposer", "source")
_EXPLICIT = ("campaigns", "experiments", "results", "trials", "queue", "events", "gpu_samples", "winners",
             "hypotheses", "verdicts", "evidence", "learnings", "devices")
# A campaign's `control` (a person's pause/stop request to the driver running it) stays with the
# store whose driver it was written for: it is copied with a new campaign, never updated.
_MUTABLE_CAMPAIGN = ("state", "updated_at", "finished_at", "gpu_seconds", "llm_cost_usd", "estimate")
_MUTABLE_QUEUE = ("priority", "reason", "state", "worker", "experiment_key", "started_at", "finished_at", "pinned")
_MUTABLE_HYPOTHESIS = ("state", "pairs", "wins", "losses", "effect", "ci_low", "ci_high", "noise", "reason",
                       "updated_at", "decided_at")


@dataclass
class MergeReport:
    """What a merge did. `added` / `updated`: rows per table; `renamed`: source name -> name here."""

    source: str
    target: str
    added: Counter[str] = field(default_factory=Counter)
    updated: Counter[str] = field(default_factory=Counter)
    renamed: dict[str, str] = field(default_factory=dict)
    hypotheses_renamed: dict[str, str] = field(default_factory=dict)
    campaigns_known: list[str] = field(default_factory=list)  # names here of campaigns already present
    results_kept: int = 0  # experiments measured in both stores: this store's result kept

    @property
    def changed(self) -> bool:
        return bool(sum(self.added.values()) or sum(self.updated.values()))

    def summary(self) -> dict[str, Any]:
        return {"source": self.source, "added": dict(self.added), "updated": dict(self.updated),
                "renamed": self.renamed, "hypotheses_renamed": self.hypotheses_renamed,
                "results_kept": self.results_kept}


def merge_file(target: str | Path, source: str | Path) -> MergeReport:
    """Merge the store at `source` into the store at `target` (created if missing).

    Raises InputError, before anything is written, when `source` is missing, is not a tilepilot
    database, has a newer schema, or is the target itself; or when the target cannot be used.
    """
    source, target = Path(source), Path(target)
    src = open_source(source)
    try:
        if target.exists() and source.samefile(target):
            raise InputError(f"cannot merge {str(source)!r} into itself")
        with Store(target) as store:
            return merge(store, src, source_label=str(source.resolve()), stem=source.stem)
    finally:
        src.close()


def open_source(path: Path) -> sqlite_utils.Database:
    """A read-only connection to another tilepilot store of this schema version or older."""
    origin = str(path)
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise InputError(f"cannot merge {origin!r}: it {what}")
    try:
        db = connect(path, readonly=True)
    except sqlite3.Error as e:
        raise InputError(f"cannot open {origin!r}: {e}") from None
    try:
        found = schema_version(db)
        if found > SCHEMA_VERSION:
            raise InputError(f"{origin!r} has schema version {found}, newer than this tilepilot knows "
                             f"({SCHEMA_VERSION}): upgrade tilepilot here first")
        if found == 0 or "campaigns" not in db.table_names():
            raise InputError(f"{origin!r} is not a tilepilot database")
    except sqlite3.DatabaseError as e:
        db.close()
        raise InputError(f"{origin!r} is not a tilepilot database ({e})") from None
    except BaseException:
        db.close()
        raise
    return db


def merge(store: Store, src: sqlite_utils.Database, *, source_label: str, stem: str) -> MergeReport:
    """Fold `src` into `store` in one transaction; returns what was added and changed."""
    report = MergeReport(source=source_label, target=str(store.path))
    src.conn.execute("BEGIN")  # one read snapshot of the source, even while a campaign writes to it
    try:
        with store.transaction():
            _Merger(store.db, src, report, stem).run()
            if report.changed:
                _log(store.db, "merged_from", f"merged {source_label}: " + describe(report),
                     None, {**report.summary(), "merged_at": time.time()})
    finally:
        src.conn.execute("ROLLBACK")
    return report


def describe(report: MergeReport) -> str:
    """One line: rows added per table, renames."""
    if not report.changed:
        return "nothing new (everything in it is already here)"
    order = [*TABLES, *sorted((set(report.added) | set(report.updated)) - set(TABLES))]
    parts = [f"{n} {t}" for t in order if (n := report.added.get(t))]
    text = "added " + (", ".join(parts) if parts else "nothing")
    changed = [f"{n} {t}" for t in order if (n := report.updated.get(t))]
    if changed:
        text += "; updated from a newer copy: " + ", ".join(changed)
    if report.renamed:
        text += "; campaigns renamed: " + ", ".join(f"{a} -> {b}" for a, b in report.renamed.items())
    if report.hypotheses_renamed:
        text += f"; {len(report.hypotheses_renamed)} hypothesis id(s) renamed"
    return text


def campaign_uid(row: dict[str, Any]) -> str:
    """The identity of a campaign, the same in every store it is copied to (its name may differ)."""
    return hashlib.sha256(canonical_json({k: row[k] for k in _IDENTITY}).encode()).hexdigest()[:16]


def _log(db: sqlite_utils.Database, kind: str, message: str, campaign_id: int | None, data: dict[str, Any]) -> None:
    db.execute("INSERT INTO events (ts, campaign_id, kind, message, data) VALUES (?, ?, ?, ?, ?)",
               [time.time(), campaign_id, kind, message, dumps(data)])


class _Merger:
    """One merge: reads the source, writes the target (inside the caller's transaction)."""

    def __init__(self, dst: sqlite_utils.Database, src: sqlite_utils.Database, report: MergeReport,
                 stem: str) -> None:
        self.dst, self.src, self.report, self.stem = dst, src, report, stem
        self.src_tables = set(src.table_names())
        self.campaigns: dict[int, int] = {}  # source campaign id -> id here
        self.uids: dict[int, str] = {}  # source campaign id -> uid
        self.newer: set[int] = set()  # source campaign ids whose source copy is newer
        self.hyps: dict[str, str] = {}  # source hypothesis id -> id here
        self._cols: dict[str, list[str]] = {}

    def run(self) -> None:
        self.experiments()
        self.results()
        self.campaigns_()
        self.hypotheses()
        self.verdicts()
        self.evidence()
        self.learnings()
        self.trials()
        self.queue()
        self.winners()
        self.events()
        self.gpu_samples()
        self.devices()
        for table in self.dst.table_names():
            if table not in _EXPLICIT and not table.startswith("sqlite_") and table in self.src_tables:
                self.generic(table)

    # -- helpers ------------------------------------------------------------------------------
    def _src(self, table: str, order: str = "rowid") -> list[dict[str, Any]]:
        if table not in self.src_tables:
            return []
        return list(self.src.query(f"SELECT * FROM {table} ORDER BY {order}"))

    def _dst(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        return list(self.dst.query(sql, list(params)))

    def _columns(self, table: str, row: dict[str, Any]) -> list[str]:
        """The target's columns of `table` that the source row has (an older source has fewer)."""
        if table not in self._cols:
            skip = {"id"} if self._auto_id(table) else set()  # an autoincrement id is given here, not copied
            self._cols[table] = [c for c in self.dst[table].columns_dict if c not in skip]
        return [c for c in self._cols[table] if c in row]

    def _auto_id(self, table: str) -> bool:
        return self.dst[table].pks == ["id"] and self.dst[table].columns_dict.get("id") is int

    def _insert(self, table: str, row: dict[str, Any], **override: Any) -> int | None:
        record = {c: row[c] for c in self._columns(table, row)}
        record.update(override)
        cols = ", ".join(record)
        cur = self.dst.execute(f"INSERT INTO {table} ({cols}) VALUES ({', '.join('?' * len(record))})",
                               list(record.values()))
        self.report.added[table] += 1
        return cur.lastrowid

    def _update(self, table: str, where: dict[str, Any], values: dict[str, Any], current: dict[str, Any]) -> None:
        changed = {k: v for k, v in values.items() if current.get(k) != v}
        if not changed:
            return
        sets = ", ".join(f"{k} = ?" for k in changed)
        cond = " AND ".join(f"{k} = ?" for k in where)
        self.dst.execute(f"UPDATE {table} SET {sets} WHERE {cond}", [*changed.values(), *where.values()])
        self.report.updated[table] += 1

    def _hyp(self, hid: str | None) -> str | None:
        return self.hyps.get(hid, hid) if hid else hid

    # -- experiments and results ----------------------------------------------------------------
    def experiments(self) -> None:
        here = {r["key"] for r in self._dst("SELECT key FROM experiments")}
        for r in self._src("experiments"):
            if r["key"] not in here:
                self._insert("experiments", r)

    def results(self) -> None:
        here = {r["experiment_key"] for r in self._dst("SELECT experiment_key FROM results")}
        for r in self._src("results"):
            if r["experiment_key"] in here:
                self.report.results_kept += 1
            else:
                self._insert("results", r)

    # -- campaigns ------------------------------------------------------------------------------
    def campaigns_(self) -> None:
        rows = self._dst("SELECT * FROM campaigns")
        by_uid = {campaign_uid(r): r for r in rows}
        names = {r["name"] for r in rows}
        for s in self._src("campaigns", "id"):
            uid = campaign_uid(s)
            self.uids[s["id"]] = uid
            known = by_uid.get(uid)
            if known is not None:
                self.campaigns[s["id"]] = known["id"]
                self.report.campaigns_known.append(known["name"])
                if s["updated_at"] > known["updated_at"]:
                    self.newer.add(s["id"])
                    self._update("campaigns", {"id": known["id"]}, {c: s[c] for c in _MUTABLE_CAMPAIGN}, known)
                continue
            name = s["name"] if s["name"] not in names else self._free_name(s["name"], names)
            new_id = self._insert("campaigns", s, name=name)
            assert new_id is not None
            names.add(name)
            self.campaigns[s["id"]] = new_id
            self.newer.add(s["id"])
            if name != s["name"]:
                self.report.renamed[s["name"]] = name
            there = f" (named {s['name']!r} there)" if name != s["name"] else ""
            _log(self.dst, "merged_from", f"campaign {name} copied from {self.report.source}{there}", new_id,
                 {"source": self.report.source, "source_campaign": s["name"], "source_id": s["id"]})

    def _free_name(self, name: str, taken: set[str]) -> str:
        candidate, n = f"{name}@{self.stem}", 1
        while candidate in taken:
            n += 1
            candidate = f"{name}@{self.stem}-{n}"
        return candidate

    # -- the hypothesis ledger ----------------------------------------------------------------
    def hypotheses(self) -> None:
        here = {r["id"]: r for r in self._dst("SELECT * FROM hypotheses")}
        # Within a campaign a statement has one hypothesis, whatever id another store gave it.
        same = {(r["campaign_id"], r["statement_key"]): r["id"] for r in here.values()}
        for h in self._src("hypotheses", "created_at, id"):
            cid = self.campaigns[h["campaign_id"]]
            hid = same.get((cid, h["statement_key"]), h["id"])
            if hid in here and here[hid]["campaign_id"] != cid:
                hid = f"{h['id'].partition('@')[0]}@{self.uids[h['campaign_id']][:8]}"
            self.hyps[h["id"]] = hid
            local = here.get(hid)
            if local is None:
                self._insert("hypotheses", h, id=hid, campaign_id=cid)
                if hid != h["id"]:
                    self.report.hypotheses_renamed[h["id"]] = hid
                here[hid] = {**h, "id": hid, "campaign_id": cid}
                same[(cid, h["statement_key"])] = hid
            elif local["campaign_id"] != cid:
                raise RuntimeError(f"hypothesis id {hid} is taken here by campaign {local['campaign_id']}")
            elif h["updated_at"] > local["updated_at"]:
                self._update("hypotheses", {"id": hid}, {c: h[c] for c in _MUTABLE_HYPOTHESIS}, local)

    def verdicts(self) -> None:
        cols = ("hypothesis_id", "state", "pairs", "wins", "losses", "reason", "decided_at")
        here = {tuple(r[c] for c in cols) for r in self._dst("SELECT * FROM verdicts")}
        for v in self._src("verdicts", "id"):
            v = {**v, "hypothesis_id": self._hyp(v["hypothesis_id"])}
            if tuple(v[c] for c in cols) not in here:
                self._insert("verdicts", v)
                here.add(tuple(v[c] for c in cols))

    def evidence(self) -> None:
        here = {(r["hypothesis_id"], r["experiment_a"], r["experiment_b"])
                for r in self._dst("SELECT hypothesis_id, experiment_a, experiment_b FROM evidence")}
        for e in self._src("evidence"):
            e = {**e, "hypothesis_id": self._hyp(e["hypothesis_id"])}
            if (e["hypothesis_id"], e["experiment_a"], e["experiment_b"]) not in here:
                self._insert("evidence", e)
                here.add((e["hypothesis_id"], e["experiment_a"], e["experiment_b"]))

    def learnings(self) -> None:
        here = {r["hypothesis_id"] for r in self._dst("SELECT hypothesis_id FROM learnings")}
        for lrn in self._src("learnings"):
            hid = self._hyp(lrn["hypothesis_id"])
            if hid in here:
                continue
            lid = lrn["id"] if hid == lrn["hypothesis_id"] else "L-" + str(hid).removeprefix("H-")
            self._insert("learnings", lrn, id=lid, hypothesis_id=hid)
            here.add(hid)

    # -- trials, queue, winners -----------------------------------------------------------------
    def trials(self) -> None:
        rows = self._dst("SELECT campaign_id, problem_key, experiment_key, seq FROM trials")
        done = {(r["campaign_id"], r["experiment_key"]) for r in rows}
        seqs = {(r["campaign_id"], r["problem_key"], r["seq"]) for r in rows}
        top: Counter[tuple[int, str]] = Counter()
        for r in rows:
            top[(r["campaign_id"], r["problem_key"])] = max(top[(r["campaign_id"], r["problem_key"])], r["seq"])
        for t in self._src("trials", "id"):
            cid = self.campaigns[t["campaign_id"]]
            if (cid, t["experiment_key"]) in done:
                continue
            group = (cid, t["problem_key"])
            seq = t["seq"] if (cid, t["problem_key"], t["seq"]) not in seqs else top[group] + 1
            self._insert("trials", t, campaign_id=cid, seq=seq, hypothesis_id=self._hyp(t["hypothesis_id"]))
            done.add((cid, t["experiment_key"]))
            seqs.add((cid, t["problem_key"], seq))
            top[group] = max(top[group], seq)

    def queue(self) -> None:
        here = {(r["campaign_id"], r["problem_key"], r["config_key"]): r for r in self._dst("SELECT * FROM queue")}
        for q in self._src("queue", "id"):
            cid = self.campaigns[q["campaign_id"]]
            local = here.get((cid, q["problem_key"], q["config_key"]))
            if local is None:
                self._insert("queue", q, campaign_id=cid, hypothesis_id=self._hyp(q["hypothesis_id"]))
            elif q["campaign_id"] in self.newer:
                self._update("queue", {"id": local["id"]}, {c: q[c] for c in _MUTABLE_QUEUE}, local)

    def winners(self) -> None:
        here = {(r["campaign_id"], r["problem_key"]): r for r in self._dst("SELECT * FROM winners")}
        for w in self._src("winners"):
            cid = self.campaigns[w["campaign_id"]]
            local = here.get((cid, w["problem_key"]))
            if local is None:
                self._insert("winners", w, campaign_id=cid)
            elif w["decided_at"] > local["decided_at"]:
                values = {c: w[c] for c in self._columns("winners", w) if c not in ("campaign_id", "problem_key")}
                self._update("winners", {"campaign_id": cid, "problem_key": w["problem_key"]}, values, local)

    # -- events and GPU samples -----------------------------------------------------------------
    def events(self) -> None:
        def sig(r: dict[str, Any]) -> tuple[Any, ...]:
            return (r["ts"], r["campaign_id"], r["kind"], r["message"], r["data"])

        here = {sig(r) for r in self._dst("SELECT ts, campaign_id, kind, message, data FROM events")}
        for e in self._src("events", "id"):
            cid = None if e["campaign_id"] is None else self.campaigns[e["campaign_id"]]
            e = {**e, "campaign_id": cid}
            if sig(e) not in here:
                self._insert("events", e)
                here.add(sig(e))

    def gpu_samples(self) -> None:
        here = {(r["ts"], r["node"], r["gpu_uuid"]) for r in self._dst("SELECT ts, node, gpu_uuid FROM gpu_samples")}
        for g in self._src("gpu_samples", "id"):
            if (g["ts"], g["node"], g["gpu_uuid"]) not in here:
                self._insert("gpu_samples", g)
                here.add((g["ts"], g["node"], g["gpu_uuid"]))

    # -- device ceilings -----------------------------------------------------------------------
    def devices(self) -> None:
        """One row per (device, driver): a row new here is copied, a later measurement replaces ours."""
        here = {(r["device"], r["driver"]): r for r in self._dst("SELECT * FROM devices")}
        for d in self._src("devices"):
            local = here.get((d["device"], d["driver"]))
            if local is None:
                self._insert("devices", d)
            elif d["measured_at"] > local["measured_at"]:
                values = {c: d[c] for c in self._columns("devices", d) if c not in ("device", "driver")}
                self._update("devices", {"device": d["device"], "driver": d["driver"]}, values, local)

    # -- any other table (added by a later schema step) ---------------------------------------
    def generic(self, table: str) -> None:
        """Rows are copied with campaign and hypothesis ids mapped; a row is already here when its
        primary key (or, for an autoincrement id, every other column) matches one here."""
        sig_cols = self._columns(table, self.dst[table].columns_dict) if self._auto_id(table) else self.dst[table].pks
        here = {tuple(r[c] for c in sig_cols) for r in self._dst(f"SELECT * FROM {table}")}
        for r in self._src(table):
            r = dict(r)
            if r.get("campaign_id") is not None:
                r["campaign_id"] = self.campaigns[r["campaign_id"]]
            if r.get("hypothesis_id"):
                r["hypothesis_id"] = self._hyp(r["hypothesis_id"])
            sig = tuple(r.get(c) for c in sig_cols)
            if sig not in here:
                self._insert(table, r)
                here.add(sig)


def table_counts(db: sqlite_utils.Database, tables: Iterable[str] = TABLES) -> dict[str, int]:
    """Rows per table (for reports and tests)."""
    return {t: int(db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in tables if t in db.table_names()}
