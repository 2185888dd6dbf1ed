"""A replay executor whose batches come back only when a test lets them, and a driver in a thread.

Replay answers instantly; to act on a running campaign (pause it, reorder its queue) a test
needs it to hold still. `GatedExecutor` runs one batch at a time (one slot) and `poll` hands
a finished batch back only after `release()`; `DriverThread` runs a `Driver` on it in a thread.
The timings are the replay dataset's; nothing here is faked.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tilepilot.experiments import Result
from tilepilot.orchestrator.driver import Driver
from tilepilot.orchestrator.executor import Batch
from tilepilot.orchestrator.replay import ReplayDataset
from tilepilot.orchestrator.replay_executor import ReplayExecutor
from tilepilot.orchestrator.tune import TuneOptions, plan
from tilepilot.storage.store import Store, WinnerRow


class GatedExecutor(ReplayExecutor):
    def __init__(self, dataset: ReplayDataset, *, slots: int = 1, gated: bool = True) -> None:
        super().__init__(dataset, slots=slots)
        self.submitted: list[Batch] = []
        self._gate = threading.Semaphore(0)
        self._gated = gated

    def submit(self, batch: Batch) -> None:
        self.submitted.append(batch)
        super().submit(batch)

    def poll(self, timeout_s: float) -> list[tuple[Batch, list[Result]]]:
        if not self._done:
            return []
        if self._gated and not self._gate.acquire(timeout=timeout_s):
            return []
        return [self._done.pop(0)]

    def release(self, n: int = 1) -> None:
        """Let `n` more batches come back."""
        for _ in range(n):
            self._gate.release()

    def open(self) -> None:
        """Every batch comes back from now on."""
        self._gated = False
        self._gate.release()


class DriverThread:
    """A campaign of the replay backend driven in a thread, on a GatedExecutor."""

    def __init__(self, campaign: Path, dataset: Path, db: Path, *, slots: int = 1, gated: bool = True,
                 warm_start: bool = False) -> None:
        p = plan(TuneOptions(campaign=campaign, backend="replay", dataset=dataset, db=db))
        assert p.dataset is not None
        self.db = db
        self.store = Store(db)
        self.executor = GatedExecutor(p.dataset, slots=slots, gated=gated)
        self.campaign_id = self.store.create_campaign(p.campaign, backend="replay", dataset=str(dataset),
                                                      device=self.executor.environment.device)
        self.driver = Driver(p.campaign, p.family, self.store, self.executor, spaces=p.spaces,
                             campaign_id=self.campaign_id, first=p.first, warm_start=warm_start)
        self.winners: list[WinnerRow] | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.winners = self.driver.run()
        except BaseException as e:  # handed to the test by join()
            self.error = e

    def start(self) -> DriverThread:
        self._thread.start()
        return self

    def join(self, timeout_s: float = 30.0) -> list[WinnerRow]:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise AssertionError(f"the driver did not finish within {timeout_s} s")
        if self.error is not None:
            raise self.error
        assert self.winners is not None
        return self.winners

    def close(self) -> None:
        if self._thread.is_alive():
            self.executor.open()
            self._thread.join(30)
        self.store.close()

    def events(self, kind: str) -> list[tuple[str, dict[str, Any]]]:
        """The campaign's events of a kind, oldest first (read through a connection of its own)."""
        rows = read(self.db, "SELECT message, data FROM events WHERE campaign_id = ? AND kind = ? ORDER BY id",
                    [self.campaign_id, kind])
        return [(m, json.loads(d)) for m, d in rows]


def read(db: Path, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def wait_for(condition: Callable[[], object], timeout_s: float = 10.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
