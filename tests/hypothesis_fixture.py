"""A replay dataset whose parameter effects are known, written by the tests themselves.

SYNTHETIC: the timings come from a formula with planted effects and seeded noise, not from a
GPU. They let the tests check the hypothesis miner and judge against a known truth:

- BLOCK_SIZE_M: 64 is 1.40x as fast as 128 when M <= 64; 128 is 1.10x as fast when M >= 256;
- num_stages: 4 is 1.12x as fast as 3 when K >= 4096; 3 is 1.04x as fast when K < 4096;
- BLOCK_SIZE_N: 128 is 1.06x as fast as 64 everywhere;
- num_warps and BLOCK_SIZE_K: no effect (noise only).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from pathlib import Path

from tilepilot.agents.pairs import Observation
from tilepilot.experiments import Config, Problem

DEVICE = "synthetic device"
PROBLEMS = [
    {"M": 16, "N": 4096, "K": 4096, "dtype": "bf16"},
    {"M": 64, "N": 4096, "K": 8192, "dtype": "bf16"},
    {"M": 32, "N": 2048, "K": 1024, "dtype": "bf16"},
    {"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"},
    {"M": 2048, "N": 2048, "K": 8192, "dtype": "fp16"},
    {"M": 4096, "N": 1024, "K": 1024, "dtype": "fp16"},
]
GRID = {
    "BLOCK_SIZE_M": (64, 128),
    "BLOCK_SIZE_N": (64, 128),
    "BLOCK_SIZE_K": (32, 64),
    "GROUP_SIZE_M": (8,),
    "num_warps": (4, 8),
    "num_stages": (3, 4),
}
NOISE = 0.01  # sd of the log-time noise
SPREAD = 0.02  # rel_spread of every timing


def synthetic_ms(problem: dict, config: dict) -> float:
    log_t = math.log(0.05 * problem["M"] * problem["N"] * problem["K"] / 4096**3 + 0.01)
    if config["BLOCK_SIZE_M"] == 128:
        log_t += math.log(1.40) if problem["M"] <= 64 else -math.log(1.10)
    if config["num_stages"] == 3:
        log_t += math.log(1.12) if problem["K"] >= 4096 else -math.log(1.04)
    if config["BLOCK_SIZE_N"] == 64:
        log_t += math.log(1.06)
    seed = hashlib.sha256(json.dumps([problem, config], sort_keys=True).encode()).digest()
    log_t += random.Random(seed).gauss(0.0, NOISE)
    return round(math.exp(log_t), 7)


def configs() -> list[dict]:
    return [dict(zip(GRID, v, strict=True)) for v in itertools.product(*GRID.values())]


def write_dataset(path: Path) -> Path:
    lines = []
    for problem in PROBLEMS:
        for config in configs():
            ms = synthetic_ms(problem, config)
            lines.append(json.dumps({
                "kernel": "matmul", "problem": problem, "config": config, "status": "ok", "median_ms": ms,
                "p20_ms": ms * (1 - SPREAD / 2), "p80_ms": ms * (1 + SPREAD / 2), "reps": 50, "device": DEVICE,
                "torch": "0.0", "triton": "0.0", "recorded_at": "2026-11-21"}))
    path.write_text("\n".join(lines) + "\n")
    return path


def grid_observations(problems: list[dict] | None = None) -> list[Observation]:
    """Every (problem, config) of the grid as an observation; the key names both."""
    out = []
    for problem in problems or PROBLEMS:
        for config in configs():
            ms = synthetic_ms(problem, config)
            p, c = Problem.of(problem), Config.of(config)
            out.append(Observation(f"{p.key()}|{c.key()}", p, c, ms, SPREAD))
    return out
