"""The rules proposer: its resource model, roofline, explanations and how measurements move it.

Timings here are SYNTHETIC (functions of the config written in this file); nothing is measured.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

import numpy as np
import pytest

from tests.proposer_toys import ENV, drive
from tilepilot.agents.base import ProposerContext, SearchState
from tilepilot.agents.roofline import H100_SXM, problem_roofline, siblings
from tilepilot.agents.rules import RulesProposer, RulesSettings
from tilepilot.agents.rules_text import describe
from tilepilot.agents.tile_model import DEFAULT_CONSTANTS, estimate
from tilepilot.experiments import Config, Param, Problem, Result, SearchSpace, Status, Timing
from tilepilot.kernels.matmul import pipelined_shared_bytes

SQUARE = Problem.of({"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"})
SKINNY = Problem.of({"M": 16, "N": 4096, "K": 4096, "dtype": "bf16"})
# The recorded grid's parameters, with no shared-memory constraint: the model must keep out
# the configs whose pipelined tiles do not fit by itself.
UNCHECKED = SearchSpace((
    Param("BLOCK_SIZE_M", (64, 128, 256)),
    Param("BLOCK_SIZE_N", (64, 128, 256)),
    Param("BLOCK_SIZE_K", (32, 64, 128)),
    Param("GROUP_SIZE_M", (8,)),
    Param("num_warps", (4, 8)),
    Param("num_stages", (3, 4, 5)),
))


def cfg(bm: int, bn: int, bk: int, warps: int, stages: int) -> Config:
    return Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 8,
                      "num_warps": warps, "num_stages": stages})


def rules(problem: Problem = SQUARE, budget: int = 200) -> RulesProposer:
    return RulesProposer(ProposerContext("matmul", problem, UNCHECKED, seed=0, budget=budget))


def timed(problem: Problem, config: Config, ms: float) -> Result:
    t = Timing(median_ms=ms, p20_ms=ms, p80_ms=ms, min_ms=ms, reps=1, l2_flushed=True, method="replay")
    return Result(problem, config, Status.OK, ENV, timing=t)


def test_config_whose_pipelined_tiles_exceed_shared_memory_is_never_proposed() -> None:
    p = rules()
    state = drive(p, budget=len(list(UNCHECKED)), answer=lambda c: timed(SQUARE, c, 1.0))
    too_big = [c for c in UNCHECKED if pipelined_shared_bytes(c, SQUARE) > H100_SXM.smem_per_block]
    assert too_big, "the grid has configs that do not fit"
    assert not set(too_big) & set(state.results)
    assert len(state.results) == len(list(UNCHECKED)) - len(too_big), "every config that fits is proposed"
    assert p.propose(state, 4) == []


def test_accumulator_past_the_register_limit_spills_and_is_predicted_slow() -> None:
    spilling = estimate(SQUARE, cfg(256, 256, 32, 4, 3))
    assert spilling.acc_regs == 256 * 256 / 128
    assert spilling.spilled_regs > 0
    fits = estimate(SQUARE, cfg(128, 128, 32, 4, 3))
    assert fits.acc_regs == 128 and fits.spilled_regs == 0
    assert spilling.predicted_ms > 2 * fits.predicted_ms
    assert "spill" in RulesProposer(ProposerContext("matmul", SQUARE, UNCHECKED, 0, 8))._why(
        cfg(256, 256, 32, 4, 3), 1.0, 0.1, None, 0)


def test_roofline_calls_a_skinny_problem_memory_bound_and_a_square_one_compute_bound() -> None:
    skinny, square = problem_roofline(SKINNY), problem_roofline(SQUARE)
    assert skinny is not None and square is not None
    assert skinny.bound == "memory" and square.bound == "compute"
    assert skinny.intensity < skinny.ridge < square.intensity
    assert "problem memory-bound" in rules(SKINNY).propose(SearchState(), 1)[0].rationale
    assert "problem compute-bound" in rules(SQUARE).propose(SearchState(), 1)[0].rationale


def test_skinny_m_starts_with_the_smallest_block_m() -> None:
    p = rules(SKINNY)
    assert p.propose(SearchState(), 1)[0].config["BLOCK_SIZE_M"] == 64
    launchable = [c for c in UNCHECKED if (e := p.estimate(c)) is not None and e.launches]
    best = {bm: min(p.prior_ms(c) for c in launchable if c["BLOCK_SIZE_M"] == bm) for bm in (64, 128, 256)}
    assert best[64] < best[128] < best[256]


def test_rationale_names_tiles_waves_shared_memory_and_a_hypothesis() -> None:
    for cand in rules().propose(SearchState(), 4):
        why = cand.rationale
        assert "waves on 132 SMs" in why and "stages fit in" in why and "KiB" in why, why
        assert "hypothesis:" in why and "\n" not in why
        assert cand.predicted_ms is not None and cand.predicted_ms > 0
        assert cand.hypothesis_id is None


def _model_wrong_about_wide_tiles(p: RulesProposer) -> dict[Config, float]:
    """SYNTHETIC truth: the model's time, but 3x slower for BLOCK_SIZE_N >= 128 (the model's favourites)."""
    valid = [c for c in UNCHECKED if (e := p.estimate(c)) is not None and e.launches]
    return {c: p.prior_ms(c) * (3.0 if int(c["BLOCK_SIZE_N"]) >= 128 else 1.0) for c in valid}


def test_measurements_move_the_ranking_when_the_prior_is_wrong() -> None:
    p = rules()
    truth = _model_wrong_about_wide_tiles(p)
    optimum = min(truth.values())
    prior_order = sorted(truth, key=p.prior_ms)
    static_rank = next(i for i, c in enumerate(prior_order, start=1) if truth[c] <= optimum * 1.02)
    assert static_rank > 16, "the case must fool the prior past the budget"
    state = drive(p, budget=16, answer=lambda c: timed(SQUARE, c, truth[c]))
    best = state.best()
    assert best is not None and best.median_ms is not None
    assert best.median_ms <= optimum * 1.02, (best.median_ms, optimum)
    later = p.propose(state, 4)
    assert all(int(c.config["BLOCK_SIZE_N"]) == 64 for c in later)
    assert all("after 16 measured" in c.rationale for c in later)


def test_out_of_resources_ranks_configs_needing_as_much_shared_memory_last() -> None:
    p = rules()
    first = p.propose(SearchState(), 1)[0].config
    cap = pipelined_shared_bytes(first, SQUARE)
    failed = Result(SQUARE, first, Status.OUT_OF_RESOURCES, ENV, message="synthetic: shared memory")
    p.observe([failed])
    state = SearchState(results={first: failed})
    nxt = p.propose(state, 8)
    assert all(pipelined_shared_bytes(c.config, SQUARE) < cap for c in nxt)


def test_a_space_without_tile_parameters_is_still_searched() -> None:
    space = SearchSpace((Param("x", (1, 2, 3, 4, 5, 6, 7, 8)),))
    problem = Problem.of({"n": 1})
    p = RulesProposer(ProposerContext("toy", problem, space, seed=0, budget=8))
    first = p.propose(SearchState(), 2)
    assert all(c.predicted_ms is None and "no tile model" in c.rationale for c in first)

    def answer(c: Config) -> Result:
        return timed(problem, c, 1.0 + abs(int(c["x"]) - 6))

    state = drive(p, budget=5, answer=answer)
    best = state.best()
    assert best is not None and best.config["x"] == 6
    assert math.isclose(best.median_ms or 0, 1.0)


def test_a_compile_error_ranks_down_the_same_tile_shape() -> None:
    p = rules()
    first = p.propose(SearchState(), 1)[0].config
    failed = Result(SQUARE, first, Status.COMPILE_ERROR, ENV, message="synthetic: compile error")
    p.observe([failed])
    nxt = p.propose(SearchState(results={first: failed}), 3)
    shape = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_warps")
    assert all(tuple(c.config[k] for k in shape) != tuple(first[k] for k in shape) for c in nxt)
    same = next(c for c in UNCHECKED if c != first and all(c[k] == first[k] for k in shape))
    assert "ranked down" in p._why(same, 1.0, 0.1, None, 0)


def test_a_row_stride_not_divisible_by_16_is_named_and_costs_time() -> None:
    aligned = Problem.of({"M": 3072, "N": 5120, "K": 1024, "dtype": "fp16"})
    unaligned = Problem.of({"M": 3000, "N": 5000, "K": 1000, "dtype": "fp16"})
    c = cfg(128, 64, 32, 4, 4)
    assert estimate(aligned, c).scalar_operands == ""
    assert estimate(unaligned, c).scalar_operands == "A, B"
    assert estimate(Problem.of({**unaligned.as_dict(), "K": 1024}), c).scalar_operands == "B"
    assert estimate(unaligned, c).predicted_ms > 2 * estimate(aligned, c).predicted_ms
    why = RulesProposer(ProposerContext("matmul", unaligned, UNCHECKED, 0, 8)).propose(SearchState(), 1)[0].rationale
    assert "not a multiple of 16: loads of A, B not vectorised" in why


def test_a_partial_last_wave_shares_l2_among_the_sms_that_run_it() -> None:
    # 288 and 396 tiles of 64×128 both leave the busiest of 132 SMs three tiles; L2 serves the
    # operands of 288 tiles in 288/396 of the time, since the SMs with two tiles are done and no
    # longer take their share. One SM's own rate and latency are set out of the way.
    k = dataclasses.replace(DEFAULT_CONSTANTS, sm_gbps=1e9, latency_us=1e-9)
    c = cfg(64, 128, 64, 4, 3)
    partial, full = (estimate(Problem.of({"M": 768, "N": n, "K": 768, "dtype": "fp16"}), c, k=k)
                     for n in (3072, 4224))
    assert (partial.tiles, full.tiles) == (288, 396)
    assert math.ceil(partial.tiles / H100_SXM.sms) == math.ceil(full.tiles / H100_SXM.sms) == 3
    operands = (64 + 128) * 64 * 2 * (768 // 64)  # bytes one tile reads
    assert math.isclose(partial.feed_us, 288 * operands / (k.l2_gbps * 1e3))
    assert math.isclose(partial.feed_us / full.feed_us, 288 / 396)


def test_one_sm_takes_no_more_than_its_own_bandwidth() -> None:
    # 72 tiles on 132 SMs, an SM taking 50 GB/s: L2 (72 x 50 GB/s asked of it) has bandwidth
    # to spare, and each tile goes at its SM's rate.
    k = dataclasses.replace(DEFAULT_CONSTANTS, sm_gbps=50.0, latency_us=1e-9)
    est = estimate(Problem.of({"M": 768, "N": 3072, "K": 768, "dtype": "fp16"}), cfg(128, 256, 64, 8, 3), k=k)
    assert est.tiles == 72
    assert math.isclose(est.feed_us, (128 + 256) * 64 * 2 * (768 // 64) / (k.sm_gbps * 1e3))


def test_under_a_dram_bound_the_config_whose_sms_keep_up_with_room_to_spare_is_faster() -> None:
    # M=96: B (100 MB) streams from DRAM for every tile shape here. As a hard maximum the DRAM time
    # would tie the two configs; combined as a p-norm, the tile whose SMs need less of the run
    # (deeper pipeline, wider tile) comes first, and neither is predicted faster than DRAM allows.
    # (The physics alone: without the order mark, which scales times by tile shape.)
    problem = Problem.of({"M": 96, "N": 12288, "K": 4096, "dtype": "bf16"})
    wide, narrow = cfg(64, 256, 64, 4, 5), cfg(64, 64, 32, 4, 5)
    bare = dataclasses.replace(DEFAULT_CONSTANTS, order_mark=0.0)
    hard = dataclasses.replace(bare, overlap_power=1e3)
    assert estimate(problem, wide, k=hard).limit == estimate(problem, narrow, k=hard).limit == "dram"
    assert math.isclose(estimate(problem, wide, k=hard).predicted_ms, estimate(problem, narrow, k=hard).predicted_ms,
                        rel_tol=1e-3)
    fast, slow = estimate(problem, wide, k=bare), estimate(problem, narrow, k=bare)
    assert fast.predicted_ms < slow.predicted_ms
    assert fast.predicted_ms * 1e3 > fast.dram_us + DEFAULT_CONSTANTS.launch_us


def test_another_device_is_named_as_an_assumption() -> None:
    ctx = ProposerContext("matmul", SQUARE, UNCHECKED, seed=0, budget=8, device="NVIDIA H200")
    assert "ceilings of NVIDIA H100 SXM assumed, results from NVIDIA H200" in RulesProposer(ctx).propose(
        SearchState(), 1)[0].rationale
    h100 = ProposerContext("matmul", SQUARE, UNCHECKED, seed=0, budget=8, device="NVIDIA H100 80GB HBM3")
    assert "assumed" not in RulesProposer(h100).propose(SearchState(), 1)[0].rationale


def test_every_fourth_pick_is_a_local_step_from_the_best_result_so_far() -> None:
    p = rules()
    first = p.propose(SearchState(), 4)
    # The model's favourites measured slow, one of its outsiders fast: the incumbent is a config
    # the model ranks low, and a local step must look next to it, not where the model points.
    outsider = cfg(64, 64, 32, 4, 3)
    state = SearchState(results={c.config: timed(SQUARE, c.config, 2.0) for c in first})
    state.results[outsider] = timed(SQUARE, outsider, 0.5)
    picks = p.propose(state, 4)
    local = [c for c in picks if c.rationale.startswith("local step from the best so far")]
    assert [picks.index(c) for c in local] == [3], [c.rationale for c in picks]
    step = local[0].config
    moved = [k for k in outsider if outsider[k] != step[k]]
    assert len(moved) == 1, (outsider.label(), step.label())
    choices = next(q.choices for q in UNCHECKED.params if q.name == moved[0])
    assert abs(choices.index(step[moved[0]]) - choices.index(outsider[moved[0]])) == 1


def test_no_local_step_before_enough_results() -> None:
    picks = rules().propose(SearchState(), 8)
    assert not [c for c in picks if c.rationale.startswith("local step")]


def test_a_tile_value_every_measured_config_shares_is_tested_once_a_batch() -> None:
    # Four results, all with 8 warps, the others varied: the model's preference for 8 warps is
    # untested, and one pick of the next batch (no more) takes 4 warps and says why.
    p = rules()
    ran = [cfg(128, 256, 64, 8, 3), cfg(256, 128, 64, 8, 3), cfg(128, 128, 64, 8, 4), cfg(128, 256, 32, 8, 4)]
    state = SearchState(results={c: timed(SQUARE, c, 1.0 + i / 10) for i, c in enumerate(ran)})
    picks = p.propose(state, 4)
    tests = [c for c in picks if c.rationale.startswith("tests ")]
    assert len(tests) == 1, [c.rationale for c in picks]
    assert tests[0].config["num_warps"] == 4
    assert tests[0].rationale.startswith("tests num_warps=4: every config measured so far has num_warps=8; ")
    # once a batch in flight holds 4 warps, nothing is shared and no pick is made for it
    state.pending.add(tests[0].config)
    assert not [c for c in p.propose(state, 4) if c.rationale.startswith("tests ")]


def test_no_untried_value_pick_before_results_or_when_turned_off() -> None:
    assert not [c for c in rules().propose(SearchState(), 8) if c.rationale.startswith("tests ")]
    p = RulesProposer(ProposerContext("matmul", SQUARE, UNCHECKED, seed=0, budget=200),
                      settings=dataclasses.replace(RulesSettings(), test_untried=False))
    ran = [cfg(128, 256, 64, 8, 3), cfg(256, 128, 64, 8, 3), cfg(128, 128, 64, 8, 4), cfg(128, 256, 32, 8, 4)]
    state = SearchState(results={c: timed(SQUARE, c, 1.0) for c in ran})
    assert not [c for c in p.propose(state, 4) if c.rationale.startswith("tests ")]


def test_the_pool_is_every_valid_launchable_config_in_the_models_order() -> None:
    # The pool is built tile first (configs of a tile that cannot launch are never built): it must
    # be exactly the valid configs whose tile launches, sorted by the model (ties: space order).
    from tilepilot.kernels import get_family

    space = get_family("matmul").space().narrowed({"BLOCK_SIZE_K": [32, 64], "GROUP_SIZE_M": [8],
                                                   "SPLIT_K": [1, 4], "num_stages": [3, 4]})
    problem = Problem.of({"M": 3000, "N": 5000, "K": 1000, "dtype": "fp16"})
    p = RulesProposer(ProposerContext("matmul", problem, space, seed=0, budget=64))
    valid = [c for c in space.valid(problem) if (e := p.estimate(c)) is None or e.launches]
    order = {c: i for i, c in enumerate(valid)}
    assert len(valid) < len(list(space))  # something was left out
    assert p._configs() == sorted(valid, key=lambda c: (p._rank_key(c), order[c]))


def test_the_local_step_mask_is_the_one_step_neighbourhood() -> None:
    p = rules()
    pool = p._pool_of()
    alive = np.arange(len(pool.configs))
    best = timed(SQUARE, cfg(128, 128, 64, 4, 4), 1.0)
    p._picks = p.settings.neighbour_every  # this pick is a local step
    mask = p._local_step(pool, alive, best, measured=p.settings.neighbour_after)
    assert mask is not None
    expected = [p._neighbours(best.config, c) for c in pool.configs]
    assert mask.tolist() == expected and sum(expected) >= 4


def test_tile_widths_between_powers_of_two_keep_the_powers_one_step_apart() -> None:
    from tilepilot.agents.rules import _grades
    from tilepilot.kernels import get_family

    assert _grades((16, 32, 64, 128, 160, 192, 256)) == pytest.approx((0, 1, 2, 3, 3 + math.log2(1.25),
                                                                        3 + math.log2(1.5), 4))
    for plain in ((64, 128, 256), (1, 2, 3, 4, 5, 6, 7, 8), (2, 3, 4, 5), (1, 4, 8, 16), ("a", "b")):
        assert _grades(plain) == tuple(range(len(plain)))
    # in the family's whole space the grouped kernel (no 160 or 192) still steps 128 -> 256 columns
    space = get_family("matmul").space()
    p = RulesProposer(ProposerContext("matmul", SQUARE, space, seed=0, budget=200))
    grouped = space.parse({**cfg(128, 128, 64, 8, 4).as_dict(), "VARIANT": "grouped"})
    wider, wide = (space.parse({**grouped.as_dict(), **kw}) for kw in ({"BLOCK_SIZE_N": 256},
                                                                      {"BLOCK_SIZE_N": 192, "VARIANT": "tma"}))
    assert p._neighbours(grouped, wider)
    assert not p._neighbours(grouped, wide)  # two parameters moved
    assert p._neighbours(space.parse({**grouped.as_dict(), "VARIANT": "tma"}), wide)
    assert not p._neighbours(space.parse({**grouped.as_dict(), "BLOCK_SIZE_N": 64}), wider)  # 64 -> 256: two steps


UNALIGNED = Problem.of({"M": 1500, "N": 1500, "K": 1500, "dtype": "fp16"})  # K and N no multiple of 16
HALF = Problem.of({"M": 1000, "N": 3000, "K": 2000, "dtype": "bf16"})  # N alone no multiple of 16


def test_an_operand_loaded_element_by_element_is_out_of_the_copy_pipeline() -> None:
    # its tile sits in shared memory once (recorded on the H100: 106,496 B for 256x64x64, 3 stages,
    # on 1000x3000x2000), and where both load so, the pipeline's depth changes nothing
    assert estimate(HALF, cfg(256, 64, 64, 4, 3)).shared_bytes == (3 * 256 + 64) * 64 * 2
    assert estimate(SQUARE, cfg(256, 64, 64, 4, 3)).shared_bytes == 3 * (256 + 64) * 64 * 2
    assert len({estimate(UNALIGNED, cfg(128, 64, 32, 4, s)).predicted_ms for s in (3, 4, 5)}) == 1
    assert len({estimate(HALF, cfg(128, 64, 32, 4, s)).predicted_ms for s in (3, 4, 5)}) > 1


def test_element_wise_loads_hold_an_address_per_element_and_spill_those_as_reloads() -> None:
    # 128x256x32 with 8 warps on 3000x5000x1000 fp16: 128 accumulator registers, 48 elements per
    # thread each with its own address (recorded: 255 registers and 176 spilled); only the
    # addresses spill, so it costs reloads at the element-wise rate, not the spill multiplier
    unaligned = Problem.of({"M": 3000, "N": 5000, "K": 1000, "dtype": "fp16"})
    aligned = Problem.of({"M": 3072, "N": 5120, "K": 1024, "dtype": "fp16"})
    config = cfg(128, 256, 32, 8, 3)
    big = estimate(unaligned, config)
    assert big.regs > 255 and big.spilled_regs == 0
    assert big.regs - estimate(aligned, config).regs > 48
    assert estimate(unaligned, cfg(128, 64, 32, 4, 3)).regs < 255
    # with one register per address nothing spills: the difference is the reloads alone, which
    # scale the element-wise feed by (elements + reloads) / elements, below the spill multiplier
    k = dataclasses.replace(DEFAULT_CONSTANTS, regs_per_vector=1.0)
    unspilled = estimate(unaligned, config, k=k)
    assert unspilled.regs < 255
    reloads = big.regs - 255
    assert big.feed_us > 1.1 * unspilled.feed_us
    assert big.predicted_ms / unspilled.predicted_ms < 1 + DEFAULT_CONSTANTS.spill_cost * reloads / 255
    assert "load addresses spill and are reloaded" in describe(big, None, H100_SXM)


def test_num_stages_is_inert_only_where_both_operands_load_element_by_element_and_nothing_vectorises() -> None:
    from tilepilot.agents.rules import _inert
    from tilepilot.kernels import get_family

    assert _inert(UNALIGNED, UNCHECKED) == {"num_stages"}
    assert _inert(HALF, UNCHECKED) == frozenset() and _inert(SQUARE, UNCHECKED) == frozenset()
    assert _inert(UNALIGNED, get_family("matmul").space()) == frozenset()  # ALIGN_HINT and tma vectorise
    unaligned, aligned = rules(UNALIGNED), rules(SQUARE)
    k = unaligned.constants
    assert k.scalar_error_var > 1
    assert unaligned._gp_settings().signal_var == pytest.approx(unaligned.settings.signal_var * k.scalar_error_var)
    assert aligned._gp_settings().signal_var == aligned.settings.signal_var


def test_configs_that_differ_only_in_an_inert_parameter_come_after_every_other() -> None:
    p = rules(UNALIGNED)
    state = drive(p, budget=40, answer=lambda c: timed(UNALIGNED, c, 1.0 + 0.01 * int(c["BLOCK_SIZE_K"])))
    tiles = [(c["BLOCK_SIZE_M"], c["BLOCK_SIZE_N"], c["BLOCK_SIZE_K"], c["num_warps"]) for c in state.results]
    distinct = len(set(tiles))
    assert distinct == len(tiles) == 40  # no stage-only sibling while other tiles are left
    everything = drive(rules(UNALIGNED), budget=len(list(UNCHECKED)), answer=lambda c: timed(UNALIGNED, c, 1.0))
    assert len(everything.results) > distinct  # the siblings still come, last: the search stays exhaustive


# ---- history: the nearest problem of the store in this problem's regime corrects the model ----------
class History:
    """A store's results as the driver hands them to a proposer (`HistoryReader`), from a dict: those
    of the campaign's device (""), and of other devices in `elsewhere`."""

    def __init__(self, results: dict[Problem, dict[Config, float]],
                 elsewhere: dict[str, dict[Problem, dict[Config, float]]] | None = None, device: str = "",
                 versions: dict[Problem, str] | None = None) -> None:
        self.by_device = {device: results, **(elsewhere or {})}
        self.results = results
        self.versions = versions or {}  # the kernel version that measured a problem (default "v1")
        self.asked: list[Problem] = []
        self.asked_on: list[tuple[Problem, str]] = []

    def devices(self, kernel: str) -> list[str]:
        return sorted(d for d, results in self.by_device.items() if results)

    def measured_problems(self, kernel: str, device: str) -> list[Problem]:
        return list(self.by_device.get(device, {}))

    def measured(self, kernel: str, device: str, problem: Problem) -> list[tuple[Config, float]]:
        self.asked.append(problem)
        self.asked_on.append((problem, device))
        return list(self.by_device[device][problem].items())

    def kernel_versions(self, kernel: str, device: str, problem: Problem) -> frozenset[str]:
        return frozenset({self.versions.get(problem, "v1")})


