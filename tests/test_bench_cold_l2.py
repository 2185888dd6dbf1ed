"""bench/kernels.py's cold L2: with `--cold-l2 copies` each config and baseline arm of a family
timed cold rotates over copies of the problem's data (as the campaigns' evaluator times), with
`flush` the L2 is zeroed before each launch; each timed arm says which it got. The rotation is
checked on the GPU (copies are CUDA memory); on the CPU, that a bad choice is refused and that
nothing is copied there."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tilepilot.experiments import Config
from tilepilot.kernels import get_family

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import kernels  # type: ignore[import-not-found]  # noqa: E402

TILE = Config.of({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8, "num_warps": 4,
                  "num_stages": 3})


def test_a_bad_cold_l2_is_refused_with_the_choices() -> None:
    family = get_family("matmul")
    with pytest.raises(ValueError, match="cold_l2 must be one of copies, flush, not 'cold'"):
        kernels.Arms(family, family.parse_problem({"M": 8, "N": 8, "K": 8, "dtype": "fp16"}), None, device="cpu",
                     cold_l2="cold")


def test_the_cli_refuses_a_bad_cold_l2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        kernels.main(["--cold-l2", "cold", "--out", "/nonexistent/x.json"])
    assert e.value.code == 2
    err = capsys.readouterr().err  # argparse quotes the choices or not by Python version
    assert "argument --cold-l2: invalid choice: 'cold'" in err and "copies" in err.splitlines()[-1]


@pytest.mark.parametrize(("earlier", "now"), [(None, "copies"), ("copies", "flush"), ("flush", "copies")])
def test_resuming_a_run_with_another_cold_l2_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         earlier: str | None, now: str) -> None:
    # a run's rows are all timed one way: resuming --out with the other is refused before any GPU work,
    # and the file is left as it was (a run from before --cold-l2 has no key: it flushed)
    out = tmp_path / "k.json"
    run = {"command": "python bench/kernels.py", **({"cold_l2": earlier} if earlier else {})}
    out.write_text(json.dumps({"rows": [], "runs": [run]}))
    before = out.read_text()
    with pytest.raises(SystemExit) as e:
        kernels.main(["--cold-l2", now, "--out", str(out)])
    assert e.value.code == 2
    was = earlier or "flush"
    assert (f"--cold-l2 {now}: {out} holds rows timed with --cold-l2 {was}; resume with that or write to "
            "another --out") in capsys.readouterr().err
    assert out.read_text() == before


def test_no_copies_off_the_gpu() -> None:
    family = get_family("matmul")
    arms = kernels.Arms(family, family.parse_problem({"M": 8, "N": 8, "K": 8, "dtype": "fp16"}), None, device="cpu",
                        cold_l2="copies")
    arms.baseline("cublas")
    assert arms.copies == [] and arms.rotated == {} and arms.cold("cublas") == "flush"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_copies_rotate_the_config_and_baseline_arms_and_say_so() -> None:
    from tilepilot.kernels.evaluate import Evaluator
    from tilepilot.kernels.timing import GpuTimer

    family = get_family("matmul")
    problem = family.parse_problem({"M": 64, "N": 4096, "K": 4096, "dtype": "bf16"})
    timer, target = GpuTimer(), Evaluator("gpu").target()
    arms = kernels.Arms(family, problem, target, cold_l2="copies", l2_bytes=timer.l2_bytes)
    # 33 MB of data a copy: enough copies that the others touch twice the L2 between two uses of one
    footprint = (64 * 4096 + 4096 * 4096 + 64 * 4096) * 2
    assert len(arms.copies) >= 2 and (len(arms.copies) - 1) * footprint >= 2 * timer.l2_bytes
    assert arms.copies[0][0] is arms.inputs
    ptrs = {inputs[1].data_ptr() for inputs, _ in arms.copies} | {out.data_ptr() for _, out in arms.copies}
    assert len(ptrs) == 2 * len(arms.copies)  # every copy has its own B and its own output

    arms.config("tile", TILE)
    arms.baseline("cublas")
    probe_out = family.make_output(problem, arms.inputs)
    arms.add("probe", lambda out: family.baseline(problem, arms.inputs, out))
    assert set(arms.rotated) == {"tile", "cublas"} and all(len(v) == len(arms.copies) for v in arms.rotated.values())
    for launch, (inputs, out) in zip(arms.rotated["tile"], arms.copies, strict=True):
        out.zero_()
        launch()
        torch.cuda.synchronize()
        assert family.error(problem, out, family.reference(problem, inputs)) <= family.tolerance(problem)
    timings: dict[str, Any] = arms.time(timer, family.l2_flush)
    assert set(timings) == {"tile", "cublas", "probe"} and all(t.median_ms > 0 for t in timings.values())
    assert arms.cold("tile") == arms.cold("cublas") == f"{len(arms.copies)} copies"
    assert arms.cold("probe") == "flush"
    del probe_out

    flushed = kernels.Arms(family, problem, target, cold_l2="flush", l2_bytes=timer.l2_bytes)
    flushed.config("tile", TILE)
    assert flushed.copies == [] and flushed.rotated == {} and flushed.cold("tile") == "flush"
