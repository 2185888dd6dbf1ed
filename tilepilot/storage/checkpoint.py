"""`WalCheckpointer`: copies a database's write-ahead log into the database file from a thread of
its own, so that the campaign driver's commits never do it.

In WAL mode SQLite checkpoints inside the commit that takes the log past `wal_autocheckpoint`
pages (1000 by default), and with synchronous=NORMAL that checkpoint is the only place a commit
waits for the disk (an fsync of the log, then of the database file). On the CPU replay benchmark
those commits cost the driver 0.09 to 0.18 ms a trial of its 0.15 to 0.25 ms of committing; a
passive checkpoint on another connection does the same work beside it (the sqlite3 module
releases the GIL while SQLite runs) and never blocks the writer or a reader.

The writer's own automatic checkpoint stays on, at `FALLBACK_PAGES`, in case this thread falls
behind. Nothing here changes what is durable: a commit is in the log when it returns, and a
checkpoint only moves committed pages into the database file (a kill -9 at any point loses
nothing that was committed; the next open recovers the log).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger(__name__)

EVERY_COMMITS = 50  # commits between two checkpoints (about the default's 1000 pages on a campaign's commits)
EVERY_S = 1.0  # and at least this often, for the commits of a slow campaign
FALLBACK_PAGES = 10_000  # the writer's own automatic checkpoint, in case this thread falls behind


class WalCheckpointer:
    """A daemon thread that runs `PRAGMA wal_checkpoint(PASSIVE)` on its own connection every
    EVERY_COMMITS commits (`committed()` counts them) and every EVERY_S seconds, until `close()`."""

    def __init__(self, path: Path) -> None:
        self._conn = sqlite3.connect(str(path), timeout=30, check_same_thread=False)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._commits = 0
        self._thread = threading.Thread(target=self._run, name=f"wal-checkpoint {path.name}", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """Count a commit of the writer (its caller holds the writer's lock)."""
        self._commits += 1
        if self._commits >= EVERY_COMMITS:
            self._commits = 0
            self._wake.set()

    def close(self) -> None:
        """Stop the thread (after the checkpoint it may be running) and close its connection."""
        self._stop.set()
        self._wake.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            while True:
                self._wake.wait(EVERY_S)
                self._wake.clear()
                if self._stop.is_set():
                    return
                try:
                    self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as e:  # the writer's fallback checkpoint still bounds the log
                    log.warning("WAL checkpoint failed: %s", e)
        finally:
            self._conn.close()
