"""Where a time stands against the device's ceilings.

A problem's least time on a device is max(FLOPs / matmul rate, bytes / copy bandwidth): the
work comes from the kernel family's work model (`KernelFamily.work(problem)`), the two rates
from the `devices` table (measured once per device and driver: device-to-device copy GB/s and
the vendor's bf16 matmul TFLOP/s). A result's share of the roofline is that least time over its
median, in percent. Without stored ceilings for the device, or without a work model for the
kernel (a family this process cannot import), there is no share: the pages show "—".
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tilepilot.experiments import DeviceCeilings, InputError, Problem

log = logging.getLogger(__name__)

HELP = ("the least time the device's ceilings allow, max(FLOPs / matmul TFLOP/s, bytes / copy GB/s), over the "
        "measured median, in percent; — where no ceilings are stored for the device")


@dataclass(frozen=True)
class WorkOf:
    flops: float
    bytes: float

    @property
    def intensity(self) -> float | None:
        """FLOPs per byte; None without bytes."""
        return self.flops / self.bytes if self.bytes > 0 else None


@functools.lru_cache(maxsize=4096)
def _work(kernel: str, problem_items: tuple[tuple[str, Any], ...]) -> WorkOf | None:
    from tilepilot.kernels.registry import get_family  # the registry imports no torch or triton
    try:
        w = get_family(kernel).work(Problem.of(dict(problem_items)))
    except (InputError, KeyError, TypeError, ValueError) as e:  # an unknown family, or a problem it cannot read
        log.debug("no work model for %s %s: %s", kernel, problem_items, e)
        return None
    return WorkOf(float(w.flops), float(w.bytes))


def work(kernel: str, problem: Mapping[str, Any]) -> WorkOf | None:
    """The family's work for the problem, or None where this process has no model for it."""
    return _work(kernel, tuple(problem.items()))


def pick(ceilings: Sequence[DeviceCeilings], device: str, driver: str = "") -> DeviceCeilings | None:
    """The ceilings of `device` under `driver`, else the newest of `device` under any driver."""
    same = [c for c in ceilings if c.device == device]
    exact = [c for c in same if c.driver == driver]
    found = exact or same
    return max(found, key=lambda c: c.measured_at) if found else None


def pct(w: WorkOf | None, c: DeviceCeilings | None, median_ms: float | None) -> float | None:
    """The share of the roofline in percent, or None."""
    if w is None or c is None:
        return None
    return c.roofline_pct(w.flops, w.bytes, median_ms)


def tflops(w: WorkOf, median_ms: float) -> float:
    return w.flops / (median_ms * 1e-3) / 1e12


def ridge(c: DeviceCeilings) -> float:
    """The arithmetic intensity (FLOPs per byte) where the two ceilings meet."""
    return c.matmul_tflops * 1e12 / (c.copy_gbps * 1e9)