NEAR = Problem.of({"M": 4096, "N": 4096, "K": 2048, "dtype": "bf16"})  # vectorised, like SQUARE
FAR = Problem.of({"M": 512, "N": 512, "K": 512, "dtype": "bf16"})  # vectorised, farther from SQUARE
ELEMENT_WISE = Problem.of({"M": 4096, "N": 4096, "K": 4100, "dtype": "bf16"})  # A element by element


def with_history(history: History, problem: Problem = SQUARE, device: str = "", version: str = "") -> RulesProposer:
    return RulesProposer(ProposerContext("matmul", problem, UNCHECKED, seed=0, budget=200, device=device,
                                         history=history, kernel_version=version))


def _slow_wide_tiles(problem: Problem) -> dict[Config, float]:
    """SYNTHETIC results of `problem`: the model's time, 3x slower for BLOCK_SIZE_N >= 128."""
    truth = {}
    for c in UNCHECKED:
        e = estimate(problem, c)
        if e.launches:
            truth[c] = e.predicted_ms * (3.0 if int(c["BLOCK_SIZE_N"]) >= 128 else 1.0)
    return truth


@pytest.fixture
def one_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """The correction from the nearest source alone (TRANSFER_SOURCES = 1): which source is the nearest."""
    import tilepilot.agents.rules as rules_module

    monkeypatch.setattr(rules_module, "TRANSFER_SOURCES", 1)


