"""`tilepilot merge`: another store folded in with nothing lost, experiments deduplicated,
campaigns and hypotheses renamed on a clash, a campaign copied back recognised, running it
twice changing nothing, and bad input refused before anything is written."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard_fixture import P1, build_ledger, cfg, ok
from tests.replay_fixture import write_campaign, write_dataset
from tilepilot.cli import main
from tilepilot.experiments import Candidate, experiment_key
from tilepilot.storage.merge import campaign_uid, merge_file
from tilepilot.storage.rows import WinnerRow
from tilepilot.storage.schema import SCHEMA_VERSION
from tilepilot.storage.store import Store


def tables(db: Path) -> list[str]:
    con = sqlite3.connect(db)
    try:
        return [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                          "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    finally:
        con.close()


def rows(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute(sql, params)]
    finally:
        con.close()


def snapshot(db: Path) -> dict[str, tuple[int, str]]:
    """Rows and a checksum of every table (rows sorted, every column)."""
    out = {}
    for t in tables(db):
        found = sorted(json.dumps(r, sort_keys=True) for r in rows(db, f"SELECT * FROM {t}"))
        out[t] = (len(found), hashlib.sha256("\n".join(found).encode()).hexdigest())
    return out


@pytest.fixture()
def stores(tmp_path: Path) -> tuple[Path, Path]:
    """Two stores written on 'two machines': the same campaign names, different campaigns."""
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    build_ledger(a).live.store.close()
    build_ledger(b).live.store.close()
    return a, b


def campaign_names(db: Path) -> dict[str, str]:
    """uid -> name."""
    return {campaign_uid(r): r["name"] for r in rows(db, "SELECT * FROM campaigns")}


def test_merging_twice_changes_nothing(stores):
    a, b = stores
    source_before = snapshot(b)
    first = merge_file(a, b)
    assert first.changed
    after_first = snapshot(a)
    second = merge_file(a, b)
    assert not second.changed
    assert snapshot(a) == after_first
    assert snapshot(b) == source_before  # the source is only read
    merge_file(b, a)
    after_back = snapshot(b)
    merge_file(b, a)
    merge_file(a, b)
    assert snapshot(b) == after_back


def test_merge_loses_no_row_of_either_store(stores):
    a, b = stores
    before_a, before_b = snapshot(a), snapshot(b)
    keys_a = {r["key"] for r in rows(a, "SELECT key FROM experiments")}
    keys_b = {r["key"] for r in rows(b, "SELECT key FROM experiments")}
    report = merge_file(a, b)
    merged = snapshot(a)
    # experiments are the same experiments (same kernel, problem, config, device, toolchain): deduplicated
    assert keys_a == keys_b and merged["experiments"][0] == len(keys_a | keys_b)
    assert merged["results"][0] == len(keys_a)
    assert report.results_kept == len(keys_b)
    # every campaign of b is a different campaign of the same name: each comes in, renamed
    assert report.renamed == {"mm-live": "mm-live@b", "mm-replay": "mm-replay@b", "mm-hyp": "mm-hyp@b"}
    for table in ("campaigns", "trials", "queue", "winners", "gpu_samples", "hypotheses", "verdicts", "evidence",
                  "learnings"):
        assert merged[table][0] == before_a[table][0] + before_b[table][0], table
    assert merged["events"][0] == before_a["events"][0] + before_b["events"][0] + 3 + 1  # + merged_from notes
    # b's rows, found in a under the mapped campaign names and hypothesis ids
    for t in rows(b, "SELECT c.name, t.experiment_key, t.seq, t.proposer, t.hypothesis_id FROM trials t "
                     "JOIN campaigns c ON c.id = t.campaign_id"):
        hid = report.hypotheses_renamed.get(t["hypothesis_id"], t["hypothesis_id"])
        got = rows(a, "SELECT t.seq, t.proposer, t.hypothesis_id FROM trials t JOIN campaigns c "
                      "ON c.id = t.campaign_id WHERE c.name = ? AND t.experiment_key = ?",
                   (report.renamed[t["name"]], t["experiment_key"]))
        assert got == [{"seq": t["seq"], "proposer": t["proposer"], "hypothesis_id": hid}]
    for w in rows(b, "SELECT c.name, w.problem_key, w.experiment_key, w.median_ms FROM winners w "
                     "JOIN campaigns c ON c.id = w.campaign_id"):
        got = rows(a, "SELECT w.experiment_key, w.median_ms FROM winners w JOIN campaigns c ON c.id = w.campaign_id "
                      "WHERE c.name = ? AND w.problem_key = ?", (report.renamed[w["name"]], w["problem_key"]))
        assert got == [{"experiment_key": w["experiment_key"], "median_ms": w["median_ms"]}]


def test_hypotheses_of_a_same_named_campaign_are_renamed_with_their_ledger(stores):
    a, b = stores
    report = merge_file(a, b)
    ids_b = [r["id"] for r in rows(b, "SELECT id FROM hypotheses")]
    assert set(report.hypotheses_renamed) == set(ids_b)  # "H-" + hash(campaign name, statement): same ids
    for old, new in report.hypotheses_renamed.items():
        assert new.startswith(old + "@")
        h_a, h_b = (rows(a, "SELECT * FROM hypotheses WHERE id = ?", (new,)),
                    rows(b, "SELECT * FROM hypotheses WHERE id = ?", (old,)))
        assert len(h_a) == 1 and {k: v for k, v in h_a[0].items() if k not in ("id", "campaign_id")} \
            == {k: v for k, v in h_b[0].items() if k not in ("id", "campaign_id")}
        assert rows(a, "SELECT name FROM campaigns WHERE id = ?", (h_a[0]["campaign_id"],)) == [{"name": "mm-hyp@b"}]
        ev = "SELECT experiment_a, experiment_b, ratio, relation FROM evidence WHERE hypothesis_id = ? ORDER BY 1, 2"
        assert rows(a, ev, (new,)) == rows(b, ev, (old,))
        vd = "SELECT state, pairs, reason, decided_at FROM verdicts WHERE hypothesis_id = ? ORDER BY id"
        assert rows(a, vd, (new,)) == rows(b, vd, (old,))
    (learning,) = rows(b, "SELECT * FROM learnings")
    (copied,) = rows(a, "SELECT * FROM learnings WHERE hypothesis_id = ?",
                     (report.hypotheses_renamed[learning["hypothesis_id"]],))
    assert copied["id"] != learning["id"] and copied["text"] == learning["text"]


def test_a_campaign_copied_back_is_recognised_under_its_new_name(stores):
    a, b = stores
    merge_file(a, b)  # b's campaigns are in a as NAME@b
    report = merge_file(b, a)  # back: b recognises its own campaigns, and takes a's as NAME@a
    assert sorted(report.campaigns_known) == ["mm-hyp", "mm-live", "mm-replay"]
    assert report.renamed == {"mm-live": "mm-live@a", "mm-replay": "mm-replay@a", "mm-hyp": "mm-hyp@a"}
    assert set(campaign_names(a)) == set(campaign_names(b))  # the same six campaigns in both
    for db in (a, b):
        per = rows(db, "SELECT c.name, COUNT(t.id) AS n FROM campaigns c LEFT JOIN trials t ON t.campaign_id = c.id "
                       "GROUP BY c.id")
        assert len(per) == 6
    count = "SELECT COUNT(*) AS n FROM hypotheses"
    assert rows(a, count) == rows(b, count) == [{"n": 10}]


def test_a_campaign_that_went_on_elsewhere_brings_its_new_rows(stores, tmp_path):
    a, b = stores
    merge_file(a, b)
    with Store(b) as store:  # mm-live went on running on machine b
        cid = store.get_campaign("mm-live").id
        queued = store.queued(cid)[0]
        result = ok(P1, cfg(32, 64), 0.9)
        key = experiment_key("matmul", "1", result.problem, result.config, result.env)
        store.record_result(result, key=key, kernel="matmul", kernel_version="1")
        store.add_trial(cid, key, Candidate(P1, cfg(32, 64), "optuna", "late sample"), reused=False)
        store.set_queue_state(queued.id, "done", worker="gpu-1", experiment_key=key)
        store.set_winner(WinnerRow(cid, P1.key(), key, 0.9, 0.01))
        store.set_campaign_state(cid, "finished")
    report = merge_file(a, b)
    assert report.added["trials"] == 1 and report.added["experiments"] == 1 and report.added["winners"] == 1
    assert report.updated["campaigns"] == 1 and report.updated["queue"] == 1
    (camp,) = rows(a, "SELECT id, state FROM campaigns WHERE name = 'mm-live@b'")
    assert camp["state"] == "finished"
    assert rows(a, "SELECT state, worker FROM queue WHERE campaign_id = ? AND problem_key = ? AND config_key = ?",
                (camp["id"], queued.problem_key, queued.config_key)) == [{"state": "done", "worker": "gpu-1"}]
    assert not merge_file(a, b).changed


def test_replay_campaigns_on_two_machines_share_their_experiments(tmp_path):
    from tilepilot.orchestrator.tune import TuneOptions, tune

    dataset = write_dataset(tmp_path / "ds.jsonl")
    for db, proposer in (("a.db", "grid"), ("b.db", "random")):
        campaign = write_campaign(tmp_path / f"{db}.toml", name="t", proposer=proposer, budget=8)
        tune(TuneOptions(campaign=campaign, backend="replay", dataset=dataset, db=tmp_path / db))
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    keys = {db: {r["key"] for r in rows(db, "SELECT key FROM experiments")} for db in (a, b)}
    assert keys[a] & keys[b] and keys[a] != keys[b]
    trials_b = rows(b, "SELECT experiment_key, seq FROM trials ORDER BY id")
    report = merge_file(a, b)
    assert report.added["experiments"] == len(keys[b] - keys[a])
    assert {r["key"] for r in rows(a, "SELECT key FROM experiments")} == keys[a] | keys[b]
    assert rows(a, "SELECT experiment_key, seq FROM trials t JOIN campaigns c ON c.id = t.campaign_id "
                   "WHERE c.name = 't@b' ORDER BY t.id") == trials_b


# ---- bad input ----------------------------------------------------------------------------------

def _newer_schema(path: Path) -> Path:
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.commit()
    con.close()
    return path


def _other_program(path: Path) -> Path:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    con.commit()
    con.close()
    return path


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: p / "missing.db", "it does not exist"),
    (lambda p: p, "it is not a file"),
    (lambda p: (p / "notes.txt").write_text("hello\n" * 200) and p / "notes.txt", "is not a tilepilot database"),
    (lambda p: _other_program(p / "other.db"), "is not a tilepilot database"),
    (lambda p: _newer_schema(shutil.copy(p / "b.db", p / "newer.db") and p / "newer.db"),
     f"has schema version {SCHEMA_VERSION + 1}, newer than this tilepilot knows"),
])
def test_bad_source_is_one_line_exit_2_and_writes_nothing(stores, tmp_path, capsys, make, message):
    a, _ = stores
    source = make(tmp_path)
    before = snapshot(a)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert main(["merge", str(source), "--db", str(a)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("tilepilot: error: ")
    assert snapshot(a) == before
    assert not (tmp_path / "new.db").exists()
    assert main(["merge", str(source), "--db", str(tmp_path / "new.db")]) == 2
    assert not (tmp_path / "new.db").exists()  # the target is not even created
    # SQLite may leave a -shm/-wal beside a WAL source it read; no other file appears
    new = {p.name for p in tmp_path.iterdir()} - set(files)
    assert all(n.startswith(source.name + "-") for n in new), new


def test_merging_a_store_into_itself_is_refused(stores, capsys):
    a, _ = stores
    before = snapshot(a)
    assert main(["merge", str(a), "--db", str(a.parent / "." / a.name)]) == 2
    assert "into itself" in capsys.readouterr().err
    assert snapshot(a) == before


def test_cli_merge_reports_renames_and_then_nothing_new(stores, capsys):
    a, b = stores
    assert main(["merge", str(b), "--db", str(a)]) == 0
    out = capsys.readouterr().out
    assert "campaigns renamed: mm-live -> mm-live@b" in out
    assert "campaign 'mm-hyp' of" in out and "is named 'mm-hyp@b' here" in out
    events = rows(a, "SELECT message, data FROM events WHERE kind = 'merged_from' AND campaign_id IS NULL")
    assert len(events) == 1 and json.loads(events[0]["data"])["source"] == str(b.resolve())
    assert main(["merge", str(b), "--db", str(a)]) == 0
    assert "nothing new" in capsys.readouterr().out


def test_a_table_added_by_a_later_schema_step_comes_along_with_campaign_ids_mapped(stores):
    a, b = stores
    for db in (a, b):
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE later_notes (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                    "campaign_id INTEGER REFERENCES campaigns(id), ts REAL NOT NULL, text TEXT NOT NULL)")
        con.commit()
        con.close()
    con = sqlite3.connect(b)
    cid = con.execute("SELECT id FROM campaigns WHERE name = 'mm-hyp'").fetchone()[0]
    con.executemany("INSERT INTO later_notes (campaign_id, ts, text) VALUES (?, ?, ?)",
                    [(cid, 1.0, "first"), (cid, 2.0, "second"), (None, 3.0, "global")])
    con.commit()
    con.close()
    report = merge_file(a, b)
    assert report.added["later_notes"] == 3
    assert rows(a, "SELECT c.name, n.text FROM later_notes n LEFT JOIN campaigns c ON c.id = n.campaign_id "
                   "ORDER BY n.ts") == [{"name": "mm-hyp@b", "text": "first"}, {"name": "mm-hyp@b", "text": "second"},
                                        {"name": None, "text": "global"}]
    assert not merge_file(a, b).changed


# ---- schema version 4: cost, estimates, device ceilings, imported experiments ------------------

def _v4_store(tmp_path: Path, name: str, *, ceilings: list[tuple[str, float, float, float]]) -> Path:
    """A replay campaign (its cost and estimate recorded), device ceilings and an imported vLLM file."""
    from tilepilot.experiments import DeviceCeilings

    db = tmp_path / f"{name}.db"
    dataset = write_dataset(tmp_path / f"{name}.jsonl")
    camp = write_campaign(tmp_path / f"{name}.toml", name=name, proposer="random", budget=5)
    assert main(["tune", str(camp), "--backend", "replay", "--dataset", str(dataset), "--db", str(db)]) == 0
    vllm = tmp_path / f"kernel=matmul,N=512,K=512,device_name=vendor_{name},dtype=fp16.json"
    vllm.write_text(json.dumps({"512": {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32,
                                        "GROUP_SIZE_M": 8, "num_warps": 4, "num_stages": 3}}))
    assert main(["import", str(vllm), "--db", str(db)]) == 0
    with Store(db) as store:
        for device, copy, rate, at in ceilings:
            store.set_ceilings(DeviceCeilings(device, "570.00", copy_gbps=copy, matmul_tflops=rate, measured_at=at))
    return db


def test_v4_columns_devices_and_imports_come_along_and_twice_changes_nothing(tmp_path):
    a = _v4_store(tmp_path, "a", ceilings=[("gpu x", 1000.0, 300.0, 100.0), ("gpu z", 1500.0, 350.0, 500.0)])
    b = _v4_store(tmp_path, "b", ceilings=[("gpu x", 2000.0, 400.0, 200.0), ("gpu y", 3000.0, 900.0, 100.0),
                                           ("gpu z", 1.0, 1.0, 400.0)])
    b_campaign = rows(b, "SELECT gpu_seconds, llm_cost_usd, estimate, control FROM campaigns")[0]
    b_imported = rows(b, "SELECT key, origin, origin_data FROM experiments WHERE origin != '' ORDER BY key")
    a_before = {t: rows(a, f"SELECT * FROM {t}") for t in ("experiments", "results", "campaigns")}
    report = merge_file(a, b)
    assert report.added["devices"] == 1 and report.updated["devices"] == 1
    devices = {(r["device"], r["copy_gbps"], r["matmul_tflops"], r["measured_at"]) for r in rows(
        a, "SELECT * FROM devices")}
    # gpu x: b measured later; gpu y: new; gpu z: ours is the later measurement
    assert devices == {("gpu x", 2000.0, 400.0, 200.0), ("gpu y", 3000.0, 900.0, 100.0),
                       ("gpu z", 1500.0, 350.0, 500.0)}
    assert rows(a, "SELECT gpu_seconds, llm_cost_usd, estimate, control FROM campaigns WHERE name = 'b'") == [
        b_campaign]
    assert json.loads(b_campaign["estimate"])["actual"]["gpu_seconds"] == b_campaign["gpu_seconds"] > 0
    assert rows(a, "SELECT key, origin, origin_data FROM experiments WHERE origin LIKE '%vendor_b%' ORDER BY key") \
        == b_imported
    assert rows(a, "SELECT COUNT(*) AS n FROM results WHERE experiment_key IN (SELECT key FROM experiments "
                   "WHERE origin != '')") == [{"n": 0}]  # imported stays imported: no result
    for table, before in a_before.items():  # nothing of a's own changed
        after = {json.dumps(r, sort_keys=True) for r in rows(a, f"SELECT * FROM {table}")}
        assert {json.dumps(r, sort_keys=True) for r in before} <= after
    summary = json.loads(rows(a, "SELECT data FROM events WHERE kind = 'merged_from' AND campaign_id IS NULL")[0]
                         ["data"])
    assert summary["added"]["devices"] == 1 and summary["updated"]["devices"] == 1
    after = snapshot(a)
    assert not merge_file(a, b).changed and snapshot(a) == after
    fresh = tmp_path / "fresh.db"
    merge_file(fresh, a)
    once = snapshot(fresh)
    assert not merge_file(fresh, a).changed and snapshot(fresh) == once
    assert rows(fresh, "SELECT device, copy_gbps FROM devices ORDER BY device") == rows(
        a, "SELECT device, copy_gbps FROM devices ORDER BY device")


def test_a_newer_copy_brings_the_campaigns_cost_but_never_its_control_request(tmp_path):
    a = _v4_store(tmp_path, "a", ceilings=[])
    b = tmp_path / "b.db"
    shutil.copy(a, b)
    for suffix in ("-wal", "-shm"):
        if Path(f"{a}{suffix}").exists():
            shutil.copy(f"{a}{suffix}", f"{b}{suffix}")
    con = sqlite3.connect(b)
    con.execute("UPDATE campaigns SET gpu_seconds = 12.5, llm_cost_usd = 0.75, control = 'stop', "
                "updated_at = updated_at + 10")
    con.commit()
    con.close()
    merge_file(a, b)
    assert rows(a, "SELECT gpu_seconds, llm_cost_usd, control FROM campaigns") == [
        {"gpu_seconds": 12.5, "llm_cost_usd": 0.75, "control": ""}]
