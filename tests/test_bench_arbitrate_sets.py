"""bench/arbitrate_sets.py: the plan (the fastest by recorded times of the first 8 configs `rules`
measures, and the recorded optimum, on every problem of the grids) and its refusals. Timing the
two side by side needs a GPU of the grids' device; without one `run` ends in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import arbitrate_sets  # type: ignore[import-not-found]  # noqa: E402
import search  # type: ignore[import-not-found]  # noqa: E402

H200 = str(REPO / "data/replay/matmul-h200.jsonl.gz")
RERECORD = str(REPO / "data/replay/matmul-h200-rerecord-shuffled.jsonl.gz")
H100_FRESH = str(REPO / "data/replay/matmul-h100-fresh.jsonl.gz")


def test_the_plan_pairs_each_problem_s_pick_in_8_with_the_recorded_optimum(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    assert arbitrate_sets.main(["plan", "--datasets", f"{H200},{RERECORD}", "--out", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert plan["device"] == "NVIDIA H200" and plan["budget"] == 8
    family = arbitrate_sets.get_family("matmul")
    rows = plan["problems"]
    for path in (H200, RERECORD):
        ds = arbitrate_sets.load_dataset(path, family)
        mine = [r for r in rows if r["dataset"] == path]
        assert [r["label"] for r in mine] == [p.label() for p in ds.problems]
        for r, problem in zip(mine, ds.problems, strict=True):
            records = ds.records(problem)
            optimum = min(t.median_ms for t in records.values() if t.median_ms is not None)
            assert records[search.Config.of(r["optimum"])].median_ms == optimum
            trace = search.drive(ds, problem, "rules", 0, 8)  # the run bench/search.py scores
            assert search.Config.of(r["pick"]) in trace.configs
            best = search.best_after(trace, 8)
            assert records[search.Config.of(r["pick"])].median_ms == best
            assert r["regret_recorded"] == pytest.approx(best / optimum - 1, abs=1e-5)
            assert r["same"] == (r["pick"] == r["optimum"])
    assert plan["to_retime"] == sum(not r["same"] for r in rows)
    assert plan["within_2pct_recorded"] == sum(r["regret_recorded"] <= 0.02 for r in rows)


def test_the_summary_counts_what_was_re_timed_per_grid_and_over_all() -> None:
    rows = [{"dataset": "a", "regret_recorded": 0.0, "regret_retimed": 0.0},
            {"dataset": "a", "regret_recorded": 0.035, "regret_retimed": 0.004},
            {"dataset": "b", "regret_recorded": 0.01, "regret_retimed": 0.03},
            {"dataset": "b", "regret_recorded": 0.05}]  # not re-timed yet (a run cut short)
    s = arbitrate_sets.summary(rows)
    assert s["all"] == {"problems": 4, "within_2pct_recorded": 2, "retimed": 3, "within_2pct_retimed": 2,
                        "max_regret_retimed": 0.03}
    assert s["a"]["within_2pct_retimed"] == 2 and s["b"]["retimed"] == 1 and s["b"]["within_2pct_retimed"] == 0


@pytest.mark.parametrize(("argv", "says"), [
    (["plan", "--datasets", f"{H200},{H100_FRESH}", "--out", "{tmp}/p.json"], "2 devices"),
    (["plan", "--datasets", H200, "--budget", "0", "--out", "{tmp}/p.json"], "--budget 0"),
    (["plan", "--datasets", "{tmp}/absent.jsonl.gz", "--out", "{tmp}/p.json"], "absent.jsonl.gz"),
    (["run", "{tmp}/absent.json", "--out", "{tmp}/r.json"], "absent.json"),
    (["run", "{tmp}/absent.json", "--repeats", "0", "--out", "{tmp}/r.json"], "--repeats 0"),
    (["run", "{tmp}/junk.json", "--out", "{tmp}/r.json"], "not a plan"),
    (["run", "{tmp}/list.json", "--out", "{tmp}/r.json"], "not a plan"),
    (["plan", "--datasets", H200, "--out", "{tmp}/absent/p.json"], "does not exist"),
])
def test_mistakes_are_one_line(tmp_path: Path, argv: list[str], says: str) -> None:
    (tmp_path / "junk.json").write_text("[1, 2")
    (tmp_path / "list.json").write_text("[1, 2]")
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    done = subprocess.run([sys.executable, str(REPO / "bench/arbitrate_sets.py"), *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "r.json").exists()
