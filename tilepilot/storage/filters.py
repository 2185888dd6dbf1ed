"""Filters of the history queries: parsed from text, checked, and turned into bound SQL.

`Filters` holds what a person asked for (`tilepilot history --kernel matmul --problem "M<=64"
--device H100 --triton 3.6 --since 7d`); `parse_filters(...)` builds one from command-line text
and raises InputError naming the bad value and what is allowed; `conditions(f)` gives SQL
conditions over the aliases `e` (experiments), `r` (results), `t` (trials), `c` (campaigns)
with every value a bound parameter. Column names and operators come from this module only.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tilepilot.experiments import Bound, InputError, Scope, Status

IMPORTED = "imported"  # the status shown for an experiment imported from elsewhere (no result row)
STATUSES = (*(s.value for s in Status), IMPORTED)
BACKENDS = ("gpu", "interpret", "replay", "imported")
_SQL_OPS = {"<=": "<=", ">=": ">=", "<": "<", ">": ">", "=": "=", "!=": "!="}
_SPAN = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_SPAN_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BOUND = re.compile(r"^(.*?)(<=|>=|==|!=|≤|≥|<|>|=)(.*)$", re.DOTALL)
_OPS = {"<=": "<=", "≤": "<=", ">=": ">=", "≥": ">=", "<": "<", ">": ">", "=": "=", "==": "=", "!=": "!="}
_DATE_HELP = "YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS] (UTC), or a span back from now such as 90m, 36h, 7d, 2w"


@dataclass(frozen=True)
class Filters:
    """What to keep. None / empty: no condition. Times are epoch seconds (UTC)."""

    campaign_id: int | None = None
    kernel: str | None = None
    scope: Scope = field(default_factory=Scope)  # bounds on the problem: M<=64, dtype=bf16
    problem_key: str | None = None  # one exact problem (canonical JSON)
    device: str | None = None  # a case-insensitive part of the device name
    backend: str | None = None
    torch: str | None = None  # a version or its prefix: 2.11 matches 2.11.0+cu130
    triton: str | None = None
    statuses: tuple[str, ...] = ()  # Status values and/or "imported"
    proposer: str | None = None
    since: float | None = None
    until: float | None = None

    @property
    def wants_measured(self) -> bool:
        return not self.statuses or any(s != IMPORTED for s in self.statuses)

    @property
    def wants_imported(self) -> bool:
        """Imported experiments belong to no campaign and have no proposer or result."""
        return ((not self.statuses or IMPORTED in self.statuses) and self.campaign_id is None
                and self.proposer is None and self.backend in (None, IMPORTED))


def parse_filters(*, campaign_id: int | None = None, kernel: str | None = None,
                  problem: Sequence[str] | Mapping[str, Any] | str | None = None, device: str | None = None,
                  backend: str | None = None, torch: str | None = None, triton: str | None = None,
                  status: Sequence[str] | str | None = None, proposer: str | None = None,
                  since: str | float | None = None, until: str | float | None = None,
                  now: float | None = None) -> Filters:
    """Check every filter; raises InputError naming the first bad value and what is allowed."""
    scope, key = problem_scope(problem)
    return Filters(
        campaign_id=campaign_id, kernel=_text("--kernel", kernel), scope=scope, problem_key=key,
        device=_text("--device", device), backend=_choice("--backend", backend, BACKENDS),
        torch=_version("--torch", torch), triton=_version("--triton", triton), statuses=statuses(status),
        proposer=_text("--proposer", proposer), since=when("--since", since, now), until=when("--until", until, now))


def problem_scope(problem: Sequence[str] | Mapping[str, Any] | str | None) -> tuple[Scope, str | None]:
    """A scope from filter texts ("M<=64,K>=4096", repeatable), a dict of exact values, or a
    problem key (canonical JSON, starting with '{')."""
    if problem is None:
        return Scope(), None
    if isinstance(problem, str) and problem.lstrip().startswith("{"):
        return Scope(), problem
    if isinstance(problem, Mapping):
        bounds = []
        for name, value in problem.items():
            _param(str(name))
            if not isinstance(value, int | float | str | bool):
                raise InputError(f"problem {name}={value!r} is not a number, text or boolean")
            bounds.append(Bound(str(name), "=", value))
        return Scope.of(bounds), None
    texts = [problem] if isinstance(problem, str) else list(problem)
    return Scope.of([_parse_bound(part) for t in texts for part in t.split(",") if part.strip()]), None


def _parse_bound(text: str) -> Bound:
    """NAME OP VALUE: M<=64, K>=4096, dtype=bf16, M!=1 (a value is a number, true/false or text)."""
    m = _BOUND.match(text)
    if not m:
        raise InputError(f"--problem {text.strip()!r} is not NAME OP VALUE with OP one of <=, >=, <, >, =, != "
                         "(e.g. M<=64, K>=4096 or dtype=bf16)")
    name, op, raw = m.group(1).strip(), _OPS[m.group(2)], m.group(3).strip()
    if not name or not raw or raw[0] in "<>=!":
        raise InputError(f"--problem {text.strip()!r} is not NAME OP VALUE with OP one of <=, >=, <, >, =, != "
                         "(e.g. M<=64, K>=4096 or dtype=bf16)")
    _param(name)
    value = _value(raw)
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if op not in ("=", "!=") and not numeric:
        raise InputError(f"--problem {text.strip()!r}: {raw!r} is not a number (only = and != take text)")
    if numeric and isinstance(value, int) and not -(2**63) <= value < 2**63:
        raise InputError(f"--problem {text.strip()!r}: {raw} is out of range (a 64-bit integer)")
    return Bound(name, op, value)


def _value(raw: str) -> Any:
    """An int or a float written in ASCII digits, true/false, else the text itself."""
    if raw.isascii():
        if re.fullmatch(r"[+-]?\d+", raw):
            return int(raw)
        if re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?", raw):
            return float(raw)
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    return raw


def statuses(status: Sequence[str] | str | None) -> tuple[str, ...]:
    """Statuses from "ok", "ok,timeout" or a list of those; raises InputError for an unknown one."""
    if status is None:
        return ()
    given = [status] if isinstance(status, str) else list(status)
    out = [s.strip() for item in given for s in str(item).split(",") if s.strip()]
    for s in out:
        if s not in STATUSES:
            raise InputError(f"unknown status {s!r} (allowed: {', '.join(STATUSES)})")
    return tuple(dict.fromkeys(out))


def when(flag: str, value: str | float | None, now: float | None = None) -> float | None:
    """Epoch seconds from a date, a date and time (UTC unless it says otherwise) or a span back from now."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return None if value is None else float(value)
    text = str(value).strip()
    m = _SPAN.match(text)
    if m:
        return (time.time() if now is None else now) - float(m.group(1)) * _SPAN_S[m.group(2)]
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise InputError(f"{flag} {text!r} is not a date ({_DATE_HELP})") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _param(name: str) -> None:
    if not _PARAM_NAME.match(name):
        raise InputError(f"bad problem parameter name {name!r} (letters, digits and '_', not first a digit)")


