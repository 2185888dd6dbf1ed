"""The dashboard server's process: Streamlit's own command line, after the store is read once.

    python -m tilepilot.dashboard.server run app.py [streamlit options] -- --db PATH

(what `launch.command` builds). Before handing over to `streamlit run`, it starts a background
thread that reads every campaign's trials into the shared trial log (`data.trial_log`: the
longest read of the Overview, about 0.6 s at 100k experiments on a 2-core machine) and imports
the chart library, so the first page a person opens does not wait for them. The thread only
reads; a page that asks for the trials while it still runs waits for the same read (the trial
log's lock) instead of starting another. A store that cannot be read is left to the app, which
says why on the page.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)


def warm(db: str) -> None:
    """Read the store's trials into the shared trial log and import the charts' modules."""
    started = time.perf_counter()
    try:
        from tilepilot.dashboard import charts, data  # noqa: F401  (charts: altair's import, once)

        path = str(Path(db).resolve())
        if data.open_problem(path) is None:
            data.trial_log(path).read(data.handle(path))
    except Exception:  # the app reports a store it cannot read; warming up is only a head start
        log.exception("warming up the dashboard's caches failed")
        return
    log.info("dashboard caches warm in %.2f s", time.perf_counter() - started)


def main() -> None:
    from tilepilot.dashboard import data

    db = data.db_path(sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else [])
    if db:
        threading.Thread(target=warm, args=(db,), name="tilepilot-warm-up", daemon=True).start()
    from streamlit.web import cli

    sys.exit(cli.main(prog_name="streamlit"))


if __name__ == "__main__":
    main()
