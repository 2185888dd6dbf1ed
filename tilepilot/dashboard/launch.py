"""Start the dashboard: `streamlit run app.py` as a child process, bound to 127.0.0.1 by default."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import IO

from tilepilot.experiments import InputError

log = logging.getLogger(__name__)

APP = Path(__file__).with_name("app.py")


def command(db: str, host: str = "127.0.0.1", port: int = 8501) -> list[str]:
    """The command line that serves the dashboard for `db` on `host:port`.

    Streamlit binds every interface unless `--server.address` is given, so it always is.
    """
    if not 0 < port < 65536:
        raise InputError(f"port {port} is not a TCP port (allowed: 1 to 65535)")
    if not host:
        raise InputError("host is empty (give an address such as 127.0.0.1)")
    return [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.headless", "true",
        "--server.address", host,
        "--server.port", str(port),
        "--browser.gatherUsageStats", "false",
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
    """Serve the dashboard until the server exits or the user interrupts; return its exit code."""
    proc = start(db, host, port)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            return proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