@pytest.mark.usefixtures("one_source")
def test_results_of_the_nearest_problem_in_the_same_regime_correct_the_model_before_any_result() -> None:
    cold = rules().propose(SearchState(), 4)
    assert all(int(c.config["BLOCK_SIZE_N"]) >= 128 for c in cold)  # the model's favourites
    history = History({FAR: {c: 1.0 for c in list(_slow_wide_tiles(FAR))[:8]}, NEAR: _slow_wide_tiles(NEAR),
                       ELEMENT_WISE: _slow_wide_tiles(ELEMENT_WISE)})
    p = with_history(history)
    warm = p.propose(SearchState(), 4)
    assert all(int(c.config["BLOCK_SIZE_N"]) == 64 for c in warm), [c.config.label() for c in warm]
    assert history.asked == [NEAR]  # the nearest of its regime, read once
    assert "by the results of M=4096 N=4096 K=2048 bf16" in warm[0].rationale
    note = p.drain_records().notes
    assert note == (f"rules: the tile model for {SQUARE.label()} corrected by {len(history.results[NEAR])} "
                    f"results of {NEAR.label()}, the nearest problem the store holds with vectorised operands",)
    assert not p.drain_records().notes  # handed over once
    # the correction is the neighbour's pattern, not its scale: the wide tiles, not every config
    wide, narrow = cfg(128, 128, 64, 8, 3), cfg(128, 64, 64, 8, 3)
    assert p.prior_ms(wide) / rules().prior_ms(wide) > 1.5 * p.prior_ms(narrow) / rules().prior_ms(narrow)


