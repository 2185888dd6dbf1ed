"""bench/gpu_campaign.py's choice of the recorded grid an --arbitrate run re-times against: the
result's own grid, unless --dataset names one, with a one-line refusal where it cannot tell."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import gpu_campaign  # noqa: E402

from tilepilot.experiments import InputError  # noqa: E402


def test_arbitrate_reads_the_grid_the_result_was_checked_against(tmp_path: Path) -> None:
    result = tmp_path / "campaign.json"
    result.write_text(json.dumps({"dataset": "matmul-h200-fresh8.jsonl.gz", "per_problem": []}))
    assert gpu_campaign.dataset_of(result) == str(REPO / "data" / "replay" / "matmul-h200-fresh8.jsonl.gz")
    assert gpu_campaign.dataset_of(None) == str(REPO / "data" / "replay" / "matmul-h100.jsonl.gz")
    result.write_text(json.dumps({"dataset": "matmul-h100.jsonl"}))  # as the earliest results name it
    assert gpu_campaign.dataset_of(result) == str(REPO / "data" / "replay" / "matmul-h100.jsonl.gz")


@pytest.mark.parametrize("text, says", [
    ("not json", "not a campaign result"),
    (json.dumps({"per_problem": []}), "not a campaign result"),
    (json.dumps({"dataset": "matmul-never-recorded.jsonl.gz"}), "give --dataset"),
])
def test_arbitrate_refuses_a_result_without_a_grid_in_one_line(tmp_path: Path, text: str, says: str) -> None:
    result = tmp_path / "campaign.json"
    result.write_text(text)
    with pytest.raises(InputError, match=says):
        gpu_campaign.dataset_of(result)
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_campaign.py"), "--arbitrate", str(result),
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpu_campaign.py: error: --arbitrate ") and says in lines[0]
    assert "Traceback" not in proc.stderr and not out.exists()
