"""The attention model (`agents/attention_model.py`) and the `rules` proposer on flash attention's space.

Timings here are SYNTHETIC (functions of the config written in this file) except where a test reads
a recorded grid of `data/replay/`, which it names.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from tests.proposer_toys import drive
from tests.test_row_model import timed
from tilepilot.agents.attention_model import AttentionConstants, attention_space, estimate_attention
from tilepilot.agents.base import ProposerContext, SearchState
from tilepilot.agents.portfolio import MODEL_PRIOR, PortfolioProposer
from tilepilot.agents.roofline import H100_SXM
from tilepilot.agents.rules import RulesProposer
from tilepilot.experiments import Config, Param, Problem, SearchSpace
from tilepilot.kernels import get_family
from tilepilot.orchestrator.replay import load_dataset

REPO = Path(__file__).resolve().parents[1]
SPACE = get_family("attention").space()


def problem(b: int, h: int, s: int, d: int, causal: bool = False, dtype: str = "bf16") -> Problem:
    return Problem.of({"B": b, "H": h, "S": s, "D": d, "causal": causal, "dtype": dtype})


def config(bm: int, bn: int, warps: int, stages: int, variant: str = "plain") -> Config:
    return Config.of({"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages, "VARIANT": variant})


def rules_for(p: Problem, budget: int = 8, history: object = None) -> RulesProposer:
    return RulesProposer(ProposerContext("attention", p, SPACE, seed=0, budget=budget,
                                         history=history))  # type: ignore[arg-type]


def test_only_the_attention_space_and_problem_are_modelled() -> None:
    names = set(SPACE.names)
    assert attention_space(names, problem(4, 32, 1024, 64))
    assert not attention_space(names, Problem.of({"M": 8, "N": 8, "K": 8, "dtype": "bf16"}))
    assert not attention_space(set(get_family("softmax").space().names), problem(4, 32, 1024, 64))
    assert not attention_space(names, problem(4, 32, 1024, 64, dtype="fp8"))
    toy = SearchSpace((Param("BLOCK_M", (64,)), Param("num_warps", (4,))))
    assert not attention_space(set(toy.names), problem(4, 32, 1024, 64))


def test_shared_memory_decides_the_programs_resident_on_an_sm() -> None:
    p = problem(4, 32, 4096, 128)
    # (3·2·64 + 64)·128·2 = 112 KiB: two to an SM; with 4 stages 144 KiB, one
    assert estimate_attention(p, config(64, 64, 4, 3), H100_SXM).blocks_per_sm == 2
    assert estimate_attention(p, config(64, 64, 4, 4), H100_SXM).blocks_per_sm == 1
    # 5 stages of 128-key tiles: 336 KiB, more than a block can have
    too_big = estimate_attention(p, config(128, 128, 8, 5), H100_SXM)
    assert not too_big.launches and math.isinf(too_big.predicted_ms)


def test_warpgroups_that_split_the_keys_are_slower_than_one_that_holds_them() -> None:
    # 64 queries on 8 warps: two warpgroups of 32 rows, below one MMA's 64; they split the keys
    for p in (problem(4, 32, 4096, 64), problem(1, 16, 512, 64)):
        alone = estimate_attention(p, config(64, 64, 4, 3), H100_SXM)
        split = estimate_attention(p, config(64, 64, 8, 3), H100_SXM)
        assert split.predicted_ms > 1.2 * alone.predicted_ms, p.label()


def test_a_narrow_key_tile_waits_on_shared_memory_for_its_operands() -> None:
    p = problem(4, 32, 4096, 128)
    narrow = config(64, 32, 4, 3)
    fast = dataclasses.replace(AttentionConstants(), smem_bytes_per_clock=1e9)
    assert (estimate_attention(p, narrow, H100_SXM).predicted_ms
            > 1.05 * estimate_attention(p, narrow, H100_SXM, fast).predicted_ms)
    wide = config(64, 64, 4, 3)  # Q and a 64-key K tile stream no slower than their MMA
    assert (estimate_attention(p, wide, H100_SXM).predicted_ms
            == pytest.approx(estimate_attention(p, wide, H100_SXM, fast).predicted_ms))


def test_a_causal_problem_walks_about_half_the_keys() -> None:
    c = config(64, 64, 4, 3)
    full = estimate_attention(problem(4, 32, 8192, 64), c, H100_SXM)
    causal = estimate_attention(problem(4, 32, 8192, 64, causal=True), c, H100_SXM)
    assert causal.steps == pytest.approx(full.steps / 2, rel=0.01)
    assert causal.predicted_ms < 0.55 * full.predicted_ms


def test_a_second_stage_hides_the_loads_the_first_leaves_waiting() -> None:
    p = problem(4, 32, 4096, 64)
    two, three = (estimate_attention(p, config(128, 64, 8, s), H100_SXM) for s in (2, 3))
    assert two.exposed_cycles > three.exposed_cycles and two.predicted_ms > three.predicted_ms


def test_rules_scores_attention_configs_before_any_result_so_the_portfolio_gives_it_the_head_start() -> None:
    p = problem(4, 32, 1024, 64)
    r = rules_for(p)
    scores = r.score([config(64, 64, 4, 3)])
    assert scores[0][0] is not None and "attention model" in scores[0][1]
    first = r.propose(SearchState(), 4)
    assert all(c.predicted_ms is not None for c in first)
    assert "queries a program" in first[0].rationale and "hypothesis" in first[0].rationale
    portfolio = PortfolioProposer(ProposerContext("attention", p, SPACE, seed=0, budget=8))
    try:
        rules = next(m for m in portfolio.members if m.name == "rules")
        assert rules.prior == MODEL_PRIOR
    finally:
        portfolio.close()


def test_measurements_correct_the_attention_model() -> None:
    # SYNTHETIC: configs with 128-key tiles run 3x faster than the model says, the rest as it says
    p = problem(4, 32, 4096, 64)
    r = rules_for(p, budget=40)
    state = drive(r, budget=12, answer=lambda c: timed(p, c, r.prior_ms(c) / (3 if c["BLOCK_N"] == 128 else 1)))
    best = state.best()
    assert best is not None and best.config["BLOCK_N"] == 128


def _wide_keys_fast(p: Problem) -> dict[Config, float]:
    """SYNTHETIC results of `p`: the attention model's time, 3x faster with 128-key tiles."""
    out = {}
    for c in SPACE:
        if SPACE.check(c, p) is None:
            e = estimate_attention(p, c, H100_SXM)
            out[c] = e.predicted_ms / (3.0 if c["BLOCK_N"] == 128 else 1.0)
    return out


