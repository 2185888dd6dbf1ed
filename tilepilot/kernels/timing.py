"""Timing of several kernels at once, interleaved, so that drift in clocks and temperature hits
them alike, with as many repetitions as each kernel needs.

GPU: each kernel is warmed up and its time estimated. A kernel shorter than
`plan.graph_below_ms` is timed by CUDA-graph replay (method "cuda-graph"): runs of its launches
are captured in graphs, and one sample is the mean launch time of one replay (about SAMPLE_MS of
GPU time), timed with CUDA events; host launch overhead stays out. A longer kernel (method
"cuda-events") is launched from the host, and one sample is the mean time of a run of about
SAMPLE_MS of back-to-back launches between two CUDA events (one launch when it is longer): a pair
of events around every launch would add the launch latency to each (seen on an H100: 34.5 µs per
launch that way for a 2048³ bf16 matmul that graph replay timed at 27.0 µs).

Then rounds run, each giving every kernel still going one block of about `plan.block_ms` of GPU
time, in an order drawn afresh every round (`plan.order` "shuffled", the default, from a seeded
generator), so that no kernel always runs first or always follows the same kernel. Under a power cap
a kernel's clocks depend on what ran in the milliseconds before it. In a fixed succession (A B C, B
C A, ...: "rotating", the order before) each kernel follows the same one in nearly every round, and
its time carries that neighbour's mark, the same in every run: on an H200, the near-best configs of
large problems read 2.6-4.4% apart (median; up to 12%) between the two orders, more than either
order's run-to-run spread (rotating 1%, shuffled 1.3-2.2%), and a rotating recording's best config
was up to 14% slower than the shuffled one's best (bench/order_probe.py, bench/order_compare.py,
bench/results/order-repeatability-h200.json). After at least `plan.rounds` rounds a kernel stops
once the relative spread of its samples, (p80 - p20) / median, is at most `plan.spread_target`
("spread", and no sooner than MIN_SPREAD_SAMPLES samples) or the GPU time spent timing it reached
`plan.time_cap_ms` ("cap"); the others go on. The spread of the samples does not shrink with more of
them: the target says how steady a kernel's samples must be to stop early, the cap bounds the cost
of the rest.

Cold L2 (`plan.flush_l2`): a kernel whose launches rotate over copies of its data that together
exceed twice the L2 (the caller makes them, see `cold_copies_needed`; `cold[i]` says so) is timed
as above, each launch reading data no recent launch touched. Otherwise L2 is flushed (a buffer
twice its size zeroed) before each launch, outside the events, and the kernel is timed with
events around each launch. Warm (not `flush_l2`): launches rotate over the input sets given.

Inside a block (bench/block_probe.py, bench/results/block-probe-h200.json, an H200): the first
sample reads about 40 µs slow whichever kernel ran before (the same config too: 6-25% of a 0.3 ms
matmul, 0-15% of a 1.3 ms one), and the rest differ by the kernel before it to the block's end (a
config's last quarter of a 10 ms block 0-8% over its median by predecessor, rotating order): the
mark outlasts a block, and the shuffled order spreads it instead of settling it. `plan.settle_launches`
runs that many launches of the kernel untimed at the start of each block (counted in its GPU time);
the default is none: with one, a campaign's plan measured medians within 0.6% of those without, was
no steadier from repeat to repeat (2.1% -> 2.8% on one problem, 2.0% -> 1.5% on another), and spent
2-22% more GPU time per config (bench/settle_probe.py, bench/results/settle-probe-h200.json).

A short spin kernel at the start of each block keeps the GPU ahead of the host, so that launch
overhead stays outside the events; the launches that estimate a kernel's time queue behind a spin
longer than the host takes to issue them (a slow launch from the host would otherwise read as a
long kernel and be timed by events, host-bound), and a kernel timed by events whose launch takes
the host at least HOST_BOUND of its GPU time (a chain of eager PyTorch operations, say) gets such
a spin before each sample, so that its samples are GPU time as graph replay's are. The device
is synchronised after every block, so that an error is raised while its kernel's block runs.
Timing runs on a side stream of its own.

CPU (method "cpu-wallclock", for the interpreter): `rounds` rounds of one launch each, timed
with perf_counter. These are CPU timings and are labelled so.

Every timing field is in milliseconds.
"""

from __future__ import annotations

import gc
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tilepilot.experiments import Timing
from tilepilot.kernels import failures

