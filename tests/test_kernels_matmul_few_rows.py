"""FEW_ROWS: where M is below a tile's rows (the decode shapes), the grouped and split-K kernels mask
A's rows past M instead of wrapping them (which loads A's M rows BLOCK_SIZE_M / M times over, from
the same addresses in every program). The host sets it, the compiled kernel's specialisation says
so, and the result is unchanged (the interpreter tests of tests/test_kernels_matmul_variants.py run
M = 1 on 16-row tiles through every variant); on the GPU, the AOT kernel is the JIT's with it."""

from __future__ import annotations

import pytest

from tilepilot.experiments import Config
from tilepilot.kernels import get_family
from tilepilot.kernels.matmul import _kernel, few_rows

FAMILY = get_family("matmul")


def cfg(variant: str, bm: int, split: int = 1) -> Config:
    return Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8, "num_warps": 4,
                      "num_stages": 3, "VARIANT": variant, "SPLIT_K": split})


@pytest.mark.parametrize(("variant", "split"), [("grouped", 1), ("splitk", 2), ("splitk_fused", 2)])
@pytest.mark.parametrize(("m", "bm", "expected"), [(1, 16, True), (4, 16, True), (16, 16, False), (32, 64, True),
                                                   (3000, 128, False), (100, 128, True)])
def test_the_pointer_kernels_mask_rows_where_m_is_below_a_tile(variant: str, split: int, m: int, bm: int,
                                                                expected: bool) -> None:
    problem = FAMILY.parse_problem({"M": m, "N": 4096, "K": 4096, "dtype": "bf16"})
    config = cfg(variant, bm, split)
    assert few_rows(problem, config) is expected
    _, _, constexprs = _kernel(problem, config)
    assert constexprs["FEW_ROWS"] is expected
    assert ("FEW_ROWS" in FAMILY.specialisation(problem, config)) is expected


@pytest.mark.parametrize("variant", ["persistent", "tma", "tma_tail", "streamk", "tma_splitk"])
def test_the_other_variants_take_no_few_rows(variant: str) -> None:
    problem = FAMILY.parse_problem({"M": 1, "N": 4096, "K": 4096, "dtype": "bf16"})
    config = cfg(variant, 64, 2 if variant == "tma_splitk" else 1)
    assert not few_rows(problem, config)
    _, _, constexprs = _kernel(problem, config)
    assert "FEW_ROWS" not in constexprs
    assert "FEW_ROWS" not in FAMILY.specialisation(problem, config)


def test_problems_that_differ_in_few_rows_share_no_compiled_kernel() -> None:
    # M=4 and M=3000 are alike to Triton (neither 1 nor a multiple of 16); on 16-row tiles only the
    # first masks its rows, so they must not share a compiled kernel
    config = cfg("grouped", 16)
    small = FAMILY.parse_problem({"M": 4, "N": 4096, "K": 4096, "dtype": "bf16"})
    large = FAMILY.parse_problem({"M": 3000, "N": 4096, "K": 4096, "dtype": "bf16"})
    assert FAMILY.specialisation(small, config) != FAMILY.specialisation(large, config)
