"""What the Overview shows of a campaign, computed from its trials in one pass.

`digest(...)` turns a campaign's trials (`reads.trial_points`), its winners, the ceilings and the
LLM spend into per-problem figures (progress, best so far, speed-ups, share of the roofline) and
campaign figures (progress, ETA, GPU time, compile time). `convergence(...)` and
`roofline_points(...)` thin a campaign's trials to what a chart can carry; `parameter_effects(...)`
summarises, per parameter value, the time relative to the problem's best. Pure functions: no
Streamlit, no database.

Definitions, as the pages state them:
- trials done: trials that count against the budget (measured: every status but `invalid`; a
  result reused from the store is free), at most the budget per problem; the budget is per problem;
- ETA: the trials left over the recent rate, `RECENT` counted trials over the time from the
  oldest of them until now (so a stalled campaign's ETA grows); only while running;
- GPU time: `campaigns.gpu_seconds` where the driver recorded it (at the campaign's end), else
  the same sum `storage.cost` makes: over the results the campaign measured itself (not reused,
  not invalid), each result's `timed_ms` where recorded, else repetitions × median for an ok
  one: time spent timing on the GPU, not compiling, verifying or idling (a lower bound of the
  time held); compile time is the sum of the results' `compile_ms` (CPU time, in the compile
  pool), reused results not counted;
- speed-up over the median config: the median of the problem's ok results over the best (the
  winner's own figure once decided); over the vendor baseline: the baseline's time over the
  best, known once the problem's winner is decided.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import pandas as pd

from tilepilot.dashboard import roofline
from tilepilot.dashboard.reads import CampaignInfo, ExperimentBrief, LlmSpend, TrialPoint, Winner
from tilepilot.experiments import DeviceCeilings, canonical_json

NOT_COUNTED = ("invalid",)
RECENT = 100
MAX_POINTS = 150  # trials drawn per problem in a convergence chart (every new best is kept)
MAX_ROOFLINE_POINTS = 40  # results drawn per problem on the roofline (the best is kept) ...
ROOFLINE_BUDGET = 400  # ... and at most about this many in all: MAX_ROOFLINE_POINTS shared among the problems


@dataclass(frozen=True)
class ProblemDigest:
    problem_key: str
    problem: dict[str, Any]
    trials: int
    counted: int
    ok: int
    failed: int
    reused: int
    best_ms: float | None  # the fastest ok trial's median
    best_key: str | None
    median_ms: float | None  # median over the ok trials
    winner: Winner | None
    config: dict[str, Any] | None  # the winner's once decided, else the fastest trial's
    speedup_vs_median: float | None
    speedup_vs_baseline: float | None
    baseline_name: str
    roofline_pct: float | None  # of the winner once decided, else of the fastest trial
    best_proposer: str  # of the fastest trial


@dataclass(frozen=True)
class CampaignDigest:
    campaign: CampaignInfo
    problems: tuple[ProblemDigest, ...]
    trials: int
    ok: int
    failed: int
    spent: int  # counted trials, at most the budget per problem
    total: int  # budget × problems
    rate_per_min: float | None  # counted trials per minute, recently
    eta_s: float | None
    gpu_s: float | None
    gpu_source: str  # "recorded" (campaigns.gpu_seconds) | "timed" (summed from the results) | "" (unknown)
    compile_s: float
    llm: LlmSpend | None
    ceilings: DeviceCeilings | None

    @property
    def progress(self) -> float:
        return self.spent / self.total if self.total else 0.0

    def geomean(self, attr: str) -> float | None:
        """Geometric mean over the problems of a speed-up attribute (None where none has one)."""
        values = [getattr(p, attr) for p in self.problems if getattr(p, attr)]
        return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None

    def median_roofline(self) -> float | None:
        values = [p.roofline_pct for p in self.problems if p.roofline_pct is not None]
        return statistics.median(values) if values else None


def keys_to_read(c: CampaignInfo, points: Sequence[TrialPoint], winners: Mapping[str, Winner]) -> list[str]:
    """The experiments whose problem, config and driver the digest needs: each problem's best
    (and winner), and one trial of each problem without an ok result."""
    best: dict[str, TrialPoint] = {}
    for p in points:
        b = best.get(p.problem_key)
        if b is None or _faster(p, b):
            best[p.problem_key] = p
    return sorted({b.experiment_key for b in best.values()} | {w.experiment_key for w in winners.values()})


def _faster(p: TrialPoint, than: TrialPoint) -> bool:
    if p.status != "ok" or p.median_ms is None:
        return False
    return than.status != "ok" or than.median_ms is None or p.median_ms < than.median_ms


def digest(c: CampaignInfo, points: Sequence[TrialPoint], winners: Mapping[str, Winner],
           briefs: Mapping[str, ExperimentBrief], ceilings: Sequence[DeviceCeilings], llm: LlmSpend | None,
           now: float) -> CampaignDigest:
    by_problem: dict[str, list[TrialPoint]] = {}
    for p in points:
        by_problem.setdefault(p.problem_key, []).append(p)
    listed = [canonical_json(p) for p in c.problems]
    keys = listed + [k for k in by_problem if k not in listed]
    listed_problem = dict(zip(listed, c.problems, strict=True))
    driver = _driver(by_problem, briefs)
    ceiling = roofline.pick(ceilings, c.device, driver)
    problems = tuple(_problem(c, k, listed_problem.get(k), by_problem.get(k, []), winners.get(k), briefs, ceiling)
                     for k in keys)
    spent = sum(min(p.counted, c.budget) for p in problems)
    total = c.budget * len(problems)
    rate = _rate(points, now)
    eta = (total - spent) / rate * 60 if rate and c.state == "running" and total > spent else None
    gpu_s, source = _gpu_time(c, points)
    compile_s = sum(p.compile_ms or 0.0 for p in points if not p.reused) / 1000
    return CampaignDigest(c, problems, len(points), sum(p.ok for p in problems), sum(p.failed for p in problems),
                          spent, total, rate, eta, gpu_s, source, compile_s, llm, ceiling)


def _driver(by_problem: Mapping[str, list[TrialPoint]], briefs: Mapping[str, ExperimentBrief]) -> str:
    drivers = [b.driver for b in briefs.values() if b.driver]
    return max(set(drivers), key=drivers.count) if drivers else ""


def _problem(c: CampaignInfo, key: str, listed: dict[str, Any] | None, trials: list[TrialPoint],
             winner: Winner | None, briefs: Mapping[str, ExperimentBrief],
             ceiling: DeviceCeilings | None) -> ProblemDigest:
    ok = [t for t in trials if t.status == "ok" and t.median_ms is not None]
    best = min(ok, key=lambda t: t.median_ms or 0.0) if ok else None
    chosen = winner.experiment_key if winner else (best.experiment_key if best else None)
    brief = briefs.get(chosen) if chosen else None
    problem = listed if listed is not None else (brief.problem if brief else _problem_of(trials, briefs))
    median = statistics.median(t.median_ms for t in ok) if ok else None  # type: ignore[misc]
    shown_ms = winner.median_ms if winner else (best.median_ms if best else None)
    median_cfg = winner.median_config_ms if winner and winner.median_config_ms else median
    w = roofline.work(c.kernel, problem) if problem else None
    return ProblemDigest(
        key, problem or {}, len(trials), sum(t.status not in NOT_COUNTED and not t.reused for t in trials), len(ok),
        len(trials) - len(ok), sum(t.reused for t in trials), best.median_ms if best else None,
        best.experiment_key if best else None, median, winner, brief.config if brief else None,
        _ratio(median_cfg, shown_ms), _ratio(winner.baseline_ms, shown_ms) if winner else None,
        winner.baseline_name if winner else "", roofline.pct(w, ceiling, shown_ms), best.proposer if best else "")


def _problem_of(trials: list[TrialPoint], briefs: Mapping[str, ExperimentBrief]) -> dict[str, Any] | None:
    for t in trials:
        if t.experiment_key in briefs:
            return briefs[t.experiment_key].problem
    return None


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _rate(points: Sequence[TrialPoint], now: float) -> float | None:
    counted = [p for p in points if p.status not in NOT_COUNTED and not p.reused]
    recent = counted[-RECENT:]
    if not recent:
        return None
    span = now - recent[0].created_at
    return len(recent) / span * 60 if span > 0 else None


def _gpu_time(c: CampaignInfo, points: Sequence[TrialPoint]) -> tuple[float | None, str]:
    if c.gpu_seconds > 0:
        return c.gpu_seconds, "recorded"
    measured = [p for p in points if not p.reused and p.status not in NOT_COUNTED]
    timed = [p.timed_ms if p.timed_ms is not None else
             (p.reps * p.median_ms if p.status == "ok" and p.reps and p.median_ms else None) for p in measured]
    known = [t for t in timed if t is not None]
    return (sum(known) / 1000, "timed") if known else (None, "")


# ---- thinned for charts ------------------------------------------------------------------------------

class ConvergencePoint(NamedTuple):
    seq: int
    median_ms: float | None  # ok trials only
    best_so_far_ms: float | None
    improved: bool
    status: str
    proposer: str


def convergence(points: Sequence[TrialPoint], max_points: int = MAX_POINTS) -> dict[str, list[ConvergencePoint]]:
    """Problem key -> its trials in seq order with the best so far; at most `max_points` per
    problem: every new best, the last trial, and an even sample of the others."""
    by_problem: dict[str, list[TrialPoint]] = {}
    for p in points:
        by_problem.setdefault(p.problem_key, []).append(p)
    out: dict[str, list[ConvergencePoint]] = {}
    for key, trials in by_problem.items():
        trials.sort(key=lambda t: t.seq)
        full: list[ConvergencePoint] = []
        best: float | None = None
        for t in trials:
            ms = t.median_ms if t.status == "ok" else None
            improved = ms is not None and (best is None or ms < best)
            best = ms if improved else best
            full.append(ConvergencePoint(t.seq, ms, best, improved, t.status, t.proposer))
        out[key] = thin(full, max_points)
    return out


def thin(full: list[ConvergencePoint], max_points: int) -> list[ConvergencePoint]:
    if len(full) <= max_points:
        return full
    keep = {i for i, p in enumerate(full) if p.improved} | {len(full) - 1}
    step = len(full) / max(1, max_points - len(keep))
    keep |= {int(i * step) for i in range(max(0, max_points - len(keep)))}
    return [full[i] for i in sorted(keep)]


class RooflinePoint(NamedTuple):
    problem_key: str
    intensity: float  # FLOPs per byte
    tflops: float
    median_ms: float
    pct: float | None
    best: bool


def roofline_per_problem(problems: int) -> int:
    """How many results the roofline draws per problem: `MAX_ROOFLINE_POINTS`, fewer when many
    problems share the chart (`ROOFLINE_BUDGET` in all, at least 8 each): the browser's cost grows
    with the marks, and a problem's results all lie on one vertical line (its intensity)."""
    return max(8, min(MAX_ROOFLINE_POINTS, ROOFLINE_BUDGET // max(1, problems)))


def roofline_points(kernel: str, problems: Sequence[ProblemDigest], points: Sequence[TrialPoint],
                    ceiling: DeviceCeilings | None, per_problem: int | None = None) -> list[RooflinePoint]:
    """The ok results placed by arithmetic intensity and achieved TFLOP/s; at most `per_problem`
    per problem (`roofline_per_problem` by default; its best always, then an even sample). Empty
    without work models."""
    per_problem = roofline_per_problem(len(problems)) if per_problem is None else per_problem
    by_problem: dict[str, list[TrialPoint]] = {}
    for p in points:
        if p.status == "ok" and p.median_ms:
            by_problem.setdefault(p.problem_key, []).append(p)
    out: list[RooflinePoint] = []
    for pd_ in problems:
        w = roofline.work(kernel, pd_.problem) if pd_.problem else None
        ok = by_problem.get(pd_.problem_key, [])
        if w is None or w.intensity is None or w.flops <= 0 or not ok:
            continue
        ok.sort(key=lambda t: t.median_ms or 0.0)
        step = max(1, len(ok) // per_problem)
        for i, t in enumerate(ok[::step][:per_problem]):
            ms = float(t.median_ms or 0.0)
            out.append(RooflinePoint(pd_.problem_key, w.intensity, roofline.tflops(w, ms), ms,
                                     roofline.pct(w, ceiling, ms), i == 0))
    return out


# ---- the effect of each parameter ---------------------------------------------------------------------

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def parameter_effects(points: Sequence[TrialPoint]) -> pd.DataFrame:
    """Per parameter and value: how many ok results, and the quantiles (10, 25, 50, 75, 90 %) of
    median_ms over the best median of the same problem (1 = as fast as the problem's best).
    Columns: param, value, order (the value's rank among the parameter's values), n, q10..q90."""
    columns = ["param", "value", "order", "n", "q10", "q25", "q50", "q75", "q90"]
    ok = [p for p in points if p.status == "ok" and p.median_ms and p.median_ms > 0]
    if not ok:
        return pd.DataFrame(columns=columns)
    frame = _config_frame([p.config for p in ok])
    frame["_problem"] = [p.problem_key for p in ok]
    frame["_ms"] = [p.median_ms for p in ok]
    frame["_rel"] = frame["_ms"] / frame.groupby("_problem")["_ms"].transform("min")
    params = [c for c in frame.columns if not c.startswith("_")]
    out = []
    for param in params:
        stats = frame.groupby(param, dropna=True)["_rel"].quantile(list(QUANTILES)).unstack()
        counts = frame.groupby(param, dropna=True)["_rel"].size()
        for order, value in enumerate(sorted(stats.index, key=_sort_key)):
            q = stats.loc[value]
            out.append({"param": param, "value": str(value), "order": order, "n": int(counts[value]),
                        **{f"q{round(x * 100)}": float(q[x]) for x in QUANTILES}})
    return pd.DataFrame(out, columns=columns)


def _config_frame(configs: list[str]) -> pd.DataFrame:
    """One row per config text (JSON objects as stored), a column per parameter. Each distinct text
    is parsed once, and all of them in one `json.loads` of a JSON array: at 40k configs a call per
    config costs five times as much."""
    index: dict[str, int] = {}
    codes = [index.setdefault(c, len(index)) for c in configs]
    distinct = pd.DataFrame(json.loads("[" + ",".join(index) + "]"))
    return distinct.iloc[codes].reset_index(drop=True)


def _sort_key(value: object) -> tuple[int, float, str]:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return (1, 0.0, str(value))
    return (0, float(value), "")
