"""`GpuSample`: one NVML reading of one GPU, as workers take them every few seconds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSample:
    ts: float  # seconds since the epoch
    node: str  # host name (or Ray node id) the GPU belongs to
    uuid: str  # "GPU-..." as NVML names it
    index: int  # NVML index on its node
    name: str
    util_pct: float
    mem_used_mb: float
    mem_total_mb: float
    sm_clock_mhz: float
    power_w: float
    temp_c: float
    throttle: str = ""  # active clock-throttle reasons, comma-separated; "" when none
    worker: str = ""  # the worker that owns the GPU
    running: str = ""  # what it is running now (campaign, problem, config), "" when idle
