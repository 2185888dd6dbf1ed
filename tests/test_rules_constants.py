"""The rules model's constants chosen at tune time: TILEPILOT_RULES_CONSTANTS names a JSON file
of `Constants` fields (refitted for another device, or without the problems a check scores).
A bad file is a one-line error before anything is written."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.replay_fixture import write_campaign, write_dataset
from tilepilot.agents.base import ProposerContext, SearchState
from tilepilot.agents.rules import RulesProposer
from tilepilot.agents.tile_model import CONSTANTS_ENV, DEFAULT_CONSTANTS, configured_constants, load_constants
from tilepilot.experiments import Config, InputError, Problem
from tilepilot.kernels import get_family

REPO = Path(__file__).resolve().parents[1]
SQUARE = Problem.of({"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"})


def write_json(path: Path, value: object) -> Path:
    path.write_text(json.dumps(value))
    return path


def test_a_file_overrides_the_constants_it_names_and_keeps_the_rest(tmp_path: Path) -> None:
    k = load_constants(write_json(tmp_path / "k.json", {"l2_gbps": 5000, "fill_us": 0.5}))
    assert (k.l2_gbps, k.fill_us) == (5000.0, 0.5)
    back = dataclasses.replace(k, l2_gbps=DEFAULT_CONSTANTS.l2_gbps, fill_us=DEFAULT_CONSTANTS.fill_us)
    assert back == DEFAULT_CONSTANTS


def test_the_order_mark_scales_each_tile_shape_and_a_file_may_leave_it_off(tmp_path: Path) -> None:
    from tilepilot.agents.tile_model import ORDER_MARK, estimate

    off = load_constants(write_json(tmp_path / "k.json", {"order_mark": 0}))
    assert off == dataclasses.replace(DEFAULT_CONSTANTS, order_mark=0.0)
    half = dataclasses.replace(DEFAULT_CONSTANTS, order_mark=0.5)
    for (bm, bn, warps), mark in [((128, 128, 8), ORDER_MARK[128, 128, 8]), ((256, 128, 8), ORDER_MARK[256, 128, 8]),
                                  ((64, 64, 4), ORDER_MARK[64, 64, 4]), ((32, 64, 4), 0.0)]:
        c = Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8,
                       "num_warps": warps, "num_stages": 3})
        bare = estimate(SQUARE, c, k=off).predicted_ms
        assert estimate(SQUARE, c).predicted_ms == pytest.approx(bare * math.exp(mark), rel=1e-12)
        assert estimate(SQUARE, c, k=half).predicted_ms == pytest.approx(bare * math.exp(mark / 2), rel=1e-12)
    # the rotating recording's lean: 128x128 with 8 warps read slow there, 128x256 and 256x128 fast
    assert ORDER_MARK[128, 128, 8] < 0 < ORDER_MARK[128, 256, 8] and ORDER_MARK[256, 128, 8] > 0


def test_fits_read_the_grid_as_recorded_without_the_order_mark() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    import fit_rules  # type: ignore[import-not-found]

    assert fit_rules.NEUTRAL.order_mark == 0.0
    assert DEFAULT_CONSTANTS.order_mark == 1.0


def test_without_the_variable_the_shipped_constants_are_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONSTANTS_ENV, raising=False)
    assert configured_constants() == DEFAULT_CONSTANTS


@pytest.mark.parametrize(("content", "message"), [
    ({"l2_gbsp": 1.0}, "unknown rules constant 'l2_gbsp'"),
    ({"l2_gbps": -1}, "rules constant l2_gbps=-1 "),
    ({"l2_gbps": "fast"}, "rules constant l2_gbps='fast' "),
    ({"l2_gbps": True}, "rules constant l2_gbps=True "),
    ({"l2_gbps": 0}, "rules constant l2_gbps=0 "),
    ({"order_mark": 1.5}, "rules constant order_mark=1.5 .* must be from 0 to 1"),
    ({"order_mark": -0.5}, "rules constant order_mark=-0.5 .* must be from 0 to 1"),
    ([1, 2], "must be a JSON object"),
])
def test_bad_constants_are_one_line_errors_naming_the_value(tmp_path: Path, content: object, message: str) -> None:
    with pytest.raises(InputError, match=message) as e:
        load_constants(write_json(tmp_path / "k.json", content))
    assert "\n" not in str(e.value)


def test_unreadable_and_non_json_files_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read the rules constants"):
        load_constants(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InputError, match="are not JSON"):
        load_constants(tmp_path / "bad.json")


def test_the_rules_proposer_ranks_with_the_configured_constants(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    family = get_family("matmul")
    ctx = ProposerContext("matmul", SQUARE, family.space(), 0, 8)
    monkeypatch.delenv(CONSTANTS_ENV, raising=False)
    shipped = RulesProposer(ctx)
    # A device whose L2 feeds operands 8x slower and whose MMA rate halves at a far larger tile:
    # a different model, so a different first proposal order.
    slow = write_json(tmp_path / "slow.json", {"l2_gbps": 1000, "sm_gbps": 12, "mma_half_area": 32768})
    monkeypatch.setenv(CONSTANTS_ENV, str(slow))
    refitted = RulesProposer(ctx)
    assert refitted.constants == load_constants(slow) and shipped.constants == DEFAULT_CONSTANTS
    first = [c.config for c in shipped.propose(SearchState(), 8)]
    second = [c.config for c in refitted.propose(SearchState(), 8)]
    assert all(isinstance(c, Config) for c in first + second)
    assert first != second


def test_tune_refuses_a_bad_constants_file_before_writing_anything(tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "d.jsonl")
    campaign = write_campaign(tmp_path / "c.toml", proposer="rules")
    bad = write_json(tmp_path / "k.json", {"nope": 1})
    proc = subprocess.run(
        [sys.executable, "-m", "tilepilot", "tune", str(campaign), "--backend", "replay", "--dataset", str(dataset),
         "--db", str(tmp_path / "t.db")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), CONSTANTS_ENV: str(bad)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "unknown rules constant 'nope'" in proc.stderr
    assert CONSTANTS_ENV in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "t.db").exists()


def test_the_fit_measures_how_much_more_the_model_errs_where_both_operands_load_element_by_element() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    import fit_rules  # type: ignore[import-not-found]

    from tilepilot.orchestrator.replay import DATA_DIR, load_dataset

    ds = load_dataset(DATA_DIR / "matmul-h100.jsonl.gz", get_family("matmul"))
    data = fit_rules.problem_data(ds, ds.problems)
    both = [d for d in data if fit_rules.both_scalar(d.problem)]
    assert [d.problem.label() for d in both] == ["M=3000 N=5000 K=1000 fp16", "M=1500 N=1500 K=1500 fp16"]
    # measured on the grid as recorded (rotating order): without the order mark, as fits read it
    ratio = fit_rules.error_variance_ratio(data, dataclasses.replace(DEFAULT_CONSTANTS, order_mark=0.0))
    assert ratio == pytest.approx(DEFAULT_CONSTANTS.scalar_error_var, rel=0.01)  # what the shipped fit measured
    assert ratio > 4
    assert fit_rules.error_variance_ratio([d for d in data if d not in both], DEFAULT_CONSTANTS) == 1.0  # no evidence


def test_a_fit_models_the_grid_as_the_kernel_that_recorded_it_ran() -> None:
    """The grids recorded before FEW_ROWS ran a grouped kernel that wrapped A's rows past M: the
    fit reads their configs without VARIANT (a kernel that wraps them); a grid recorded since keeps
    it (the grouped kernel masks them)."""
    sys.path.insert(0, str(REPO / "bench"))
    import fit_rules  # type: ignore[import-not-found]

    from tilepilot.agents.tile_model import estimate
    from tilepilot.orchestrator.replay import DATA_DIR, load_dataset

    family = get_family("matmul")
    for name, wraps in (("matmul-h100.jsonl.gz", True), ("matmul-h200-fresh.jsonl.gz", False)):
        ds = load_dataset(DATA_DIR / name, family)
        decode = next(p for p in ds.problems if int(p["M"]) < 8)
        (data,) = fit_rules.problem_data(ds, [decode])
        assert all(("VARIANT" not in c) == wraps for c in data.configs)
        assert all(estimate(decode, c).tile.wraps_rows == wraps for c in data.configs)
        assert {c.key() for c in data.configs} <= {fit_rules._as_run(c, wraps).key() for c in ds.records(decode)}
