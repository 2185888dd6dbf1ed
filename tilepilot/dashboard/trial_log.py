"""Every campaign's trials, read once and then only the new ones.

Trials are only ever appended (their ids grow) and a trial's result does not change once it is
recorded, so each refresh reads the trials above the last id seen (a range of the trials' own
key: milliseconds) instead of a join over the whole store. Everything is read again every
`FULL_RELOAD_S` seconds all the same, so that a result replaced in place (a measurement
repeated under the same key) shows within that time. One log per database (`data.trial_log`),
shared by every session; `read` is thread-safe.
"""

from __future__ import annotations

import threading
import time

from tilepilot.dashboard import reads

FULL_RELOAD_S = 60.0


class TrialLog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_campaign: dict[int, tuple[reads.TrialPoint, ...]] = {}
        self._last = 0
        self._loaded_at = -FULL_RELOAD_S

    def read(self, db: reads.DashboardDB, now: float | None = None) -> dict[int, tuple[reads.TrialPoint, ...]]:
        """Campaign id -> its trials so far, in trial order (the mapping is a snapshot: later
        reads return a new one)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if now - self._loaded_at > FULL_RELOAD_S:
                everything, self._last = reads.all_trials(db)
                self._by_campaign = {cid: tuple(points) for cid, points in everything.items()}
                self._loaded_at = now
                return self._by_campaign
            new = reads.trials_after(db, self._last)
            if new:
                grown: dict[int, list[reads.TrialPoint]] = {}
                for cid, point in new:
                    grown.setdefault(cid, []).append(point)
                self._by_campaign = {**self._by_campaign,
                                     **{cid: self._by_campaign.get(cid, ()) + tuple(points)
                                        for cid, points in grown.items()}}
                self._last = new[-1][1].trial_id
            return self._by_campaign