log = logging.getLogger(__name__)

Launch = Callable[[], None]
OnStart = Callable[[int], None]

METHOD_EVENTS, METHOD_GRAPH, METHOD_CPU = "cuda-events", "cuda-graph", "cpu-wallclock"
STOP_SPREAD, STOP_CAP, STOP_OUTCLASSED = "spread", "cap", "outclassed"
ORDERS = ("shuffled", "rotating")  # TimingPlan.order
ORDER_SEED = 0  # the seed of a GpuTimer's generator of round orders

MAX_SAMPLES = 100  # samples in one events block
WARMUP_LAUNCHES = 2
ESTIMATE_LAUNCHES = 3
SPIN_CYCLES = 200_000  # ~0.1 ms at 2 GHz
MAX_ESTIMATE_SPIN_MS = 5.0  # the longest spin ahead of the estimate's launches
HOST_BOUND = 0.5  # events: a kernel whose launch takes the host this share of its GPU time or more
MAX_SAMPLE_SPIN_MS = 20.0  # the longest spin ahead of one sample of such a kernel
IDLE_S = 1.0  # idle this long, a GPU has lowered its clocks
WAKE_MS = 30.0  # busy time that brings them back before timing
MIN_SPREAD_SAMPLES = 5  # fewer samples say too little about their spread to stop on it
MAX_ROUNDS = 200
SAMPLE_MS = 0.2  # GPU time of one sample: a graph replay, or a run of launches between two events
MAX_GRAPH_LAUNCHES = 1000
MAX_GRAPHS = 64  # graphs of one kernel (they split its copies between them)
MAX_REPLAYS = 1000  # replays in one block