def test_history_of_another_regime_or_with_too_few_results_is_not_read() -> None:
    few = dict(list(_slow_wide_tiles(NEAR).items())[:3])
    history = History({ELEMENT_WISE: _slow_wide_tiles(ELEMENT_WISE), NEAR: few})
    p = with_history(history)
    cold = rules()
    assert [c.config for c in p.propose(SearchState(), 6)] == [c.config for c in cold.propose(SearchState(), 6)]
    assert history.asked == [NEAR] and not p.drain_records().notes  # three results are too few
    q = with_history(History({NEAR: _slow_wide_tiles(NEAR)}), problem=ELEMENT_WISE)
    assert q.prior_ms(cfg(128, 128, 64, 8, 3)) == RulesProposer(
        ProposerContext("matmul", ELEMENT_WISE, UNCHECKED, seed=0, budget=200)).prior_ms(cfg(128, 128, 64, 8, 3))


def test_the_problems_own_earlier_results_on_this_device_are_not_a_correction() -> None:
    """They are this problem's results: the driver reuses them where rules proposes their configs;
    as a correction they found fewer optima than none (bench/retune.py)."""
    for version in ("", "v0"):  # measured by this kernel or another version of it
        history = History({NEAR: _slow_wide_tiles(NEAR), SQUARE: _slow_wide_tiles(SQUARE)},
                          versions={SQUARE: version or "v1"})
        p = with_history(history, version="v1")
        assert all(int(c.config["BLOCK_SIZE_N"]) == 64 for c in p.propose(SearchState(), 4))  # NEAR's correction
        assert history.asked == [NEAR]
        assert p.drain_records().notes[0].startswith(f"rules: the tile model for {SQUARE.label()} corrected by "
                                                     f"{len(history.results[NEAR])} results of {NEAR.label()}")
    alone = History({SQUARE: _slow_wide_tiles(SQUARE)})
    p = with_history(alone)
    assert [c.config for c in p.propose(SearchState(), 6)] == [c.config for c in rules().propose(SearchState(), 6)]
    assert alone.asked == [] and not p.drain_records().notes


