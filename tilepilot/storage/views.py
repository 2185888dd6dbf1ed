"""Frozen records that the read-only queries (`storage.queries`) return.

Problems and configs are plain dicts here (they go to tables, charts and JSON); times are
epoch seconds; every timing field is in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tilepilot.experiments import Status
from tilepilot.storage.rows import QueueRow


@dataclass(frozen=True)
class HistoryRow:
    """One trial of a campaign with its result (campaign fields are None for an experiment
    that no campaign tried)."""

    campaign: str | None
    campaign_id: int | None
    trial_id: int | None
    seq: int | None
    experiment_key: str
    kernel: str
    problem: dict[str, Any]
    problem_key: str
    config: dict[str, Any]
    config_key: str
    status: Status
    median_ms: float | None
    rel_spread: float | None
    max_rel_err: float | None
    compile_ms: float | None
    proposer: str | None
    rationale: str | None
    predicted_ms: float | None
    hypothesis_id: str | None
    reused: bool
    measured_at: float
    device: str
    backend: str
    message: str


@dataclass(frozen=True)
class BestRow:
    """The best config of one problem of one campaign: the declared winner when there is one
    (`decided`), else the fastest ok result so far."""

    campaign: str
    campaign_id: int
    kernel: str
    problem: dict[str, Any]
    problem_key: str
    experiment_key: str
    config: dict[str, Any]
    median_ms: float
    rel_spread: float | None
    proposer: str
    decided: bool
    tie: bool
    margin: float | None  # runner-up over winner, minus 1 (decided rows only)
    runner_up_ms: float | None
    recheck_passed: bool | None  # None when not decided or not re-checked
    median_config_ms: float | None  # median over the ok configs of the problem
    speedup_vs_median: float | None  # median_config_ms / median_ms
    baseline_name: str
    baseline_ms: float | None
    speedup_vs_baseline: float | None  # baseline_ms / median_ms
    ok: int  # ok results of the problem in the campaign
    trials: int
    device: str
    backend: str
    roofline_pct: float | None = None  # the roofline time bound over median_ms, in percent (storage/roofline.py)


@dataclass(frozen=True)
class ProblemProgress:
    problem: dict[str, Any]
    problem_key: str
    trials: int
    counted: int  # trials that count against the budget (measured: every status but invalid; reused is free)
    ok: int
    failed: int
    reused: int
    best_ms: float | None


@dataclass(frozen=True)
class CampaignSummary:
    id: int
    name: str
    kernel: str
    proposer: str
    backend: str
    device: str
    dataset: str
    state: str
    budget: int  # per problem
    description: str
    problems: tuple[ProblemProgress, ...]
    trials: int
    ok: int
    failed: int
    queued: int
    running: int  # queue rows compiling or running
    created_at: float
    updated_at: float
    finished_at: float | None

    @property
    def progress(self) -> float:
        """Fraction of the budget spent over all problems (0..1; 0 with no problems)."""
        if not self.problems:
            return 0.0
        spent = sum(min(p.counted, self.budget) for p in self.problems)
        return spent / (self.budget * len(self.problems))


@dataclass(frozen=True)
class ConvergencePoint:
    problem_key: str
    problem: dict[str, Any]
    seq: int
    experiment_key: str
    config: dict[str, Any]
    proposer: str
    status: Status
    median_ms: float | None
    best_so_far_ms: float | None  # None until the problem's first ok result
    improved: bool  # this trial set a new best


@dataclass(frozen=True)
class QueueDone:
    row: QueueRow
    status: Status | None  # None when the row was dropped before it ran
    median_ms: float | None


@dataclass(frozen=True)
class QueueView:
    running: tuple[QueueRow, ...]  # compiling or running, oldest start first
    next: tuple[QueueRow, ...]  # queued, in the order they will run
    done: tuple[QueueDone, ...]  # done or dropped, latest first
    queued_total: int
    done_total: int


@dataclass(frozen=True)
class EventRow:
    id: int
    ts: float
    campaign_id: int | None
    kind: str
    message: str
    data: dict[str, Any]


@dataclass(frozen=True)
class GpuSampleRow:
    id: int
    ts: float
    node: str
    gpu_uuid: str
    gpu_index: int
    name: str
    util_pct: float | None
    mem_used_mb: float | None
    mem_total_mb: float | None
    sm_clock_mhz: float | None
    power_w: float | None
    temp_c: float | None
    throttle: str
    worker: str
    running: str
