"""A cost model of a flash-attention config (`attention`: see `kernels/attention.py`) on one device:
resources, the key loop's step and a predicted time, for the `rules` proposer.

A program holds BLOCK_M queries and walks the keys BLOCK_N at a time; each step multiplies its
queries by a K tile (tensor cores), takes the softmax's exponentials and sums of the scores
(the special-function and fp32 units), rescales its accumulator and adds P·V (tensor cores). Its
num_warps/4 warpgroups split the queries and work side by side; below 64 queries a warpgroup (one
Hopper MMA's rows) they split the keys instead, exchange the scores through shared memory every
step and wait on each other (no faster in sequence than one warpgroup). What the model estimates:

- resources: shared memory (num_stages K and V tiles and the Q tile, as `attention.shared_bytes`)
  and registers (the fp32 accumulator and scores and the 16-bit probabilities of each thread, as
  `attention.tile_registers`, and what the compiler adds: about half as many again, seen on the
  recorded sm_90 compiles) against the SM's limits give the programs resident on an SM;
- a step's work on the SM's pipes: tensor-core cycles of both products (at half the datasheet's
  rate, as Triton's kernel reaches on the recorded grid; where their operands take longer to
  stream from shared memory, that: Q and the K tile, which every warpgroup reads whole, for the
  first, the V tile for the second, which takes P from registers), exponentials at the special-function
  units, the fp32 work of the scores and of each query row (rescaling its accumulator, its
  reductions), and the shared-memory exchange above; registers past 70% of the 255 a thread can
  have slow the fp32 work (the compiler's juggling, spills beyond);
- overlap: the resident programs share the pipes (their sum is the p-norm of the pipes, a
  throughput bound), while one program's step runs its parts in sequence (a latency bound); a
  round of every resident program's step takes the p-norm of the two, plus what the K/V loads
  leave exposed: a load is issued num_stages - 1.5 rounds ahead of its use (the last buffer waits
  for the MMA reading it) and takes an L2 round trip under load;
- the grid: each program walks all keys (causal: up to its diagonal, the diagonal block
  included), programs spread over the resident slots of all SMs; the longest program bounds the
  time from below.

The constants (`AttentionConstants`) are quantities of the right order set by hand, chosen while
the model was written against the recorded H100 grid (`data/replay/attention-h100.jsonl.gz`, 8
problems). Two fresh H200 sets, each planned first, measured it (`bench/results/attention-h200-
fresh-plan.json`: whether `rules` keeps it; `-fresh2-plan.json`: the key split's waiting and the
shared-memory streaming, read off the first set's misses); a third (`-fresh3-plan.json`) turned
down a change read off the first two (bookkeeping issued per warpgroup, the programs an SM really
holds, the longest program alone on its SM): fewer configs to 2% but a higher mean regret at 5
configs, as decided in advance. The `rules` proposer corrects the model
with the results of nearby problems the store holds and with the problem's own. No torch, no
triton here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tilepilot.agents.roofline import Device
from tilepilot.experiments import Config, Problem

ATTENTION_PARAMS = frozenset({"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"})
ATTENTION_KEYS = frozenset({"B", "H", "S", "D", "causal", "dtype"})
DTYPE_BYTES = {"bf16": 2, "fp16": 2}
WARP = 32
WARPGROUP = 4  # warps: one Hopper MMA's issue unit
MMA_ROWS = 64  # rows of one warpgroup's MMA
RESERVED_SMEM = 1024  # shared memory the driver reserves per block
BARRIER_BYTES = 1024  # the tma variant's copy barriers (`attention.TMA_BARRIER_BYTES`)


@dataclass(frozen=True)
class AttentionConstants:
    mma_flop_per_clock: float = 4096.0  # dense 16-bit FLOP per SM-cycle (the datasheet's 989 TFLOP/s)
    mma_efficiency: float = 0.5  # of that, what Triton's kernel reaches on the recorded H100 grid
    exp_per_clock: float = 16.0  # exponentials per SM-cycle (special-function units)
    fp32_per_clock: float = 128.0  # fp32 operations per SM-cycle
    ops_per_score: float = 4.0  # scale, max, sum, convert per score
    ops_per_row: float = 96.0  # a query row's per-step work besides its accumulator (alpha, m, l, reductions)
    step_issue: float = 100.0  # SM-cycles of a step's own bookkeeping (addresses, barriers, loop)
    step_latency: float = 250.0  # SM-cycles one step waits in sequence besides its work (MMA and shuffle latency)
    tma_latency: float = 40.0  # more per step through the tensor-memory copies (their barriers)
    load_latency: float = 3000.0  # SM-cycles of a K/V tile's round trip from L2 under load
    lead: float = 1.5  # rounds a load is issued ahead of its use: num_stages - lead
    stage_cost: float = 0.03  # each pipeline stage past 3 lengthens a step by this much
    exchange_bytes: float = 8.0  # shared-memory bytes per score exchanged when warpgroups split keys
    smem_bytes_per_clock: float = 128.0  # shared memory read per SM-cycle
    pressure_from: float = 0.7  # registers past this share of a thread's 255 slow its fp32 work...
    pressure_cost: float = 6.0  # ...by this much per unit of the share
    overlap_power: float = 3.0  # parts combine as their p-norm
    clock_ghz: float = 1.98  # the SM clock (the recorded grids run near boost)


@dataclass(frozen=True)
class AttentionEstimate:
    regs: int
    shared_bytes: int
    blocks_per_sm: int  # programs resident on one SM (0: cannot launch)
    programs: int
    steps: int  # key steps of all programs together
    round_cycles: float  # one step of every resident program
    exposed_cycles: float  # of which the loads leave waiting
    predicted_ms: float
    limit: str  # throughput | latency | longest program | resources

    @property
    def launches(self) -> bool:
        return self.blocks_per_sm > 0


def attention_space(names: frozenset[str] | set[str], problem: Problem) -> bool:
    """Whether a space (its parameter names) and a problem are the flash-attention kernel's the model
    reads: positive int B, H, S, a head dim, a causal flag and a 16-bit dtype."""
    if not (ATTENTION_PARAMS <= set(names) and ATTENTION_KEYS <= set(problem.keys())):
        return False
    sizes = [problem[k] for k in ("B", "H", "S", "D")]
    return (all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes)
            and isinstance(problem["causal"], bool) and str(problem["dtype"]) in DTYPE_BYTES)


def _pnorm(parts: list[float], p: float) -> float:
    return sum(x ** p for x in parts) ** (1 / p)


def estimate_attention(problem: Problem, config: Config, device: Device,
                       k: AttentionConstants | None = None) -> AttentionEstimate:
    """The model's estimate of one config (see the module docstring)."""
    k = k or AttentionConstants()
    b, h, s, d = (int(problem[n]) for n in ("B", "H", "S", "D"))
    causal, size = bool(problem["causal"]), DTYPE_BYTES[str(problem["dtype"])]
    bm, bn = int(config["BLOCK_M"]), int(config["BLOCK_N"])
    warps, stages = int(config["num_warps"]), int(config["num_stages"])
    tma = config.get("VARIANT") == "tma"
    threads = WARP * warps
    groups = max(1, warps // WARPGROUP)
    rows = bm / groups  # queries of one warpgroup

    shared = (stages * 2 * bn + bm) * d * size + (BARRIER_BYTES if tma else 0)
    tile_regs = (bm * d + bm * bn + bm * bn // 2) / threads
    regs = 1.45 * tile_regs + 10
    regs_alloc = min(device.max_regs_per_thread, 8 * math.ceil(regs / 8))
    fit = [device.max_blocks_per_sm, device.max_warps_per_sm // warps, device.regs_per_sm // (threads * regs_alloc),
           device.smem_per_sm // (shared + RESERVED_SMEM) if shared <= device.smem_per_block else 0]
    resident = max(0, min(fit))
    n_m = math.ceil(s / bm)
    programs = b * h * n_m
    if not resident:
        return AttentionEstimate(int(regs), shared, 0, programs, 0, math.inf, 0.0, math.inf, "resources")

    pressure = 1 + k.pressure_cost * max(0.0, regs / device.max_regs_per_thread - k.pressure_from)
    # both products, 2·D FLOPs each per query-key pair, or the shared memory their operands stream
    # from where that takes longer: Q and K for the first (every warpgroup reads all of the K
    # tile), V for the second (P stays in registers)
    mmas = bm / MMA_ROWS
    flops = 2 * bm * bn * d / k.mma_flop_per_clock
    qk = max(flops, (bm * d * size + mmas * bn * d * size) / k.smem_bytes_per_clock)
    pv = max(flops, mmas * bn * d * size / k.smem_bytes_per_clock)
    mma = (qk + pv) / k.mma_efficiency
    exp = bm * bn / k.exp_per_clock
    fp32 = bm * bn * k.ops_per_score / k.fp32_per_clock * pressure
    per_row = bm * (d + k.ops_per_row) / k.fp32_per_clock
    exchange = (k.exchange_bytes * bm * bn / k.smem_bytes_per_clock * (MMA_ROWS / rows)) if rows < MMA_ROWS else 0.0
    pipes = _pnorm([mma, exp, fp32 + exchange + per_row + k.step_issue], k.overlap_power)
    split = groups if rows >= MMA_ROWS else 1  # warpgroups splitting the keys wait on each other's halves
    chain = ((mma + exp + fp32 + per_row) / split + exchange + k.step_latency + (k.tma_latency if tma else 0.0)) \
        * (1 + k.stage_cost * (stages - 3))
    throughput = resident * pipes
    round_cycles = _pnorm([throughput, chain], k.overlap_power)
    exposed = 0.0
    for _ in range(4):  # the exposed load latency depends on the round it hides behind
        exposed = max(0.0, k.load_latency - (stages - k.lead) * round_cycles)
        round_cycles = _pnorm([throughput, chain + exposed], k.overlap_power)

    if causal:  # program m walks keys 0 .. its last query
        per_program = [math.ceil(min(s, (m + 1) * bm) / bn) for m in range(n_m)]
    else:
        per_program = [math.ceil(s / bn)] * n_m
    steps = b * h * sum(per_program)
    spread = steps / device.sms * round_cycles / resident  # every SM busy with `resident` programs
    longest = max(per_program) * round_cycles
    cycles = max(spread, longest)
    limit = ("longest program" if longest > spread else "throughput" if throughput >= chain + exposed
             else "latency")
    return AttentionEstimate(int(regs), shared, resident, programs, steps, round_cycles, exposed,
                             cycles / (k.clock_ghz * 1e6), limit)


def describe_attention(est: AttentionEstimate, config: Config) -> str:
    """One sentence on what the model sees in a config."""
    groups = max(1, int(config["num_warps"]) // WARPGROUP)
    rows = int(config["BLOCK_M"]) // groups
    split = "" if rows >= MMA_ROWS else ", the warpgroups splitting the keys"
    resident = f"{est.blocks_per_sm} program{'s' if est.blocks_per_sm != 1 else ''} resident an SM"
    return (f"{config['BLOCK_M']} queries a program ({rows} a warpgroup{split}), keys {config['BLOCK_N']} a step "
            f"through {config['num_stages']} stages; about {est.regs} registers a thread, "
            f"{est.shared_bytes // 1024} KiB shared, {resident}; {est.programs} programs; bound by {est.limit}")
