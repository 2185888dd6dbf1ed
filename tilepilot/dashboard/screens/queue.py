"""Queue: what runs now, what runs next (in order, with why each entry holds its place and its last
move), what just finished, and the history of re-orderings, drops and a person's controls."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from tilepilot.dashboard import data, live, queue_history
from tilepilot.dashboard.reads import CampaignInfo, QueueEntry
from tilepilot.dashboard.text import ago, clock, params, source

NEXT_SHOWN = 25
DONE_SHOWN = 25
CHANGES_READ = 50  # events
MS = st.column_config.NumberColumn(format="%.4g")
COLUMNS = {
    "predicted (ms)": MS, "median (ms)": MS, "priority": st.column_config.NumberColumn(format="%.4g"),
    "reason": st.column_config.TextColumn(help="why the entry holds this place, as the last scoring said"),
    "last move": st.column_config.TextColumn(help="the entry's latest re-ordering, drop or a person's control"),
    "predicted / measured": st.column_config.NumberColumn(
        format="%.2f", help="the proposer's predicted time over the measured median (1: a perfect prediction)"),
}


def _why(q: QueueEntry) -> dict[str, object]:
    return {"proposer": q.proposer, "predicted (ms)": q.predicted_ms, "hypothesis": q.hypothesis_id or "",
            "rationale": q.rationale}


def _what(q: QueueEntry) -> dict[str, object]:
    return {"problem": params(q.problem), "config": params(q.config)}


def _where(q: QueueEntry, names: dict[int, CampaignInfo]) -> dict[str, object]:
    c = names.get(q.campaign_id)
    return {"campaign": c.name if c else str(q.campaign_id), "source": source(c.backend, c.device) if c else ""}


def running_table(rows: list[QueueEntry], names: dict[int, CampaignInfo]) -> pd.DataFrame:
    return pd.DataFrame([{
        "worker": q.worker, "state": q.state, "started": ago(q.started_at), **_why(q), **_what(q), **_where(q, names),
    } for q in rows])


def next_table(rows: list[QueueEntry], names: dict[int, CampaignInfo],
               moves: dict[int, queue_history.Change]) -> pd.DataFrame:
    return pd.DataFrame([{
        "#": i, "pinned": q.pinned, "last move": queue_history.describe(moves[q.id]) if q.id in moves else "",
        "reason": q.reason, **_why(q), **_what(q), "priority": q.priority, "entry": q.id, **_where(q, names),
    } for i, q in enumerate(rows, start=1)])


def done_table(rows: list[QueueEntry], names: dict[int, CampaignInfo]) -> pd.DataFrame:
    return pd.DataFrame([{
        "finished": clock(q.finished_at), "result": q.status or q.state, "median (ms)": q.median_ms,
        "predicted / measured": q.predicted_ms / q.median_ms if q.predicted_ms and q.median_ms else None,
        "reason": q.reason if q.state == "dropped" else "", **_why(q), **_what(q), "worker": q.worker,
        **_where(q, names),
    } for q in rows])


def changes_table(rows: list[queue_history.Change], names: dict[int, CampaignInfo]) -> pd.DataFrame:
    return pd.DataFrame([{
        "time": clock(c.ts), "change": c.what,
        "places": f"{c.before}→{c.after}" if c.before is not None and c.after is not None else "",
        "because": c.because, "entry": c.queue_id, "config": params(c.config),
        "campaign": names[c.campaign_id].name if c.campaign_id in names else "",
    } for c in rows])


def body(campaign_id: int | None) -> None:
    path = live.db()
    names = {c.id: c for c in data.campaigns(path)}
    totals = data.queue_totals(path, campaign_id)
    running = data.running(path, campaign_id)
    nxt = data.queued(path, campaign_id, NEXT_SHOWN)
    done = data.recently_done(path, campaign_id, DONE_SHOWN)
    changes = queue_history.changes(data.queue_events(path, campaign_id, CHANGES_READ))
    st.subheader(f"Running ({len(running)})")
    if running:
        st.dataframe(running_table(running, names), hide_index=True, width="stretch", column_config=COLUMNS)
    else:
        st.caption("Nothing is running.")
    queued_total = totals.get("queued", 0)
    st.subheader(f"Next ({queued_total} queued)")
    if nxt:
        if queued_total > len(nxt):
            st.caption(f"the first {len(nxt)} of {queued_total}, in the order they will run (pinned first)")
        st.dataframe(next_table(nxt, names, queue_history.last_change(changes)), hide_index=True, width="stretch",
                     column_config=COLUMNS)
    else:
        st.caption("The queue is empty.")
    st.subheader(f"Recently done ({totals.get('done', 0) + totals.get('dropped', 0)} in all)")
    if done:
        st.dataframe(done_table(done, names), hide_index=True, width="stretch", column_config=COLUMNS)
    else:
        st.caption("Nothing has finished yet.")
    st.subheader("Why the queue changed")
    if changes:
        st.caption(f"re-orderings, drops and a person's controls from the newest {CHANGES_READ} such events, "
                   "newest first; places count among the problem's queued entries, 1 first")
        st.dataframe(changes_table(changes, names), hide_index=True, width="stretch")
    else:
        st.caption("No re-ordering yet: the queue runs in the order the proposers gave.")


def main() -> None:
    st.title("Queue")
    summaries = data.campaigns(live.db())
    options: dict[int | None, str] = {None: "all campaigns"}
    options.update({c.id: f"{c.name} ({c.state})" for c in summaries})
    campaign_id = st.selectbox("Campaign", list(options), format_func=options.__getitem__,
                               key="queue_campaign")
    live.live(lambda: body(campaign_id))


main()
