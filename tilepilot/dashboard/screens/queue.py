"""Queue: what runs now, what runs next (in order, with the reason for each position), what just finished."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from tilepilot.dashboard import data, live
from tilepilot.dashboard.text import ago, clock, params, source
from tilepilot.storage.rows import QueueRow
from tilepilot.storage.views import CampaignSummary, QueueDone

NEXT_SHOWN = 25
DONE_SHOWN = 25
MS = st.column_config.NumberColumn(format="%.4g")


def _what(q: QueueRow) -> dict[str, object]:
    return {"problem": params(q.problem), "config": params(q.config), "proposer": q.proposer}


def _where(q: QueueRow, names: dict[int, CampaignSummary]) -> dict[str, object]:
    c = names.get(q.campaign_id)
    return {"campaign": c.name if c else str(q.campaign_id),
            "source": source(c.backend, c.device) if c else ""}


def running_table(rows: tuple[QueueRow, ...], names: dict[int, CampaignSummary]) -> pd.DataFrame:
    return pd.DataFrame([{
        "worker": q.worker, "state": q.state, "started": ago(q.started_at), **_what(q),
        "predicted (ms)": q.predicted_ms, "rationale": q.rationale, **_where(q, names),
    } for q in rows])


def next_table(rows: tuple[QueueRow, ...], names: dict[int, CampaignSummary]) -> pd.DataFrame:
    return pd.DataFrame([{
        "#": i, "priority": q.priority, "reason": q.reason, **_what(q),
        "predicted (ms)": q.predicted_ms, "rationale": q.rationale, "hypothesis": q.hypothesis_id or "",
        **_where(q, names),
    } for i, q in enumerate(rows, start=1)])


def done_table(rows: tuple[QueueDone, ...], names: dict[int, CampaignSummary]) -> pd.DataFrame:
    out = []
    for d in rows:
        out.append({
            "finished": clock(d.row.finished_at), "result": d.status.value if d.status else d.row.state,
            "median (ms)": d.median_ms, "predicted (ms)": d.row.predicted_ms, **_what(d.row),
            "rationale": d.row.rationale, "worker": d.row.worker, **_where(d.row, names),
        })
    return pd.DataFrame(out)


def body(campaign_id: int | None) -> None:
    path = live.db()
    names = {c.id: c for c in data.campaigns(path)}
    view = data.queue_view(path, campaign_id, next_limit=NEXT_SHOWN, done_limit=DONE_SHOWN)
    config = {"predicted (ms)": MS, "median (ms)": MS,
              "priority": st.column_config.NumberColumn(format="%.4g")}
    st.subheader(f"Running ({len(view.running)})")
    if view.running:
        st.dataframe(running_table(view.running, names), hide_index=True, width="stretch",
                     column_config=config)
    else:
        st.caption("Nothing is running.")
    st.subheader(f"Next ({view.queued_total} queued)")
    if view.next:
        if view.queued_total > len(view.next):
            st.caption(f"the first {len(view.next)} of {view.queued_total}, in the order they will run")
        st.dataframe(next_table(view.next, names), hide_index=True, width="stretch", column_config=config)
    else:
        st.caption("The queue is empty.")
    st.subheader(f"Recently done ({view.done_total} in all)")
    if view.done:
        st.dataframe(done_table(view.done, names), hide_index=True, width="stretch", column_config=config)
    else:
        st.caption("Nothing has finished yet.")


def main() -> None:
    st.title("Queue")
    summaries = data.campaigns(live.db())
    options: dict[int | None, str] = {None: "all campaigns"}
    options.update({c.id: f"{c.name} ({c.state})" for c in summaries})
    campaign_id = st.selectbox("Campaign", list(options), format_func=options.__getitem__,
                               key="queue_campaign")
    live.live(lambda: body(campaign_id))


main()
