"""`Result`: what one evaluation of one config on one problem gave."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tilepilot.experiments.status import Status
from tilepilot.experiments.values import Config, Problem


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
    """CUDA-event timings of one config, in milliseconds, and how they were taken."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    min_ms: float
    reps: int
    l2_flushed: bool
    method: str = "cuda-events"  # cuda-events | cuda-graph | cpu-wallclock | replay

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
