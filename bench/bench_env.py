"""What a CPU-side benchmark record says about where it ran: the machine (CPU model, cores,
platform, Python, load and niceness at the start) and the commit of the code it measured."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def machine() -> dict[str, Any]:
    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
            "nice": os.getpriority(os.PRIO_PROCESS, 0)}


def git(*args: str) -> str:
    """The output of `git ARGS` in the repository, or "unknown" where git cannot say."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
