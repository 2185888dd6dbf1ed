"""Exports of declared winners: vLLM tuned-config files, a Triton module, annotated JSON.

`winners(db, ...)` reads the declared winners (the `winners` table, never an undecided
"fastest so far") with everything that explains them; `export(db, fmt, ...)` renders them.
One winner per (kernel, device, problem): when several campaigns declared one, the most
recently decided is taken (a re-tune replaces an old answer). Winners measured by the
`interpret` backend are CPU timings: the vllm and triton formats leave them out (with a
warning), the json format keeps them, labelled.

The renderers live in `export_vllm` and `export_triton`; this module holds the query, the
json format and the dispatch. Nothing here imports torch or triton.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tilepilot.experiments import InputError
from tilepilot.storage.queries import ReadOnlyDB, campaign_id_of
from tilepilot.storage.rows import in_chunks, loads

log = logging.getLogger(__name__)

FORMATS = ("vllm", "triton", "json")
JSON_FORMAT = "tilepilot.winners/1"


@dataclass(frozen=True)
class ExportEntry:
    """A declared winner with the evidence behind it (times in ms, spreads relative)."""

    kernel: str
    problem: dict[str, Any]
    problem_key: str
    config: dict[str, Any]
    experiment_key: str
    median_ms: float  # the winner's re-measured median
    rel_spread: float | None  # (p80 - p20) / median of that re-measurement: the noise
    runner_up_key: str | None
    runner_up_config: dict[str, Any] | None
    runner_up_ms: float | None
    runner_up_rel_spread: float | None  # of the runner-up's recorded result
    margin: float | None  # runner-up over winner, minus 1
    tie: bool  # the margin is within the measured noise: either config will do
    recheck_passed: bool | None
    campaign: str
    campaign_id: int
    decided_at: float
    proposer: str
    rationale: str
    device: str
    backend: str
    kernel_version: str
    torch: str
    triton: str
    driver: str
    hypotheses: tuple[str, ...]  # hypotheses whose evidence uses the winner or runner-up, or that it tested
    recheck_err: float | None = None  # the re-check's max relative error on fresh inputs
    median_config_ms: float | None = None  # median over the campaign's ok configs of the problem
    baseline_name: str = ""
    baseline_ms: float | None = None
    learnings: tuple[str, ...] = ()  # learnings drawn from those hypotheses


@dataclass(frozen=True)
class ExportFile:
    """One output: `name` is the file name to write (vllm), or "" for the single output."""

    name: str
    text: str


_WINNERS = """
SELECT w.*, c.name AS campaign, c.kernel, e.problem, e.config, e.device, e.backend, e.kernel_version,
       e.torch, e.triton, e.driver, eu.config AS runner_up_config, ru.rel_spread AS runner_up_rel_spread,
       t.proposer, t.rationale, t.hypothesis_id
FROM winners w JOIN campaigns c ON c.id = w.campaign_id
JOIN experiments e ON e.key = w.experiment_key
LEFT JOIN experiments eu ON eu.key = w.runner_up_key
LEFT JOIN results ru ON ru.experiment_key = w.runner_up_key
LEFT JOIN trials t ON t.campaign_id = w.campaign_id AND t.experiment_key = w.experiment_key
"""


def winners(db: ReadOnlyDB, *, campaign: str | int | None = None, kernel: str | None = None,
            device: str | None = None, problem: Mapping[str, Any] | None = None) -> list[ExportEntry]:
    """Declared winners, one per (kernel, device, problem), ordered by kernel, device, problem.

    `device` is a case-insensitive part of the device name; `problem` keeps the problems whose
    items include all of its items. Raises InputError for an unknown campaign.
    """
    where: list[str] = []
    params: list[Any] = []
    if campaign is not None:
        where.append("w.campaign_id = ?")
        params.append(campaign_id_of(db, campaign))
    if kernel is not None:
        where.append("c.kernel = ?")
        params.append(kernel)
    if device is not None:
        where.append("instr(lower(e.device), lower(?)) > 0")
        params.append(device)
    cond = " WHERE " + " AND ".join(where) if where else ""
    rows = db.rows(_WINNERS + cond + " ORDER BY w.decided_at, w.campaign_id", params)
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in rows:
        if problem is None or _matches(loads(r["problem"]), problem):
            latest[(r["kernel"], r["device"], r["problem_key"])] = r  # later decisions replace earlier
    hyps = _hypotheses(db, list(latest.values()))
    for r in latest.values():
        if r["hypothesis_id"]:
            hyps.setdefault(r["experiment_key"], set()).add(r["hypothesis_id"])
    learned = _learnings(db, sorted({h for ids in hyps.values() for h in ids}))
    return [_entry(latest[k], hyps, learned) for k in sorted(latest, key=lambda k: (k[0], k[1], _order(latest[k])))]


def _order(row: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Problems in the order of their values (M=1 before M=16), whatever the types."""
    return tuple((type(v).__name__, v) for v in loads(row["problem"]).values())


