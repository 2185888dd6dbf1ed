"""The GPU benchmarks, run where there is no CUDA GPU (as on CI), end with one line naming what is
missing and exit code 2, write nothing, and show no traceback (bench_env.run_main)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# script, its arguments besides the output file (given as --out, or last for remeasure_probe.py)
GPU_BENCHMARKS = [
    ("kernels.py", ["--families", "softmax"]), ("timing_quality.py", []),
    ("record.py", ["--problems", "64x4096x4096:bf16"]), ("first_batch.py", []), ("load_probe.py", []),
    ("decode_probe.py", []), ("align_probe.py", []), ("cluster_probe.py", []), ("ctas_probe.py", []),
    ("hostdesc_probe.py", []), ("store_probe.py", []), ("ws_probe.py", []), ("remeasure_probe.py", []),
    ("multicast_probe.py", []), ("pad_probe.py", []), ("group_probe.py", []),
    ("sibling_gpu.py", ["--work", "sibling-work-never-made"]),
    ("arbitrate_sets.py", ["run", "bench/results/arbitrate-sets-h200-plan.json"]),
    ("rows_gpu_campaign.py", ["--families", "softmax", "--db", "rows-never-made.db"]),
]


def _no_cuda() -> bool:
    torch = pytest.importorskip("torch")
    return not torch.cuda.is_available()


@pytest.mark.parametrize("script, args", GPU_BENCHMARKS, ids=[s for s, _ in GPU_BENCHMARKS])
def test_a_gpu_benchmark_without_a_gpu_says_so_in_one_line(tmp_path: Path, script: str, args: list[str]) -> None:
    if not _no_cuda():
        pytest.skip("a CUDA GPU is visible: the benchmark would run")
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    where = [str(out)] if script == "remeasure_probe.py" else ["--out", str(out)]
    proc = subprocess.run([sys.executable, str(REPO / "bench" / script), *args, *where], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error: ") and "GPU" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_the_multicast_probe_names_a_bad_form_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "multicast_probe.py"), "--forms", "tiles,fast",
                           "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert lines == ["multicast_probe.py: error: --forms 'tiles,fast': each must be tiles, persistent, ws or pp"]
    assert not out.exists()