@dataclass(frozen=True)
class TimingPlan:
    """How long and how finely to time: at least `rounds` interleaved rounds of about `block_ms`
    of GPU time per kernel, then more until the spread target or the time cap (per kernel)."""

    rounds: int = 3
    block_ms: float = 1.0
    flush_l2: bool = True  # cold: each launch reads data that is not in L2
    spread_target: float = 0.02  # (p80 - p20) / median at or under which a kernel stops
    time_cap_ms: float = 15.0  # GPU time spent timing one kernel after which it stops
    graph_below_ms: float = 0.05  # kernels shorter than this are timed by CUDA-graph replay
    # Evaluator only: a config whose verification launches took at least this many times the
    # problem's best time (and at least outclass_min_ms) is not timed further; None: every config
    # is timed (see evaluate.py)
    outclass_ratio: float | None = None
    outclass_min_ms: float = 0.2
    order: str = "shuffled"  # the kernels' order in each round: one of ORDERS (see the module docstring)
    settle_launches: int = 0  # untimed launches of the kernel at the start of each block (see `GpuTimer._block`)

    def __post_init__(self) -> None:
        if self.rounds < 1 or not self.block_ms > 0 or self.spread_target < 0 or not self.time_cap_ms > 0:
            raise ValueError(f"bad timing plan {self}: rounds >= 1, block_ms > 0, spread_target >= 0 "
                             "and time_cap_ms > 0")
        if self.settle_launches < 0:
            raise ValueError(f"bad timing plan {self}: settle_launches must be 0 or more")
        if self.order not in ORDERS:
            raise ValueError(f"bad timing plan {self}: order must be one of {', '.join(ORDERS)}")
        if self.outclass_ratio is not None and not self.outclass_ratio > 1:
            raise ValueError(f"bad timing plan {self}: outclass_ratio must be above 1, or None")


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of already sorted values."""
    if not sorted_values:
        raise ValueError("no values")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def relative_spread(samples_ms: Sequence[float]) -> float:
    """(p80 - p20) / median of the samples (0 for a median of 0), as `Timing.rel_spread`."""
    s = sorted(samples_ms)
    median = quantile(s, 0.5)
    return (quantile(s, 0.8) - quantile(s, 0.2)) / median if median > 0 else 0.0


def summarise(samples_ms: Sequence[float], *, l2_flushed: bool, method: str, spread_target: float | None = None,
              time_cap_ms: float | None = None, stop_reason: str = "", timed_ms: float | None = None) -> Timing:
    s = sorted(samples_ms)
    return Timing(median_ms=quantile(s, 0.5), p20_ms=quantile(s, 0.2), p80_ms=quantile(s, 0.8),
                  min_ms=s[0], reps=len(s), l2_flushed=l2_flushed, method=method, spread_target=spread_target,
                  time_cap_ms=time_cap_ms, stop_reason=stop_reason, timed_ms=timed_ms)


def stop_reason(samples_ms: Sequence[float], rounds: int, timed_ms: float, plan: TimingPlan) -> str:
    """Why a kernel's timing stops after `rounds` rounds: "spread" when its samples' relative
    spread is at most the target (given MIN_SPREAD_SAMPLES samples), "cap" when `timed_ms` reached
    the time cap (or MAX_ROUNDS rounds ran), "" to go on. Never before `plan.rounds` rounds."""
    if rounds < plan.rounds:
        return ""
    if len(samples_ms) >= MIN_SPREAD_SAMPLES and relative_spread(samples_ms) <= plan.spread_target:
        return STOP_SPREAD
    if timed_ms >= plan.time_cap_ms or rounds >= MAX_ROUNDS:
        return STOP_CAP
    return ""


def cold_copies_needed(footprint_bytes: int, l2_bytes: int) -> int:
    """Copies of a kernel's data to rotate over so that, between two uses of one copy, the other
    copies touched more than twice the L2: ceil(2 * L2 / footprint) + 1, at least 2."""
    if footprint_bytes <= 0:
        raise ValueError(f"footprint must be positive, not {footprint_bytes}")
    return max(2, math.ceil(2 * l2_bytes / footprint_bytes) + 1)


def graph_layout(copies: int, launches: int) -> list[list[int]]:
    """Which copy each launch of each graph uses, for `copies` copies and about `launches`
    launches per replay. Replays cycle through the graphs, and every copy is used once per cycle
    (so each copy waits a full cycle before its next use): one graph of a whole number of passes
    over the copies when they are few, else the copies split over up to MAX_GRAPHS graphs."""
    if copies < 1 or launches < 1:
        raise ValueError(f"copies and launches must be positive ({copies}, {launches})")
    if copies <= launches:
        n = min(math.ceil(launches / copies), max(1, MAX_GRAPH_LAUNCHES // copies)) * copies
        return [[k % copies for k in range(n)]]
    size = math.ceil(copies / min(MAX_GRAPHS, math.ceil(copies / launches)))
    return [list(range(s, min(s + size, copies))) for s in range(0, copies, size)]


def time_cpu(launches: Sequence[Sequence[Launch]], rounds: int, on_start: OnStart) -> list[Timing]:
    """Wall-clock timing on the host; `launches[i][s]` launches kernel i on input set s."""
    samples: list[list[float]] = [[] for _ in launches]
    for r in range(rounds):
        for i, sets in enumerate(launches):
            on_start(i)
            fn = sets[r % len(sets)]
            t0 = time.perf_counter()
            fn()
            samples[i].append((time.perf_counter() - t0) * 1e3)
    return [summarise(s, l2_flushed=False, method=METHOD_CPU) for s in samples]


@dataclass
class Track:
    """One kernel's timing in progress: how it is timed, and its samples so far."""

    launches: Sequence[Launch]
    flush: bool  # flush L2 before each launch (events only)
    method: str = METHOD_EVENTS
    estimate_ms: float = 0.0
    host_ms: float = 0.0  # the host's time to issue one launch (median of the estimate's)
    per_block: int = 1  # samples per block (events: runs of launches; graph: replays)
    per_sample: int = 1  # events: launches between one pair of events
    cursor: int = 0  # the next launch (events) or graph (graph) to run
    graphs: list[tuple[Any, int]] = field(default_factory=list)  # (CUDA graph, launches in it)
    samples: list[float] = field(default_factory=list)
    timed_ms: float = 0.0
    rounds: int = 0
    stop: str = ""


def interleave(tracks: Sequence[Track], plan: TimingPlan, on_start: OnStart, block: Callable[[int], None],
               rng: random.Random | None = None) -> None:
    """Run rounds until every track has stopped: each round, `on_start(i)` then `block(i)` (which
    adds kernel i's samples and GPU time to its track) for each kernel still going, in the round's
    order (`plan.order`: "shuffled", a permutation drawn from `rng`, a generator seeded with
    ORDER_SEED where none is given; "rotating", the order of the tracks rotated by one every
    round); then each one's `stop_reason`."""
    rng = rng if rng is not None else random.Random(ORDER_SEED)
    r = 0
    while True:
        active = [i for i, t in enumerate(tracks) if not t.stop]
        if not active:
            return
        if plan.order == "shuffled":
            order = rng.sample(active, len(active))
        else:
            order = [active[(j + r) % len(active)] for j in range(len(active))]
        for i in order:
            on_start(i)
            block(i)
        for i in active:
            t = tracks[i]
            t.rounds += 1
            t.stop = stop_reason(t.samples, t.rounds, t.timed_ms, plan)
        r += 1


