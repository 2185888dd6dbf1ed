"""A campaign's trials, read once and then only the new ones.

Trials are only ever appended (their ids grow) and a trial's result does not change once it is
recorded, so each refresh reads the trials above the last id seen: a running campaign with 40k
trials costs a few milliseconds per refresh instead of a full join. Everything is read again
every `FULL_RELOAD_S` seconds all the same, so that a result replaced in place (a measurement
repeated under the same key) shows within that time. One log per (database, campaign), shared by
every session (`data.trial_log`); `read` is thread-safe.
"""

from __future__ import annotations

import threading
import time

from tilepilot.dashboard import reads
from tilepilot.storage.queries import ReadOnlyDB

FULL_RELOAD_S = 60.0


class TrialLog:
    def __init__(self, campaign_id: int) -> None:
        self.campaign_id = campaign_id
        self._lock = threading.Lock()
        self._points: tuple[reads.TrialPoint, ...] = ()
        self._loaded_at = 0.0

    def read(self, db: ReadOnlyDB, now: float | None = None) -> tuple[reads.TrialPoint, ...]:
        """Every trial of the campaign so far, in trial order."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if now - self._loaded_at > FULL_RELOAD_S:
                self._points, self._loaded_at = (), now
            last = self._points[-1].trial_id if self._points else 0
            new = reads.trial_points(db, self.campaign_id, after=last)
            if new:
                self._points = self._points + tuple(new)
            return self._points
