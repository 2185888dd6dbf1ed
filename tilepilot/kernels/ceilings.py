"""Device ceilings: the device-to-device copy bandwidth and the vendor library's bf16 matrix
product rate, measured on random data, for roofline percentages.

Method: a copy of `copy_bytes` (bytes read plus bytes written count) and a product of two
`matmul_n`×`matmul_n` bf16 matrices (torch.matmul, i.e. cuBLAS; 2·n³ FLOPs), each timed with CUDA
events, interleaved (copy, product, copy, product, ...) after warm-up, `reps` times; each timed
sample covers `inner` back-to-back launches. The ceilings are the medians; `details` keeps the
sizes, the repetitions, p20/p80, min, max and the relative spread of both.

Runs in a process with CUDA (the GPU worker's child process, or a bench script):
`measure_ceilings()`. Never at import time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from tilepilot.experiments import BackendUnavailable, DeviceCeilings
from tilepilot.kernels import telemetry
from tilepilot.kernels.timing import quantile, relative_spread

log = logging.getLogger(__name__)

COPY_BYTES = 2**30  # 1 GiB, far beyond any L2
MATMUL_N = 8192
REPS = 10
WARMUP = 3
COPY_INNER = 4  # copies per timed sample
MATMUL_INNER = 2  # products per timed sample


def measure_ceilings(*, copy_bytes: int = COPY_BYTES, matmul_n: int = MATMUL_N, reps: int = REPS,
                     warmup: int = WARMUP) -> DeviceCeilings:
    """Measure the current CUDA device's ceilings (see the module docstring).

    Raises BackendUnavailable without a CUDA device, ValueError for sizes that are not positive.
    """
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailable("measuring device ceilings needs a CUDA GPU")
    if copy_bytes < 1 or matmul_n < 1 or reps < 1 or warmup < 0:
        raise ValueError(f"bad sizes: copy_bytes={copy_bytes}, matmul_n={matmul_n}, reps={reps}, warmup={warmup}")
    copy_bytes = _fitting(copy_bytes, 3 * 2 * matmul_n * matmul_n)
    nbytes, copy_ms, matmul_ms = _sample(copy_bytes, matmul_n, reps, warmup)
    torch.cuda.empty_cache()
    copy_gbps = [2 * nbytes / (ms * 1e-3) / 1e9 for ms in copy_ms]
    tflops = [2.0 * matmul_n**3 / (ms * 1e-3) / 1e12 for ms in matmul_ms]
    details = {
        "method": "CUDA events, copy and bf16 matmul interleaved after warm-up; medians",
        "copy": {"bytes": nbytes, "counted": "read + written", "inner": COPY_INNER, **_stats(copy_gbps, "gbps")},
        "matmul": {"n": matmul_n, "dtype": "bf16", "library": "torch.matmul (cuBLAS)", "inner": MATMUL_INNER,
                   "data": "random normal", **_stats(tflops, "tflops")},
        "reps": reps, "warmup": warmup, "torch": torch.__version__,
    }
    ceilings = DeviceCeilings(device=torch.cuda.get_device_name(0), driver=telemetry.driver_version(),
                              copy_gbps=details["copy"]["median_gbps"],
                              matmul_tflops=details["matmul"]["median_tflops"], matmul_dtype="bf16",
                              details=details, measured_at=time.time())
    log.info("%s: copy %.0f GB/s, bf16 matmul %.0f TFLOP/s", ceilings.device, ceilings.copy_gbps,
             ceilings.matmul_tflops)
    return ceilings


def _sample(copy_bytes: int, matmul_n: int, reps: int, warmup: int) -> tuple[int, list[float], list[float]]:
    """Bytes copied, and the milliseconds of each timed copy and product, interleaved."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)
    src = torch.rand(copy_bytes // 4, generator=gen, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    a = torch.randn((matmul_n, matmul_n), generator=gen, device="cuda", dtype=torch.float32).to(torch.bfloat16)
    b = torch.randn((matmul_n, matmul_n), generator=gen, device="cuda", dtype=torch.float32).to(torch.bfloat16)
    c = torch.empty_like(a)

    def copy() -> None:
        dst.copy_(src)

    def matmul() -> None:
        torch.matmul(a, b, out=c)

    copy_ms: list[float] = []
    matmul_ms: list[float] = []
    for r in range(warmup + reps):
        once = _timed(copy, COPY_INNER), _timed(matmul, MATMUL_INNER)
        if r >= warmup:
            copy_ms.append(once[0])
            matmul_ms.append(once[1])
    return src.numel() * src.element_size(), copy_ms, matmul_ms


def _fitting(copy_bytes: int, other_bytes: int) -> int:
    """The copy size, halved until source and destination fit in half the free memory beside the
    matrices."""
    import torch

    free, _ = torch.cuda.mem_get_info()
    while copy_bytes > 64 * 2**20 and 2 * copy_bytes + other_bytes > free // 2:
        copy_bytes //= 2
    return copy_bytes


def _timed(fn: Callable[[], None], inner: int) -> float:
    """Milliseconds per call of `inner` back-to-back calls between two CUDA events."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(inner):
        fn()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / inner


def _stats(values: list[float], unit: str) -> dict[str, Any]:
    s = sorted(values)
    return {f"median_{unit}": quantile(s, 0.5), f"p20_{unit}": quantile(s, 0.2), f"p80_{unit}": quantile(s, 0.8),
            f"min_{unit}": s[0], f"max_{unit}": s[-1], "rel_spread": relative_spread(s), "samples": len(s)}
