"""Two campaigns, or two devices, side by side: the same problems, each side's winner, the ratio.

A side's answer for a problem is its best row (`queries.best`: the declared winner, else the
fastest ok result) for a campaign, or for a device the latest declared winner measured on it,
else its fastest ok result. `ratio` is b_ms / a_ms (above 1: side b is slower). Where one side
also measured the other side's winner, that time is shown (`a_config_on_b_ms`: what running
a's choice on b costs), so a difference of configs can be told from a difference of hardware.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tilepilot.experiments import InputError, Status
from tilepilot.storage.queries import ReadOnlyDB, best, campaign_id_of, history
from tilepilot.storage.rows import in_chunks, loads

SIDES = ("campaign", "device")


@dataclass(frozen=True)
class Side:
    kernel: str
    problem: dict[str, Any]
    problem_key: str
    config: dict[str, Any]
    config_key: str
    median_ms: float
    decided: bool
    label: str  # the campaign or device


@dataclass(frozen=True)
class CompareRow:
    kernel: str
    problem: dict[str, Any]
    problem_key: str
    a_config: dict[str, Any] | None
    a_ms: float | None
    b_config: dict[str, Any] | None
    b_ms: float | None
    ratio: float | None  # b_ms / a_ms
    same_config: bool | None
    a_config_on_b_ms: float | None  # a's winner as measured on side b
    b_config_on_a_ms: float | None


@dataclass(frozen=True)
class Comparison:
    by: str  # campaign | device
    a: str
    b: str
    rows: tuple[CompareRow, ...]  # problems both sides have first, then those of one side only


def compare(db: ReadOnlyDB, a: str, b: str, *, by: str = "campaign", kernel: str | None = None,
            problem: Sequence[str] | Mapping[str, Any] | None = None) -> Comparison:
    """Raises InputError for an unknown side kind, campaign or device, or a device text that
    names several devices."""
    if by not in SIDES:
        raise InputError(f"--by {by!r} is not one of {', '.join(SIDES)}")
    if by == "campaign":
        sa, sb = (_campaign_side(db, x, kernel, problem) for x in (a, b))
        la, lb = a, b
    else:
        la, lb = device_named(db, a), device_named(db, b)
        if la == lb:
            raise InputError(f"--device texts {a!r} and {b!r} name the same device {la!r}")
        sa, sb = (_device_side(db, x, kernel, problem) for x in (la, lb))
    times_a, times_b = (_times(db, by, x, kernel, problem) for x in (la, lb))
    rows = []
    for key in [*[k for k in sa if k in sb], *[k for k in sa if k not in sb], *[k for k in sb if k not in sa]]:
        x, y = sa.get(key), sb.get(key)
        first = x or y
        assert first is not None
        rows.append(CompareRow(
            kernel=first.kernel, problem=first.problem, problem_key=first.problem_key,
            a_config=x.config if x else None, a_ms=x.median_ms if x else None,
            b_config=y.config if y else None, b_ms=y.median_ms if y else None,
            ratio=y.median_ms / x.median_ms if x and y and x.median_ms else None,
            same_config=x.config_key == y.config_key if x and y else None,
            a_config_on_b_ms=times_b.get((key, x.config_key)) if x else None,
            b_config_on_a_ms=times_a.get((key, y.config_key)) if y else None))
    return Comparison(by, la, lb, tuple(rows))


def device_named(db: ReadOnlyDB, text: str) -> str:
    """The one measured device whose name contains `text` (case-insensitive)."""
    names = [r["device"] for r in db.rows("SELECT DISTINCT e.device FROM experiments e "
                                          "JOIN results r ON r.experiment_key = e.key ORDER BY e.device")]
    exact = [n for n in names if n.lower() == text.lower()]
    found = exact or [n for n in names if text.lower() in n.lower()]
    if len(found) == 1:
        return found[0]
    if not found:
        raise InputError(f"no measured device matches {text!r} (devices: {', '.join(names) or 'none'})")
    raise InputError(f"{text!r} matches {len(found)} devices ({', '.join(found)}): give more of the name")


def _campaign_side(db: ReadOnlyDB, campaign: str, kernel: str | None,
                   problem: Any) -> dict[tuple[str, str], Side]:
    campaign_id_of(db, campaign)  # an unknown name is one line naming the known ones
    rows = best(db, campaign=campaign, kernel=kernel, problem=problem)
    keys = _config_keys(db, [r.experiment_key for r in rows])
    return {(r.kernel, r.problem_key): Side(r.kernel, r.problem, r.problem_key, r.config, keys[r.experiment_key],
                                            r.median_ms, r.decided, campaign) for r in rows}


def _device_side(db: ReadOnlyDB, device: str, kernel: str | None,
                 problem: Any) -> dict[tuple[str, str], Side]:
    out: dict[tuple[str, str], Side] = {}
    for r in history(db, kernel=kernel, problem=problem, status="ok", device=device):
        if r.device != device:
            continue
        key = (r.kernel, r.problem_key)
        if key not in out or (r.median_ms is not None and r.median_ms < out[key].median_ms):
            out[key] = Side(r.kernel, r.problem, r.problem_key, r.config, r.config_key, r.median_ms or 0.0, False,
                            device)
    for w in db.rows("SELECT w.median_ms, w.decided_at, e.kernel, e.problem, e.problem_key, e.config, e.config_key "
                     "FROM winners w JOIN experiments e ON e.key = w.experiment_key WHERE e.device = ? "
                     "ORDER BY w.decided_at", [device]):
        key = (w["kernel"], w["problem_key"])
        if key in out:  # the latest declared winner replaces the fastest single reading
            out[key] = Side(w["kernel"], loads(w["problem"]), w["problem_key"], loads(w["config"]), w["config_key"],
                            w["median_ms"], True, device)
    return out


def _times(db: ReadOnlyDB, by: str, side: str, kernel: str | None, problem: Any) -> dict[tuple[Any, str], float]:
    """(kernel, problem key), config key -> the fastest ok time of that config on this side."""
    rows = history(db, kernel=kernel, problem=problem, status=Status.OK.value,
                   **({"campaign": side} if by == "campaign" else {"device": side}))
    out: dict[tuple[Any, str], float] = {}
    for r in rows:
        if (by == "device" and r.device != side) or r.median_ms is None:
            continue
        k = ((r.kernel, r.problem_key), r.config_key)
        out[k] = min(out.get(k, r.median_ms), r.median_ms)
    return out


def _config_keys(db: ReadOnlyDB, keys: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for chunk, marks in in_chunks(keys, 400):
        for r in db.rows(f"SELECT key, config_key FROM experiments WHERE key IN ({marks})", chunk):
            out[r["key"]] = r["config_key"]
    return out
