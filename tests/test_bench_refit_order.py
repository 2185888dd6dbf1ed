"""bench/refit_sets.py (each recorded grid scored with constants fitted on the others, beside the
shipped ones) and bench/order_compare.py's shift by tile shape between two recordings."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import fit_rules  # type: ignore[import-not-found]  # noqa: E402
import order_compare  # type: ignore[import-not-found]  # noqa: E402
import refit_sets  # type: ignore[import-not-found]  # noqa: E402

H200 = str(REPO / "data/replay/matmul-h200.jsonl.gz")
RERECORD = str(REPO / "data/replay/matmul-h200-rerecord-shuffled.jsonl.gz")


def test_each_grid_is_scored_with_constants_fitted_on_the_others_and_with_the_shipped_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fitted_on: list[set[str]] = []

    def quick_fit(data: Any) -> Any:  # a short fit: what is fitted on, not how well, is checked here
        fitted_on.append({d.problem.label() for d in data})
        return fit_rules.fit(data, evals=3)

    monkeypatch.setattr(refit_sets, "fit", quick_fit)
    out = tmp_path / "refit.json"
    assert refit_sets.main(["--out", str(out), H200, RERECORD]) == 0
    result = json.loads(out.read_text())
    h200 = {p.label() for p in refit_sets.load_dataset(H200, refit_sets.get_family("matmul")).problems}
    rerecord = {p.label() for p in refit_sets.load_dataset(RERECORD, refit_sets.get_family("matmul")).problems}
    assert fitted_on == [rerecord, h200]  # never on the grid it scores
    assert set(result["held_out"]) == {H200, RERECORD}
    for path, labels in ((H200, h200), (RERECORD, rerecord)):
        row = result["held_out"][path]
        assert row["fitted_on"] == [p for p in (H200, RERECORD) if p != path]
        assert set(row["refit_constants"]) == set(fit_rules.SAVED)
        for arm in ("shipped", "refit"):
            scored = row[arm]
            assert scored["problems"] == len(labels) and set(scored["per_problem_regret"]) == labels
            assert scored["within_2pct"] == sum(r <= 0.02 for r in scored["per_problem_regret"].values())
            assert all(r >= 0 for r in scored["per_problem_regret"].values())
            reach = scored["per_problem_configs_to_2pct"].values()
            assert all(n is None or 1 <= n <= refit_sets.LONGEST for n in reach)
    assert result["shipped_constants"]["mma_half_n"] == refit_sets.DEFAULT_CONSTANTS.mma_half_n

    fitted_on.clear()  # --held-out: that grid alone is scored, fitted on the other
    assert refit_sets.main(["--out", str(out), "--held-out", RERECORD, H200, RERECORD]) == 0
    assert fitted_on == [h200] and set(json.loads(out.read_text())["held_out"]) == {RERECORD}


def test_one_grid_alone_is_refused_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "refit.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench/refit_sets.py"), "--out", str(out), H200], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "refit_sets.py: error: give at least two datasets (got 1): each is scored with constants fitted on the others"]
    assert not out.exists()


def test_a_held_out_grid_that_is_not_among_the_datasets_is_refused_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "refit.json"
    argv = ["--out", str(out), "--held-out", "nope.gz", H200, RERECORD]
    proc = subprocess.run([sys.executable, str(REPO / "bench/refit_sets.py"), *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("refit_sets.py: error: --held-out 'nope.gz' is not among the datasets given (")
    assert not out.exists()


def test_a_grid_with_a_problem_no_config_was_timed_on_is_refused_in_one_line(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in gzip.open(RERECORD, "rt", encoding="utf-8")]
    first = next(r["problem"] for r in rows if "problem" in r)
    for r in rows:
        if r.get("problem") == first and r.get("status") == "ok":
            r.update(status="crashed", median_ms=None, p20_ms=None, p80_ms=None, min_ms=None, message="killed")
    broken = tmp_path / "broken.jsonl"
    broken.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "refit.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench/refit_sets.py"), "--out", str(out), str(broken), H200],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    label = f"M={first['M']} N={first['N']} K={first['K']} {first['dtype']}"
    assert line == f"refit_sets.py: error: {broken}: {label} has no timed config, so no optimum to score or fit against"
    assert not out.exists()


def _tile(bm: int, bn: int, warps: int, stages: int = 3) -> tuple[int, ...]:
    return (bm, bn, 64, 8, warps, stages)


def test_the_shape_shift_cancels_a_level_shift_and_shows_a_shape_that_moved() -> None:
    a = {"p": {_tile(128, 128, 8): 1.0, _tile(128, 256, 8): 0.9, _tile(64, 64, 4): 2.0, _tile(64, 64, 4, 4): 2.2}}
    # the whole problem 10% slower (another clock), and 128x256 a further 5% slower
    b = {"p": {c: t * 1.1 * (1.05 if c[:2] == (128, 256) else 1.0) for c, t in a["p"].items()}}
    shift = order_compare.shape_shift(a, b)
    assert set(shift) == {"128x128 w8", "128x256 w8", "64x64 w4"}
    assert shift["64x64 w4"] == {"configs": 2, "mean_log_shift": 0.0}
    assert shift["128x128 w8"]["mean_log_shift"] == 0.0
    assert shift["128x256 w8"]["mean_log_shift"] == pytest.approx(math.log(1.05), abs=1e-4)


def test_the_shape_shift_reads_only_configs_both_recordings_timed() -> None:
    a = {"p": {_tile(128, 128, 8): 1.0, _tile(64, 64, 4): 2.0}, "only-a": {_tile(64, 64, 4): 1.0}}
    b = {"p": {_tile(128, 128, 8): 1.0, _tile(128, 256, 8): 0.5}}
    assert order_compare.shape_shift(a, b) == {}  # one config in common: no shift to read


def test_the_pooled_shift_keeps_each_pairs_problems_apart_and_reads_as_the_models_order_mark() -> None:
    # the same label in two pairs: two problems, each with its own level
    a1 = {"p": {_tile(128, 128, 8): 1.0, _tile(128, 256, 8): 1.0, _tile(64, 64, 4): 1.0}}
    b1 = {"p": {_tile(128, 128, 8): 2.0, _tile(128, 256, 8): 2.0 * 1.04, _tile(64, 64, 4): 2.0}}
    a2 = {"p": {_tile(128, 128, 8): 3.0, _tile(128, 256, 8): 3.0, _tile(64, 64, 4): 3.0}}
    b2 = {"p": {_tile(128, 128, 8): 1.5, _tile(128, 256, 8): 1.5 * 1.02, _tile(64, 64, 4): 1.5}}
    out = order_compare.pooled({"one": (a1, b1), "two": (a2, b2)})
    assert out["pairs"] == ["one", "two"] and out["problems"] == 2
    assert out["shape_shift"]["128x256 w8"]["configs"] == 2
    assert out["order_mark"]["128,256,8"] == pytest.approx(round(math.log(1.04 * 1.02) / 2, 4))
    assert out["order_mark"]["128,128,8"] == 0.0 and out["order_mark"]["64,64,4"] == 0.0


def test_the_pooled_h200_pair_gives_the_shipped_order_mark() -> None:
    from tilepilot.agents.tile_model import ORDER_MARK

    out = order_compare.pooled({"h200": (order_compare.load(H200), order_compare.load(RERECORD))})
    assert {tuple(int(x) for x in k.split(",")): v for k, v in out["order_mark"].items()} == dict(ORDER_MARK)


def test_a_pair_named_twice_is_refused_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "shift.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench/order_compare.py"), "--pool", "--out", str(out),
                           f"x={H200},{RERECORD}", f"x={H200},{RERECORD}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line == "order_compare.py: error: pair name 'x' given twice: name each pair once"
    assert not out.exists()
