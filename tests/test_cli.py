"""The `tilepilot` command end to end on the replay backend (synthetic dataset, no GPU)."""

from __future__ import annotations

import csv
import io
import json
import os
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.cli_helpers import run
from tests.replay_fixture import PROBLEMS, write_campaign, write_dataset
from tilepilot.kernels.registry import get_family

REPO = Path(__file__).resolve().parents[1]
BUDGET = 6
LABELS = ["M=512 N=512 K=512 dtype=fp16", "M=64 N=1024 K=2048 dtype=bf16"]  # PROBLEMS, as printed
FIRST = ('\n[[configs]]\nBLOCK_SIZE_M = 64\nBLOCK_SIZE_N = 64\nBLOCK_SIZE_K = 32\nGROUP_SIZE_M = 8\n'
         "num_warps = 8\nnum_stages = 3\n")


def rows_of(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "matmul-synthetic.jsonl")


@pytest.fixture()
def tuned(tmp_path: Path, dataset: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A db holding one finished campaign 't' (random, budget 6, [[configs]] measured first)."""
    campaign = write_campaign(tmp_path / "t.toml", name="t", budget=BUDGET, extra=FIRST)
    db = tmp_path / "t.db"
    code, _, err = run(capsys, "tune", campaign, "--backend", "replay", "--dataset", dataset, "--db", db)
    assert code == 0, err
    return db


def tune_args(campaign: Path, dataset: Path, db: Path, *extra: object) -> list[object]:
    return ["tune", campaign, "--backend", "replay", "--dataset", dataset, "--db", db, *extra]


# ---- tune -------------------------------------------------------------------------------------
def test_tune_prints_winners_replay_origin_and_db_path(tmp_path, dataset, capsys):
    campaign = write_campaign(tmp_path / "c.toml", name="c", budget=BUDGET)
    db = tmp_path / "c.db"
    code, out, err = run(capsys, *tune_args(campaign, dataset, db))
    assert code == 0, err
    assert "campaign c finished (replay: replayed from measurements recorded on synthetic device)" in out
    assert "winner" in out.splitlines()[1] and "median_ms" in out.splitlines()[1]
    for label in LABELS:
        assert sum(label in line for line in out.splitlines()) == 1  # one winner row per problem
    assert f"results in {db.resolve()}" in out
    assert "Traceback" not in err and f"{BUDGET * len(PROBLEMS)}/{BUDGET * len(PROBLEMS)} trials" in err
    assert rows_of(db, "SELECT state FROM campaigns") == [("finished",)]
    assert rows_of(db, "SELECT COUNT(*) FROM trials") == [(BUDGET * len(PROBLEMS),)]


def test_python_m_tilepilot_tune_runs_as_a_program(tmp_path, dataset):
    campaign = write_campaign(tmp_path / "c.toml", name="sub", budget=4)
    argv = [sys.executable, "-m", "tilepilot", *map(str, tune_args(campaign, dataset, tmp_path / "s.db"))]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert "replayed from measurements recorded on synthetic device" in proc.stdout
    assert f"results in {(tmp_path / 's.db').resolve()}" in proc.stdout
    assert all(label in proc.stdout for label in LABELS)
    assert "Traceback" not in proc.stderr


def test_resume_of_finished_campaign_measures_nothing_and_prints_winners(tmp_path, dataset, tuned, capsys):
    snapshot = "SELECT id, experiment_key, seq, proposer FROM trials ORDER BY id"
    trials, experiments = rows_of(tuned, snapshot), rows_of(tuned, "SELECT key FROM experiments ORDER BY key")
    winners = rows_of(tuned, "SELECT problem_key, experiment_key, median_ms FROM winners ORDER BY problem_key")
    code, out, err = run(capsys, *tune_args(tmp_path / "t.toml", dataset, tuned, "--resume"))
    assert code == 0, err
    assert "campaign t finished" in out and all(label in out for label in LABELS)
    assert rows_of(tuned, snapshot) == trials
    assert rows_of(tuned, "SELECT key FROM experiments ORDER BY key") == experiments
    assert rows_of(tuned, "SELECT problem_key, experiment_key, median_ms FROM winners ORDER BY problem_key") == winners
    assert rows_of(tuned, "SELECT state FROM queue WHERE state NOT IN ('done', 'dropped')") == []
    assert rows_of(tuned, "SELECT state FROM campaigns") == [("finished",)]


def test_dry_run_prints_plan_and_writes_nothing(tmp_path, dataset, capsys):
    campaign = write_campaign(tmp_path / "c.toml", name="dry", budget=5, extra="\n[space]\nnum_warps = [4]\n")
    db = tmp_path / "dry.db"
    code, out, err = run(capsys, *tune_args(campaign, dataset, db, "--dry-run"))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == ("campaign dry: kernel matmul, proposer random, backend replay, budget 5 per problem, "
                        "2 problem(s), at most 10 configs measured (results in the store are reused, free)")
    assert lines[1:3] == ["  M=512 N=512 K=512 fp16: 16 valid configs in the space",
                          "  M=64 N=1024 K=2048 bf16: 16 valid configs in the space"]
    assert lines[3:] == [f"estimate: no store at {db} yet, so no history to estimate from"]
    assert list(tmp_path.glob("dry.db*")) == []


def test_dry_run_of_an_existing_campaign_leaves_the_db_as_it_was(tmp_path, dataset, tuned, capsys):
    before = tuned.read_bytes()
    code, out, err = run(capsys, *tune_args(tmp_path / "t.toml", dataset, tuned, "--dry-run", "--budget", "30"))
    assert code == 0, err
    assert "budget 30 per problem" in out
    assert tuned.read_bytes() == before
    assert rows_of(tuned, "SELECT COUNT(*) FROM trials") == [(BUDGET * len(PROBLEMS),)]


def test_interrupted_tune_says_how_to_resume_and_resume_finishes(tmp_path, dataset, capsys, monkeypatch):
    import tilepilot.cli as cli

    campaign = write_campaign(tmp_path / "c.toml", name="ctrl-c", budget=BUDGET)
    db = tmp_path / "i.db"
    shown = cli._ProgressBar.__call__

    def interrupt_after_four(self, p):
        shown(self, p)
        if p.done >= 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(cli._ProgressBar, "__call__", interrupt_after_four)
    code, out, err = run(capsys, *tune_args(campaign, dataset, db))
    assert code == 130 and out == ""
    assert err.splitlines()[-1] == f"tilepilot: interrupted; resume with: tilepilot tune {campaign} --db {db} --resume"
    assert rows_of(db, "SELECT state FROM campaigns") == [("interrupted",)]
    monkeypatch.undo()
    code, out, err = run(capsys, *tune_args(campaign, dataset, db, "--resume"))
    assert code == 0, err
    assert rows_of(db, "SELECT state FROM campaigns") == [("finished",)]
    assert rows_of(db, "SELECT COUNT(*) FROM trials") == [(BUDGET * len(PROBLEMS),)]


# ---- kernels ----------------------------------------------------------------------------------
def test_kernels_lists_matmul_with_its_parameters(capsys):
    code, out, err = run(capsys, "kernels")
    assert code == 0 and err == ""
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("matmul "))
    assert "bf16, fp16" in lines[head]
    space = get_family("matmul").space()
    block = lines[head + 2: head + 2 + len(space.params)]
    assert block == [f"    {p.name}: {', '.join(str(c) for c in p.choices)}" for p in space.params]


# ---- history ----------------------------------------------------------------------------------
def history_json(capsys, db: Path, *filters: object) -> list[dict]:
    code, out, err = run(capsys, "history", "--db", db, "--json", *filters)
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_history_table_has_a_row_per_trial(tuned, capsys):
    code, out, err = run(capsys, "history", "--db", tuned)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["campaign", "problem", "config", "status", "median_ms", "proposer", "rationale"]
    assert len(lines) == 1 + BUDGET * len(PROBLEMS)
    assert all(line.startswith("t ") for line in lines[1:])


def test_history_json_is_one_object_per_trial_matching_the_store(tuned, capsys):
    rows = history_json(capsys, tuned)
    stored = rows_of(tuned, "SELECT t.experiment_key, r.status, r.median_ms, t.proposer FROM trials t "
                            "JOIN results r ON r.experiment_key = t.experiment_key")
    assert len(rows) == len(stored) == BUDGET * len(PROBLEMS)
    assert {(r["experiment_key"], r["status"], r["median_ms"], r["proposer"]) for r in rows} == set(stored)
    for r in rows:
        assert {"problem", "config", "status", "median_ms", "proposer"} <= set(r)
        assert r["problem"] in PROBLEMS and isinstance(r["config"], dict)
        assert (r["status"] == "ok") == (r["median_ms"] is not None)
    assert {"campaign", "random"} <= {r["proposer"] for r in rows}


def test_history_csv_has_header_and_a_row_per_trial(tuned, capsys):
    code, out, err = run(capsys, "history", "--db", tuned, "--csv")
    assert code == 0, err
    reader = csv.DictReader(io.StringIO(out))
    rows = list(reader)
    assert {"campaign", "problem", "config", "status", "median_ms", "proposer"} <= set(reader.fieldnames or [])
    assert len(rows) == BUDGET * len(PROBLEMS)
    assert all(json.loads(r["problem"]) in PROBLEMS for r in rows)


def test_history_csv_header_is_the_same_without_rows(tuned, capsys):
    _, full, _ = run(capsys, "history", "--db", tuned, "--csv")
    code, empty, err = run(capsys, "history", "--db", tuned, "--csv", "--problem", "M=3")
    assert code == 0, err
    assert empty.splitlines() == full.splitlines()[:1]


def test_history_filters_campaign_status_proposer_problem(tmp_path, dataset, tuned, capsys):
    other = write_campaign(tmp_path / "g.toml", name="g", proposer="grid", budget=4)
    assert run(capsys, *tune_args(other, dataset, tuned))[0] == 0
    everything = history_json(capsys, tuned)
    mine = history_json(capsys, tuned, "--campaign", "g")
    assert len(everything) == BUDGET * len(PROBLEMS) + len(mine) and {r["campaign"] for r in mine} == {"g"}
    for problem in PROBLEMS:  # 4 measured; what the grid walks of t's results is reused, free
        assert sum(not r["reused"] for r in mine if r["problem"] == problem) == 4
    reused_512 = sum(r["reused"] for r in mine if r["problem"]["M"] == 512)

    ok = history_json(capsys, tuned, "--status", "ok")
    assert ok and all(r["status"] == "ok" for r in ok)
    assert len(ok) == sum(r["status"] == "ok" for r in everything)

    listed = history_json(capsys, tuned, "--proposer", "campaign")
    assert len(listed) == len(PROBLEMS) and all(r["config"]["num_warps"] == 8 for r in listed)

    m512 = history_json(capsys, tuned, "--problem", "M=512")
    assert len(m512) == BUDGET + 4 + reused_512 and all(r["problem"]["M"] == 512 for r in m512)
    both = history_json(capsys, tuned, "--problem", "M=512", "--problem", "dtype=fp16", "--campaign", "t")
    assert len(both) == BUDGET
    assert history_json(capsys, tuned, "--problem", "M=512", "--problem", "dtype=bf16") == []

    limited = history_json(capsys, tuned, "--limit", "3")
    assert limited == everything[:3]


def test_history_table_says_no_rows_when_nothing_matches(tuned, capsys):
    code, out, err = run(capsys, "history", "--db", tuned, "--status", "timeout")
    assert (code, out, err) == (0, "no rows\n", "")


def test_history_problem_value_with_non_ascii_digits_matches_nothing(tuned, capsys):
    code, out, err = run(capsys, "history", "--db", tuned, "--problem", "M=²")
    assert (code, out, err) == (0, "no rows\n", "")


# ---- best -------------------------------------------------------------------------------------
def test_best_table_has_a_winner_per_problem(tuned, capsys):
    code, out, err = run(capsys, "best", "--db", tuned)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["campaign", "problem", "winner", "median_ms"] and "vs median config" in lines[0]
    assert len(lines) == 1 + len(PROBLEMS)
    assert all(any(label in line for line in lines[1:]) for label in LABELS)


def test_best_json_speedup_is_over_the_median_config_measured(tuned, capsys):
    code, out, err = run(capsys, "best", "--db", tuned, "--json")
    assert code == 0, err
    best = [json.loads(line) for line in out.splitlines()]
    history = history_json(capsys, tuned)
    assert sorted(b["problem"]["M"] for b in best) == sorted(p["M"] for p in PROBLEMS)
    for b in best:
        ok = [r["median_ms"] for r in history if r["problem"] == b["problem"] and r["status"] == "ok"]
        assert b["median_ms"] == min(ok)
        assert b["median_config_ms"] == pytest.approx(statistics.median(ok))
        assert b["speedup_vs_median"] == pytest.approx(statistics.median(ok) / min(ok))
        assert b["speedup_vs_median"] >= 1.0
        assert b["decided"] is True and b["backend"] == "replay" and b["device"] == "synthetic device"


def test_best_csv_has_header_and_a_row_per_problem(tuned, capsys):
    code, out, err = run(capsys, "best", "--db", tuned, "--csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == len(PROBLEMS) and all(float(r["speedup_vs_median"]) >= 1.0 for r in rows)


# ---- dashboard --------------------------------------------------------------------------------
@pytest.fixture()
def no_server(monkeypatch):
    import tilepilot.dashboard.launch as launch

    def refuse(*a, **k):
        raise AssertionError("the dashboard server was started")

    monkeypatch.setattr(launch, "subprocess", SimpleNamespace(Popen=refuse))


def test_dashboard_port_zero_is_one_line_error(tuned, capsys, no_server):
    code, out, err = run(capsys, "dashboard", "--db", tuned, "--port", "0")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tilepilot: error: --port 0 ")


def test_dashboard_missing_db_is_one_line_error(tmp_path, capsys, no_server):
    code, out, err = run(capsys, "dashboard", "--db", tmp_path / "absent.db")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tilepilot: error:") and "absent.db" in err
    assert not (tmp_path / "absent.db").exists()


# ---- output into a closed pipe ------------------------------------------------------------------
def test_history_into_a_closed_pipe_prints_no_traceback(tuned):
    proc = subprocess.Popen([sys.executable, "-m", "tilepilot", "history", "--db", str(tuned), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line, like `| head -0`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert err == ""


def test_table_cells_leave_out_variant_parameters_at_their_default() -> None:
    from tilepilot.cli import _compact

    plain = {"BLOCK_SIZE_M": 64, "num_warps": 4, "VARIANT": "grouped", "SPLIT_K": 1, "ALIGN_HINT": False}
    assert _compact(plain) == "BM=64 warps=4"
    split = {**plain, "VARIANT": "splitk", "SPLIT_K": 4}
    assert _compact(split) == "BM=64 warps=4 VARIANT=splitk SPLIT_K=4"
    assert _compact({"M": 1, "K": 1}) == "M=1 K=1"  # a problem's own keys are never hidden
