"""Frozen records of the tables the `Store` writes, and their conversion to and from rows.

A row is a dict as sqlite-utils returns it (column name -> value). JSON columns are parsed
here and nowhere else.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tilepilot.experiments import (
    Campaign,
    Candidate,
    Config,
    DeviceCeilings,
    Environment,
    Problem,
    Result,
    Status,
    Telemetry,
    Timing,
)

Row = Mapping[str, Any]
T = TypeVar("T")
IN_CHUNK = 500  # values per `IN (...)` list: well under SQLite's bound-parameter limit


def in_chunks(values: Sequence[T], size: int = IN_CHUNK) -> Iterator[tuple[list[T], str]]:
    """`values` in slices for `... IN (marks)` queries: each slice with its `?, ?, ...` placeholders."""
    for i in range(0, len(values), size):
        part = list(values[i:i + size])
        yield part, ", ".join("?" * len(part))


def dumps(data: Mapping[str, Any] | list[Any]) -> str:
    """JSON for a column. Key order is kept: problems and configs display in the order given."""
    return json.dumps(data)


def loads(text: str | None) -> Any:
    return json.loads(text) if text else {}


@dataclass(frozen=True)
class CampaignRow:
    id: int
    name: str
    kernel: str
    proposer: str
    budget: int
    seed: int
    backend: str
    dataset: str  # the replay dataset's path, or ""
    device: str
    state: str  # one of schema.CAMPAIGN_STATES
    source: str  # the campaign TOML as loaded
    description: str
    problems: tuple[Problem, ...]  # as created (may be empty: every problem of a dataset)
    created_at: float
    updated_at: float
    finished_at: float | None

    def as_campaign(self) -> Campaign:
        return Campaign(self.name, self.kernel, self.proposer, self.budget, self.seed,
                        self.problems, self.description, self.source)


@dataclass(frozen=True)
class TrialRow:
    id: int
    campaign_id: int
    problem_key: str
    experiment_key: str
    seq: int  # 1-based order of this trial within its campaign and problem
    proposer: str
    rationale: str
    predicted_ms: float | None
    hypothesis_id: str | None
    reused: bool  # the result came from the store, not measured in this campaign
    created_at: float


@dataclass(frozen=True)
class TrialWrite:
    """One trial of a batch written by `Store.record_trials`: the experiment `key`, the candidate
    tried and its result. `reused`: the result came from the store (only the trial is written);
    `queue_id`: the queue row it ran from (set 'done'), None for one settled without measuring;
    `worker`: who measured it."""

    key: str
    candidate: Candidate
    result: Result
    reused: bool = False
    queue_id: int | None = None
    worker: str = ""


@dataclass(frozen=True)
class QueueRow:
    id: int
    campaign_id: int
    problem_key: str
    problem: Problem
    config: Config
    config_key: str
    proposer: str
    rationale: str
    predicted_ms: float | None
    hypothesis_id: str | None
    priority: float  # higher runs first
    reason: str  # why the row has this priority
    state: str  # one of schema.QUEUE_STATES
    worker: str
    experiment_key: str  # "" until known
    enqueued_at: float
    started_at: float | None
    finished_at: float | None

    @property
    def candidate(self) -> Candidate:
        return Candidate(self.problem, self.config, self.proposer, self.rationale,
                         self.predicted_ms, self.hypothesis_id)


@dataclass(frozen=True)
class WinnerRow:
    """The config declared best for one problem of one campaign, and how sure that is."""

    campaign_id: int
    problem_key: str
    experiment_key: str
    median_ms: float  # from the final interleaved re-measurement
    rel_spread: float | None = None
    runner_up_key: str | None = None
    runner_up_ms: float | None = None
    margin: float | None = None  # runner_up_ms / median_ms - 1
    tie: bool = False  # the margin is within the measured noise
    recheck_passed: bool | None = None  # correct again on fresh inputs; None: not re-checked
    recheck_err: float | None = None  # max relative error of that re-check
    median_config_ms: float | None = None  # median over the campaign's ok configs of the problem
    baseline_ms: float | None = None
    baseline_name: str = ""
    decided_at: float | None = None  # set by the store when None


def campaign_from_row(r: Row) -> CampaignRow:
    problems = tuple(Problem.of(p) for p in loads(r["problems"]) or ())
    return CampaignRow(
        r["id"], r["name"], r["kernel"], r["proposer"], r["budget"], r["seed"], r["backend"],
        r["dataset"], r["device"], r["state"], r["source"], r["description"], problems,
        r["created_at"], r["updated_at"], r["finished_at"])


def trial_from_row(r: Row) -> TrialRow:
    return TrialRow(
        r["id"], r["campaign_id"], r["problem_key"], r["experiment_key"], r["seq"], r["proposer"],
        r["rationale"], r["predicted_ms"], r["hypothesis_id"], bool(r["reused"]), r["created_at"])


def queue_from_row(r: Row) -> QueueRow:
    return QueueRow(
        r["id"], r["campaign_id"], r["problem_key"], Problem.of(loads(r["problem"])),
        Config.of(loads(r["config"])), r["config_key"], r["proposer"], r["rationale"],
        r["predicted_ms"], r["hypothesis_id"], r["priority"], r["reason"], r["state"], r["worker"],
        r["experiment_key"], r["enqueued_at"], r["started_at"], r["finished_at"])


def _flag(value: int | None) -> bool | None:
    return None if value is None else bool(value)


# The experiments and results columns (aliases e, r) that rebuild a Result.
RESULT_FIELDS = """e.problem, e.config, e.backend, e.device, e.torch, e.triton, e.driver,
r.status, r.median_ms, r.p20_ms, r.p80_ms, r.min_ms, r.reps, r.rel_spread, r.l2_flushed,
r.timing_method, r.max_rel_err, r.compile_ms, r.message, r.sm_clock_mhz, r.power_w, r.temp_c,
r.extra, r.worker, r.measured_at, r.spread_target, r.time_cap_ms, r.stop_reason, r.timed_ms"""
RESULT_JOIN = "results r JOIN experiments e ON e.key = r.experiment_key"


def result_from_row(r: Row) -> Result:
    """Rebuild a Result from a row holding RESULT_FIELDS."""
    timing = None
    if r["median_ms"] is not None:
        timing = Timing(r["median_ms"], r["p20_ms"], r["p80_ms"], r["min_ms"], r["reps"],
                        bool(r["l2_flushed"]), r["timing_method"], r["spread_target"], r["time_cap_ms"],
                        r["stop_reason"] or "", r["timed_ms"])
    return Result(
        problem=Problem.of(loads(r["problem"])),
        config=Config.of(loads(r["config"])),
        status=Status(r["status"]),
        env=Environment(r["backend"], r["device"], r["torch"], r["triton"], r["driver"]),
        timing=timing,
        message=r["message"],
        max_rel_err=r["max_rel_err"],
        compile_ms=r["compile_ms"],
        telemetry=Telemetry(r["sm_clock_mhz"], r["power_w"], r["temp_c"]),
        extra=loads(r["extra"]),
    )


def result_columns(result: Result) -> dict[str, Any]:
    """The `results` columns of a Result (without experiment_key, worker, measured_at)."""
    t, tel = result.timing, result.telemetry
    return {
        "status": result.status.value,
        "median_ms": t.median_ms if t else None,
        "p20_ms": t.p20_ms if t else None,
        "p80_ms": t.p80_ms if t else None,
        "min_ms": t.min_ms if t else None,
        "reps": t.reps if t else None,
        "rel_spread": t.rel_spread if t else None,
        "l2_flushed": int(t.l2_flushed) if t else None,
        "timing_method": t.method if t else None,
        "spread_target": t.spread_target if t else None,
        "time_cap_ms": t.time_cap_ms if t else None,
        "stop_reason": t.stop_reason if t else "",
        "timed_ms": t.timed_ms if t else None,
        "max_rel_err": result.max_rel_err,
        "compile_ms": result.compile_ms,
        "message": result.message,
        "sm_clock_mhz": tel.sm_clock_mhz,
        "power_w": tel.power_w,
        "temp_c": tel.temp_c,
        "extra": dumps(result.extra),
    }


def ceilings_columns(c: DeviceCeilings) -> dict[str, Any]:
    """The `devices` columns of a DeviceCeilings."""
    return {"device": c.device, "driver": c.driver, "copy_gbps": c.copy_gbps, "matmul_tflops": c.matmul_tflops,
            "matmul_dtype": c.matmul_dtype, "details": dumps(dict(c.details)), "measured_at": c.measured_at}


def ceilings_from_row(r: Row) -> DeviceCeilings:
    return DeviceCeilings(r["device"], r["driver"], r["copy_gbps"], r["matmul_tflops"], r["matmul_dtype"],
                          loads(r["details"]), r["measured_at"])
