"""`tilepilot pause|resume|stop CAMPAIGN` and `tilepilot queue [promote|drop|pin ID]`: a person in charge.

The verbs write requests through the store; the campaign's driver honours them at its next
step and logs each (events `control`): pause dispatches nothing new (what runs finishes),
resume clears a pause, stop lets what runs finish and leaves the campaign interrupted
(continue it with `tilepilot tune FILE --resume`); promote moves a queued entry to the head,
drop takes it off the queue unmeasured, pin keeps it first whatever the re-scoring says.
`tilepilot queue` alone lists what runs and what runs next, with the reason for each place.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tilepilot.experiments import InputError

QUEUE_ACTIONS = ("promote", "drop", "pin")
_DONE = {"promote": "promoted", "drop": "dropped", "pin": "pinned"}
_LIVE = ("running", "interrupted")  # campaign states a request can still reach


def add_control_parsers(sub: Any) -> None:
    """Register `pause`, `resume`, `stop` and `queue` on the `tilepilot` command's subparsers."""
    helps = {"pause": "dispatch nothing new in a running campaign (what runs finishes)",
             "resume": "let a paused campaign go on",
             "stop": "let what runs finish, then leave the campaign interrupted (resumable with tune --resume)"}
    for verb, text in helps.items():
        v = sub.add_parser(verb, help=text, description=text[0].upper() + text[1:] + ".")
        v.add_argument("campaign", help="campaign name")
        _db(v)
        v.set_defaults(func=cmd_control, verb=verb)
    q = sub.add_parser("queue", help="list the queue, or promote, drop or pin a queued entry",
                       description="Without an action: what runs now and what runs next, in order, with the "
                       "reason for each place. promote ID: move a queued entry to the head; drop ID: take it off "
                       "the queue unmeasured; pin ID: keep it first whatever the re-scoring says. The campaign's "
                       "driver honours these at its next step and logs them.")
    q.add_argument("action", nargs="?", metavar="ACTION", help="promote | drop | pin")
    q.add_argument("id", nargs="?", metavar="ID", help="queue entry id (the first column of the listing)")
    q.add_argument("--campaign", help="list only this campaign's queue")
    q.add_argument("--limit", type=int, help="entries per campaign at most")
    q.add_argument("--json", action="store_true", help="JSON, one object per entry")
    _db(q)
    q.set_defaults(func=cmd_queue)


def _db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", type=Path, default=Path("tilepilot.db"), help="SQLite store (default: tilepilot.db)")


# ---- pause, resume, stop ----------------------------------------------------------------------
def cmd_control(args: argparse.Namespace) -> int:
    from tilepilot.storage.store import Store

    cid = _campaign_id(args.db, args.campaign)
    with Store(args.db) as store:
        row = store.get_campaign(args.campaign)
        assert row is not None
        control = store.control(cid)
        message = _control_message(args.verb, row.name, row.state, control)
        if message is None:
            return 0
        new = {"pause": "pause", "stop": "stop", "resume": ""}[args.verb]
        with store.transaction():
            store.set_control(cid, new)
            store.add_request(cid, args.verb, message=f"a person asked to {args.verb} campaign {row.name}")
    print(message)
    return 0


def _control_message(verb: str, name: str, state: str, control: str) -> str | None:
    """What the request will do, or None (after saying so) when there is nothing to do.
    Raises InputError when the campaign's state does not allow it."""
    if state not in _LIVE:
        raise InputError(f"campaign {name!r} is {state}: there is nothing to {verb}")
    resume_hint = "continue it with: tilepilot tune CAMPAIGN.toml --resume"
    if verb == "stop":
        if state != "running":
            raise InputError(f"campaign {name!r} is interrupted already ({resume_hint})")
        if control == "stop":
            print(f"campaign {name}: a stop was asked already; its driver stops at its next step")
            return None
        return f"campaign {name}: stop asked; what runs finishes, then the campaign is left interrupted"
    if control == "stop":
        raise InputError(f"campaign {name!r} is stopping; {resume_hint} once it has stopped")
    if verb == "pause":
        if control == "pause":
            print(f"campaign {name} is paused already")
            return None
        later = "" if state == "running" else " (it is interrupted: the pause holds when it resumes)"
        return f"campaign {name}: pause asked; nothing new starts, what runs finishes{later}"
    if control != "pause":
        raise InputError(f"campaign {name!r} is not paused (it is {state}"
                         + (f"; {resume_hint})" if state == "interrupted" else ")"))
    later = "" if state == "running" else f"; it is interrupted: {resume_hint}"
    return f"campaign {name}: resume asked; its driver goes on at its next step{later}"


def _campaign_id(db_path: Path, name: str) -> int:
    """The campaign's id; InputError (one line, naming the known campaigns) when there is none."""
    from tilepilot.storage.queries import campaign_id_of, open_db

    with open_db(db_path) as db:
        return campaign_id_of(db, name)