class GpuTimer:
    """CUDA timing on the current device. Holds a side stream and, once needed, the L2 flush
    buffer (allocated once)."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        props = torch.cuda.get_device_properties(0)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
        self._stream = torch.cuda.Stream()
        self._flush_buf: Any = None
        self._last_busy = -math.inf  # monotonic time the last timing ended
        self.wakes = 0  # warm-ups run after an idle spell
        self._orders = random.Random(ORDER_SEED)  # the rounds' orders (plan.order "shuffled")

    def _wake(self) -> None:
        """A GPU idle for IDLE_S has lowered its clocks, and the first samples after it read
        slow (3.9% on one H100 re-measurement): keep it busy for WAKE_MS before timing."""
        if time.monotonic() - self._last_busy < IDLE_S:
            return
        self._spin(WAKE_MS)
        self._torch.cuda.synchronize()
        self.wakes += 1

    def flush(self) -> None:
        if self._flush_buf is None:
            size = max(2 * self.l2_bytes, 64 * 2**20) // 4
            self._flush_buf = self._torch.empty(size, dtype=self._torch.int32, device="cuda")
        self._flush_buf.zero_()

    def time(self, launches: Sequence[Sequence[Launch]], plan: TimingPlan, on_start: OnStart,
             cold: Sequence[bool] | None = None) -> list[Timing]:
        """One Timing per kernel, in order. `launches[i]` are kernel i's launches, rotated over
        (input sets, or copies of its data); with `plan.flush_l2`, `cold[i]` says they are enough
        copies to read cold data without a flush (see the module docstring)."""
        torch = self._torch
        tracks = [Track(list(sets), plan.flush_l2 and not (cold is not None and cold[i]))
                  for i, sets in enumerate(launches)]
        torch.cuda.synchronize()
        self._wake()
        try:
            with torch.cuda.stream(self._stream):
                for i, t in enumerate(tracks):
                    on_start(i)
                    self._prepare(t, plan)
                interleave(tracks, plan, on_start, lambda i: self._block(tracks[i], plan.settle_launches),
                           self._orders)
        finally:
            for t in tracks:
                t.graphs.clear()
            self._last_busy = time.monotonic()
        return [summarise(t.samples, l2_flushed=plan.flush_l2, method=t.method, spread_target=plan.spread_target,
                          time_cap_ms=plan.time_cap_ms, stop_reason=t.stop, timed_ms=t.timed_ms) for t in tracks]

    # ---- steps ------------------------------------------------------------------------------
    def _prepare(self, t: Track, plan: TimingPlan) -> None:
        """Warm up, estimate the launch time, and choose the method and the block size."""
        torch = self._torch
        fn = t.launches[0]
        span = self._events(1)[0]
        pairs = self._events(ESTIMATE_LAUNCHES)
        span[0].record()
        host_s = 0.0
        for _ in range(WARMUP_LAUNCHES):
            t0 = time.perf_counter()
            fn()
            host_s = time.perf_counter() - t0  # the last warm-up's: the first may set things up
        # the estimate's launches queue behind a spin that lasts longer than the host takes to
        # issue them, so that each pair of events brackets the kernel's GPU time and not the
        # host's launch latency (a slow host would otherwise push a short kernel past
        # graph_below_ms and into host-bound event timing); a kernel timed by events whose launch
        # takes the host HOST_BOUND of its GPU time or more gets such a spin before each sample
        self._spin(min(MAX_ESTIMATE_SPIN_MS, max(0.1, 2e3 * host_s * ESTIMATE_LAUNCHES)))
        host = []
        for start, end in pairs:
            start.record()
            t0 = time.perf_counter()
            fn()
            host.append(time.perf_counter() - t0)
            end.record()
        span[1].record()
        torch.cuda.synchronize()
        t.timed_ms += span[0].elapsed_time(span[1])
        t.estimate_ms = max(quantile(sorted(s.elapsed_time(e) for s, e in pairs), 0.5), 1e-4)
        t.host_ms = 1e3 * quantile(sorted(host), 0.5)
        if not t.flush and t.estimate_ms < plan.graph_below_ms and self._capture(t):
            t.method = METHOD_GRAPH
            mean_launches = sum(n for _, n in t.graphs) / len(t.graphs)
            t.per_block = min(MAX_REPLAYS, max(1, round(plan.block_ms / (t.estimate_ms * mean_launches))))
        else:
            t.per_sample = 1 if t.flush else min(MAX_GRAPH_LAUNCHES, max(1, math.ceil(SAMPLE_MS / t.estimate_ms)))
            t.per_block = min(MAX_SAMPLES, max(1, math.ceil(plan.block_ms / (t.estimate_ms * t.per_sample))))

    def _capture(self, t: Track) -> bool:
        """Capture the kernel's graphs and replay each once (the first replay uploads it).
        False, with the graphs dropped, when the launches cannot be captured."""
        torch = self._torch
        per_replay = min(MAX_GRAPH_LAUNCHES, max(1, math.ceil(SAMPLE_MS / t.estimate_ms)))
        pool = torch.cuda.graph_pool_handle()
        try:
            for indices in graph_layout(len(t.launches), per_replay):
                t.graphs.append((self._graph([t.launches[k] for k in indices], pool), len(indices)))
        except RuntimeError as e:
            if failures.is_sticky(e):
                raise
            log.warning("CUDA-graph capture failed, timing with events instead: %s", failures.one_line(e))
            t.graphs.clear()
            torch.cuda.synchronize()
            return False
        span = self._events(1)[0]
        span[0].record()
        for g, _ in t.graphs:
            g.replay()
        span[1].record()
        torch.cuda.synchronize()
        t.timed_ms += span[0].elapsed_time(span[1])
        return True

    def _graph(self, fns: Sequence[Launch], pool: Any) -> Any:
        """One graph of `fns` launched in order, captured on the timer's stream. The cyclic GC
        is off meanwhile: a Triton kernel it finalised would unload its module, which is illegal
        during a capture."""
        torch = self._torch
        g = torch.cuda.CUDAGraph()
        enabled = gc.isenabled()
        gc.disable()
        try:
            g.capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                for fn in fns:
                    fn()
            finally:
                g.capture_end()
        finally:
            if enabled:
                gc.enable()
        return g

    def _block(self, t: Track, settle: int = 0) -> None:
        """One block of the kernel: its samples and GPU time are added to the track. `settle`
        launches of the kernel run first, untimed but counted in its GPU time."""
        torch = self._torch
        n = t.per_block
        pairs = self._events(n)
        span = self._events(1)[0]
        self._spin(0.1)
        span[0].record()
        for _ in range(settle):  # the next in the kernel's own rotation, so that no copy is read warm
            if t.method == METHOD_GRAPH:
                t.graphs[t.cursor % len(t.graphs)][0].replay()
            else:
                if t.flush:
                    self.flush()
                t.launches[t.cursor % len(t.launches)]()
            t.cursor += 1
        launched: list[int] = []
        host_bound = t.host_ms >= HOST_BOUND * t.estimate_ms
        for start, end in pairs:
            if t.method == METHOD_GRAPH:
                g, count = t.graphs[t.cursor % len(t.graphs)]
                start.record()
                g.replay()
                t.cursor += 1
            else:
                count = t.per_sample
                if host_bound:  # the sample's launches queue behind a spin, as the estimate's did
                    self._spin(min(MAX_SAMPLE_SPIN_MS, 1.5 * t.host_ms * count))
                if t.flush:
                    self.flush()
                start.record()
                for _ in range(count):
                    t.launches[t.cursor % len(t.launches)]()
                    t.cursor += 1
            end.record()
            launched.append(count)
        span[1].record()
        torch.cuda.synchronize()
        t.samples.extend(s.elapsed_time(e) / k for (s, e), k in zip(pairs, launched, strict=True))
        t.timed_ms += span[0].elapsed_time(span[1])

    def _spin(self, ms: float) -> None:
        """Keep the GPU busy for about `ms` (a spin kernel on the current stream), so that what
        the host issues meanwhile queues behind it."""
        if hasattr(self._torch.cuda, "_sleep"):
            self._torch.cuda._sleep(int(SPIN_CYCLES * ms / 0.1))

    def _events(self, n: int) -> list[tuple[Any, Any]]:
        event = self._torch.cuda.Event
        return [(event(enable_timing=True), event(enable_timing=True)) for _ in range(n)]
