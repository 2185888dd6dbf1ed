"""A store for the export tests: a grid campaign replayed on the synthetic dataset of
`replay_fixture`, over more problems, so that the winners differ with M.

SYNTHETIC: the timings come from `replay_fixture.synthetic_ms` with one change (large M tiles
pay off on large M, narrow N tiles on tiny M); they exercise the exports, not a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests import replay_fixture

TOKEN_COUNTS = (1, 16, 64, 256, 1024, 4096)
PROBLEMS = [*({"M": m, "N": 1024, "K": 2048, "dtype": "bf16"} for m in TOKEN_COUNTS),
            {"M": 512, "N": 512, "K": 512, "dtype": "fp16"}]
_BASE_MS = replay_fixture.synthetic_ms


def tiered_ms(problem: dict[str, Any], config: dict[str, Any]) -> float:
    ms = _BASE_MS(problem, config)
    if problem["M"] >= 256 and config["BLOCK_SIZE_M"] == 128:
        ms *= 0.9
    if problem["M"] <= 16 and config["BLOCK_SIZE_N"] == 64:
        ms *= 0.8
    return round(ms, 6)


def build_store(folder: Path, *, name: str = "grid", proposer: str = "grid", budget: int = 32,
                db_name: str = "export.db") -> Path:
    """Replay a campaign over PROBLEMS into folder/db_name; returns the database path."""
    from tilepilot.orchestrator.tune import TuneOptions, tune

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(replay_fixture, "PROBLEMS", PROBLEMS)
        mp.setattr(replay_fixture, "synthetic_ms", tiered_ms)
        dataset = replay_fixture.write_dataset(folder / "tiered.jsonl")
    campaign = replay_fixture.write_campaign(folder / f"{name}.toml", name=name, proposer=proposer, budget=budget)
    db = folder / db_name
    tune(TuneOptions(campaign=campaign, backend="replay", dataset=dataset, db=db))
    return db
