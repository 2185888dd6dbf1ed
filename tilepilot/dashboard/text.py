"""How numbers, times and provenance are written on screen.

Every number the dashboard shows says which backend produced it: `source()` is the one
wording. Text that came from a user or a model goes through `st.text`, `st.code` or
`st.dataframe`; the only markdown we build from stored text goes through `md_escape`.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping

BACKENDS = ("gpu", "interpret", "replay")

_MD_INLINE = re.compile(r"([\\`*_\[\]<>~$|:&])")  # markup anywhere in a line (`:` for :icons:)
_MD_LEADING = re.compile(r"^(\s*\d*)([-+#=.)])")  # markup at the start of a line: lists, headers


def source(backend: str, device: str) -> str:
    """Where a number came from, in the words every screen uses."""
    if backend == "gpu":
        return f"gpu = measured on {device or 'an unnamed GPU'}"
    if backend == "interpret":
        return "interpret = CPU timings (Triton interpreter)"
    if backend == "replay":
        return f"replay = recorded on {device or 'an unrecorded device'}"
    return f"{backend} on {device}" if device else backend


def ms(value: float | None) -> str:
    """A duration in milliseconds with four significant digits; '—' when unknown."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.4g} ms"


def num(value: float | None, unit: str = "", digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    text = f"{value:.{digits}f}"
    return f"{text} {unit}".rstrip()


def clock(ts: float | None) -> str:
    """Local wall-clock time of an epoch timestamp, as HH:MM:SS (with the date when not today)."""
    if ts is None:
        return "—"
    now = time.localtime()
    t = time.localtime(ts)
    if (t.tm_year, t.tm_yday) == (now.tm_year, now.tm_yday):
        return time.strftime("%H:%M:%S", t)
    return time.strftime("%Y-%m-%d %H:%M:%S", t)


def ago(ts: float | None, now: float | None = None) -> str:
    if ts is None:
        return "never"
    seconds = max(0.0, (time.time() if now is None else now) - ts)
    if seconds < 60:
        return f"{seconds:.0f} s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def params(values: Mapping[str, object] | None) -> str:
    """A problem or config as `k=v k=v`, in the order stored."""
    if not values:
        return ""
    return " ".join(f"{k}={v}" for k, v in values.items())


def md_escape(value: str) -> str:
    """Stored text made safe to place inside a markdown string (headers, labels)."""
    escaped = _MD_INLINE.sub(r"\\\1", value.replace("\r", " ").replace("\n", " "))
    return _MD_LEADING.sub(lambda m: f"{m[1]}\\{m[2]}", escaped)


def duration(seconds: float | None) -> str:
    """A span of time in the largest units that keep it short: '0.227 s', '45 s', '12 min', '3 h 05 min', '2 d 4 h'."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "—"
    s = max(0.0, seconds)
    if s < 10:
        return f"{s:.3g} s"
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 86400:
        return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"
    return f"{int(s // 86400)} d {int(s % 86400 // 3600)} h"


def count(n: float | None) -> str:
    """A count in short form: 950, 12.3k, 4.56M."""
    if n is None:
        return "—"
    if abs(n) < 1000:
        return f"{n:.0f}"
    if abs(n) < 1_000_000:
        return f"{n / 1000:.3g}k"
    return f"{n / 1_000_000:.3g}M"


def usd(value: float | None) -> str:
    if value is None:
        return "—"
    return f"${value:.2f}" if value >= 1 else f"${value:.4f}"
