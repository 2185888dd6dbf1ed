"""A cost model of a tiled GEMM config on one device: resources, waves and a predicted time.

The model reads a config through the tile parameters it knows (`BLOCK_SIZE_M` or `BLOCK_M`,
and likewise N and K, `num_warps`, `num_stages`); a space without them has no tile model.

What it estimates for one (problem, config):
- resources: shared memory of the pipelined A/B tiles (`stages × (BM + BN) × BK × bytes`; an
  operand loaded element by element sits there once, not once per stage) against the device's
  per-block and per-SM limits; registers per thread (the fp32
  accumulator `BM·BN / (32·num_warps)` plus addressing: an address per 16-byte load, and per
  element of an operand loaded element by element) against the 255-register limit, the excess
  being spilled (addresses first: those cost reloads, the rest the spill multiplier); resident
  blocks per SM from both;
- the grid: tiles `⌈M/BM⌉·⌈N/BN⌉`, waves over the SMs, work wasted padding M, N, K to the tile;
- time: each SM works through its tiles at the slower of its tensor-core rate (lower for
  small per-warpgroup tiles) and its operand feed (the bandwidth one SM can take, and the
  bytes the asynchronous copies keep in flight over the memory latency; element-wise loads where
  a row stride is not a multiple of 16 go outside that pipeline, synchronously: at a rate of their
  own, at most one K step of the resident tiles' loads per memory latency), plus a
  fill-and-drain cost per round of resident tiles;
  L2 delivering every tile's operands at its aggregate bandwidth bounds the feed (a last,
  partial wave shares L2 among the few SMs that run it, not among all), and DRAM traffic at
  the HBM ceiling bounds the whole, not as a hard maximum: the SMs' time and the DRAM time
  combine as their p-norm (`overlap_power`), the larger where one dominates, more than either
  where they are close (two streams that each need most of the run overlap imperfectly, and a
  config whose SMs keep up with DRAM with room to spare is faster than one that barely does);
  rows of A re-read when M < BLOCK_SIZE_M add a hot-spot term, for a kernel that wraps them
  (`offs_am % M`, as Triton's tutorial and matmul's `persistent` variant do; the other variants of
  the matmul family mask them or read through tensor descriptors, so no row is read twice: see
  `Tile.wraps_rows`); spills multiply it.

The constants are physical quantities of the right order (named in `Constants`), fitted on
recorded data (see `Constants`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tilepilot.agents.roofline import H100_SXM, Device, gemm_dims
from tilepilot.experiments import Config, InputError, Problem

ALIASES = {
    "bm": ("BLOCK_SIZE_M", "BLOCK_M"),
    "bn": ("BLOCK_SIZE_N", "BLOCK_N"),
    "bk": ("BLOCK_SIZE_K", "BLOCK_K"),
    "warps": ("num_warps",),
    "stages": ("num_stages",),
}
TILE_NAMES = frozenset(name for names in ALIASES.values() for name in names)
# The matmul family's variants that read no row of A past M: the grouped and split-K kernels mask
# those rows where M is below BLOCK_SIZE_M (FEW_ROWS), the tma kernels' descriptors fill them with
# zeros. `persistent` wraps them, as does a kernel whose space has no VARIANT (Triton's tutorial).
VARIANT = "VARIANT"
ROWS_MASKED_VARIANTS = frozenset({"grouped", "splitk", "splitk_fused", "tma", "tma_tail", "streamk", "tma_splitk"})


@dataclass(frozen=True)
class Constants:
    """The model's free constants (units in the names).

    The nine fitted ones (`bench/fit_rules.FITTED`) were fitted by `python bench/fit_rules.py
    --problems all --fit` (a ranking loss, Nelder-Mead from round physical values) on all 29
    problems of data/replay/matmul-h100.jsonl.gz, and `scalar_error_var` measured there after the
    fit; `bench/search.py` never scores with these: it refits them without the problem it
    scores. Set by hand: `launch_us` (changes no ranking), `spill_cost` (spilling configs ran
    5-40x slower), `mma_sync_fraction` and the register model (Triton's register counts are
    within ~20 of it; on the recorded H100 grid, every config with vectorised loads it says
    spills did spill, and no other; with element-wise loads its call is right for 297 of 348).
    Measured on another grid: `order_mark`'s table (ORDER_MARK).
    """

    mma_half_area: float = 512.0  # per-warpgroup tile area (elements) at which the MMA rate halves
    mma_sync_fraction: float = 0.5  # rate of warp-level MMA (BM < 64 or < 4 warps: no warpgroup MMA)
    reg_overhead: float = 40.0  # registers per thread besides the accumulator and tile pointers
    regs_per_vector: float = 2.0  # registers per load address: per 16-byte load and stage, per element-wise load
    l2_gbps: float = 7800.4  # operand bandwidth of L2 to all SMs together
    sm_gbps: float = 72.07  # operand bandwidth one SM can take
    latency_us: float = 1.482  # memory latency the pipeline's bytes in flight must cover
    dup_gbps: float = 1204.5  # per distinct row of A: L2 rate for rows re-read when M < BLOCK_SIZE_M
    scalar_gbps: float = 18.007  # per SM: element-wise loads of an operand that is not vectorised
    mma_half_n: float = 79.45  # width N of one warpgroup's MMA at which its rate halves
    fill_us: float = 2.973  # fill and drain of one round of resident tiles (prologue, epilogue)
    launch_us: float = 4.0  # fixed cost of a launch as CUDA events see it
    spill_cost: float = 15.0  # time multiplier per fraction of 255 registers spilled
    dram_refetch: float = 1.0  # scale of the wave-by-wave DRAM traffic estimate
    # the variance of the model's log-error over a problem's configs where both operands load
    # element by element, over that variance on the other problems: measured on the problems the
    # constants are fitted on (bench/fit_rules.error_variance_ratio; 1 where they hold none such)
    scalar_error_var: float = 4.833
    # the p of the p-norm that combines the SMs' time and the DRAM time (p -> inf: the larger)
    overlap_power: float = 2.304
    # how much of ORDER_MARK the times take on: 1 to rank as the timer's shuffled rounds measure,
    # 0 for a grid recorded in rotating order (as the fits read the H100 grid: bench/fit_rules.py)
    order_mark: float = 1.0


# The mark the order of the timer's rounds left on the grid the constants are fitted on, per tile
# shape (BLOCK_SIZE_M, BLOCK_SIZE_N, num_warps): the mean log-ratio of a shape's configs' times,
# shuffled order over rotating, less the problem's median (bench/order_compare.py shape_shift,
# bench/results/order-shape-shift-h200.json, pair h200-grid-vs-rerecord-shuffled: the H200 grid
# recorded on 2026-11-21 in rotating order, as the H100 grid was that day, against four of its
# problems recorded again in shuffled order). The timer shuffles every round now, so the model's
# time of a config is scaled by exp(Constants.order_mark x the mark of its shape): a model fitted
# on the rotating grid then ranks as today's timer measures (decided on the seventh fresh
# H200 set by the rule written before it was recorded: bench/results/matmul-h200-fresh7-plan.json).
ORDER_MARK: Mapping[tuple[int, int, int], float] = {
    (64, 64, 4): 0.021, (64, 64, 8): 0.0389, (64, 128, 4): 0.0035, (64, 128, 8): -0.0072,
    (64, 256, 4): -0.0343, (64, 256, 8): -0.0489, (128, 64, 4): -0.0212, (128, 64, 8): -0.0089,
    (128, 128, 4): -0.067, (128, 128, 8): -0.0952, (128, 256, 8): 0.0892, (256, 64, 4): 0.0133,
    (256, 64, 8): 0.0202, (256, 128, 8): 0.0815,
}

DEFAULT_CONSTANTS = Constants()
CONSTANTS_ENV = "TILEPILOT_RULES_CONSTANTS"


def load_constants(path: str | Path) -> Constants:
    """Constants from a JSON object of `Constants` fields (those left out keep their defaults):
    the model refitted for another device, or without some problems (`bench/fit_rules.py`)."""
    where = f"{CONSTANTS_ENV}={str(path)!r}" if str(path) == os.environ.get(CONSTANTS_ENV) else repr(str(path))
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(f"cannot read the rules constants {where}: {e.strerror or e}") from None
    except ValueError as e:
        raise InputError(f"the rules constants {where} are not JSON: {e}") from None
    fields = {f.name for f in dataclasses.fields(Constants)}
    if not isinstance(raw, dict):
        raise InputError(f"the rules constants {where} must be a JSON object of constants "
                         f"(allowed keys: {', '.join(sorted(fields))})")
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise InputError(f"unknown rules constant {unknown[0]!r} in {where} (allowed: {', '.join(sorted(fields))})")
    for name, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InputError(f"rules constant {name}={value!r} in {where} is not a number")
        if name == "order_mark" and not 0 <= value <= 1:
            raise InputError(f"rules constant order_mark={value!r} in {where} must be from 0 to 1")
        if name != "order_mark" and value <= 0:
            raise InputError(f"rules constant {name}={value!r} in {where} is not a positive number")
    return dataclasses.replace(DEFAULT_CONSTANTS, **{k: float(v) for k, v in raw.items()})


def configured_constants() -> Constants:
    """The constants named by the environment variable TILEPILOT_RULES_CONSTANTS (a JSON file),
    else the shipped ones."""
    path = os.environ.get(CONSTANTS_ENV, "")
    return load_constants(path) if path else DEFAULT_CONSTANTS


@dataclass(frozen=True)
class Tile:
    bm: int
    bn: int
    bk: int
    warps: int
    stages: int
    wraps_rows: bool = True  # rows past M load rows of A again (see ROWS_MASKED_VARIANTS)

    def label(self) -> str:
        return f"{self.bm}×{self.bn}×{self.bk}"


@dataclass(frozen=True)
class Estimate:
    tile: Tile
    shared_bytes: int
    acc_regs: float  # fp32 accumulator values per thread
    regs: float  # estimated registers per thread, before spilling
    spilled_regs: float
    blocks_per_sm: int  # 0: cannot launch
    tiles: int
    waves: float
    waste: float  # fraction of the MMA work spent on padding
    compute_us: float  # busiest SM at its tensor-core rate
    feed_us: float  # busiest SM at its operand feed rate
    dram_us: float
    predicted_ms: float
    limit: str  # what bounds the prediction: compute | feed | dram | launch | resources
    scalar_operands: str = ""  # operands loaded element by element: "", "A", "B" or "A, B"

    @property
    def launches(self) -> bool:
        return self.blocks_per_sm > 0


def tile_of(config: Config) -> Tile | None:
    """The tile parameters of a config, or None when the space has no tile model."""
    return tile_from(config.as_dict())


def tile_from(values: Mapping[str, object]) -> Tile | None:
    """The tile parameters among a config's values (parameter -> value), or None. The tile wraps
    rows past M unless the values name a VARIANT that masks them (ROWS_MASKED_VARIANTS)."""
    found: dict[str, int] = {}
    for field, names in ALIASES.items():
        for name in names:
            v = values.get(name)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                found[field] = v
                break
        else:
            return None
    return Tile(**found, wraps_rows=values.get(VARIANT) not in ROWS_MASKED_VARIANTS)


def element_wise_operands(problem: Problem) -> tuple[str, ...]:
    """The operands ("A", "B") the plain kernel loads element by element. Triton specialises
    integer arguments on divisibility by 16: a row stride (K for A, N for B) that is not a multiple
    of 16 leaves the loads of that operand unvectorised and out of the asynchronous copy pipeline:
    they go through registers at a low rate of their own, and their tile sits in shared memory
    once, not once per stage. () for a problem that is not a GEMM."""
    dims = gemm_dims(problem)
    if dims is None:
        return ()
    _, n, k, _ = dims
    return tuple(name for name, dim in (("A", k), ("B", n)) if dim % 16)


def has_model(problem: Problem, config: Config) -> bool:
    return gemm_dims(problem) is not None and tile_of(config) is not None


def estimate(problem: Problem, config: Config, device: Device = H100_SXM,
             k: Constants = DEFAULT_CONSTANTS) -> Estimate:
    """The model's view of one config. Raises ValueError when the problem or config has no model."""
    tile = tile_of(config)
    if tile is None:
        raise ValueError(f"no tile model for {problem.label()} / {config.label()}")
    return estimate_tile(problem, tile, device, k)


