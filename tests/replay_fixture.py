"""A small replay dataset written by the tests themselves.

SYNTHETIC: the timings come from a formula, not from a GPU. They exercise the driver's
mechanics (budgets, resume, reuse, winners); the measured data lives in data/replay/.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

PROBLEMS = [
    {"M": 512, "N": 512, "K": 512, "dtype": "fp16"},
    {"M": 64, "N": 1024, "K": 2048, "dtype": "bf16"},
]
GRID = {
    "BLOCK_SIZE_M": (64, 128),
    "BLOCK_SIZE_N": (64, 128),
    "BLOCK_SIZE_K": (32, 64),
    "GROUP_SIZE_M": (8,),
    "num_warps": (4, 8),
    "num_stages": (3, 4),
}


def synthetic_ms(problem: dict, config: dict) -> float:
    m_waste = max(1.0, config["BLOCK_SIZE_M"] / max(problem["M"], 1))
    return round(0.01 * m_waste * (1 + abs(config["num_stages"] - 3.4)) * (1 + 0.1 * (config["num_warps"] == 8))
                 * (1 + 0.05 * (config["BLOCK_SIZE_K"] == 32)) * (256 / config["BLOCK_SIZE_N"]) ** 0.3, 6)


def write_dataset(path: Path) -> Path:
    lines = []
    for problem in PROBLEMS:
        for values in itertools.product(*GRID.values()):
            config = dict(zip(GRID, values, strict=True))
            status, median, message = "ok", synthetic_ms(problem, config), ""
            if config["BLOCK_SIZE_M"] == 128 and config["BLOCK_SIZE_N"] == 128 and config["num_stages"] == 4:
                status, median, message = "out_of_resources", None, "synthetic: shared memory"
            lines.append(json.dumps({
                "kernel": "matmul", "problem": problem, "config": config, "status": status,
                "median_ms": median, "p20_ms": median and median * 0.99, "p80_ms": median and median * 1.01,
                "reps": 50 if median else 0, "message": message, "device": "synthetic device",
                "torch": "0.0", "triton": "0.0", "recorded_at": "2026-11-21"}))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_campaign(path: Path, *, name: str = "t", proposer: str = "random", budget: int = 6, extra: str = "") -> Path:
    path.write_text(f'[campaign]\nname = "{name}"\nkernel = "matmul"\nproposer = "{proposer}"\n'
                    f"budget = {budget}\nseed = 1\n{extra}")
    return path