def test_another_kernel_versions_results_count_by_distance_and_come_second_at_equal_distance(one_source: None) -> None:
    middle = Problem.of({"M": 4096, "N": 6144, "K": 2048, "dtype": "bf16"})  # 1.17 from SQUARE, NEAR 1.0
    history = History({NEAR: _slow_wide_tiles(NEAR), middle: _slow_wide_tiles(middle)}, versions={NEAR: "v0"})
    p = with_history(history, version="v1")
    assert all(int(c.config["BLOCK_SIZE_N"]) == 64 for c in p.propose(SearchState(), 4))
    assert history.asked == [NEAR]  # the nearer problem, though an older kernel measured it
    assert p.drain_records().notes == (
        f"rules: the tile model for {SQUARE.label()} corrected by {len(history.results[NEAR])} results of "
        f"{NEAR.label()}, the nearest problem the store holds with vectorised operands (measured by another "
        "version of the kernel than v1)",)
    twin = Problem.of({"M": 4096, "N": 4096, "K": 8192, "dtype": "bf16"})  # 1.0 from SQUARE, as NEAR
    for old, new in ((NEAR, twin), (twin, NEAR)):  # whichever comes first by key
        tied = History({NEAR: _slow_wide_tiles(NEAR), twin: _slow_wide_tiles(twin)}, versions={old: "v0"})
        with_history(tied, version="v1").propose(SearchState(), 4)
        assert tied.asked == [new]  # at equal distance, this version's results
    same = with_history(History({NEAR: _slow_wide_tiles(NEAR)}), version="v1")  # measured by v1
    same.propose(SearchState(), 4)
    assert "another version" not in same.drain_records().notes[0]


