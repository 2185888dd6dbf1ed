"""One experiment with everything the store holds about it (`tilepilot show KEY`).

`experiment_detail(db, key)` gathers: the experiment (kernel, version, problem, config, device,
toolchain, origin), its result (status, every timing field, spread, error, telemetry, extra),
the campaigns that tried it (trial, proposer, rationale, prediction, hypothesis), its queue
entries (priority and the reason for it), the winners it is or is runner-up of, the hypothesis
evidence it takes part in (with the hypothesis' statement and state), the learnings drawn from
those hypotheses, and the events that name it. Text in it (rationales, messages, statements) is
data, shown as text.
"""

from __future__ import annotations

import re
from typing import Any

from tilepilot.experiments import InputError
from tilepilot.storage.queries import ReadOnlyDB
from tilepilot.storage.rows import loads

_HEX = re.compile(r"^[0-9a-f]{4,64}$")


def find_experiment(db: ReadOnlyDB, text: str) -> str:
    """The full key of the one experiment whose key starts with `text` (at least 4 hex digits)."""
    prefix = text.strip().lower()
    if not _HEX.match(prefix):
        raise InputError(f"experiment {text!r} is not a key or key prefix (4 or more of 0-9a-f, as shown by "
                         "tilepilot history --json)")
    found = [r["key"] for r in db.rows("SELECT key FROM experiments WHERE substr(key, 1, ?) = ? ORDER BY key LIMIT 6",
                                       [len(prefix), prefix])]
    if len(found) == 1:
        return found[0]
    if not found:
        raise InputError(f"no experiment whose key starts with {prefix!r}")
    more = "..." if len(found) > 5 else ""
    raise InputError(f"{prefix!r} starts {len(found)}{'+' if more else ''} experiment keys "
                     f"({', '.join(found[:5])}{more}): give more of it")


def experiment_detail(db: ReadOnlyDB, key: str) -> dict[str, Any]:
    """Everything stored about experiment `key` (a key or unique prefix). Raises InputError."""
    key = find_experiment(db, key)
    e = db.rows("SELECT * FROM experiments WHERE key = ?", [key])[0]
    experiment = {**e, "problem": loads(e["problem"]), "config": loads(e["config"]),
                  "origin_data": loads(e.get("origin_data"))}
    found = db.rows("SELECT * FROM results WHERE experiment_key = ?", [key])
    result = {**found[0], "extra": loads(found[0]["extra"])} if found else None
    trials = db.rows("SELECT c.name AS campaign, t.* FROM trials t JOIN campaigns c ON c.id = t.campaign_id "
                     "WHERE t.experiment_key = ? ORDER BY t.id", [key])
    queue = db.rows("SELECT c.name AS campaign, q.id, q.state, q.priority, q.reason, q.proposer, q.worker, "
                    "q.enqueued_at, q.started_at, q.finished_at FROM queue q JOIN campaigns c ON c.id = q.campaign_id "
                    "WHERE q.experiment_key = ? ORDER BY q.id", [key])
    winner_of = [{**w, "role": "winner" if w["experiment_key"] == key else "runner-up"} for w in db.rows(
        "SELECT c.name AS campaign, w.* FROM winners w JOIN campaigns c ON c.id = w.campaign_id "
        "WHERE w.experiment_key = ? OR w.runner_up_key = ? ORDER BY w.decided_at", [key, key])]
    evidence = [{**v, "other": v["experiment_b"] if v["experiment_a"] == key else v["experiment_a"]}
                for v in db.rows(
        "SELECT v.*, h.text AS statement, h.state AS hypothesis_state FROM evidence v "
        "JOIN hypotheses h ON h.id = v.hypothesis_id WHERE v.experiment_a = ? OR v.experiment_b = ? "
        "ORDER BY v.hypothesis_id", [key, key])]
    tested = sorted({t["hypothesis_id"] for t in trials if t["hypothesis_id"]})
    hyp_ids = sorted({*tested, *(v["hypothesis_id"] for v in evidence)})
    hypotheses = _in(db, "SELECT id, state, text, reason, effect, pairs FROM hypotheses WHERE id IN ({})", hyp_ids)
    learnings = _in(db, "SELECT id, hypothesis_id, text, effect, pairs, scope FROM learnings "
                    "WHERE hypothesis_id IN ({})", hyp_ids)
    events = [{**ev, "data": loads(ev["data"])} for ev in db.rows(
        "SELECT * FROM events WHERE json_extract(data, '$.experiment') = ? ORDER BY id", [key])]
    return {"experiment": experiment, "result": result, "trials": trials, "queue": queue, "winner_of": winner_of,
            "evidence": evidence, "hypotheses_tested": tested, "hypotheses": hypotheses, "learnings": learnings,
            "events": events}


def _in(db: ReadOnlyDB, sql: str, ids: list[str]) -> list[dict[str, Any]]:
    if not ids:
        return []
    return db.rows(sql.format(", ".join("?" * len(ids))), ids)
