"""What a campaign cost (GPU-seconds per device, model tokens and dollars per model), and what a
campaign will cost, estimated from the history before it runs.

GPU-seconds. A result's GPU time is the time its worker spent timing it on the GPU: the
result's `timed_ms` where the worker recorded it, otherwise its repetitions times its median
(`reps * median_ms`: the time the timed launches themselves ran, which is all a replayed
recording says). Results of other statuses count their `timed_ms` or nothing. A campaign's
GPU-seconds are the sum over the results it measured itself: a trial reused from the store
(measured by an earlier campaign) costs nothing, and a config settled as `invalid` never ran.
This counts GPU busy time in measurement, not the wall time a GPU was held (compiling,
verification, warm-up and idle time are not in it): read it as the lower bound of the bill.
Per device kind: grouped by the experiment's device name (for the `interpret` backend these
are CPU seconds, and say so by their device name).

Model cost. Every call of the `llm` proposer is a row of `llm_calls` with its tokens and cost:
summed per model (a call whose model has no known price counts its tokens and is reported as
unpriced).

Estimate (`estimate(...)`), per problem, from the history of the same kernel on the same device
and backend: the configs the campaign will measure (its budget, at most the valid configs of the
space the store has no result of: a result reused from the store is free, the campaign measures
its budget beside it) times the mean GPU time per measured result of the nearest problem in the
history (nearest in log2 of its integer dimensions, same non-integer fields first); beside them,
the configs it is expected to reuse on the way, at no GPU time (a proposer is assumed to draw
configs independently of what is stored: measured × stored / (valid − stored + 1), every stored
one where it measures all the others). Model cost: calls per trial and dollars per call
of earlier campaigns with the same proposer. The estimate is stored in `campaigns.estimate`
when a campaign starts and the actual beside it when it finishes:
`{"estimate": {...}, "actual": {...}, "ratio": {"gpu_seconds": actual / estimate, ...}}`.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tilepilot.experiments import Problem, Status
from tilepilot.storage.rows import loads

RowsFn = Callable[[str, Sequence[Any]], list[dict[str, Any]]]
LLM_PROPOSERS = ("llm", "portfolio")  # proposers that may call a model

# GPU seconds of one results row (aliases: r results)
RESULT_GPU_S = ("(COALESCE(r.timed_ms, CASE WHEN r.status = 'ok' THEN r.reps * r.median_ms END, 0) / 1000.0)")


@dataclass(frozen=True)
class DeviceCost:
    device: str
    backend: str
    results: int  # results this campaign measured on it
    gpu_seconds: float


@dataclass(frozen=True)
class ModelCost:
    model: str
    calls: int
    failed: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_creation_tokens: int
    cost_usd: float  # over the calls with a known price
    unpriced: int  # answered calls whose model has no known price


@dataclass(frozen=True)
class CampaignCost:
    campaign_id: int
    gpu_seconds: float
    devices: tuple[DeviceCost, ...]
    llm_cost_usd: float
    models: tuple[ModelCost, ...]
    measured: int  # results the campaign measured itself
    reused: int  # trials answered from the store
    wall_s: float | None  # created to finished (None while running)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def campaign_cost(rows: RowsFn, campaign_id: int) -> CampaignCost:
    """The GPU-seconds and model cost of one campaign, from its rows (see the module's definitions)."""
    devices = tuple(DeviceCost(r["device"], r["backend"], r["n"], r["s"] or 0.0) for r in rows(
        f"SELECT e.device, e.backend, COUNT(*) AS n, SUM({RESULT_GPU_S}) AS s FROM trials t "
        "JOIN results r ON r.experiment_key = t.experiment_key JOIN experiments e ON e.key = t.experiment_key "
        "WHERE t.campaign_id = ? AND t.reused = 0 AND r.status != ? GROUP BY e.device, e.backend "
        "ORDER BY e.device", [campaign_id, Status.INVALID.value]))
    reused = rows("SELECT COUNT(*) AS n FROM trials WHERE campaign_id = ? AND reused = 1", [campaign_id])[0]["n"]
    models = tuple(ModelCost(
        r["model"], r["calls"], r["failed"], r["i"] or 0, r["o"] or 0, r["cr"] or 0, r["cc"] or 0, r["usd"] or 0.0,
        r["unpriced"]) for r in rows(
        "SELECT model, COUNT(*) AS calls, SUM(error != '') AS failed, SUM(input_tokens) AS i, "
        "SUM(output_tokens) AS o, SUM(cache_read_tokens) AS cr, SUM(cache_creation_tokens) AS cc, "
        "SUM(cost_usd) AS usd, SUM(cost_usd IS NULL AND input_tokens IS NOT NULL) AS unpriced "
        "FROM llm_calls WHERE campaign_id = ? GROUP BY model ORDER BY model", [campaign_id]))
    c = rows("SELECT created_at, finished_at FROM campaigns WHERE id = ?", [campaign_id])
    wall = c[0]["finished_at"] - c[0]["created_at"] if c and c[0]["finished_at"] is not None else None
    return CampaignCost(campaign_id, sum(d.gpu_seconds for d in devices), devices,
                        sum(m.cost_usd for m in models), models, sum(d.results for d in devices), reused, wall)


# ---- the estimate --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProblemEstimate:
    problem: dict[str, Any]
    trials: int  # configs the campaign will try: those it measures and, rounded, those it reuses
    reused: float  # of those, expected to be answered from the store (free of the budget)
    gpu_s_per_result: float | None
    gpu_seconds: float | None
    basis: str  # where the per-result time came from


@dataclass(frozen=True)
class Estimate:
    gpu_seconds: float | None  # None: no history to estimate from
    llm_calls: float | None
    llm_cost_usd: float | None
    trials: int
    measured: float  # trials expected to be measured (not reused)
    problems: tuple[ProblemEstimate, ...]
    basis: str  # one line: what history the estimate rests on
    made_at: float = field(default_factory=time.time)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate(rows: RowsFn, *, kernel: str, device: str | None, backend: str, kernel_version: str | None,
             valid: Mapping[Problem, int], budget: int, proposer: str,
             exclude_campaign: int | None = None) -> Estimate:
    """Estimate a campaign's GPU-seconds and model cost from the history (see the module's text).

    `valid`: the number of valid configs per problem; `device` None: any device of this kernel and
    backend; `kernel_version` None: reuse is not estimated.
    """
    per_problem = _history_per_problem(rows, kernel, device, backend, exclude_campaign)
    out = []
    to_measure = 0
    for problem, n_valid in valid.items():
        stored = min(n_valid, _stored(rows, kernel, kernel_version, problem, device, backend) if kernel_version else 0)
        left = n_valid - stored  # valid configs the store has no result of
        measured = min(budget, left)
        reused = float(stored) if measured == left else min(stored, measured * stored / (left + 1))
        per, basis = _per_result(per_problem, problem)
        gpu = None if per is None else per * measured
        out.append(ProblemEstimate(problem.as_dict(), measured + round(reused), reused, per, gpu, basis))
        to_measure += measured
    known = [p.gpu_seconds for p in out if p.gpu_seconds is not None]
    gpu_total = sum(known) if out and len(known) == len(out) else None
    trials = sum(p.trials for p in out)
    calls, usd, llm_basis = _llm(rows, proposer, trials, exclude_campaign)
    n_results = sum(len(v) for v in per_problem.values())
    where = f"on {device}" if device else "on any device"
    if per_problem:
        basis = f"{n_results} measured result(s) of {kernel} {where} ({backend}) in {len(per_problem)} problem(s)"
    else:
        basis = f"no measured {kernel} result {where} ({backend}) in the store"
    basis += "; " + llm_basis
    return Estimate(gpu_total, calls, usd, trials, to_measure, tuple(out), basis)


def _history_per_problem(rows: RowsFn, kernel: str, device: str | None, backend: str,
                         exclude: int | None) -> dict[str, list[float]]:
    """problem key -> GPU seconds of each measured result (not reused, not invalid)."""
    cond, params = "", []
    if device is not None:
        cond += " AND e.device = ?"
        params.append(device)
    if exclude is not None:
        cond += " AND t.campaign_id != ?"
        params.append(exclude)
    found: dict[str, list[float]] = {}
    for r in rows(f"SELECT e.problem, {RESULT_GPU_S} AS s FROM trials t "
                  "JOIN results r ON r.experiment_key = t.experiment_key "
                  "JOIN experiments e ON e.key = t.experiment_key "
                  f"WHERE e.kernel = ? AND e.backend = ? AND t.reused = 0 AND r.status != ?{cond}",
                  [kernel, backend, Status.INVALID.value, *params]):
        found.setdefault(r["problem"], []).append(float(r["s"] or 0.0))
    return found


def _stored(rows: RowsFn, kernel: str, kernel_version: str, problem: Problem, device: str | None,
            backend: str) -> int:
    cond, params = ("", []) if device is None else (" AND e.device = ?", [device])
    found = rows("SELECT COUNT(DISTINCT e.config_key) AS n FROM experiments e "
                 "JOIN results r ON r.experiment_key = e.key "
                 f"WHERE e.kernel = ? AND e.kernel_version = ? AND e.problem_key = ? AND e.backend = ?{cond}",
                 [kernel, kernel_version, problem.key(), backend, *params])
    return int(found[0]["n"])


def _per_result(history: dict[str, list[float]], problem: Problem) -> tuple[float | None, str]:
    """Mean GPU seconds per result of the nearest problem in the history, and which it was."""
    if not history:
        return None, "no history"
    want = problem.as_dict()

    def distance(text: str) -> tuple[int, float]:
        other = loads(text)
        mismatched = sum(other.get(k) != v for k, v in want.items() if not _is_int(v))
        dims = [k for k, v in want.items() if _is_int(v) and _is_int(other.get(k))]
        return mismatched, sum((math.log2(max(want[k], 1)) - math.log2(max(other[k], 1))) ** 2 for k in dims)

    nearest = min(sorted(history), key=distance)
    same = loads(nearest) == want
    label = " ".join(f"{k}={v}" for k, v in loads(nearest).items())
    return statistics.fmean(history[nearest]), ("this problem" if same else f"nearest problem {label}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _llm(rows: RowsFn, proposer: str, trials: int, exclude: int | None) -> tuple[float | None, float | None, str]:
    """Expected calls and dollars, from earlier campaigns of the same proposer."""
    params: list[Any] = [proposer]
    cond = ""
    if exclude is not None:
        cond = " AND c.id != ?"
        params.append(exclude)
    past = rows("SELECT c.id, (SELECT COUNT(*) FROM trials t WHERE t.campaign_id = c.id) AS trials, "
                "(SELECT COUNT(*) FROM llm_calls l WHERE l.campaign_id = c.id) AS calls, "
                "(SELECT COALESCE(SUM(cost_usd), 0) FROM llm_calls l WHERE l.campaign_id = c.id) AS usd "
                f"FROM campaigns c WHERE c.proposer = ?{cond}", params)
    past = [p for p in past if p["trials"]]
    if not past:
        if proposer in LLM_PROPOSERS:
            return None, None, f"no earlier {proposer} campaign: model cost unknown"
        return 0.0, 0.0, f"proposer {proposer} calls no model"
    calls = sum(p["calls"] for p in past)
    per_trial = calls / sum(p["trials"] for p in past)
    per_call = sum(p["usd"] for p in past) / calls if calls else 0.0
    expected = per_trial * trials
    return expected, expected * per_call, (f"model calls from {len(past)} earlier {proposer} campaign(s): "
                                           f"{per_trial:.3g} call(s) per trial, ${per_call:.4g} per call")


# ---- recording -----------------------------------------------------------------------------------

def record_estimate(store: Any, campaign_id: int, est: Estimate) -> bool:
    """Store the estimate in campaigns.estimate unless one is there (a resumed campaign keeps its
    first); returns True when written. `store` is a `Store`."""
    with store.transaction():
        found = store.db.execute("SELECT estimate FROM campaigns WHERE id = ?", [campaign_id]).fetchone()
        if found is None:
            raise KeyError(f"no campaign with id {campaign_id}")
        if loads(found[0]).get("estimate"):
            return False
        store.db.execute("UPDATE campaigns SET estimate = ? WHERE id = ?",
                         [json.dumps({"estimate": est.as_dict()}), campaign_id])
    return True


def record_actual(store: Any, campaign_id: int) -> CampaignCost:
    """Write the campaign's GPU-seconds and model cost, and the actual beside its estimate."""
    with store.transaction():
        cost = campaign_cost(store._rows, campaign_id)
        found = store.db.execute("SELECT estimate FROM campaigns WHERE id = ?", [campaign_id]).fetchone()
        doc = loads(found[0]) if found else {}
        actual = {"gpu_seconds": cost.gpu_seconds, "llm_cost_usd": cost.llm_cost_usd,
                  "llm_calls": sum(m.calls for m in cost.models), "measured": cost.measured, "reused": cost.reused,
                  "recorded_at": time.time()}
        doc["actual"] = actual
        est = doc.get("estimate") or {}
        doc["ratio"] = {k: _ratio(actual[k], est.get(k)) for k in ("gpu_seconds", "llm_cost_usd", "llm_calls")}
        store.db.execute("UPDATE campaigns SET gpu_seconds = ?, llm_cost_usd = ?, estimate = ? WHERE id = ?",
                         [cost.gpu_seconds, cost.llm_cost_usd, json.dumps(doc), campaign_id])
    return cost


def _ratio(actual: float, estimated: float | None) -> float | None:
    return actual / estimated if estimated else None


def record_start(store: Any, campaign_id: int, *, kernel: str, proposer: str, budget: int, device: str,
                 backend: str, kernel_version: str, valid: Mapping[Problem, int]) -> None:
    """At a campaign's start: estimate it from the rest of the history and store that (once)."""
    est = estimate(store._rows, kernel=kernel, device=device, backend=backend, kernel_version=kernel_version,
                   valid=valid, budget=budget, proposer=proposer, exclude_campaign=campaign_id)
    record_estimate(store, campaign_id, est)