def test_the_corrections_of_the_nearest_problems_of_the_regime_are_averaged_by_inverse_square_distance() -> None:
    middle = Problem.of({"M": 4096, "N": 6144, "K": 2048, "dtype": "bf16"})  # 1.17 from SQUARE
    truth = {q: _slow_wide_tiles(q) for q in (NEAR, middle, FAR, ELEMENT_WISE)}
    truth[FAR] = {c: 1.0 for c in list(truth[FAR])[:8]}  # FAR's results disagree with the others'
    history = History(truth)
    p = with_history(history)
    p.propose(SearchState(), 4)
    assert history.asked == [NEAR, middle, FAR]  # nearest first; ELEMENT_WISE loads otherwise
    alone = [with_history(History({q: truth[q]})) for q in (NEAR, middle, FAR)]
    weights = [1.0, 1 / (1 + math.log2(1.5) ** 2), 1 / 27.0]  # 1/d²: d = 1, 1.17 and sqrt(27) (3 octaves each way)
    for c in (cfg(128, 128, 64, 8, 3), cfg(128, 64, 64, 8, 3), cfg(64, 64, 32, 4, 4)):
        assert p._shift(c) == pytest.approx(np.average([a._shift(c) for a in alone], weights=weights), abs=1e-9)
    far_alone = alone[2]._shift(cfg(128, 128, 64, 8, 3))
    mean = np.mean([a._shift(cfg(128, 128, 64, 8, 3)) for a in alone])
    assert abs(p._shift(cfg(128, 128, 64, 8, 3)) - far_alone) > abs(mean - far_alone)  # the far one counts less
    assert p.drain_records().notes == (
        f"rules: the tile model for {SQUARE.label()} corrected by {len(truth[NEAR])} results of {NEAR.label()}, the "
        f"nearest problem the store holds with vectorised operands, and by {len(truth[middle])} of {middle.label()} "
        f"and 8 of {FAR.label()} (the mean of their corrections, weighed by 1/distance²)",)
    own = History({**truth, SQUARE: _slow_wide_tiles(SQUARE)})
    with_history(own).propose(SearchState(), 1)
    assert own.asked == [NEAR, middle, FAR]  # not its own earlier results on this device


def test_the_five_nearest_problems_of_the_regime_correct_the_model_and_no_more() -> None:
    shapes = [(4096, 4096, 2048), (4096, 6144, 2048), (2048, 4096, 4096), (4096, 2048, 8192), (8192, 4096, 2048),
              (1024, 1024, 1024)]  # the last is the farthest from SQUARE
    problems = [Problem.of({"M": m, "N": n, "K": k, "dtype": "bf16"}) for m, n, k in shapes]
    history = History({q: _slow_wide_tiles(q) for q in problems})
    p = with_history(history)
    p.propose(SearchState(), 4)
    assert sorted(history.asked, key=Problem.key) == sorted(problems[:5], key=Problem.key)
    assert len(p._transfers) == len(p._weights) == 5


def test_a_source_weighs_the_inverse_square_of_its_distance_from_a_floor() -> None:
    from tilepilot.agents.rules import TRANSFER_NEAR, _source_weight
    assert _source_weight(2.0) == pytest.approx(0.25) and _source_weight(1.0) == 1.0
    assert _source_weight(0.1) == _source_weight(0.0) == pytest.approx(1 / TRANSFER_NEAR**2)


