"""bench/warm_campaigns.py: whole replay campaigns, cold, warm, and warm without the store's learnings,
on one recorded H200 grid with another as the store."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import warm_campaigns  # type: ignore[import-not-found]  # noqa: E402

TARGET = "data/replay/matmul-h200.jsonl.gz"
STORE = "data/replay/matmul-h200-fresh3.jsonl.gz"


def test_each_problem_is_tuned_alone_in_each_arm_and_scored_by_the_grid(tmp_path: Path) -> None:
    out = tmp_path / "warm.json"
    assert warm_campaigns.main(["--dataset", TARGET, "--store", STORE, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    dataset = warm_campaigns.load_dataset(str(REPO / TARGET), warm_campaigns.get_family("matmul"))
    labels = sorted(p.label() for p in dataset.problems)
    assert report["store"]["trials"] == 16 * 32  # a rules campaign of 32 configs on each store problem
    assert report["store"]["learnings"] == len(report["store"]["learning_texts"])
    for arm in warm_campaigns.ARMS:
        rows = report["arms"][arm]["per_problem"]
        assert sorted(rows) == labels
        for label, row in rows.items():
            assert len(row["configs"]) == 8 and len(set(row["configs"])) == 8, (arm, label)
            assert row["regret"] >= 0  # never faster than the grid's optimum
            assert (row["regret"] <= warm_campaigns.TOLERANCE) == math.isfinite(row["to_2pct"])
        summary = report["arms"][arm]["summary"]
        assert summary["within_2pct"] == sum(r["regret"] <= warm_campaigns.TOLERANCE for r in rows.values())
    cold = report["arms"]["cold"]["per_problem"]
    warm = report["arms"]["warm"]["per_problem"]
    assert any(cold[k]["configs"] != warm[k]["configs"] for k in labels)  # the store is read warm, not cold
    if not report["store"]["learnings"]:  # nothing to delete: the same campaigns
        assert warm == report["arms"]["warm-no-learnings"]["per_problem"]
    assert report["command"].startswith("python bench/warm_campaigns.py --dataset")


@pytest.mark.parametrize(("args", "message"), [
    (["--dataset", "nowhere.jsonl.gz", "--store", STORE], "nowhere.jsonl.gz: no such file"),
    (["--dataset", TARGET, "--store", f"{STORE},{TARGET}"], "the store is to hold other grids only"),
    (["--dataset", TARGET, "--store", STORE, "--budget", "0"], "--budget 0: must be at least 1"),
    (["--dataset", TARGET, "--store", STORE, "--out", "no/such/folder/w.json"], "folder no/such/folder does not exist"),
])
def test_bad_input_is_one_line_and_exit_code_2(args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "bench/warm_campaigns.py"), *args],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
