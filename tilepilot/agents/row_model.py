"""A cost model of a row-wise config (`softmax`, `rmsnorm`, `layernorm`: see `kernels/rowwise.py`) on
one device: resources, waves and a predicted time, for the `rules` proposer.

A program handles ROWS_PER_PROGRAM rows, one after another; a row is read in blocks of BLOCK_SIZE
values spread over 32·num_warps threads (`v` values a thread). In one pass (the row fits a block)
each row is one load, its reductions and one store; in two, a first loop over the row's blocks
gathers the statistics and a second reads them again and writes. What the model estimates:

- resources: registers per thread (addressing and the reductions, plus about two fp32 values for
  each value a thread holds; past what leaves room for one program, they spill) and the pipeline's
  shared memory (`(num_stages - 1)` blocks of each operand the loop loads) against the SM's limits
  give the programs resident on an SM;
- the grid: `⌈rows / ROWS_PER_PROGRAM⌉` programs in waves over the resident slots of all SMs;
- time: three bounds, combined as their p-norm (the slowest, and more where two are close), plus
  a launch. (1) Latency: a program waits for each load in turn, a memory latency per load (from
  L2 where the data is there: these kernels run without an L2 flush), divided by the depth of the
  loop's pipeline where `num_stages` pipelines it (over the rows of one pass, over the blocks of a
  row in two); it works through its values in sequence (`value_ns` each: a thread's exp,
  reductions and store; more where they spill out of the registers); waves run one after another.
  (2) Streaming: the bytes at the DRAM ceiling (the input, twice in two passes, from L2 where it
  fits there with the output) and every load at L2's. (3) Issue: every loop step's warp
  instructions (its values' and its own) at the SMs' schedulers.

The constants are physical quantities of the right order (`RowConstants`), set by hand, not
fitted, while the model was written against the recorded H100 grids of the three families
(`data/replay/{softmax,rmsnorm,layernorm}-h100.jsonl.gz`); the `rules` proposer corrects the model
with the results of nearby problems the store holds and with the problem's own.
No torch, no triton here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tilepilot.agents.roofline import Device
from tilepilot.experiments import Config, Problem

ROW_PARAMS = frozenset({"BLOCK_SIZE", "ROWS_PER_PROGRAM", "num_warps", "num_stages"})
ROW_KEYS = frozenset({"rows", "cols", "dtype"})
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
VECTORS = {"softmax": 0, "rmsnorm": 1, "layernorm": 2}  # per-column operands the write loop loads besides x


@dataclass(frozen=True)
class RowConstants:
    dram_latency_us: float = 0.8  # a load's round trip to DRAM, as the waiting thread sees it
    l2_latency_us: float = 0.4  # the same from L2
    value_ns: float = 15.0  # a thread's work on one value in sequence (convert, exp or square, reduce, store)
    instr_per_value: float = 12.0  # warp instructions a value of each thread costs (a warp's 32 lanes at once)
    instr_per_step: float = 60.0  # warp instructions of one loop step besides its values (addresses, masks, reductions)
    sync_us: float = 0.1  # a step's reduction across the warps (shared memory and a barrier) as a thread waits
    clock_ghz: float = 1.755  # the SM clock under load (datasheet boost 1.98)
    stream_gbps: float = 3000.0  # DRAM rate of a streaming kernel (the datasheet's 3.35 TB/s, less overheads)
    l2_gbps: float = 7800.0  # L2 to all SMs together (`tile_model.Constants.l2_gbps`)
    launch_us: float = 2.0  # a launch and a program's start, the same for every config
    base_regs: int = 24  # registers a thread needs besides the values it holds
    overlap_power: float = 3.0  # the bounds combine as their p-norm: a run near two of them is slower than at either


@dataclass(frozen=True)
class RowEstimate:
    single_pass: bool
    values_per_thread: int
    regs: int
    blocks_per_sm: int  # programs resident on one SM (0: cannot launch)
    programs: int
    waves: int
    latency_us: float  # bound (1): a program's chain of loads and values, wave after wave
    stream_us: float  # bound (2): bytes at the DRAM and L2 ceilings
    issue_us: float  # bound (3): warp instructions at the SMs' schedulers
    predicted_ms: float
    limit: str  # latency | stream | issue | resources

    @property
    def launches(self) -> bool:
        return self.blocks_per_sm > 0


def row_space(names: frozenset[str] | set[str], problem: Problem) -> bool:
    """Whether a space (its parameter names) and a problem are a row-wise kernel's the model reads:
    positive int rows and cols, and an element size it knows."""
    if not (ROW_PARAMS <= set(names) and ROW_KEYS <= set(problem.keys())):
        return False
    sizes = [problem["rows"], problem["cols"]]
    return (all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes)
            and str(problem["dtype"]) in DTYPE_BYTES)


def estimate_rows(kernel: str, problem: Problem, config: Config, device: Device,
                  k: RowConstants | None = None) -> RowEstimate:
    """The model's estimate of one config (see the module docstring)."""
    k = k or RowConstants()
    rows, cols, size = int(problem["rows"]), int(problem["cols"]), DTYPE_BYTES[str(problem["dtype"])]
    block, per_program = int(config["BLOCK_SIZE"]), int(config["ROWS_PER_PROGRAM"])
    warps, stages = int(config["num_warps"]), int(config["num_stages"])
    vectors = VECTORS.get(kernel, 0)
    threads = 32 * warps
    v = max(1, block // threads)
    single = cols <= block
    blocks = 1 if single else math.ceil(cols / block)
    loads = 1 if single else 1 + vectors  # operands the pipelined loop carries in shared memory
    regs = k.base_regs + 2 * v
    # the compiler fits one program on an SM at least: past this many registers a thread spills
    cap = min(device.max_regs_per_thread, 8 * (device.regs_per_sm // threads // 8))
    regs_alloc = min(cap, 8 * math.ceil(regs / 8))
    shared = (stages - 1) * block * size * loads
    fit = [device.max_blocks_per_sm, device.max_warps_per_sm // warps, device.regs_per_sm // (threads * regs_alloc)]
    if shared:
        fit.append(device.smem_per_sm // shared if shared <= device.smem_per_block else 0)
    resident = max(0, min(fit))
    programs = math.ceil(rows / per_program)
    if not resident:
        return RowEstimate(single, v, regs, 0, programs, 0, math.inf, math.inf, math.inf, math.inf, "resources")
    slots = resident * device.sms
    waves = math.ceil(programs / slots)

    x_bytes = rows * cols * size
    in_l2 = 2 * x_bytes <= device.l2_bytes // 2  # input and output stay in L2 between launches
    first = k.l2_latency_us if in_l2 else k.dram_latency_us
    spill = max(1.0, regs / cap)  # values past the registers go to local memory
    work = v * k.value_ns * 1e-3 * spill  # a thread's values of one block, in sequence
    if single:
        depth = min(stages, per_program)  # the rows' loop is the one pipelined
        row_us = first / depth + work + k.sync_us
        steps = 1
    else:
        depth = min(stages, blocks)  # each pass's loop over the row's blocks
        row_us = blocks * (first / depth + work + k.sync_us) + blocks * (first / depth + work * (1 + vectors / 2))
        steps = 2 * blocks
    latency_us = waves * per_program * row_us

    # the input (twice in two passes: other rows streaming through L2 evict a row before its second
    # read) unless it is in L2, and the output
    dram = x_bytes * (0 if in_l2 else 1 if single else 2) + x_bytes
    l2 = x_bytes * (1 if single else 2) + x_bytes + vectors * rows * cols * size
    stream_us = max(dram / (k.stream_gbps * 1e3), l2 / (k.l2_gbps * 1e3))
    issue_per_us = device.sms * 4 * k.clock_ghz * 1e3  # warp instructions: 4 schedulers an SM
    issue_us = programs * per_program * steps * warps * (k.instr_per_step + v * k.instr_per_value) / issue_per_us

    bounds = {"latency": latency_us, "stream": stream_us, "issue": issue_us}
    limit = max(bounds, key=bounds.__getitem__)
    combined = sum(b ** k.overlap_power for b in bounds.values()) ** (1 / k.overlap_power)
    return RowEstimate(single, v, regs, resident, programs, waves, latency_us, stream_us, issue_us,
                       (combined + k.launch_us) * 1e-3, limit)


def describe_rows(est: RowEstimate, config: Config) -> str:
    """One sentence on what the model sees in a config."""
    rows = int(config["ROWS_PER_PROGRAM"])
    passes = "the row in one block" if est.single_pass else "two passes over the row's blocks"
    return (f"{passes}, {est.values_per_thread} value{'s' if est.values_per_thread != 1 else ''} a thread over "
            f"{config['num_warps']} warps; {est.programs} program{'s' if est.programs != 1 else ''} of {rows} "
            f"row{'s' if rows != 1 else ''}, {est.blocks_per_sm} resident an SM, {est.waves} "
            f"wave{'s' if est.waves != 1 else ''}; bound by {est.limit}")