def _text(flag: str, value: str | None) -> str | None:
    if value is None:
        return None
    if not value.strip() or any(ord(ch) < 32 for ch in value):
        raise InputError(f"{flag} {value!r} is empty or has control characters (give a name)")
    return value


def _choice(flag: str, value: str | None, allowed: Sequence[str]) -> str | None:
    if value is not None and value not in allowed:
        raise InputError(f"{flag} {value!r} is not one of {', '.join(allowed)}")
    return value


def _version(flag: str, value: str | None) -> str | None:
    if value is not None and not re.match(r"^[0-9A-Za-z][0-9A-Za-z.+_-]*$", value):
        raise InputError(f"{flag} {value!r} is not a version (e.g. 3.6 or 2.11.0+cu130)")
    return value


# ---- SQL -----------------------------------------------------------------------------------------

def conditions(f: Filters, *, measured: bool = True) -> tuple[list[str], list[Any]]:
    """WHERE conditions and their parameters. `measured`: the rows have results (r), trials (t)
    and campaigns (c) joined; otherwise only experiments (e) and the imported time e.created_at."""
    where: list[str] = []
    params: list[Any] = []
    if f.campaign_id is not None:
        where.append("c.id = ?")
        params.append(f.campaign_id)
    if f.kernel is not None:
        where.append("e.kernel = ?")
        params.append(f.kernel)
    if f.problem_key is not None:
        where.append("e.problem_key = ?")
        params.append(f.problem_key)
    for b in f.scope.bounds:
        _bound(b, where, params)
    if f.device is not None:
        where.append("instr(lower(e.device), lower(?)) > 0")
        params.append(f.device)
    if f.backend is not None:
        where.append("e.backend = ?")
        params.append(f.backend)
    for column, version in (("e.torch", f.torch), ("e.triton", f.triton)):
        if version is not None:  # the version itself, or one that extends it (3.6 -> 3.6.0, 3.6.0+git)
            where.append(f"({column} = ? OR substr({column}, 1, length(?) + 1) IN (? || '.', ? || '+'))")
            params.extend([version] * 4)
    if measured:
        real = [s for s in f.statuses if s != IMPORTED]
        if real:
            where.append(f"r.status IN ({', '.join('?' * len(real))})")
            params.extend(real)
        if f.proposer is not None:
            where.append("t.proposer = ?")
            params.append(f.proposer)
    stamp = "r.measured_at" if measured else "e.created_at"
    if f.since is not None:
        where.append(f"{stamp} >= ?")
        params.append(f.since)
    if f.until is not None:
        where.append(f"{stamp} < ?")
        params.append(f.until)
    return where, params


def _bound(b: Bound, where: list[str], params: list[Any]) -> None:
    path = f'$."{b.param}"'
    op = _SQL_OPS[b.op]
    value: Any = int(b.value) if isinstance(b.value, bool) else b.value
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        raise InputError(f"problem {b.param}={value} is out of range (a 64-bit integer)")
    if b.op in ("=", "!="):
        # != keeps problems without the parameter out, as Bound.holds does
        where.append(f"json_type(e.problem, ?) IS NOT NULL AND json_extract(e.problem, ?) {op} ?")
        params.extend([path, path, value])
    else:
        where.append(f"json_type(e.problem, ?) IN ('integer', 'real') AND json_extract(e.problem, ?) {op} ?")
        params.extend([path, path, value])
