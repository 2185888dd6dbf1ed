"""Every campaign's trials, read once and then only the new ones.

Trials are only ever appended (their ids grow) and a trial's result does not change once it is
recorded, so each refresh reads the trials above the last id seen (a range of the trials' own
key: milliseconds) instead of a join over the whole store. Everything is read again every
`FULL_RELOAD_S` seconds all the same, so that a result replaced in place (a measurement
repeated under the same key) shows within that time; that reload runs in a background thread
(about 0.6 s at 100k experiments), and readers keep getting the current trials meanwhile, so
no page waits for it. Only the very first read waits. One log per database
(`data.trial_log`), shared by every session; `read` is thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time

from tilepilot.dashboard import reads

log = logging.getLogger(__name__)

FULL_RELOAD_S = 60.0

Snapshot = dict[int, tuple[reads.TrialPoint, ...]]


class TrialLog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_campaign: Snapshot = {}
        self._last = 0
        self._loaded_at: float | None = None  # monotonic time of the last full read
        self._reloading: threading.Thread | None = None

    def read(self, db: reads.DashboardDB, now: float | None = None) -> Snapshot:
        """Campaign id -> its trials so far, in trial order (the mapping is a snapshot: later
        reads return a new one)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._loaded_at is None:
                everything, self._last = reads.all_trials(db)
                self._by_campaign = {cid: tuple(points) for cid, points in everything.items()}
                self._loaded_at = now
                return self._by_campaign
            if now - self._loaded_at > FULL_RELOAD_S and self._reloading is None:
                self._reloading = threading.Thread(target=self._reload, args=(db,), name="trial-log-reload",
                                                   daemon=True)
                self._reloading.start()
            self._append(reads.trials_after(db, self._last))
            return self._by_campaign

    def wait_for_reload(self, timeout: float | None = None) -> None:
        """Return once the background reload (if one runs) is done."""
        thread = self._reloading
        if thread is not None:
            thread.join(timeout)

    def _append(self, new: list[tuple[int, reads.TrialPoint]]) -> None:
        if not new:
            return
        grown: dict[int, list[reads.TrialPoint]] = {}
        for cid, point in new:
            grown.setdefault(cid, []).append(point)
        self._by_campaign = {**self._by_campaign,
                             **{cid: self._by_campaign.get(cid, ()) + tuple(points) for cid, points in grown.items()}}
        self._last = new[-1][1].trial_id

    def _reload(self, db: reads.DashboardDB) -> None:
        try:
            everything, last = reads.all_trials(db)
            with self._lock:
                # readers appended the trials above `last` while the reload ran: they are kept
                later = {cid: _after(points, last) for cid, points in self._by_campaign.items()}
                self._by_campaign = {cid: tuple(everything.get(cid, ())) + later.get(cid, ())
                                     for cid in everything.keys() | {c for c, v in later.items() if v}}
                self._last = max(last, self._last)
        except Exception:  # tried again after FULL_RELOAD_S; the pages' own reads raise what is wrong
            log.exception("reloading the trials failed")
        finally:
            with self._lock:
                self._loaded_at = time.monotonic()
                self._reloading = None


def _after(points: tuple[reads.TrialPoint, ...], last: int) -> tuple[reads.TrialPoint, ...]:
    """The trials with an id above `last` (the tail: `points` are in id order)."""
    i = len(points)
    while i > 0 and points[i - 1].trial_id > last:
        i -= 1
    return points[i:]