def _matches(problem: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return all(k in problem and problem[k] == v for k, v in wanted.items())


def _hypotheses(db: ReadOnlyDB, rows: Sequence[dict[str, Any]]) -> dict[str, set[str]]:
    """experiment key -> ids of the hypotheses whose evidence pairs use it."""
    keys = sorted({k for r in rows for k in (r["experiment_key"], r["runner_up_key"]) if k})
    out: dict[str, set[str]] = {}
    for chunk, marks in in_chunks(keys, 400):  # each chunk bound twice
        for e in db.rows(f"SELECT hypothesis_id, experiment_a, experiment_b FROM evidence "
                         f"WHERE experiment_a IN ({marks}) OR experiment_b IN ({marks})", [*chunk, *chunk]):
            for key in (e["experiment_a"], e["experiment_b"]):
                out.setdefault(key, set()).add(e["hypothesis_id"])
    return out


def _learnings(db: ReadOnlyDB, hypothesis_ids: Sequence[str]) -> dict[str, str]:
    """hypothesis id -> the id of the learning drawn from it."""
    out: dict[str, str] = {}
    for chunk, marks in in_chunks(hypothesis_ids, 400):
        for r in db.rows(f"SELECT id, hypothesis_id FROM learnings WHERE hypothesis_id IN ({marks})", chunk):
            out[r["hypothesis_id"]] = r["id"]
    return out


def _entry(r: dict[str, Any], hyps: dict[str, set[str]], learned: dict[str, str]) -> ExportEntry:
    ids = set(hyps.get(r["experiment_key"], set())) | set(hyps.get(r["runner_up_key"] or "", set()))
    return ExportEntry(
        kernel=r["kernel"], problem=loads(r["problem"]), problem_key=r["problem_key"], config=loads(r["config"]),
        experiment_key=r["experiment_key"], median_ms=r["median_ms"], rel_spread=r["rel_spread"],
        runner_up_key=r["runner_up_key"],
        runner_up_config=loads(r["runner_up_config"]) if r["runner_up_config"] else None,
        runner_up_ms=r["runner_up_ms"], runner_up_rel_spread=r["runner_up_rel_spread"], margin=r["margin"],
        tie=bool(r["tie"]), recheck_passed=None if r["recheck_passed"] is None else bool(r["recheck_passed"]),
        campaign=r["campaign"], campaign_id=r["campaign_id"], decided_at=r["decided_at"],
        proposer=r["proposer"] or "", rationale=r["rationale"] or "", device=r["device"], backend=r["backend"],
        kernel_version=r["kernel_version"], torch=r["torch"], triton=r["triton"], driver=r["driver"],
        hypotheses=tuple(sorted(ids)), recheck_err=r["recheck_err"], median_config_ms=r["median_config_ms"],
        baseline_name=r["baseline_name"] or "", baseline_ms=r["baseline_ms"],
        learnings=tuple(sorted({learned[h] for h in ids if h in learned})))


# ---- dispatch ---------------------------------------------------------------------------------

def export(db: ReadOnlyDB, fmt: str, *, campaign: str | int | None = None, kernel: str | None = None,
           device: str | None = None, problem: Mapping[str, Any] | None = None,
           param_defaults: Callable[[str], Mapping[str, Any]] | None = None) -> list[ExportFile]:
    """Render the selected winners in `fmt` (one of FORMATS). `param_defaults(kernel)` names the
    kernel's parameters that have a default (a variant's conditional parameters, e.g. matmul's
    VARIANT and SPLIT_K): `--format triton` leaves them out where they hold their default.

    Raises InputError for an unknown format, an empty selection, or winners the format cannot
    carry (see each renderer).
    """
    if fmt not in FORMATS:
        raise InputError(f"unknown export format {fmt!r} (allowed: {', '.join(FORMATS)})")
    entries = winners(db, campaign=campaign, kernel=kernel, device=device, problem=problem)
    if not entries:
        raise InputError(f"no declared winners to export{_selection(campaign, kernel, device, problem)} in "
                         f"{str(db.path)!r} (a campaign declares them when it finishes; see `tilepilot best`)")
    if fmt == "json":
        filters = {"campaign": campaign, "kernel": kernel, "device": device, "problem": dict(problem or {})}
        return [ExportFile("", render_json(entries, source=str(db.path), filters=filters))]
    measured = [e for e in entries if e.backend != "interpret"]
    if len(measured) < len(entries):
        log.warning("left out %d winner(s) of the interpret backend: CPU timings, not GPU",
                    len(entries) - len(measured))
    if not measured:
        raise InputError("every selected winner was timed by the Triton interpreter on a CPU; "
                         f"--format {fmt} exports GPU winners only (--format json shows them)")
    if fmt == "vllm":
        from tilepilot.storage.export_vllm import render_vllm

        return render_vllm(measured, kernel_chosen=kernel is not None)
    from tilepilot.storage.export_triton import render_triton

    defaults = param_defaults(measured[0].kernel) if param_defaults is not None else {}
    return [ExportFile("", render_triton(measured, source=str(db.path), defaults=defaults))]


def _selection(campaign: Any, kernel: Any, device: Any, problem: Any) -> str:
    parts = [f"{name} {value!r}" for name, value in (("campaign", campaign), ("kernel", kernel),
                                                      ("device", device)) if value is not None]
    if problem:
        parts.append("problem " + ",".join(f"{k}={v}" for k, v in problem.items()))
    return " for " + ", ".join(parts) if parts else ""


# ---- json -----------------------------------------------------------------------------------

def render_json(entries: Sequence[ExportEntry], *, source: str, filters: Mapping[str, Any]) -> str:
    doc = {"format": JSON_FORMAT, "source": source, "filters": dict(filters),
           "winners": [entry_json(e) for e in entries]}
    return json.dumps(doc, indent=2) + "\n"


def entry_json(e: ExportEntry) -> dict[str, Any]:
    runner = None
    if e.runner_up_key is not None:
        runner = {"config": e.runner_up_config, "median_ms": e.runner_up_ms, "rel_spread": e.runner_up_rel_spread,
                  "experiment": e.runner_up_key}
    baseline = None
    if e.baseline_ms is not None:
        baseline = {"name": e.baseline_name, "median_ms": e.baseline_ms, "speedup": e.baseline_ms / e.median_ms}
    return {
        "kernel": e.kernel, "problem": e.problem, "config": e.config, "median_ms": e.median_ms,
        "noise": e.rel_spread, "margin": e.margin, "tie": e.tie, "why": why(e), "runner_up": runner,
        "recheck_passed": e.recheck_passed, "recheck_err": e.recheck_err, "device": e.device, "backend": e.backend,
        "versions": {"kernel": e.kernel_version, "torch": e.torch, "triton": e.triton, "driver": e.driver},
        "campaign": e.campaign, "decided_at": _iso(e.decided_at), "proposer": e.proposer,
        "rationale": e.rationale, "baseline": baseline, "median_config_ms": e.median_config_ms,
        "speedup_vs_median_config": e.median_config_ms / e.median_ms if e.median_config_ms else None,
        "evidence": {"winner": e.experiment_key, "runner_up": e.runner_up_key, "hypotheses": list(e.hypotheses),
                     "learnings": list(e.learnings)},
    }


def why(e: ExportEntry) -> str:
    """One sentence: why this config won, or that it ties with the runner-up."""
    noise = f"{e.rel_spread:.1%}" if e.rel_spread is not None else "unknown"
    if e.margin is None:
        return f"the only config re-measured in the final round ({e.median_ms:.4g} ms, noise {noise})"
    if e.tie:
        return (f"a tie: the runner-up is {e.margin:.1%} slower, within the measured noise ({noise}); "
                "either config will do")
    return f"{e.margin:.1%} faster than the runner-up, beyond the measured noise ({noise})"


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
