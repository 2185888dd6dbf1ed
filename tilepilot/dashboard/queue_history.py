"""Why the queue changed: re-orderings, drops and a person's controls, one row per entry moved.

The driver logs an event each time it changes the queue:
- `reordered`: re-scored after results came in; `data.moves` lists each entry moved, as
  `{"queue_id", "config", "from", "to", "reason"}` (places among the problem's queued entries, 1 first);
- `dropped`: entries taken off unmeasured; `data.dropped` lists `{"queue_id", "config", "reason"}`;
- `control_request` / `control`: a person's request (`data.action`: pin, promote, drop, pause,
  resume, stop; `data.queue_id`) and the driver's answer (`data.honoured`);
- `pinned` / `promoted`, where a driver logs those kinds.
Fields a driver did not write are left empty; nothing here trusts the data's types.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tilepilot.dashboard.reads import QueueEvent

DONE = {"pin": "pinned", "promote": "promoted", "drop": "dropped", "pause": "paused", "resume": "resumed",
        "stop": "stopped"}


@dataclass(frozen=True)
class Change:
    ts: float
    campaign_id: int | None
    what: str  # "moved up", "moved down", "dropped", "pinned", "asked to pin", ...
    queue_id: int | None
    config: dict[str, Any]
    before: int | None  # place before (1 first), for moves
    after: int | None
    because: str


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _config(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _moves(e: QueueEvent) -> list[Change]:
    out = []
    for m in e.data.get("moves") or []:
        if not isinstance(m, Mapping):
            continue
        before, after = _int(m.get("from")), _int(m.get("to"))
        what = "moved" if before is None or after is None else ("moved up" if after < before else "moved down")
        out.append(Change(e.ts, e.campaign_id, what, _int(m.get("queue_id")), _config(m.get("config")), before,
                          after, str(m.get("reason", ""))))
    return out or [Change(e.ts, e.campaign_id, "re-scored", None, {}, None, None, e.message)]


def _dropped(e: QueueEvent) -> list[Change]:
    out = [Change(e.ts, e.campaign_id, "dropped", _int(d.get("queue_id")), _config(d.get("config")), None, None,
                  str(d.get("reason", "")))
           for d in e.data.get("dropped") or [] if isinstance(d, Mapping)]
    return out or [Change(e.ts, e.campaign_id, "dropped", None, {}, None, None, e.message)]


def _control(e: QueueEvent) -> Change:
    action = str(e.data.get("action", ""))
    if e.kind == "control_request":
        what = f"asked to {action}" if action else "request"
    elif e.kind == "control":
        what = DONE.get(action, action or "control")
        if e.data.get("honoured") is False:
            what = f"{what}: not done"
    else:
        what = e.kind
    return Change(e.ts, e.campaign_id, what, _int(e.data.get("queue_id")), _config(e.data.get("config")), None,
                  None, e.message)


def changes(events: Iterable[QueueEvent]) -> list[Change]:
    """One row per entry changed, in the events' order (newest first when they are)."""
    out: list[Change] = []
    for e in events:
        if e.kind == "reordered":
            out.extend(_moves(e))
        elif e.kind == "dropped":
            out.extend(_dropped(e))
        else:
            out.append(_control(e))
    return out


def last_change(rows: Iterable[Change]) -> dict[int, Change]:
    """Queue id -> its newest change (rows newest first)."""
    out: dict[int, Change] = {}
    for c in rows:
        if c.queue_id is not None and c.queue_id not in out:
            out[c.queue_id] = c
    return out


def describe(c: Change) -> str:
    """'moved up 7→2: <because>', 'pinned: <because>'."""
    places = f" {c.before}→{c.after}" if c.before is not None and c.after is not None else ""
    return f"{c.what}{places}: {c.because}" if c.because else f"{c.what}{places}"
