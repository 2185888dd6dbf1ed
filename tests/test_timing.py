"""Timing logic without a GPU: the adaptive stopping rule fed sample sequences, the interleaved
rounds driven by scripted blocks, the copies for cold timing, the CUDA-graph layout, and the
roofline arithmetic."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator

import pytest

from tilepilot.experiments import DeviceCeilings, Timing
from tilepilot.experiments.result import roofline_ms, roofline_pct
from tilepilot.kernels.timing import (
    MAX_GRAPH_LAUNCHES,
    MAX_GRAPHS,
    MAX_ROUNDS,
    MIN_SPREAD_SAMPLES,
    TimingPlan,
    Track,
    cold_copies_needed,
    graph_layout,
    interleave,
    relative_spread,
    stop_reason,
    summarise,
)

PLAN = TimingPlan(rounds=3, block_ms=1.0, spread_target=0.02, time_cap_ms=15.0)
STEADY = [1.000, 1.001, 0.999, 1.002, 0.998, 1.000]  # spread 0.3%
NOISY = [1.0, 1.1, 0.9, 1.2, 0.8, 1.05]  # spread ~20%


# ---- the stopping rule ----------------------------------------------------------------------------
def test_no_stop_before_the_minimum_rounds_however_steady_or_costly() -> None:
    assert stop_reason(STEADY, 2, 1.0, PLAN) == ""
    assert stop_reason(NOISY, 2, 1000.0, PLAN) == ""


def test_steady_samples_stop_on_spread() -> None:
    assert stop_reason(STEADY, 3, 3.0, PLAN) == "spread"


def test_spread_wins_over_cap_when_both_hold() -> None:
    assert stop_reason(STEADY, 3, 100.0, PLAN) == "spread"


def test_noisy_samples_go_on_until_the_cap() -> None:
    assert stop_reason(NOISY, 3, 14.9, PLAN) == ""
    assert stop_reason(NOISY, 9, 15.0, PLAN) == "cap"


def test_too_few_samples_never_stop_on_spread() -> None:
    few = STEADY[: MIN_SPREAD_SAMPLES - 1]
    assert stop_reason(few, 3, 3.0, PLAN) == ""
    assert stop_reason(few, 3, 15.0, PLAN) == "cap"


def test_rounds_are_bounded_even_when_no_time_is_counted() -> None:
    assert stop_reason(NOISY, MAX_ROUNDS - 1, 0.0, PLAN) == ""
    assert stop_reason(NOISY, MAX_ROUNDS, 0.0, PLAN) == "cap"


def test_spread_target_zero_stops_only_on_identical_samples_or_cap() -> None:
    plan = TimingPlan(rounds=1, spread_target=0.0, time_cap_ms=5.0)
    assert stop_reason(STEADY, 1, 1.0, plan) == ""
    assert stop_reason([2.0] * 5, 1, 1.0, plan) == "spread"


def test_relative_spread_is_the_timings_rel_spread() -> None:
    t = summarise(NOISY, l2_flushed=True, method="cuda-graph", spread_target=0.02, time_cap_ms=15.0,
                  stop_reason="cap", timed_ms=16.5)
    assert relative_spread(NOISY) == pytest.approx(t.rel_spread)
    assert (t.reps, t.method, t.l2_flushed, t.stop_reason, t.timed_ms) == (6, "cuda-graph", True, "cap", 16.5)
    assert t.p20_ms <= t.median_ms <= t.p80_ms and t.min_ms == 0.8


@pytest.mark.parametrize("bad", [dict(rounds=0), dict(block_ms=0.0), dict(spread_target=-0.1), dict(time_cap_ms=0.0)])
def test_bad_plan_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="bad timing plan"):
        TimingPlan(**bad)  # type: ignore[arg-type]


# ---- the interleaved rounds -----------------------------------------------------------------------
def scripted(samples: dict[int, Iterator[float]], block_ms: dict[int, float], tracks: list[Track],
             log: list[int]) -> object:
    def block(i: int) -> None:
        log.append(i)
        tracks[i].samples.append(next(samples[i]))
        tracks[i].timed_ms += block_ms[i]
    return block


def test_steady_kernels_stop_early_and_noisy_ones_run_to_the_cap() -> None:
    tracks = [Track([], False) for _ in range(3)]
    samples = {0: itertools.cycle(STEADY), 1: itertools.cycle(NOISY), 2: itertools.cycle(STEADY)}
    log: list[int] = []
    starts: list[int] = []
    plan = TimingPlan(rounds=3, spread_target=0.02, time_cap_ms=10.0)
    interleave(tracks, plan, starts.append, scripted(samples, {0: 1.0, 1: 1.0, 2: 1.0}, tracks, log))
    assert [t.stop for t in tracks] == ["spread", "cap", "spread"]
    # steady: at least MIN_SPREAD_SAMPLES samples; noisy: until 10 ms of GPU time
    assert [t.rounds for t in tracks] == [MIN_SPREAD_SAMPLES, 10, MIN_SPREAD_SAMPLES]
    assert tracks[1].timed_ms == 10.0
    assert starts == log  # on_start precedes every block


def test_rounds_interleave_every_kernel_still_going_in_a_rotating_order() -> None:
    tracks = [Track([], False) for _ in range(3)]
    samples = {i: itertools.cycle(NOISY) for i in range(3)}
    log: list[int] = []
    plan = TimingPlan(rounds=3, spread_target=0.02, time_cap_ms=3.0, order="rotating")
    interleave(tracks, plan, lambda i: None, scripted(samples, {0: 1.0, 1: 1.0, 2: 1.0}, tracks, log))
    assert log == [0, 1, 2, 1, 2, 0, 2, 0, 1]
    assert all(t.stop == "cap" and t.rounds == 3 for t in tracks)


def shuffled_log(seed: int, kernels: int = 4, rounds: int = 40) -> list[int]:
    tracks = [Track([], False) for _ in range(kernels)]
    samples = {i: itertools.cycle(NOISY) for i in range(kernels)}
    log: list[int] = []
    plan = TimingPlan(rounds=rounds, spread_target=0.02, time_cap_ms=float(rounds))
    interleave(tracks, plan, lambda i: None, scripted(samples, dict.fromkeys(range(kernels), 1.0), tracks, log),
               random.Random(seed))
    return log


def test_shuffled_rounds_give_every_kernel_one_block_and_vary_who_runs_before_it() -> None:
    """Under a power cap a kernel's clocks depend on the kernel that ran before it: in the default
    order no kernel always follows the same one, nor always runs first."""
    log = shuffled_log(seed=3)
    rounds = [log[r:r + 4] for r in range(0, len(log), 4)]
    assert len(rounds) == 40 and all(sorted(r) == [0, 1, 2, 3] for r in rounds)
    assert len({tuple(r) for r in rounds}) > 10  # not one succession rotated
    assert {r[0] for r in rounds} == {0, 1, 2, 3}
    for k in range(4):
        before = {log[j - 1] for j in range(1, len(log)) if log[j] == k}
        assert before >= {0, 1, 2, 3} - {k}  # (itself too, where it ends one round and opens the next)
    assert shuffled_log(seed=3) == log  # seeded: the same generator state gives the same orders
    assert shuffled_log(seed=4) != log


def test_an_unknown_order_or_a_negative_settle_count_is_refused() -> None:
    with pytest.raises(ValueError, match="order must be one of shuffled, rotating"):
        TimingPlan(order="sorted")
    with pytest.raises(ValueError, match="settle_launches must be 0 or more"):
        TimingPlan(settle_launches=-1)


def test_a_slow_kernel_reaches_its_cap_in_fewer_rounds() -> None:
    tracks = [Track([], False) for _ in range(2)]
    samples = {i: itertools.cycle(NOISY) for i in range(2)}
    log: list[int] = []
    plan = TimingPlan(rounds=2, spread_target=0.02, time_cap_ms=12.0)
    interleave(tracks, plan, lambda i: None, scripted(samples, {0: 6.0, 1: 1.0}, tracks, log))
    assert [(t.rounds, t.stop) for t in tracks] == [(2, "cap"), (12, "cap")]
    assert sorted(log[:2]) == sorted(log[2:4]) == [0, 1] and set(log[4:]) == {1}


# ---- cold copies and graph layout -----------------------------------------------------------------
@pytest.mark.parametrize(("footprint_mb", "l2_mb", "copies"), [(32, 50, 5), (1, 50, 101), (384, 50, 2), (100, 50, 2)])
def test_cold_copies_exceed_twice_the_l2_between_two_uses_of_one(footprint_mb: int, l2_mb: int, copies: int) -> None:
    n = cold_copies_needed(footprint_mb * 2**20, l2_mb * 2**20)
    assert n == copies
    assert (n - 1) * footprint_mb >= 2 * l2_mb


def test_cold_copies_of_nothing_is_a_bug() -> None:
    with pytest.raises(ValueError):
        cold_copies_needed(0, 50 * 2**20)


@pytest.mark.parametrize(("copies", "launches"), [(1, 1), (3, 40), (5, 7), (7, 5), (101, 20), (512, 8), (512, 1),
                                                  (2000, 3), (3, 5000)])
def test_graph_layout_uses_every_copy_equally_once_per_cycle(copies: int, launches: int) -> None:
    graphs = graph_layout(copies, launches)
    cycle = [k for g in graphs for k in g]
    assert len(graphs) <= MAX_GRAPHS and all(g for g in graphs)
    assert all(len(g) <= max(MAX_GRAPH_LAUNCHES, math.ceil(copies / MAX_GRAPHS)) for g in graphs)
    passes, rest = divmod(len(cycle), copies)
    assert rest == 0 and sorted(cycle) == sorted(list(range(copies)) * passes)
    # consecutive uses of one copy, across the cycle's end too, are a whole cycle of copies apart
    doubled = cycle + cycle
    for k in range(copies):
        at = [j for j, c in enumerate(doubled) if c == k]
        assert all(b - a == copies for a, b in itertools.pairwise(at))


def test_graph_layout_of_few_copies_is_one_graph_near_the_launches_asked() -> None:
    [g] = graph_layout(3, 40)
    assert len(g) == 42 and g[:4] == [0, 1, 2, 0]


# ---- roofline -------------------------------------------------------------------------------------
H100 = DeviceCeilings("NVIDIA H100 80GB HBM3", "580.1", copy_gbps=3000.0, matmul_tflops=750.0)


def test_roofline_bound_is_the_larger_of_compute_and_memory_time() -> None:
    n = 8192
    flops, nbytes = 2.0 * n**3, 3.0 * n * n * 2
    assert H100.bound_ms(flops, nbytes) == pytest.approx(flops / 750e12 * 1e3)  # compute-bound
    assert H100.bound_ms(1e6, 3e9) == pytest.approx(1.0)  # memory-bound: 3 GB at 3000 GB/s
    assert roofline_ms(0.0, 0.0, copy_gbps=1.0, matmul_tflops=1.0) == 0.0


def test_roofline_percentage_is_the_bound_over_the_measured_median() -> None:
    assert H100.roofline_pct(1e6, 3e9, 2.0) == pytest.approx(50.0)
    assert H100.roofline_pct(1e6, 3e9, 1.0) == pytest.approx(100.0)
    assert roofline_pct(1e6, 3e9, None, copy_gbps=3000.0, matmul_tflops=750.0) is None
    assert H100.roofline_pct(1e6, 3e9, 0.0) is None


def test_roofline_refuses_rates_that_are_not_positive() -> None:
    with pytest.raises(ValueError, match="ceilings must be positive"):
        roofline_ms(1.0, 1.0, copy_gbps=0.0, matmul_tflops=750.0)
    with pytest.raises(ValueError, match="work must not be negative"):
        roofline_ms(-1.0, 1.0, copy_gbps=1.0, matmul_tflops=1.0)


def test_timing_without_adaptive_fields_keeps_its_old_meaning() -> None:
    t = Timing(1.0, 0.9, 1.1, 0.8, 10, True)
    assert (t.spread_target, t.time_cap_ms, t.stop_reason, t.timed_ms) == (None, None, "", None)
    assert t.method == "cuda-events"


# ---- outclassed configs ----------------------------------------------------------------------------
def verified(index: int, verify_ms: list[float]) -> object:
    from tilepilot.kernels.evaluate import _Verified

    return _Verified(index, [], 0.001, None, verify_ms=verify_ms)


OUTCLASS = TimingPlan(outclass_ratio=2.0, outclass_min_ms=0.2)


def test_a_config_twice_as_slow_as_the_batch_best_is_not_timed_further() -> None:
    from tilepilot.kernels.evaluate import outclassed_timings

    batch = [verified(0, [0.30, 0.31, 0.29]), verified(1, [0.61, 0.60, 0.90]), verified(2, [0.55, 0.59, 0.58])]
    got = outclassed_timings(batch, OUTCLASS, math.inf)  # type: ignore[arg-type]
    assert list(got) == [1]  # 0.61 >= 2 x 0.30; 0.58 is not
    t = got[1]
    assert (t.median_ms, t.min_ms, t.reps, t.stop_reason, t.l2_flushed) == (0.61, 0.60, 3, "outclassed", False)
    assert t.timed_ms == pytest.approx(2.11) and t.method == "cuda-events"


def test_the_best_time_seen_before_outclasses_a_batch_of_slow_configs() -> None:
    from tilepilot.kernels.evaluate import outclassed_timings

    batch = [verified(0, [1.0, 1.0, 1.0]), verified(1, [1.9, 1.9, 1.9])]
    assert outclassed_timings(batch, OUTCLASS, math.inf) == {}  # type: ignore[arg-type]  # 1.9 < 2 x 1.0
    assert outclassed_timings(batch, OUTCLASS, 0.9).keys() == {1}  # type: ignore[arg-type]
    assert outclassed_timings(batch, OUTCLASS, 0.4).keys() == {0, 1}  # type: ignore[arg-type]
    assert outclassed_timings(batch[:1], OUTCLASS, math.inf) == {}  # type: ignore[arg-type]  # never itself


def test_short_kernels_and_plans_without_a_ratio_are_always_timed() -> None:
    from tilepilot.kernels.evaluate import outclassed_timings

    batch = [verified(0, [0.01] * 3), verified(1, [0.15] * 3), verified(2, [])]
    assert outclassed_timings(batch, OUTCLASS, math.inf) == {}  # type: ignore[arg-type]  # under 0.2 ms
    slow = [verified(0, [0.3] * 3), verified(1, [3.0] * 3)]
    assert outclassed_timings(slow, TimingPlan(), math.inf) == {}  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="outclass_ratio must be above 1"):
        TimingPlan(outclass_ratio=1.0)
