"""Everything a campaign report shows, read from the store (`build_report`), as plain numbers.

The renderers (`html`, `markdown`) only format what is here, so every number in a report is
one of these, and each of these is a query of the store:
- what was tuned: the campaign row; the devices and toolchains of its experiments;
- winners: `queries.best` (with the roofline percentage where the store has one);
- convergence: `queries.convergence` (best time so far after each trial, per problem);
- roofline: each winner's arithmetic intensity (FLOPs / bytes of the family's work model, as the
  worker stored it or as the family computes it) and throughput, against the device's measured
  ceilings (`devices`: copy bandwidth, vendor matmul rate); "no ceilings measured" without them;
- parameter effects: per parameter and value, over the campaign's ok results, the geometric mean
  of (time / the problem's best time), the results counted, and the winners with that value;
- hypotheses of the campaign with their verdict history and evidence counts; the learnings drawn
  from them; the model's own (unverified) learnings from `llm_calls`;
- failures: trials per status, with the first message of each;
- cost: `cost.campaign_cost` and the estimate stored with the campaign.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from tilepilot.experiments import DeviceCeilings, Problem, Status
from tilepilot.storage import cost as cost_mod
from tilepilot.storage import queries
from tilepilot.storage.ledger import (
    EvidenceRow,
    HypothesisRow,
    LearningRow,
    VerdictRow,
    select_evidence,
    select_verdicts,
)
from tilepilot.storage.ledger import hypotheses as ledger_hypotheses
from tilepilot.storage.ledger import learnings as ledger_learnings
from tilepilot.storage.queries import ReadOnlyDB, best, campaign_id_of, campaigns, convergence
from tilepilot.storage.rows import loads
from tilepilot.storage.views import BestRow, CampaignSummary, ConvergencePoint


@dataclass(frozen=True)
class Toolchain:
    device: str
    backend: str
    torch: str
    triton: str
    driver: str
    kernel_version: str
    experiments: int



@dataclass(frozen=True)
class RooflinePoint:
    problem: dict[str, Any]
    flops: float
    bytes: float
    median_ms: float
    intensity: float  # FLOPs per byte
    tflops: float  # achieved
    gbps: float  # achieved
    bound_tflops: float | None  # min(matmul rate, bandwidth × intensity), None without ceilings
    pct: float | None  # percent of the roofline bound (the store's, else from the ceilings)


@dataclass(frozen=True)
class Effect:
    param: str
    value: Any
    results: int  # ok results with this value
    rel_time: float  # geometric mean of median_ms / best ms of its problem (1.0 = as fast as the best)
    winners: int  # problems whose winner has this value


@dataclass(frozen=True)
class HypothesisEntry:
    row: HypothesisRow
    verdicts: tuple[VerdictRow, ...]
    supports: int
    refutes: int
    evidence: tuple[EvidenceRow, ...]  # its pairs, at most EVIDENCE_SHOWN (the ledger's order)


EVIDENCE_SHOWN = 8  # pairs listed per hypothesis (all of them are counted)


@dataclass(frozen=True)
class Failure:
    status: str
    trials: int
    example: str  # the first message of that status


@dataclass(frozen=True)
class Report:
    campaign: CampaignSummary
    seed: int
    toolchains: tuple[Toolchain, ...]
    winners: tuple[BestRow, ...]
    convergence: dict[str, tuple[ConvergencePoint, ...]]  # problem key -> points in seq order
    ceilings: DeviceCeilings | None
    roofline: tuple[RooflinePoint, ...]
    effects: tuple[Effect, ...]
    hypotheses: tuple[HypothesisEntry, ...]
    learnings: tuple[LearningRow, ...]
    model_learnings: tuple[str, ...]  # the model's own conclusions: unverified text
    statuses: tuple[Failure, ...]  # every status with its trial count (ok first)
    cost: cost_mod.CampaignCost
    estimate: dict[str, Any] = field(default_factory=dict)


def build_report(db: ReadOnlyDB, campaign: str | int) -> Report:
    """Raises InputError for an unknown campaign."""
    cid = campaign_id_of(db, campaign)
    summary = next(c for c in campaigns(db) if c.id == cid)
    row = db.rows("SELECT seed, estimate FROM campaigns WHERE id = ?", [cid])[0]
    winners = tuple(best(db, campaign=cid))
    points: dict[str, list[ConvergencePoint]] = {p.problem_key: [] for p in summary.problems}  # campaign order
    for p in convergence(db, cid):
        points.setdefault(p.problem_key, []).append(p)
    ceilings = next(iter(queries.ceilings(db, summary.device)), None)
    return Report(
        campaign=summary, seed=row["seed"], toolchains=_toolchains(db, cid), winners=winners,
        convergence={k: tuple(v) for k, v in points.items() if v}, ceilings=ceilings,
        roofline=tuple(_roofline(db, summary.kernel, winners, ceilings)), effects=tuple(_effects(db, cid, winners)),
        hypotheses=tuple(_hypotheses(db, cid)), learnings=tuple(_learnings(db, cid)),
        model_learnings=tuple(_model_learnings(db, cid)), statuses=tuple(_statuses(db, cid)),
        cost=cost_mod.campaign_cost(db.rows, cid), estimate=loads(row["estimate"]))


def _toolchains(db: ReadOnlyDB, cid: int) -> list[Toolchain]:
    return [Toolchain(r["device"], r["backend"], r["torch"], r["triton"], r["driver"], r["kernel_version"], r["n"])
            for r in db.rows("SELECT e.device, e.backend, e.torch, e.triton, e.driver, e.kernel_version, COUNT(*) AS n "
                             "FROM trials t JOIN experiments e ON e.key = t.experiment_key WHERE t.campaign_id = ? "
                             "GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY n DESC", [cid])]




def _work(db: ReadOnlyDB, kernel: str, w: BestRow) -> tuple[float, float] | None:
    """(FLOPs, bytes) of the winner's problem: as the worker stored them, else the family's work model."""
    found = db.rows("SELECT extra FROM results WHERE experiment_key = ?", [w.experiment_key])
    extra = loads(found[0]["extra"]) if found else {}
    if isinstance(extra.get("work_flops"), int | float) and isinstance(extra.get("work_bytes"), int | float):
        return float(extra["work_flops"]), float(extra["work_bytes"])
    from tilepilot.experiments import InputError
    from tilepilot.kernels.registry import get_family

    try:
        family = get_family(kernel)
        work = family.work(family.parse_problem(w.problem))
    except InputError:
        return None
    return work.flops, work.bytes


def _roofline(db: ReadOnlyDB, kernel: str, winners: tuple[BestRow, ...],
              ceil: DeviceCeilings | None) -> list[RooflinePoint]:
    out = []
    for w in winners:
        work = _work(db, kernel, w)
        if work is None or w.median_ms <= 0 or work[1] <= 0:
            continue
        flops, nbytes = work
        seconds = w.median_ms / 1e3
        intensity = flops / nbytes
        bound = min(ceil.matmul_tflops, ceil.copy_gbps * intensity / 1e3) if ceil else None
        achieved = flops / seconds / 1e12
        pct = getattr(w, "roofline_pct", None)
        if pct is None and bound:
            pct = 100.0 * achieved / bound
        out.append(RooflinePoint(w.problem, flops, nbytes, w.median_ms, intensity, achieved, nbytes / seconds / 1e9,
                                 bound, pct))
    return out


def _effects(db: ReadOnlyDB, cid: int, winners: tuple[BestRow, ...]) -> list[Effect]:
    ok = db.rows("SELECT t.problem_key, e.config, r.median_ms FROM trials t JOIN results r ON r.experiment_key = "
                 "t.experiment_key JOIN experiments e ON e.key = t.experiment_key WHERE t.campaign_id = ? "
                 "AND r.status = ? AND r.median_ms > 0", [cid, Status.OK.value])
    best_ms: dict[str, float] = {}
    for r in ok:
        best_ms[r["problem_key"]] = min(best_ms.get(r["problem_key"], math.inf), r["median_ms"])
    logs: dict[tuple[str, str], list[float]] = defaultdict(list)
    values: dict[tuple[str, str], Any] = {}
    order: dict[str, list[str]] = defaultdict(list)
    for r in ok:
        for param, value in loads(r["config"]).items():
            k = (param, repr(value))
            if k not in values:
                values[k] = value
                order[param].append(k[1])
            logs[k].append(math.log(r["median_ms"] / best_ms[r["problem_key"]]))
    won = Counter((p, repr(v)) for w in winners for p, v in w.config.items())
    out = []
    for param, reprs in order.items():
        for rv in sorted(reprs, key=lambda x: _sort_key(values[(param, x)])):
            k = (param, rv)
            out.append(Effect(param, values[k], len(logs[k]), math.exp(sum(logs[k]) / len(logs[k])), won[k]))
    return out


def _sort_key(v: Any) -> tuple[int, Any]:
    return (0, v) if isinstance(v, int | float) and not isinstance(v, bool) else (1, str(v))


def _hypotheses(db: ReadOnlyDB, cid: int) -> list[HypothesisEntry]:
    counts: dict[tuple[str, str], int] = {(r["hypothesis_id"], r["relation"]): r["n"] for r in db.rows(
        "SELECT v.hypothesis_id, v.relation, COUNT(*) AS n FROM evidence v JOIN hypotheses h ON h.id = v.hypothesis_id "
        "WHERE h.campaign_id = ? GROUP BY 1, 2", [cid])}
    return [HypothesisEntry(h, tuple(select_verdicts(db.rows, h.id)), counts.get((h.id, "supports"), 0),
                            counts.get((h.id, "refutes"), 0), tuple(select_evidence(db.rows, h.id)[:EVIDENCE_SHOWN]))
            for h in ledger_hypotheses(db, campaign=cid)]


def _learnings(db: ReadOnlyDB, cid: int) -> list[LearningRow]:
    mine = {r["id"] for r in db.rows("SELECT id FROM hypotheses WHERE campaign_id = ?", [cid])}
    return [x for x in ledger_learnings(db) if x.learning.hypothesis_id in mine]


def _model_learnings(db: ReadOnlyDB, cid: int) -> list[str]:
    seen: dict[str, None] = {}
    for r in db.rows("SELECT learnings FROM llm_calls WHERE campaign_id = ? ORDER BY id", [cid]):
        for text in loads(r["learnings"]) or []:
            seen.setdefault(str(text))
    return list(seen)


def _statuses(db: ReadOnlyDB, cid: int) -> list[Failure]:
    rows = db.rows("SELECT r.status, COUNT(*) AS n, MIN(t.id) AS first FROM trials t JOIN results r ON "
                   "r.experiment_key = t.experiment_key WHERE t.campaign_id = ? GROUP BY r.status", [cid])
    out = []
    for r in sorted(rows, key=lambda r: (r["status"] != Status.OK.value, -r["n"], r["status"])):
        msg = db.rows("SELECT r.message FROM trials t JOIN results r ON r.experiment_key = t.experiment_key "
                      "WHERE t.id = ?", [r["first"]])[0]["message"]
        out.append(Failure(r["status"], r["n"], msg))
    return out


def problem_label(problem: dict[str, Any]) -> str:
    return Problem.of(problem).label()