# ---- queue ------------------------------------------------------------------------------------
def cmd_queue(args: argparse.Namespace) -> int:
    if args.action is None:
        if args.id is not None:
            raise InputError(f"queue: give an action before the id ({', '.join(QUEUE_ACTIONS)})")
        return _list(args)
    if args.action not in QUEUE_ACTIONS:
        raise InputError(f"unknown queue action {args.action!r} (allowed: {', '.join(QUEUE_ACTIONS)}, "
                         "or none to list the queue)")
    if args.id is None:
        raise InputError(f"queue {args.action} needs the id of a queued entry (see: tilepilot queue)")
    if args.campaign or args.limit is not None or args.json:
        raise InputError("--campaign, --limit and --json are for listing the queue")
    try:
        qid = int(args.id)
    except ValueError:
        raise InputError(f"queue {args.action} {args.id!r}: an id is a whole number (see: tilepilot queue)") from None
    return _request(args.db, args.action, qid)


def _request(db_path: Path, action: str, qid: int) -> int:
    from tilepilot.storage.queries import open_db
    from tilepilot.storage.store import Store

    open_db(db_path).close()  # a missing file is one line here, and never created
    with Store(db_path) as store:
        row = store.queue_row(qid)
        if row is None:
            raise InputError(f"no queue entry {qid} in {db_path} (see: tilepilot queue --db {db_path})")
        if row.state != "queued":
            raise InputError(f"queue entry {qid} is {row.state}, not queued: only a queued entry can be "
                             f"{_DONE[action]}")
        if action == "pin" and qid in store.pinned_ids(row.campaign_id):
            print(f"queue entry {qid} is pinned already")
            return 0
        campaign = next(c for c in _campaigns(store) if c[0] == row.campaign_id)
        store.add_request(row.campaign_id, action, queue_id=qid)
    what = f"queue entry {qid} ({row.problem.label()} {row.config.label()}) of campaign {campaign[1]}"
    when = ("its driver does it at its next step" if campaign[2] == "running"
            else f"it is done when the campaign resumes (it is {campaign[2]})")
    print(f"{what}: {action} asked; {when}")
    return 0


def _campaigns(store: Any) -> list[tuple[int, str, str]]:
    """(id, name, state) of every campaign."""
    return store.campaign_states()


def _list(args: argparse.Namespace) -> int:
    from tilepilot.cli import _cell, _compact, _print_table
    from tilepilot.storage.store import Store

    if args.limit is not None and args.limit < 1:
        raise InputError(f"--limit {args.limit} must be at least 1")
    cid = _campaign_id(args.db, args.campaign) if args.campaign else None
    with Store.open_readonly(args.db) as store:
        campaigns = {c[0]: c for c in _campaigns(store)}
        rows = store.queue_listing(cid)
        pinned = store.pinned_ids(cid)
        controls = {c: store.control(c) for c in {r.campaign_id for r in rows} | ({cid} if cid else set())}
    by_campaign: dict[int, list[Any]] = {}
    for r in rows:
        by_campaign.setdefault(r.campaign_id, []).append(r)
    if args.json:
        for c, entries in by_campaign.items():
            for r in entries[: args.limit]:
                print(json.dumps(_entry(r, campaigns[c][1], r.id in pinned), default=str))
        return 0
    if not by_campaign:
        print("the queue is empty" + (f" for campaign {args.campaign}" if args.campaign else ""))
        if cid is not None:
            print(f"campaign {campaigns[cid][1]}: {_state(campaigns[cid][2], controls.get(cid, ''))}")
        return 0
    cols = ["id", "state", "pin", "problem", "config", "proposer", "reason"]
    for c, entries in by_campaign.items():
        running = sum(r.state != "queued" for r in entries)
        print(f"campaign {campaigns[c][1]} ({_state(campaigns[c][2], controls[c])}): {running} running, "
              f"{len(entries) - running} queued")
        table = [{"id": str(r.id), "state": r.state, "pin": "pin" if r.id in pinned else "",
                  "problem": r.problem.label(), "config": _compact(r.config.as_dict()), "proposer": r.proposer,
                  "reason": _cell(r.reason)} for r in entries[: args.limit]]
        _print_table(table, cols, out=lambda line: print("  " + line))
    return 0


def _state(state: str, control: str) -> str:
    if control == "pause":
        return f"{state}, paused by a person"
    if control == "stop":
        return f"{state}, stopping"
    return state


def _entry(r: Any, campaign: str, pinned: bool) -> dict[str, Any]:
    return {"id": r.id, "campaign": campaign, "state": r.state, "pinned": pinned, "priority": r.priority,
            "reason": r.reason, "problem": r.problem.as_dict(), "config": r.config.as_dict(),
            "proposer": r.proposer, "rationale": r.rationale, "predicted_ms": r.predicted_ms,
            "hypothesis_id": r.hypothesis_id, "worker": r.worker}
