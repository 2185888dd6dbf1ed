"""`Result`: what one evaluation of one config on one problem gave; `DeviceCeilings`: what a device
can do at best, measured once, against which a time reads as a share of the roofline."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tilepilot.experiments.status import Status
from tilepilot.experiments.values import Config, Problem

STOP_REASONS = ("spread", "cap", "outclassed", "")  # why adaptive repetitions stopped; "" where not adaptive


@dataclass(frozen=True)
class Environment:
    """Where a number came from. Part of the experiment key."""

    backend: str  # gpu | interpret | replay
    device: str  # e.g. "NVIDIA H100 80GB HBM3", or "cpu (Triton interpreter)"
    torch: str
    triton: str
    driver: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Timing:
    """Timings of one config, in milliseconds, and how they were taken.

    A sample is the mean launch time of a run of back-to-back launches between two CUDA events
    (cuda-events; a single launch where L2 is flushed before each), of one CUDA-graph replay
    (cuda-graph), or one launch's wall-clock time (cpu-wallclock); `reps` counts the samples.
    `l2_flushed`: every timed launch read its data cold (L2 flushed before it, or inputs rotated
    over enough copies to exceed the L2).
    The adaptive fields say how the repetitions ended: rounds were added until `rel_spread` was
    at most `spread_target` ("spread") or `timed_ms`, the GPU time spent timing this config,
    reached `time_cap_ms` ("cap"); None and "" where the repetitions were fixed. "outclassed": the
    config was not timed at all, its verification launches having already taken at least twice the
    best time of the problem (see evaluate.py); its samples are those launches, one per input set,
    with L2 not flushed.
    """

    median_ms: float
    p20_ms: float
    p80_ms: float
    min_ms: float
    reps: int
    l2_flushed: bool
    method: str = "cuda-events"  # cuda-events | cuda-graph | cpu-wallclock | replay
    spread_target: float | None = None
    time_cap_ms: float | None = None
    stop_reason: str = ""  # one of STOP_REASONS
    timed_ms: float | None = None

    @property
    def rel_spread(self) -> float:
        """Inter-quantile spread (p80 - p20) over the median."""
        return (self.p80_ms - self.p20_ms) / self.median_ms if self.median_ms > 0 else 0.0


@dataclass(frozen=True)
class Telemetry:
    """NVML readings taken around a measurement. None where unknown (no GPU, replay)."""

    sm_clock_mhz: float | None = None
    power_w: float | None = None
    temp_c: float | None = None


@dataclass(frozen=True)
class Result:
    problem: Problem
    config: Config
    status: Status
    env: Environment
    timing: Timing | None = None  # set exactly when status is OK
    message: str = ""  # the error, for every status but OK
    max_rel_err: float | None = None  # the family's error measure (KernelFamily.error); inf for NaN output
    compile_ms: float | None = None
    telemetry: Telemetry = field(default_factory=Telemetry)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. n_regs, shared_bytes

    def __post_init__(self) -> None:
        if (self.status is Status.OK) != (self.timing is not None):
            raise ValueError(f"a result has a timing exactly when its status is ok (status={self.status})")

    @property
    def median_ms(self) -> float | None:
        return self.timing.median_ms if self.timing else None


@dataclass(frozen=True)
class DeviceCeilings:
    """The best a device does, measured once per (device, driver) on random data: a large
    device-to-device copy (`copy_gbps`, bytes read plus bytes written, in 1e9 B/s) and the vendor
    library's matrix product (`matmul_tflops` in `matmul_dtype`). `details` holds the sizes,
    repetitions and spreads of both measurements."""

    device: str
    driver: str
    copy_gbps: float
    matmul_tflops: float
    matmul_dtype: str = "bf16"
    details: dict[str, Any] = field(default_factory=dict)
    measured_at: float = 0.0  # epoch seconds

    def bound_ms(self, flops: float, bytes_moved: float) -> float:
        """The roofline time bound of a piece of work on this device, in milliseconds."""
        return roofline_ms(flops, bytes_moved, copy_gbps=self.copy_gbps, matmul_tflops=self.matmul_tflops)

    def roofline_pct(self, flops: float, bytes_moved: float, median_ms: float) -> float | None:
        """The bound over a measured time, in percent (100: at the ceiling); None for no time."""
        return roofline_pct(flops, bytes_moved, median_ms, copy_gbps=self.copy_gbps,
                            matmul_tflops=self.matmul_tflops)


def roofline_ms(flops: float, bytes_moved: float, *, copy_gbps: float, matmul_tflops: float) -> float:
    """max(flops / matmul rate, bytes / copy bandwidth), in milliseconds.

    Raises ValueError for a rate that is not positive or work that is negative."""
    if not (copy_gbps > 0 and matmul_tflops > 0):
        raise ValueError(f"ceilings must be positive (copy {copy_gbps} GB/s, matmul {matmul_tflops} TFLOP/s)")
    if flops < 0 or bytes_moved < 0:
        raise ValueError(f"work must not be negative ({flops} FLOPs, {bytes_moved} B)")
    return max(flops / (matmul_tflops * 1e12), bytes_moved / (copy_gbps * 1e9)) * 1e3


def roofline_pct(flops: float, bytes_moved: float, median_ms: float | None, *, copy_gbps: float,
                 matmul_tflops: float) -> float | None:
    """roofline_ms(...) / median_ms in percent; None when there is no positive time."""
    if median_ms is None or not median_ms > 0:
        return None
    return 100.0 * roofline_ms(flops, bytes_moved, copy_gbps=copy_gbps, matmul_tflops=matmul_tflops) / median_ms
