"""Every family's baseline does the family's work: it writes `out` or returns its result, and that
result is the reference's answer within the family's tolerance. A baseline that computed nothing
(or whose result a compiler could drop) would make bench/kernels.py compare against no work.
On the CPU with small fp16/fp32 problems; attention's baseline (the flash SDPA backend) is
CUDA-only and is covered by the GPU tests."""

from __future__ import annotations

import pytest

from tilepilot.kernels import get_family
from tilepilot.kernels.base import poison, written

torch = pytest.importorskip("torch")

SMALL = {
    "matmul": {"M": 33, "N": 40, "K": 48, "dtype": "fp16"},
    "softmax": {"rows": 5, "cols": 300, "dtype": "fp32"},
    "rmsnorm": {"rows": 5, "cols": 300, "dtype": "fp32"},
    "layernorm": {"rows": 5, "cols": 300, "dtype": "fp32"},
    "silu_mul_fp8_quant": {"T": 4, "H": 256, "dtype": "fp16"},
    "fused_moe": {"M": 7, "E": 4, "topk": 2, "N": 64, "K": 32, "dtype": "fp16"},
}


@pytest.mark.parametrize("kernel", sorted(SMALL))
def test_the_baseline_computes_the_reference_answer(kernel: str) -> None:
    family = get_family(kernel)
    problem = family.parse_problem(SMALL[kernel])
    inputs = family.make_inputs(problem, 0, "cpu")
    out = family.make_output(problem, inputs)
    run = family.baseline(problem, inputs, out)
    assert run is not None and family.baseline_name
    poison(out)
    got = run()
    assert written(out) or got is not None, "the baseline neither wrote out nor returned a result"
    err = family.error(problem, out if written(out) else got, family.reference(problem, inputs))
    assert 0 <= err <= family.tolerance(problem), err


@pytest.mark.parametrize("kernel", sorted(SMALL))
def test_bench_kernels_baseline_arm_is_checked_and_keeps_its_name(kernel: str) -> None:
    # bench/kernels.py's baseline arm, as bench_problem adds it: checked against the reference,
    # ready to time, the baseline's name kept in the arm's notes
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import kernels  # type: ignore[import-not-found]

    family = get_family(kernel)
    arms = kernels.Arms(family, family.parse_problem(SMALL[kernel]), None, device="cpu")
    arms.baseline("baseline", name=family.baseline_name)
    assert arms.notes["baseline"]["name"] == family.baseline_name
    assert "error" not in arms.notes["baseline"] and "baseline" in arms.launches
