"""Timing of several kernels at once, interleaved, so that drift in clocks and temperature hits
them alike.

GPU (method "cuda-events"): each kernel is warmed up and its time estimated; then `rounds`
rounds run, each giving every kernel one block of consecutive launches (A A A, B B B, C C C,
then again), a block sized to about `block_ms` of kernel time (3 to 100 launches), the
launches of a block rotating over the input sets. Each launch
is bracketed by CUDA events; when `flush_l2` is set, a buffer twice the L2's size is zeroed
before each launch, outside the events. A short spin kernel at the start of each block keeps
the GPU ahead of the host, so that launch overhead stays outside the events. The device is
synchronised after every block, so that an error is raised while its kernel's block runs.

CPU (method "cpu-wallclock", for the interpreter): `rounds` rounds of one launch each, timed
with perf_counter. These are CPU timings and are labelled so.

Every timing field is in milliseconds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tilepilot.experiments import Timing

Launch = Callable[[], None]
OnStart = Callable[[int], None]

MIN_BLOCK, MAX_BLOCK = 3, 100
WARMUP_LAUNCHES = 2
ESTIMATE_LAUNCHES = 3
SPIN_CYCLES = 200_000  # ~0.1 ms at 2 GHz


@dataclass(frozen=True)
class TimingPlan:
    rounds: int = 4
    block_ms: float = 10.0
    flush_l2: bool = True


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of already sorted values."""
    if not sorted_values:
        raise ValueError("no values")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarise(samples_ms: Sequence[float], *, l2_flushed: bool, method: str) -> Timing:
    s = sorted(samples_ms)
    return Timing(median_ms=quantile(s, 0.5), p20_ms=quantile(s, 0.2), p80_ms=quantile(s, 0.8),
                  min_ms=s[0], reps=len(s), l2_flushed=l2_flushed, method=method)


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
    return [summarise(s, l2_flushed=False, method="cpu-wallclock") for s in samples]


class GpuTimer:
    """CUDA-event timing on the current device. Holds the L2 flush buffer (allocate once)."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 64 * 2**20)
        self._flush_buf = torch.empty(max(2 * l2, 64 * 2**20) // 4, dtype=torch.int32, device="cuda")

    def flush(self) -> None:
        self._flush_buf.zero_()

    def time(self, launches: Sequence[Sequence[Launch]], plan: TimingPlan, on_start: OnStart) -> list[Timing]:
        """`launches[i][s]` launches kernel i on input set s. One Timing per kernel, in order."""
        estimates = [self._estimate(i, sets[0], on_start) for i, sets in enumerate(launches)]
        blocks = [min(MAX_BLOCK, max(MIN_BLOCK, math.ceil(plan.block_ms / max(e, 1e-4)))) for e in estimates]
        samples: list[list[float]] = [[] for _ in launches]
        for r in range(plan.rounds):
            for j in range(len(launches)):
                i = (j + r) % len(launches)  # rotate the order, so no kernel always runs first
                on_start(i)
                samples[i].extend(self._block(launches[i], blocks[i], plan.flush_l2, first=r))
        return [summarise(s, l2_flushed=plan.flush_l2, method="cuda-events") for s in samples]

    def _estimate(self, index: int, fn: Launch, on_start: OnStart) -> float:
        torch = self._torch
        on_start(index)
        for _ in range(WARMUP_LAUNCHES):
            fn()
        torch.cuda.synchronize()
        return quantile(sorted(self._block([fn], ESTIMATE_LAUNCHES, flush=False)), 0.5)

    def _block(self, sets: Sequence[Launch], reps: int, flush: bool, first: int = 0) -> list[float]:
        """`reps` launches, rotating over the input sets starting at set `first`."""
        torch = self._torch
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(SPIN_CYCLES)
        for k, (start, end) in enumerate(events):
            fn = sets[(first + k) % len(sets)]
            if flush:
                self._flush_buf.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]
