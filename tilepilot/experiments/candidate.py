"""`Candidate`: a config a proposer wants measured, and why."""

from __future__ import annotations

from dataclasses import dataclass

from tilepilot.experiments.values import Config, Problem


@dataclass(frozen=True)
class Candidate:
    problem: Problem
    config: Config
    proposer: str
    rationale: str  # one line: why this config, now
    predicted_ms: float | None = None  # the proposer's guess of median_ms, if it makes one
    hypothesis_id: str | None = None  # the hypothesis this experiment tests, if any
