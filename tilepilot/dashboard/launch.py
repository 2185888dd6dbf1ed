"""Start the dashboard: `streamlit run app.py` (through `server.py`, which warms the caches first) as a child
process, bound to 127.0.0.1 by default."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from tilepilot.experiments import InputError

log = logging.getLogger(__name__)

APP = Path(__file__).with_name("app.py")


def command(db: str, host: str = "127.0.0.1", port: int = 8501) -> list[str]:
    """The command line that serves the dashboard for `db` on `host:port`.

    Streamlit binds every interface unless `--server.address` is given, so it always is.
    The toolbar is the viewer's: no Deploy button or developer menu on a read-only view.
    """
    if not 0 < port < 65536:
        raise InputError(f"port {port} is not a TCP port (allowed: 1 to 65535)")
    if not host:
        raise InputError("host is empty (give an address such as 127.0.0.1)")
    return [
        sys.executable, "-m", "tilepilot.dashboard.server", "run", str(APP),  # `streamlit run`, see server.py
        "--server.headless", "true",
        "--server.address", host,
        "--server.port", str(port),
        "--browser.gatherUsageStats", "false",
        "--client.toolbarMode", "viewer",
        "--server.fileWatcherType", "none",
        "--", "--db", str(db),
    ]


def check_db(db: str) -> None:
    """Raise InputError when `db` is not an existing file: the dashboard never creates one."""
    if not Path(db).is_file():
        raise InputError(f"database {db!r} does not exist (run `tilepilot tune` first, or pass --db PATH)")


def start(db: str, host: str = "127.0.0.1", port: int = 8501, *,
          output: IO[bytes] | int | None = None) -> subprocess.Popen[bytes]:
    """Start the server and return at once; the caller owns the process.

    `output` receives the server's stdout and stderr (default: this process's own).
    """
    check_db(db)
    cmd = command(db, host, port)
    log.info("dashboard for %s on http://%s:%d", db, host, port)
    stderr = None if output is None else subprocess.STDOUT
    return subprocess.Popen(cmd, env=child_env(), stdout=output, stderr=stderr)


def child_env() -> dict[str, str]:
    """This environment, with the folder holding this `tilepilot` first on PYTHONPATH, so the
    server imports the same package as the caller (installed or run from a checkout)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def serve(db: str, host: str = "127.0.0.1", port: int = 8501) -> int:
    """Serve the dashboard until the server exits; return its exit code.

    Ctrl-C or SIGTERM stops the server too: it never outlives this call.
    """
    proc = start(db, host, port)
    restore = _exit_on_sigterm()
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return stop(proc)
    finally:
        restore()
        if proc.poll() is None:
            stop(proc)


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 10) -> int:
    """Terminate the server, kill it if it lingers; returns its exit code."""
    proc.terminate()
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _exit_on_sigterm() -> Callable[[], None]:
    """Turn SIGTERM into SystemExit (so `finally` stops the server); returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    return lambda: signal.signal(signal.SIGTERM, previous)