def estimate_tile(problem: Problem, t: Tile, device: Device = H100_SXM, k: Constants = DEFAULT_CONSTANTS) -> Estimate:
    """The model's view of one tile (what `estimate` reads from a config). Raises ValueError when
    the problem has no model."""
    dims = gemm_dims(problem)
    if dims is None:
        raise ValueError(f"no tile model for {problem.label()}")
    m, n, kk, size = dims
    scalar = element_wise_operands(problem)
    vector_rows = (0 if "A" in scalar else t.bm) + (0 if "B" in scalar else t.bn)
    scalar_rows = t.bm + t.bn - vector_rows  # rows of the A and B tiles loaded element by element
    shared = (t.stages * vector_rows + scalar_rows) * t.bk * size
    threads = 32 * t.warps
    acc = t.bm * t.bn / threads
    vectors = vector_rows * t.bk * size / 16 / threads
    # An operand loaded element by element holds one address per element per thread: the model's
    # pointer registers. Past the register limit these spill first (their values are needed once
    # per K step), so their spilling costs reloads at the element-wise rate, not the multiplier
    # of a spilled accumulator or pipeline.
    elements = scalar_rows * t.bk / threads
    held = acc + k.reg_overhead + k.regs_per_vector * vectors
    regs = held + k.regs_per_vector * elements
    spilled = max(0.0, held - device.max_regs_per_thread)
    reloads = max(0.0, regs - device.max_regs_per_thread) - spilled  # spilled pointer registers per thread
    bps = _blocks_per_sm(shared, min(regs, device.max_regs_per_thread), t.warps, device)
    tm, tn, iters = math.ceil(m / t.bm), math.ceil(n / t.bn), math.ceil(kk / t.bk)
    tiles = tm * tn
    waste = 1.0 - (m * n * kk) / (tm * t.bm * tn * t.bn * iters * t.bk)
    if bps == 0:
        return Estimate(t, shared, acc, regs, spilled, 0, tiles, math.inf, waste, math.inf, math.inf,
                        math.inf, math.inf, "resources")
    per_sm = math.ceil(tiles / device.sms)
    waves = tiles / (device.sms * bps)
    groups = max(1, t.warps // 4)  # warpgroups: along M first (64 rows each), the rest split N
    along_m = max(1, min(groups, t.bm // 64))
    width = t.bn / max(1, groups // along_m)  # N of one warpgroup's MMA instruction
    area = t.bm * t.bn / groups
    rate = (device.peak_tflops * 1e12 / device.sms * area / (area + k.mma_half_area)
            * width / (width + k.mma_half_n))  # FLOP/s per SM
    if t.bm < 64 or t.warps < 4:
        rate *= k.mma_sync_fraction
    compute_us = per_sm * 2.0 * t.bm * t.bn * t.bk * iters / rate * 1e6
    stage_bytes = (t.bm + t.bn) * t.bk * size
    vector_bytes = vector_rows * t.bk * size  # what the asynchronous copies bring per stage
    in_flight = max(1, t.stages - 1) * vector_bytes * min(bps, per_sm)
    # The busiest SM at the rate one SM can take, and L2 delivering every tile's operands at its
    # aggregate rate. (Sharing L2 equally among the active SMs for the whole run would charge the
    # tiles of a last, partial wave for SMs that have already finished: 288 tiles on 132 SMs
    # would be fed as if all 132 ran three tiles each.)
    sm_gbps = min(k.sm_gbps, in_flight / (k.latency_us * 1e3))
    vector_us = per_sm * vector_bytes / sm_gbps if vector_bytes else 0.0
    feed_us = max(vector_us, tiles * stage_bytes / k.l2_gbps) * iters * 1e-3
    scalar_bytes = scalar_rows * t.bk * iters * size
    if elements:
        scalar_bytes *= 1.0 + reloads / elements  # one reload per spilled pointer register and K step
        # synchronous loads: a K step's worth per resident tile in flight over the latency
        scalar_step = scalar_rows * t.bk * size * min(bps, per_sm)
        scalar_gbps = min(k.scalar_gbps, scalar_step / (k.latency_us * 1e3))
        feed_us += per_sm * scalar_bytes / (scalar_gbps * 1e3)
    rounds = math.ceil(per_sm / bps)
    sm_us = max(compute_us, feed_us) + rounds * k.fill_us
    dram_us = _dram_bytes(m, n, kk, size, t, tm, tn, bps, device) * k.dram_refetch / (device.hbm_gbps * 1e3)
    # Rows past M re-read rows of A where the kernel wraps them: every tile asks L2 for the same
    # few lines, which serve them at a rate that grows with the number of distinct rows.
    wrapped = max(0, t.bm - m) if t.wraps_rows else 0
    hot_us = tiles * wrapped * t.bk * iters * size / (k.dup_gbps * 1e3 * min(m, t.bm))
    body_us = _p_norm(sm_us, dram_us, k.overlap_power) + hot_us
    limit = "dram" if dram_us > sm_us else ("compute" if compute_us >= feed_us else "feed")
    if body_us < k.launch_us:
        limit = "launch"
    total_us = (body_us + k.launch_us) * (1.0 + k.spill_cost * spilled / device.max_regs_per_thread)
    total_us *= math.exp(k.order_mark * ORDER_MARK.get((t.bm, t.bn, t.warps), 0.0))
    return Estimate(t, shared, acc, regs, spilled, bps, tiles, waves, waste, compute_us, feed_us, dram_us,
                    total_us * 1e-3, limit, ", ".join(scalar))


def _p_norm(a: float, b: float, p: float) -> float:
    """(a^p + b^p)^(1/p) for a, b >= 0, scaled by the larger so that no power overflows."""
    top = max(a, b)
    if top <= 0.0 or math.isinf(top):
        return top
    return top * ((a / top) ** p + (b / top) ** p) ** (1.0 / p)


def _blocks_per_sm(shared: int, regs: float, warps: int, device: Device) -> int:
    if shared > device.smem_per_block:
        return 0
    by_smem = device.smem_per_sm // (shared + 1024)  # the runtime reserves 1 KiB per block
    regs_alloc = 8 * math.ceil(regs / 8)
    by_regs = device.regs_per_sm // (regs_alloc * 32 * warps)
    by_warps = device.max_warps_per_sm // warps
    return int(min(by_smem, by_regs, by_warps, device.max_blocks_per_sm))


def _dram_bytes(m: int, n: int, k: int, size: int, t: Tile, tm: int, tn: int, bps: int, device: Device) -> float:
    """DRAM traffic: the operands once, or more when the resident tiles' panels do not stay in L2.

    Resident tiles cover `rows` tile-rows (the grouped order walks 8 at a time) and as many
    tile-columns as fit; each round reads their A and B panels, and L2 keeps the rest.
    """
    unique = float((m * k + k * n + m * n) * size)
    resident = min(tm * tn, device.sms * bps)
    rows = min(tm, 8, resident)
    cols = min(tn, math.ceil(resident / rows))
    per_round = k * size * (rows * t.bm + cols * t.bn)
    rounds = math.ceil(tm * tn / resident)
    if (m * k + k * n) * size <= device.l2_bytes // 2:
        return unique
    return max(unique, rounds * per_round + m * n * size)
