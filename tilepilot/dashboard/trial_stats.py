"""Summary figures of a filtered set of trials, for the Experiments page: how many, how they ended,
the fastest and the typical time. Pure: computed from the trial log's points (`reads.TrialPoint`),
which hold every trial in memory already, so filtering 100k trials costs no query."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from tilepilot.dashboard.reads import TrialPoint


@dataclass(frozen=True)
class Summary:
    trials: int
    by_status: tuple[tuple[str, int], ...]  # most frequent first
    ok: int
    failed: int  # every status but ok
    problems: int
    best_ms: float | None  # the fastest ok median
    median_ms: float | None  # the median of the ok medians
    reused: int  # trials answered from an earlier measurement


def summary(points: Sequence[TrialPoint], problem_key: str | None = None, statuses: Sequence[str] = (),
            proposer: str | None = None) -> Summary:
    """Over the points that match every given filter (None or empty: no filter)."""
    kept = [p for p in points
            if (problem_key is None or p.problem_key == problem_key) and (not statuses or p.status in statuses)
            and (proposer is None or p.proposer == proposer)]
    times = [p.median_ms for p in kept if p.status == "ok" and p.median_ms is not None]
    counts = Counter(p.status for p in kept)
    return Summary(len(kept), tuple(counts.most_common()), counts.get("ok", 0), len(kept) - counts.get("ok", 0),
                   len({p.problem_key for p in kept}), min(times) if times else None,
                   statistics.median(times) if times else None, sum(p.reused for p in kept))
