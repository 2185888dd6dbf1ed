"""The matmul family on the CPU side: problems, space, constraints, work, specialisation."""

from __future__ import annotations

import pytest

from tilepilot.experiments import Config, InputError, Problem
from tilepilot.kernels.faults import FAULTS
from tilepilot.kernels.matmul import MatmulFamily, pipelined_shared_bytes
from tilepilot.kernels.registry import get_family

FAMILY = MatmulFamily()


def problem(m: int = 64, n: int = 64, k: int = 64, dtype: str = "bf16") -> Problem:
    return FAMILY.parse_problem({"M": m, "N": n, "K": k, "dtype": dtype})


def config(bm: int = 128, bn: int = 128, bk: int = 64, g: int = 8, w: int = 4, s: int = 3) -> Config:
    return Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": g,
                      "num_warps": w, "num_stages": s})


def test_parse_problem_keeps_keys_in_order() -> None:
    p = FAMILY.parse_problem({"dtype": "fp16", "K": 65, "N": 47, "M": 33})
    assert list(p) == ["M", "N", "K", "dtype"] and p.label() == "M=33 N=47 K=65 fp16"


@pytest.mark.parametrize(("raw", "pattern"), [
    ({"M": 1, "N": 1, "K": 1, "dtype": "fp32"}, r"dtype='fp32' is not one of \{bf16, fp16\}"),
    ({"M": 0, "N": 1, "K": 1, "dtype": "bf16"}, r"M=0 is not a positive integer up to 65536"),
    ({"M": 1, "N": 65537, "K": 1, "dtype": "bf16"}, r"N=65537 is not a positive integer up to 65536"),
    ({"M": 1, "N": 1, "K": True, "dtype": "bf16"}, r"K=True is not a positive integer"),
    ({"M": 1.5, "N": 1, "K": 1, "dtype": "bf16"}, r"M=1.5 is not a positive integer"),
    ({"N": 1, "K": 1, "dtype": "bf16"}, r"missing M"),
    ({"M": 1, "N": 1, "K": 1, "dtype": "bf16", "batch": 2},
     r"unknown matmul problem key 'batch' \(allowed: M, N, K, dtype\)"),
    ({"M": 65536, "N": 65536, "K": 16, "dtype": "bf16"}, r"C \(M×N\) has 4294967296 elements"),
])
def test_parse_problem_rejects_with_one_line_naming_key_and_allowed(raw: dict, pattern: str) -> None:
    with pytest.raises(InputError, match=pattern) as err:
        FAMILY.parse_problem(raw)
    assert "\n" not in str(err.value)


def test_space_has_the_tutorial_parameters() -> None:
    space = FAMILY.space()
    assert space.names == ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
                           "num_stages")
    assert space.size == 5 * 5 * 5 * 4 * 3 * 4


def test_shared_memory_constraint_names_the_need_and_the_limit() -> None:
    big = config(256, 256, 128, s=3)
    reason = FAMILY.space().check(big, problem())
    assert reason is not None and "393216 B" in reason and "232448 B" in reason
    assert FAMILY.space().check(config(128, 256, 64, s=3), problem()) is None
    assert pipelined_shared_bytes(config(128, 256, 64, s=3), problem()) == 147456


def test_default_config_is_valid_for_any_problem() -> None:
    for p in (problem(1, 4096, 4096), problem(3000, 5000, 1000, "fp16"), problem()):
        cfg = FAMILY.default_config(p)
        assert FAMILY.space().check(cfg, p) is None
        assert FAMILY.space().parse(cfg.as_dict()) == cfg


def test_work_counts_flops_and_each_operand_once() -> None:
    w = FAMILY.work(problem(4096, 2048, 1024))
    assert w.flops == 2 * 4096 * 2048 * 1024
    assert w.bytes == 2 * (4096 * 1024 + 1024 * 2048 + 4096 * 2048)
    assert w.tflops(1.0) == pytest.approx(w.flops / 1e-3 / 1e12)


def test_specialisation_is_shared_by_aligned_problems_only() -> None:
    cfg = config()
    spec = FAMILY.specialisation
    assert spec(problem(4096, 4096, 4096), cfg) == spec(problem(2048, 8192, 1024), cfg)
    assert spec(problem(4096, 4096, 4096), cfg) != spec(problem(4096, 4096, 4096, "fp16"), cfg)
    assert spec(problem(1, 4096, 4096), cfg) != spec(problem(16, 4096, 4096), cfg)
    assert spec(problem(3000, 5000, 1000), cfg) != spec(problem(3008, 5008, 1008), cfg)


def test_kernel_version_hashes_the_kernel_source() -> None:
    version = FAMILY.kernel_version()
    assert version.startswith("1+") and len(version) == 2 + 12
    assert get_family("matmul_faults").kernel_version() != version


def test_faults_family_extends_the_space_with_fault() -> None:
    faults = get_family("matmul_faults")
    assert faults.space().names[-1] == "FAULT" and faults.space().param("FAULT").choices == FAULTS
    cfg = faults.default_config(problem())
    assert cfg["FAULT"] == "none" and faults.space().check(cfg, problem()) is None
    assert "FAULT:oob" in faults.specialisation(problem(), Config.of({**cfg.as_dict(), "FAULT": "oob"}))
