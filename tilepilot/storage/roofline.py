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

from tilepilot.experiments import DeviceCeilings
from tilepilot.storage.rows import in_chunks, loads

RowsFn = Callable[[str, Sequence[Any]], list[dict[str, Any]]]


def roofline_pcts(rows: RowsFn, timed: Iterable[tuple[str, float | None]],
                  ceilings: Sequence[DeviceCeilings]) -> dict[str, float]:
    """Experiment key -> roofline percentage at the given median time, for the keys that have one.
    `ceilings`: the usable ones, newest first (`queries.ceilings`)."""
    wanted = {key: ms for key, ms in timed if ms is not None and ms > 0}
    if not wanted:
        return {}
    rates = _by_device(ceilings)
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


def _by_device(ceilings: Sequence[DeviceCeilings]) -> dict[tuple[str, str | None], DeviceCeilings]:
    """(device, driver) and (device, None) -> ceilings; the newest wins."""
    out: dict[tuple[str, str | None], DeviceCeilings] = {}
    for c in reversed(ceilings):  # oldest first, so that the newest is written last
        out[(c.device, c.driver)] = out[(c.device, None)] = c
    return out


def _pct(r: dict[str, Any], median_ms: float, rates: dict[tuple[str, str | None], DeviceCeilings]) -> float | None:
    ceiling = rates.get((r["device"], r["driver"])) or rates.get((r["device"], None))
    extra = loads(r["extra"])
    flops, nbytes = extra.get("work_flops"), extra.get("work_bytes")
    if ceiling is None or not isinstance(flops, int | float) or not isinstance(nbytes, int | float):
        return None
    return ceiling.roofline_pct(float(flops), float(nbytes), median_ms)