H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def test_the_h100_sxm_and_the_h200_are_siblings_and_other_devices_are_not() -> None:
    assert siblings(H100, H200) and siblings(H200, "NVIDIA H100 SXM5 80GB") and siblings("NVIDIA H200 NVL", H100)
    assert not siblings(H200, H200)  # a device is itself, not its sibling
    assert not siblings("NVIDIA H100 PCIe", H200)  # 114 SMs
    assert not siblings("NVIDIA A100-SXM4-80GB", H200) and not siblings("", H200)  # unknown: none


def test_a_sibling_devices_results_correct_the_model_where_its_own_device_has_none() -> None:
    history = History({}, {H100: {NEAR: _slow_wide_tiles(NEAR)}}, device=H200)
    p = with_history(history, device=H200)
    warm = p.propose(SearchState(), 4)
    assert all(int(c.config["BLOCK_SIZE_N"]) == 64 for c in warm), [c.config.label() for c in warm]
    assert history.asked_on == [(NEAR, H100)]
    assert f"by the results of {NEAR.label()} on the {H100}" in warm[0].rationale
    assert p.drain_records().notes == (
        f"rules: the tile model for {SQUARE.label()} corrected by {len(history.by_device[H100][NEAR])} results "
        f"of {NEAR.label()} on the {H100}, the nearest problem the store holds with vectorised operands",)


def test_another_chips_results_are_not_read() -> None:
    for campaign_device, store_device in ((H200, "NVIDIA A100-SXM4-80GB"), ("NVIDIA A100-SXM4-80GB", H200),
                                          ("", H100)):
        history = History({}, {store_device: {NEAR: _slow_wide_tiles(NEAR)}}, device=campaign_device)
        p = with_history(history, device=campaign_device)
        assert [c.config for c in p.propose(SearchState(), 6)] == [c.config for c in rules().propose(SearchState(), 6)]
        assert history.asked == [] and not p.drain_records().notes


def test_a_siblings_results_count_one_unit_farther_than_the_devices_own(one_source: None) -> None:
    # NEAR is 1 from SQUARE (K halved): on the campaign's device it ties SQUARE's own results on the
    # sibling (0, and 1 for the device), and the campaign's device goes first
    history = History({NEAR: _slow_wide_tiles(NEAR)}, {H100: {SQUARE: _slow_wide_tiles(SQUARE)}}, device=H200)
    with_history(history, device=H200).propose(SearchState(), 1)
    assert history.asked_on == [(NEAR, H200)]
    # FAR (3 in each of M, N and K) is farther than the sibling's SQUARE
    history = History({FAR: _slow_wide_tiles(FAR)}, {H100: {SQUARE: _slow_wide_tiles(SQUARE)}}, device=H200)
    p = with_history(history, device=H200)
    p.propose(SearchState(), 1)
    assert history.asked_on == [(SQUARE, H100)]
    assert p.drain_records().notes[0].endswith(f"corrected by its own {len(history.by_device[H100][SQUARE])} "
                                               f"earlier results on the {H100}")


def test_a_store_problem_with_more_results_than_the_gp_takes_is_read_every_kth(monkeypatch: pytest.MonkeyPatch) -> None:
    import tilepilot.agents.rules as rules_module

    monkeypatch.setattr(rules_module, "TRANSFER_MAX_RESULTS", 10)
    results = _slow_wide_tiles(NEAR)
    p = with_history(History({NEAR: results}))
    assert len(results) > 20
    p.propose(SearchState(), 1)
    read = len(list(results)[::math.ceil(len(results) / 10)])
    assert read <= 10
    assert p.drain_records().notes[0].startswith(f"rules: the tile model for {SQUARE.label()} corrected by "
                                                 f"{read} results of {NEAR.label()}")


# ---- learnings: a validated "p=a beats p=b" in scope moves the p=b configs behind their twins ---------
def with_learning(scope: str, effect: float = 1.5, low: float | None = 1.2, problem: Problem = SQUARE,
                  history: bool = True, a: int = 3, b: int = 4) -> RulesProposer:
    from types import SimpleNamespace

    from tilepilot.experiments import Hypothesis, Learning, Scope

    h = Hypothesis("H-s", "matmul", "", "num_stages", a, b, Scope.parse(scope),
                   f"num_stages={a} beats num_stages={b}")
    lrn = Learning("L-s", "H-s", "matmul", "", "0.0", "0.0", h.scope, h.text, effect, 8)
    ledger = SimpleNamespace(hypotheses=lambda **kw: [SimpleNamespace(hypothesis=h, ci_low=low)],
                             learnings=lambda **kw: [SimpleNamespace(learning=lrn)])
    return RulesProposer(ProposerContext("matmul", problem, UNCHECKED, seed=0, budget=200, ledger=ledger,
                                         history=History({}) if history else None))


def _stage_pairs(cold: RulesProposer) -> list[tuple[Config, Config]]:
    """(a config with 4 stages, its twin with 3) where both launch."""
    pairs = [(c, Config.of({**c.as_dict(), "num_stages": 3})) for c in UNCHECKED if c["num_stages"] == 4]
    return [(c, t) for c, t in pairs if (e := cold.estimate(t)) is not None and e.launches
            and (f := cold.estimate(c)) is not None and f.launches]