def test_an_attention_problem_of_the_store_corrects_the_model_before_any_result() -> None:
    from tests.test_rules import History

    target, near = problem(4, 32, 4096, 64), problem(4, 32, 2048, 64)
    history = History({near: _wide_keys_fast(near)})
    r = rules_for(target, history=history)
    first = r.propose(SearchState(), 4)
    assert all(c.config["BLOCK_N"] == 128 for c in first)
    assert "model ×0.3" in first[0].rationale
    assert any("the nearest attention problem the store holds" in n and "attention model" in n
               for n in r.drain_records().notes)
    cold = rules_for(target)
    assert not all(c.config["BLOCK_N"] == 128 for c in cold.propose(SearchState(), 4))


def test_causal_problems_are_corrected_only_by_causal_ones() -> None:
    from tests.test_rules import History

    target, full = problem(4, 32, 4096, 64, causal=True), problem(4, 32, 2048, 64)
    history = History({full: _wide_keys_fast(full)})
    r = rules_for(target, history=history)
    r.propose(SearchState(), 4)
    assert not r.drain_records().notes and history.asked == []


@pytest.mark.parametrize("grid, configs, within", [
    ("attention-h100", 5, 8),  # the grid the model was written against
    ("attention-h200-fresh2", 10, 16),  # held out: recorded after the model, to decide its last change
    ("attention-h200-fresh3", 10, 16),  # held out from the model as shipped
])
def test_on_recorded_grids_rules_reaches_two_percent_within_a_few_configs(grid: str, configs: int,
                                                                          within: int) -> None:
    # data/replay/GRID.jsonl.gz: rules in batches of 4, each batch measured from the grid
    family = get_family("attention")
    dataset = load_dataset(REPO / f"data/replay/{grid}.jsonl.gz", family)
    hits = 0
    for p in dataset.problems:
        r = RulesProposer(ProposerContext("attention", p, dataset.space(family, p), seed=0, budget=configs))
        state = SearchState()
        while len(state.results) < configs:
            for cand in r.propose(state, 4)[:configs - len(state.results)]:
                result = dataset.result(p, cand.config)
                state.results[cand.config] = result
                r.observe([result])
        optimum = dataset.optimum_ms(p)
        times = [x.median_ms for x in state.results.values() if x.median_ms is not None]
        hits += optimum is not None and min(times) <= optimum * 1.02 + 1e-12
    assert hits >= within
