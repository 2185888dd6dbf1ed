"""bench/sibling_gpu.py on the recorded grids (`--replay`): each device's campaigns run through the
real driver, the warm one in a store holding the sibling device's campaign, whose results correct
the `rules` model (the note names the sibling device); a device with no sibling is refused in one
line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TILEPILOT_RULES_CONSTANTS")}
    return subprocess.run([sys.executable, str(REPO / "bench" / "sibling_gpu.py"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.parametrize(("device", "source", "problem"), [
    ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "M=512 N=32001 K=4096 bf16"),
    ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "M=1000 N=3000 K=2000 bf16"),
])
def test_each_devices_campaign_is_corrected_by_the_siblings_results(tmp_path: Path, device: str, source: str,
                                                                     problem: str) -> None:
    out = tmp_path / "out.json"
    proc = _run(tmp_path, "--replay", "--device", device, "--out", str(out), "--work", str(tmp_path / "w"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["this_device"] == device and report["source_device"] == [source]
    warm, cold = report["warm"], report["cold"]
    assert any(n.startswith(f"rules: the tile model for {problem} corrected by 32 results of ")
               and f" on the {source}, " in n for n in warm["notes"]), warm["notes"]
    assert not any("corrected by" in n for n in cold["notes"])
    # on the recorded grids the corrected model's first config is the optimum; cold takes longer
    assert warm["winner_trial"] == 1 and cold["winner_trial"] > 1
    assert warm["winner_ms"] <= cold["winner_ms"]


def test_a_device_without_a_sibling_is_refused_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc = _run(tmp_path, "--replay", "--device", "NVIDIA A100-SXM4-80GB", "--out", str(out),
                "--work", str(tmp_path / "w"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "sibling_gpu.py: error: --device 'NVIDIA A100-SXM4-80GB' has no sibling recorded here; this runs on an "
        "H100 SXM or an H200"]
    assert not out.exists()
    proc = _run(tmp_path, "--replay", "--out", str(out), "--work", str(tmp_path / "w"))
    assert proc.returncode == 2 and "needs --device" in proc.stderr and "Traceback" not in proc.stderr
