"""Roofline percentages of stored results, for the read-only queries.

A result's roofline percentage is its roofline time bound, max(FLOPs / matmul rate, bytes / copy
bandwidth), over its median time, in percent (`experiments.result.roofline_pct`). The work is the
family's work model as the worker stored it with the result (`extra.work_flops`, `work_bytes`); the
rates are the `devices` row of the experiment's device and driver, else the newest row of its
device under any driver. None where either is missing (older rows, replayed or imported results,
a device whose ceilings were never measured).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tilepilot.experiments.result import roofline_pct
from tilepilot.storage.rows import in_chunks, loads

RowsFn = Callable[[str, Sequence[Any]], list[dict[str, Any]]]


def roofline_pcts(rows: RowsFn, timed: Iterable[tuple[str, float | None]]) -> dict[str, float]:
    """Experiment key -> roofline percentage at the given median time, for the keys that have one."""
    wanted = {key: ms for key, ms in timed if ms is not None and ms > 0}
    if not wanted:
        return {}
    rates = _rates(rows)
    if not rates:
        return {}
    out: dict[str, float] = {}
    for part, marks in in_chunks(list(wanted)):
        for r in rows("SELECT r.experiment_key, r.extra, e.device, e.driver FROM results r "
                      f"JOIN experiments e ON e.key = r.experiment_key WHERE r.experiment_key IN ({marks})", part):
            pct = _pct(r, wanted[r["experiment_key"]], rates)
            if pct is not None:
                out[r["experiment_key"]] = pct
    return out


def _rates(rows: RowsFn) -> dict[tuple[str, str | None], tuple[float, float]]:
    """(device, driver) and (device, None) -> (copy GB/s, matmul TFLOP/s); the newest row wins."""
    out: dict[tuple[str, str | None], tuple[float, float]] = {}
    for r in rows("SELECT device, driver, copy_gbps, matmul_tflops FROM devices ORDER BY measured_at", []):
        if r["copy_gbps"] and r["matmul_tflops"] and r["copy_gbps"] > 0 and r["matmul_tflops"] > 0:
            out[(r["device"], r["driver"])] = out[(r["device"], None)] = (r["copy_gbps"], r["matmul_tflops"])
    return out


def _pct(r: dict[str, Any], median_ms: float, rates: dict[tuple[str, str | None], tuple[float, float]],
         ) -> float | None:
    rate = rates.get((r["device"], r["driver"])) or rates.get((r["device"], None))
    extra = loads(r["extra"])
    flops, nbytes = extra.get("work_flops"), extra.get("work_bytes")
    if rate is None or not isinstance(flops, int | float) or not isinstance(nbytes, int | float):
        return None
    return roofline_pct(float(flops), float(nbytes), median_ms, copy_gbps=rate[0], matmul_tflops=rate[1])
