"""bench/order_mark_sets.py (the tile model with and without its order mark on every recorded grid)
and where the model's mark comes from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tilepilot.agents.tile_model import ORDER_MARK

REPO = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO / "bench/order_mark_sets.py")
sys.path.insert(0, str(REPO / "bench"))
import order_mark_sets  # type: ignore[import-not-found]  # noqa: E402


def test_the_model_carries_the_mark_measured_between_the_rotating_grid_and_its_shuffled_recording() -> None:
    measured = json.loads((REPO / "bench/results/order-shape-shift-h200.json").read_text())
    pair = measured["pairs"]["h200-grid-vs-rerecord-shuffled"]
    assert pair["a"] == "data/replay/matmul-h200.jsonl.gz"
    assert pair["b"] == "data/replay/matmul-h200-rerecord-shuffled.jsonl.gz"
    shifts = {shape: r["mean_log_shift"] for shape, r in pair["shape_shift"].items()}
    assert {f"{bm}x{bn} w{w}": v for (bm, bn, w), v in ORDER_MARK.items()} == shifts


def test_every_grid_named_is_recorded_and_the_mark_comes_from_two_of_them() -> None:
    for grid, order in order_mark_sets.GRIDS.items():
        assert (REPO / "data/replay" / f"{grid}.jsonl.gz").exists(), grid
        assert order in ("rotating", "shuffled")
    assert set(order_mark_sets.MARK_FROM) <= set(order_mark_sets.GRIDS)


def test_both_weights_on_a_grid_summarised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(order_mark_sets, "GRIDS", {"matmul-h200-rerecord-shuffled": "shuffled",
                                                   "matmul-h200-fresh5": "shuffled"})
    out = tmp_path / "o.json"
    assert order_mark_sets.main(["--out", str(out), "--seeds", "1", "--jobs", "1"]) == 0
    result = json.loads(out.read_text())
    assert list(result["marks"]) == ["0", "1"]
    for mark in result["marks"].values():
        rows = mark["grids"]
        assert rows["matmul-h200-rerecord-shuffled"]["problems"] == 4 and rows["matmul-h200-fresh5"]["problems"] == 16
        assert mark["all"]["problems"] == 20
        assert mark["all"]["within_2pct"] == sum(r["within_2pct"] for r in rows.values())
        # the grid the mark was measured on is not held out from it
        assert mark["shuffled_held_out"]["problems"] == 16 and mark["rotating_held_out"]["problems"] == 0
        assert all(len(r["per_problem"]) == r["problems"] for r in rows.values())


@pytest.mark.parametrize(("args", "message"), [
    (["--marks", "2"], "--marks '2': numbers from 0 to 1"),
    (["--marks", "a,b"], "--marks 'a,b': numbers from 0 to 1"),
    (["--seeds", "0"], "--seeds 0: must be 1 or more"),
])
def test_bad_input_is_one_line_and_exit_code_2(tmp_path: Path, args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, SCRIPT, *args, "--out", str(tmp_path / "o.json")],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and message in proc.stderr and not (tmp_path / "o.json").exists(), proc.stderr


def test_an_out_folder_that_does_not_exist_is_refused_before_any_work(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path / "no" / "o.json")],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "its folder does not exist" in proc.stderr
