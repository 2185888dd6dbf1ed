"""bench/retune.py: a `rules` campaign of 8 configs on a problem an earlier campaign measured, under
each way of using the earlier results; on one recorded H200 grid."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import retune  # type: ignore[import-not-found]  # noqa: E402
import search  # type: ignore[import-not-found]  # noqa: E402

H200 = str(REPO / "data/replay/matmul-h200.jsonl.gz")


def test_free_reuse_measures_the_budget_beside_the_stored_results() -> None:
    """search.drive(free=...), as the arms `free*` run it."""
    dataset = retune.load_dataset(H200, retune.get_family("matmul"))
    problem = dataset.problems[0]
    first = search.drive(dataset, problem, "rules", 0, retune.BUDGET)  # what an earlier rules campaign measured
    stored = set(first.configs)
    times = search.drive(dataset, problem, "rules", 0, retune.BUDGET, free=stored).times_ms
    # rules, cold, proposes its earlier picks again: each reused, free; then 8 it has no result of
    assert len(times) == 2 * retune.BUDGET
    assert sorted(times[:retune.BUDGET]) == sorted(t for t in first.times_ms if t is not None)
    assert min(times) <= min(t for t in first.times_ms if t is not None)


def test_every_arm_is_scored_on_every_run_and_the_totals_add_up(tmp_path: Path) -> None:
    out = tmp_path / "retune.json"
    assert retune.main(["--datasets", H200, "--priors", "random,rules", "--seeds", "1", "--jobs", "1",
                        "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    problems = len(retune.load_dataset(H200, retune.get_family("matmul")).problems)
    assert len(result["runs"]) == 2 * problems and result["arms"] == list(retune.ARMS)
    for prior in ("random", "rules"):
        runs = [r for r in result["runs"] if r["prior"] == prior]
        summary = result["per_grid"]["matmul-h200.jsonl.gz"][prior]
        assert result["totals"][prior]["runs"] == summary["runs"] == len(runs) == problems
        for arm in retune.ARMS:
            assert all(r[arm] >= 0 for r in runs)  # the campaign's best is never faster than the grid's optimum
            assert summary[arm]["within_2pct"] == result["totals"][prior][arm] == sum(
                r[arm] <= retune.TOLERANCE for r in runs)
    rules = [r for r in result["runs"] if r["prior"] == "rules"]
    assert all(r["free"] <= r["earlier"] for r in rules)  # the earlier 8 come back, reused, and 8 more
    assert result["commit"] and result["command"].startswith("python bench/retune.py")


@pytest.mark.parametrize(("args", "message"), [
    (["--priors", "bogus"], "unknown --priors 'bogus'"),
    (["--datasets", "nowhere.jsonl.gz"], "--datasets: no such file 'nowhere.jsonl.gz'"),
    (["--seeds", "0"], "--seeds 0 --jobs 2: both must be 1 or more"),
])
def test_bad_input_is_one_line_and_exit_code_2(tmp_path: Path, args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "bench/retune.py"), *args, "--out", str(tmp_path / "r.json")],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "r.json").exists()


def test_an_out_folder_that_does_not_exist_is_refused_before_any_work(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "bench/retune.py"), "--out", str(tmp_path / "no" / "r.json")],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "its folder does not exist" in proc.stderr and proc.stderr.count("\n") == 1


def test_the_gpu_script_on_the_recorded_grid_measures_the_budget_in_each_campaign(tmp_path: Path) -> None:
    out = tmp_path / "retune-gpu.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench/retune_gpu.py"), "--replay", "--out", str(out),
                           "--work", str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    campaigns = json.loads(out.read_text())["campaigns"]
    assert list(campaigns) == ["earlier", "again", "twice"]
    for name, problems in campaigns.items():
        assert len(problems) == 2 and all(e["measured"] == 8 for e in problems.values()), (name, problems)
    assert all(e["reused"] == 0 for e in campaigns["earlier"].values())
    # cold rules proposes again's picks first (again's warm start may have put the earlier winner
    # among them): those come back free, and the campaign still measures 8 of its own
    assert all(e["reused"] >= 1 for e in campaigns["twice"].values())
    for label, e in campaigns["twice"].items():
        assert e["best_ms"] <= min(campaigns["earlier"][label]["best_ms"], campaigns["again"][label]["best_ms"])


@pytest.mark.parametrize("bad", ["work", "out"])
def test_the_gpu_script_refuses_a_missing_folder_in_one_line(tmp_path: Path, bad: str) -> None:
    work = tmp_path / "nowhere" if bad == "work" else tmp_path
    out = tmp_path / "nowhere" / "r.json" if bad == "out" else tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench/retune_gpu.py"), "--replay", "--out", str(out),
                           "--work", str(work)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and f"--{bad} " in proc.stderr, proc.stderr
    assert not (tmp_path / "retune.db").exists()
