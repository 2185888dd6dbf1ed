"""storage: SQLite (through sqlite-utils), the single source of truth.

`Store` is the one writer (the campaign driver); readers (CLI, dashboard, agents) use
`open_db` and the functions of `storage.queries`. Nothing is opened at import time.
"""

from __future__ import annotations

from tilepilot.storage.ledger import EvidenceRow, HypothesisRow, LearningRow, VerdictRow
from tilepilot.storage.llm_calls import LlmCallRow, LlmUsage
from tilepilot.storage.queries import ReadOnlyDB, open_db
from tilepilot.storage.rows import CampaignRow, QueueRow, TrialRow, WinnerRow
from tilepilot.storage.schema import CAMPAIGN_STATES, QUEUE_STATES, SCHEMA_VERSION
from tilepilot.storage.store import Store
from tilepilot.storage.views import (
    BestRow,
    CampaignSummary,
    ConvergencePoint,
    EventRow,
    GpuSampleRow,
    HistoryRow,
    ProblemProgress,
    QueueDone,
    QueueView,
)

__all__ = [
    "CAMPAIGN_STATES", "QUEUE_STATES", "SCHEMA_VERSION", "BestRow", "CampaignRow", "CampaignSummary",
    "ConvergencePoint", "EventRow", "EvidenceRow", "GpuSampleRow", "HistoryRow", "HypothesisRow", "LearningRow",
    "LlmCallRow", "LlmUsage",
    "ProblemProgress", "QueueDone", "QueueRow", "QueueView", "ReadOnlyDB", "Store", "TrialRow", "VerdictRow",
    "WinnerRow", "open_db",
]