def test_a_learning_in_scope_moves_the_configs_it_loses_by_one_shift_to_the_low_end_of_its_effect() -> None:
    """The learning is a mean over pairs: the model's mean gap is raised to the low end of its
    interval (1.2 here, the effect 1.5), every losing config by the same factor."""
    cold, p = rules(), with_learning("M>=1024")
    pairs = _stage_pairs(cold)
    gap = statistics.mean(math.log(cold.prior_ms(c) / cold.prior_ms(t)) for c, t in pairs)
    assert gap < math.log(1.2)  # the model alone puts them closer
    factors = {round(p.prior_ms(c) / cold.prior_ms(c), 9) for c, _ in pairs}
    assert len(factors) == 1 and factors.pop() == pytest.approx(1.2 / math.exp(gap))
    assert statistics.mean(math.log(p.prior_ms(c) / p.prior_ms(t)) for c, t in pairs) == pytest.approx(math.log(1.2))
    assert any(p.prior_ms(c) < 1.2 * p.prior_ms(t) for c, t in pairs)  # not a floor on every pair
    assert all(p.prior_ms(t) == cold.prior_ms(t) for _, t in pairs)  # the winners' side is untouched
    picks = p.propose(SearchState(), 40)
    shifted = [c for c in picks if c.config["num_stages"] == 4]
    assert shifted and all("slower by learning L-s: num_stages=3 beats num_stages=4 (1.50x on average, "
                           "at least 1.20x)" in c.rationale for c in shifted)
    assert [c.config for c in with_learning("M<=64").propose(SearchState(), 6)] == [
        c.config for c in rules().propose(SearchState(), 6)]  # out of scope: no effect
    cold_start = with_learning("M>=1024", history=False)  # --cold: the store is not read
    assert all(cold_start.prior_ms(c) == cold.prior_ms(c) for c, _ in pairs)


def test_a_learning_the_model_already_agrees_with_or_whose_interval_reaches_1_moves_nothing() -> None:
    cold = rules()
    configs = list(UNCHECKED)
    gap = statistics.mean(math.log(cold.prior_ms(c) / cold.prior_ms(t)) for c, t in _stage_pairs(cold))
    assert gap < 0.0  # the model puts 3 stages behind 4 on this problem, on average
    agrees = with_learning("M>=1024", low=math.exp(-gap) * 0.99, a=4, b=3)  # "4 beats 3", less than the model
    assert agrees._read_learnings()  # read, and moves nothing
    for p in (agrees, with_learning("M>=1024", low=1.0), with_learning("M>=1024", low=None)):
        assert [p.prior_ms(c) for c in configs] == [cold.prior_ms(c) for c in configs]


def test_rows_past_m_cost_a_hot_spot_only_where_the_kernel_wraps_them() -> None:
    """At M below BLOCK_SIZE_M the tutorial's kernel (and matmul's persistent variant) loads A's
    rows again for the rows past M; the grouped and split-K variants mask them (FEW_ROWS) and the
    tma variants' descriptors fill them with zeros, so no row is read twice."""
    decode = Problem.of({"M": 2, "N": 8192, "K": 8192, "dtype": "bf16"})
    tile = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 8, "num_warps": 4,
            "num_stages": 5}
    tutorial = estimate(decode, Config.of(tile))
    by_variant = {v: estimate(decode, Config.of({**tile, "VARIANT": v}))
                  for v in ("grouped", "splitk", "splitk_fused", "tma", "persistent")}
    assert tutorial.tile.wraps_rows and by_variant["persistent"].tile.wraps_rows
    assert not any(by_variant[v].tile.wraps_rows for v in ("grouped", "splitk", "splitk_fused", "tma"))
    assert by_variant["persistent"].predicted_ms == tutorial.predicted_ms
    assert by_variant["grouped"].predicted_ms < tutorial.predicted_ms  # no 32 copies of 2 rows a tile
    # where M fills the tile, nothing is wrapped and the variants agree
    full = {v: estimate(SQUARE, Config.of({**tile, "VARIANT": v})).predicted_ms for v in ("grouped", "persistent")}
    assert full["grouped"] == full["persistent"] == estimate(SQUARE, Config.of(tile)).predicted_ms


def test_the_pool_ranks_each_variant_by_whether_it_wraps_rows_past_m() -> None:
    from tilepilot.kernels import get_family

    space = get_family("matmul").space().narrowed({"BLOCK_SIZE_K": [64, 128], "GROUP_SIZE_M": [8], "num_stages": [4],
                                                   "VARIANT": ["grouped", "persistent"]})
    decode = Problem.of({"M": 2, "N": 8192, "K": 8192, "dtype": "bf16"})
    p = RulesProposer(ProposerContext("matmul", decode, space, seed=0, budget=64))
    valid = [c for c in space.valid(decode) if (e := p.estimate(c)) is None or e.launches]
    order = {c: i for i, c in enumerate(valid)}
    assert {c["VARIANT"] for c in valid} == {"grouped", "persistent"}
    assert p._configs() == sorted(valid, key=lambda c: (p._rank_key(c), order[c]))
    assert p._configs()[0]["VARIANT"] == "grouped"  # no wrapped rows to re-read


def test_a_failure_ranks_down_only_its_stage_twins_not_another_variant_of_the_tile() -> None:
    flagged = SearchSpace((*UNCHECKED.params, Param("FLAG", ("a", "b"))))
    p = RulesProposer(ProposerContext("matmul", SQUARE, flagged, seed=0, budget=200))

    def flag(c: Config, value: str) -> Config:
        return Config.of({**c.as_dict(), "FLAG": value})

    crashed = flag(cfg(128, 128, 64, 4, 3), "a")
    twin = flag(cfg(128, 128, 64, 4, 4), "a")  # differs in num_stages alone
    other_flag = flag(cfg(128, 128, 64, 4, 4), "b")
    other_tile = flag(cfg(128, 128, 64, 8, 4), "a")
    before = dict(zip((twin, other_flag, other_tile), p.score([twin, other_flag, other_tile]), strict=True))
    state = SearchState()
    state.results[crashed] = Result(SQUARE, crashed, Status.CRASHED, ENV, message="illegal memory access")
    p.observe([state.results[crashed]])
    after = dict(zip((twin, other_flag, other_tile), p.score([twin, other_flag, other_tile]), strict=True))
    assert "failed to run" in after[twin][1] and after[twin][0] == pytest.approx(4 * before[twin][0])
    for c in (other_flag, other_tile):
        assert "failed to run" not in after[c][1] and after[c][0] == pytest.approx(before[c][0])
    order = p._configs()  # the pool in the model's order, penalties included
    assert order.index(other_flag) < order.index(twin), "the other variant of the tile ranks ahead of the twin"
