"""The campaign files the benchmarks write (bench/bench_env.campaign_toml, used by gpu_campaign,
history_gpu, stability, campaign_replay and throughput) are campaigns `tilepilot tune` accepts,
with the settings, space limits, configs and problems they were given."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from bench_env import campaign_toml  # type: ignore[import-not-found]  # noqa: E402

from tilepilot.agents.registry import proposer_names  # noqa: E402
from tilepilot.experiments.campaign import parse_campaign  # noqa: E402
from tilepilot.kernels.registry import problem_parsers  # noqa: E402


def parse(text: str):  # type: ignore[no-untyped-def]
    return parse_campaign(text, kernels=problem_parsers(), proposers=proposer_names())


def test_a_campaign_with_space_configs_problems_and_settings_reads_back() -> None:
    space = {"BLOCK_SIZE_M": [64, 128], "num_warps": [4, 8], "FAULT": ["none"]}
    oob = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8, "num_warps": 4,
           "num_stages": 3, "FAULT": "oob"}
    problems = [{"M": 256, "N": 512, "K": 128, "dtype": "fp16"}, {"M": 128, "N": 128, "K": 1000, "dtype": "bf16"}]
    text = campaign_toml("probe", "matmul_faults", "random", 7, seed=3, hypothesis_share=0, space=space,
                         configs=[oob], problems=problems)
    c = parse(text)
    assert (c.name, c.kernel, c.proposer, c.budget, c.seed) == ("probe", "matmul_faults", "random", 7, 3)
    assert c.hypothesis_share == 0
    assert {k: list(v) for k, v in c.space} == space
    assert [dict(x) for x in c.configs] == [oob]
    assert [p.as_dict() for p in c.problems] == problems


def test_a_bare_campaign_has_only_its_campaign_table_and_problems() -> None:
    text = campaign_toml("t", "matmul", "rules", 4, problems=[{"M": 64, "N": 64, "K": 64, "dtype": "fp16"}])
    assert "[space]" not in text and "[[configs]]" not in text
    c = parse(text)
    assert (c.proposer, c.budget, c.seed, len(c.problems)) == ("rules", 4, 0, 1)
