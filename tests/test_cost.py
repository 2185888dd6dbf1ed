"""Campaign cost: GPU-seconds per device (each result's timed GPU time; reps x median where the
worker recorded none, as for replayed recordings), model tokens and dollars per model, the
estimate `tune --dry-run` prints from the history, and the estimate and the actual stored side by
side when a campaign ends. Replay backend on the synthetic datasets of the fixtures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests import replay_fixture
from tests.cli_helpers import run, sql
from tests.export_fixture import PROBLEMS, tiered_ms
from tilepilot.experiments import Campaign, Problem
from tilepilot.experiments.llm_call import LlmCall
from tilepilot.storage.cost import campaign_cost, estimate
from tilepilot.storage.queries import open_db
from tilepilot.storage.store import Store


def campaign_file(path: Path, name: str, *, proposer: str, budget: int, seed: int,
                  problems: list[dict[str, Any]]) -> Path:
    text = (f'[campaign]\nname = "{name}"\nkernel = "matmul"\nproposer = "{proposer}"\nbudget = {budget}\n'
            f"seed = {seed}\n")
    for p in problems:
        text += "\n[[problems]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in p.items())
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiered synthetic recording, and the same numbers recorded again (another dataset identity,
    as after a kernel change: nothing of the first is reused)."""
    root = tmp_path_factory.mktemp("cost")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(replay_fixture, "PROBLEMS", PROBLEMS)
        mp.setattr(replay_fixture, "synthetic_ms", tiered_ms)
        first = replay_fixture.write_dataset(root / "first.jsonl")
    again = root / "again.jsonl"
    again.write_text(first.read_text() + "\n")  # same lines, another file hash
    return first, again


def gpu_seconds_by_sql(db: Path, campaign: str) -> float:
    """Each result's timed_ms, else reps x median: over the results the campaign measured itself."""
    rows = sql(db, "SELECT r.timed_ms, r.reps, r.median_ms, r.status FROM trials t JOIN campaigns c ON c.id = "
                   "t.campaign_id JOIN results r ON r.experiment_key = t.experiment_key WHERE c.name = ? AND "
                   "t.reused = 0 AND r.status != 'invalid'", (campaign,))
    return sum((r["timed_ms"] if r["timed_ms"] is not None else (r["reps"] * r["median_ms"] if r["status"] == "ok"
                                                                  else 0.0)) / 1e3 for r in rows)


def test_a_campaign_records_its_gpu_seconds_and_the_estimate_beside_the_actual(datasets, tmp_path, capsys):
    first, again = datasets
    db = tmp_path / "c.db"
    before = campaign_file(tmp_path / "a.toml", "a", proposer="random", budget=10, seed=1, problems=PROBLEMS[:6])
    assert run(capsys, "tune", before, "--backend", "replay", "--dataset", first, "--db", db)[0] == 0
    row = sql(db, "SELECT gpu_seconds, llm_cost_usd, estimate FROM campaigns WHERE name = 'a'")[0]
    assert row["gpu_seconds"] == pytest.approx(gpu_seconds_by_sql(db, "a")) and row["gpu_seconds"] > 0
    assert row["llm_cost_usd"] == 0
    doc = json.loads(row["estimate"])
    assert doc["estimate"]["gpu_seconds"] is None and "no measured matmul result" in doc["estimate"]["basis"]
    assert doc["actual"]["gpu_seconds"] == pytest.approx(row["gpu_seconds"]) and doc["ratio"]["gpu_seconds"] is None

    # a campaign like it: the same problems, another seed, on a new recording of the kernel
    like = campaign_file(tmp_path / "b.toml", "b", proposer="random", budget=10, seed=7, problems=PROBLEMS[:6])
    code, out, err = run(capsys, "tune", like, "--backend", "replay", "--dataset", again, "--db", db, "--dry-run")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("estimate: "))
    printed = float(line.split()[1])
    assert "for 60 of 60 trial(s) measured" in line and "model cost $0.0000" in line
    assert run(capsys, "tune", like, "--backend", "replay", "--dataset", again, "--db", db)[0] == 0
    row = sql(db, "SELECT gpu_seconds, estimate FROM campaigns WHERE name = 'b'")[0]
    doc = json.loads(row["estimate"])
    assert doc["estimate"]["gpu_seconds"] == pytest.approx(printed, rel=1e-3)  # what the dry run said
    actual = gpu_seconds_by_sql(db, "b")
    assert row["gpu_seconds"] == pytest.approx(actual) and doc["actual"]["gpu_seconds"] == pytest.approx(actual)
    assert doc["ratio"]["gpu_seconds"] == pytest.approx(actual / doc["estimate"]["gpu_seconds"])
    assert 0.7 <= actual / printed <= 1.3, (actual, printed)
    per_problem = {json.dumps(p["problem"], sort_keys=True): p for p in doc["estimate"]["problems"]}
    assert all(p["basis"] == "this problem" and p["trials"] == 10 for p in per_problem.values())


def grid_then_plan(capsys: pytest.CaptureFixture[str], tmp_path: Path, dataset: Path, db: Path,
                   grid_budget: int) -> tuple[Path, str]:
    """Campaign a (grid, `grid_budget` configs) run on two problems, then campaign b (random, 8) planned
    with --dry-run in the same store: b's file and what the plan printed."""
    a = campaign_file(tmp_path / "a.toml", "a", proposer="grid", budget=grid_budget, seed=1, problems=PROBLEMS[:2])
    assert run(capsys, "tune", a, "--backend", "replay", "--dataset", dataset, "--db", db)[0] == 0
    b = campaign_file(tmp_path / "b.toml", "b", proposer="random", budget=8, seed=3, problems=PROBLEMS[:2])
    code, out, err = run(capsys, "tune", b, "--backend", "replay", "--dataset", dataset, "--db", db, "--dry-run")
    assert code == 0, err
    return b, out


