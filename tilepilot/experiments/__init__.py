"""The vocabulary of tilepilot. Frozen dataclasses; no I/O beyond reading a campaign file."""

from __future__ import annotations

from tilepilot.experiments.campaign import Campaign, load_campaign, parse_campaign
from tilepilot.experiments.candidate import Candidate
from tilepilot.experiments.errors import (
    BackendUnavailable,
    CampaignError,
    DatasetError,
    InputError,
    TilepilotError,
)
from tilepilot.experiments.hypothesis import (
    Bound,
    Evidence,
    Hypothesis,
    HypothesisState,
    Learning,
    Scope,
    Verdict,
)
from tilepilot.experiments.keys import experiment_key
from tilepilot.experiments.result import DeviceCeilings, Environment, Result, Telemetry, Timing
from tilepilot.experiments.space import Constraint, Param, SearchSpace, at_default, reads
from tilepilot.experiments.status import Status
from tilepilot.experiments.telemetry import GpuSample
from tilepilot.experiments.values import Config, Problem, Value, canonical_json, same_value

__all__ = [
    "BackendUnavailable", "Bound", "Campaign", "CampaignError", "Candidate", "Config", "Constraint", "DatasetError",
    "DeviceCeilings", "Environment", "Evidence", "GpuSample", "Hypothesis", "HypothesisState", "InputError",
    "Learning", "Param", "Problem", "Result", "Scope", "SearchSpace", "Status", "Telemetry", "TilepilotError",
    "Timing", "Value", "Verdict", "at_default", "canonical_json", "experiment_key", "load_campaign", "parse_campaign",
    "reads", "same_value",
]
