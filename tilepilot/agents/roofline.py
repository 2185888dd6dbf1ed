"""The device's ceilings and the roofline of a GEMM problem, for the `rules` proposer.

Limits (SMs, shared memory, registers) are the datasheet's; the two ceilings are measured
(see `H100_SXM`). Only the H100 SXM is described so far: the proposer context carries no
device, so `H100_SXM` is the assumption every prediction makes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tilepilot.experiments import Problem

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class Device:
    name: str
    sms: int
    peak_tflops: float  # dense fp16/bf16 tensor-core FLOP/s the kernel can reach, in TFLOP/s
    hbm_gbps: float  # DRAM bandwidth the kernel can reach, in GB/s
    l2_bytes: int
    smem_per_sm: int  # bytes of shared memory per SM
    smem_per_block: int  # the opt-in limit of one block
    regs_per_sm: int  # 32-bit registers
    max_regs_per_thread: int
    max_warps_per_sm: int
    max_blocks_per_sm: int
    source: str  # where the ceilings come from, quoted in explanations

    @property
    def ridge_flop_per_byte(self) -> float:
        """Arithmetic intensity (FLOP per DRAM byte) where the roofline turns from memory to compute."""
        return self.peak_tflops * 1e12 / (self.hbm_gbps * 1e9)


# Datasheet (NVIDIA H100 SXM5 80GB): 132 SMs, 989 TFLOP/s dense bf16/fp16, 3.35 TB/s HBM3, 50 MB L2,
# 228 KiB shared memory per SM (227 KiB per block), 64K registers per SM, 255 per thread.
# The two ceilings are MEASURED on an "NVIDIA H100 80GB HBM3" (driver 580.159.04, torch 2.11,
# bench/results/matmul-h100-cublas.json, 2026-11-21), as cuBLAS reaches them with L2 flushed and
# launch included, on two development problems of bench/search.py: 783 TFLOP/s on
# M=N=K=4096 bf16, and 1671 GB/s of compulsory traffic on M=64 N=K=4096 bf16 (34.6 MB in 20.7 us).
H100_SXM = Device(
    name="NVIDIA H100 SXM",
    sms=132,
    peak_tflops=783.0,
    hbm_gbps=1671.0,
    l2_bytes=50 * 2**20,
    smem_per_sm=228 * 1024,
    smem_per_block=227 * 1024,
    regs_per_sm=65536,
    max_regs_per_thread=255,
    max_warps_per_sm=64,
    max_blocks_per_sm=32,
    source="cuBLAS-measured ceilings 783 TFLOP/s and 1671 GB/s; datasheet limits",
)


# Devices whose tile-model errors one another's results may stand for: the same chip with the same
# SMs, shared memory and registers, where only the memory differs (the H200 is the H100 SXM's GH100
# with HBM3e). On the recorded grids the H100's results correct the model for the H200's problems as
# well as the H200's own (README, "The store corrects the model"). Matched on the name NVML reports.
SIBLINGS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("GH100, 132 SMs", re.compile(r"\bH100 (80GB HBM3|SXM)|\bH200\b")),
)


def sibling_group(device: str) -> str | None:
    """The group of `device` in `SIBLINGS`, None for a device in none (it has no siblings)."""
    return next((name for name, pattern in SIBLINGS if pattern.search(device)), None)


def siblings(a: str, b: str) -> bool:
    """Whether two different devices are in one group of `SIBLINGS`."""
    group = sibling_group(a)
    return a != b and group is not None and group == sibling_group(b)


@dataclass(frozen=True)
class Roofline:
    """Where a GEMM problem sits on the device's roofline."""

    flops: float
    min_bytes: float  # every operand read once and the output written once
    intensity: float  # FLOP per DRAM byte
    ridge: float
    compute_ms: float  # the flops at the compute ceiling
    memory_ms: float  # the bytes at the bandwidth ceiling

    @property
    def bound(self) -> str:
        return "compute" if self.intensity >= self.ridge else "memory"

    @property
    def floor_ms(self) -> float:
        """The least time the device can take: the larger of the two ceilings."""
        return max(self.compute_ms, self.memory_ms)

    def describe(self) -> str:
        return (f"{self.bound}-bound: {self.intensity:.0f} FLOP/B vs ridge {self.ridge:.0f}, "
                f"floor {self.floor_ms:.4g} ms")


def gemm_roofline(m: int, n: int, k: int, dtype_bytes: int, device: Device = H100_SXM) -> Roofline:
    flops = 2.0 * m * n * k
    nbytes = float((m * k + k * n + m * n) * dtype_bytes)
    return Roofline(
        flops=flops, min_bytes=nbytes, intensity=flops / nbytes, ridge=device.ridge_flop_per_byte,
        compute_ms=flops / (device.peak_tflops * 1e12) * 1e3,
        memory_ms=nbytes / (device.hbm_gbps * 1e9) * 1e3,
    )


def problem_roofline(problem: Problem, device: Device = H100_SXM) -> Roofline | None:
    """The roofline of a problem with integer M, N, K and a known dtype; None for anything else."""
    dims = gemm_dims(problem)
    if dims is None:
        return None
    m, n, k, size = dims
    return gemm_roofline(m, n, k, size, device)


def gemm_dims(problem: Problem) -> tuple[int, int, int, int] | None:
    """(M, N, K, bytes per element) of a GEMM problem, or None when the problem is not one."""
    try:
        m, n, k = (problem[key] for key in ("M", "N", "K"))
    except KeyError:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (m, n, k)):
        return None
    size = DTYPE_BYTES.get(str(problem.get("dtype", "fp16")))
    if size is None:
        return None
    return int(m), int(n), int(k), size