def test_the_estimate_measures_the_budget_beside_what_it_expects_to_reuse(datasets, tmp_path, capsys):
    first, _ = datasets
    db = tmp_path / "part.db"
    b, out = grid_then_plan(capsys, tmp_path, first, db, grid_budget=8)
    valid = int(out.splitlines()[1].split(": ")[1].split()[0])  # valid configs of the first problem
    reused = 8 * 8 / (valid - 8 + 1)  # 8 measured; drawn independently of the 8 stored, these come on the way
    assert f"for 16 of {16 + 2 * round(reused)} trial(s) measured" in out, out
    assert run(capsys, "tune", b, "--backend", "replay", "--dataset", first, "--db", db)[0] == 0
    measured = sql(db, "SELECT t.problem_key, SUM(t.reused = 0) AS n FROM trials t JOIN campaigns c "
                       "ON c.id = t.campaign_id WHERE c.name = 'b' GROUP BY t.problem_key")
    assert [r["n"] for r in measured] == [8, 8]  # the budget, measured; what it met of a's, reused free


def test_the_estimate_expects_configs_already_in_the_store_to_cost_nothing(datasets, tmp_path, capsys):
    first, _ = datasets
    db = tmp_path / "r.db"
    b, out = grid_then_plan(capsys, tmp_path, first, db, grid_budget=32)
    # every valid config is in the store: each is reused, free, and none is left to measure
    assert "estimate: 0 GPU-s for 0 of 64 trial(s) measured" in out, out
    assert run(capsys, "tune", b, "--backend", "replay", "--dataset", first, "--db", db)[0] == 0
    assert sql(db, "SELECT COUNT(*) AS n FROM trials t JOIN campaigns c ON c.id = t.campaign_id "
                   "WHERE c.name = 'b' AND t.reused = 0")[0]["n"] == 0
    assert sql(db, "SELECT gpu_seconds FROM campaigns WHERE name = 'b'")[0]["gpu_seconds"] == 0


def test_cost_per_device_and_per_model(tmp_path):
    db = tmp_path / "m.db"
    problem = Problem.of({"M": 64, "N": 1024, "K": 2048, "dtype": "bf16"})
    calls = [("model-a", 1200, 300, 0.0135, ""), ("model-a", 800, 200, 0.009, ""), ("model-b", 1000, 100, None, ""),
             ("model-a", None, None, None, "timeout")]
    with Store(db) as store:
        cid = store.create_campaign(Campaign("l", "matmul", "llm", 4, 1, (problem,)), backend="replay", dataset="",
                                    device="synthetic device")
        for model, i, o, usd, error in calls:
            store.add_llm_call(cid, LlmCall(ts=1.0, problem_key=problem.key(), model=model, input_tokens=i,
                                            output_tokens=o, cache_read_tokens=None, cache_creation_tokens=None,
                                            cost_usd=usd, stop_reason=None, request_id=None, error=error,
                                            duration_ms=10.0))
    with open_db(db) as handle:
        cost = campaign_cost(handle.rows, cid)
        est = estimate(handle.rows, kernel="matmul", device="synthetic device", backend="replay", kernel_version=None,
                       valid={problem: 16}, budget=8, proposer="llm")
    by_model = {m.model: m for m in cost.models}
    assert by_model["model-a"].calls == 3 and by_model["model-a"].failed == 1
    assert by_model["model-a"].input_tokens == 2000 and by_model["model-a"].output_tokens == 500
    assert by_model["model-a"].cost_usd == pytest.approx(0.0225)
    assert by_model["model-b"].unpriced == 1 and by_model["model-b"].cost_usd == 0
    assert cost.llm_cost_usd == pytest.approx(0.0225) and cost.gpu_seconds == 0
    assert est.llm_calls is None and est.llm_cost_usd is None  # the campaign has no trials to scale by
    assert "no earlier llm campaign" in est.basis


def test_cost_command_prints_devices_models_and_the_estimate(datasets, tmp_path, capsys):
    first, _ = datasets
    db = tmp_path / "p.db"
    a = campaign_file(tmp_path / "a.toml", "a", proposer="random", budget=5, seed=1, problems=PROBLEMS[:3])
    assert run(capsys, "tune", a, "--backend", "replay", "--dataset", first, "--db", db)[0] == 0
    code, out, err = run(capsys, "cost", "a", "--db", db)
    assert code == 0, err
    gpu = gpu_seconds_by_sql(db, "a")
    assert out.splitlines()[0] == f"campaign a: {gpu:.4g} GPU-s over 15 measured result(s), 0 reused; model $0.0000"
    assert out.splitlines()[1] == f"  synthetic device (replay): {gpu:.4g} s, 15 result(s)"
    code, out, err = run(capsys, "cost", "--db", db, "--json")
    doc = json.loads(out)
    assert doc["campaign"] == "a" and doc["gpu_seconds"] == pytest.approx(gpu) and doc["estimate"]["actual"]
    code, out, err = run(capsys, "cost", "nope", "--db", db)
    assert code == 2 and "'nope'" in err and err.count("\n") == 1
