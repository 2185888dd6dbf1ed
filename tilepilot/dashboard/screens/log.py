"""Log: the event log, newest first, filtered by kind and campaign."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from tilepilot.dashboard import data, live
from tilepilot.dashboard.reads import CampaignInfo
from tilepilot.dashboard.text import clock, source
from tilepilot.storage.views import EventRow

LIMITS = (200, 1000, 5000)


def table(rows: list[EventRow], campaigns: dict[int, CampaignInfo]) -> pd.DataFrame:
    out = []
    for e in rows:
        c = None if e.campaign_id is None else campaigns.get(e.campaign_id)
        out.append({
            "time": clock(e.ts), "kind": e.kind,
            "campaign": c.name if c else ("" if e.campaign_id is None else str(e.campaign_id)),
            "message": e.message, "source": source(c.backend, c.device) if c else "",
            "data": json.dumps(e.data) if e.data else "",
        })
    return pd.DataFrame(out)


def body(campaign_id: int | None, kinds: tuple[str, ...], limit: int) -> None:
    path = live.db()
    campaigns = {c.id: c for c in data.campaigns(path)}
    rows = data.events(path, campaign_id, kinds or None, limit)
    st.caption(f"{len(rows)} event(s), newest first" + (f" (the newest {limit})" if len(rows) == limit else ""))
    if not rows:
        st.info("No event matches these filters.")
        return
    st.dataframe(table(rows, campaigns), hide_index=True, width="stretch")


def main() -> None:
    st.title("Log")
    path = live.db()
    options: dict[int | None, str] = {None: "all campaigns"}
    options.update({c.id: c.name for c in data.campaigns(path)})
    cols = st.columns([2, 3, 1])
    campaign_id = cols[0].selectbox("Campaign", list(options), format_func=options.__getitem__,
                                    key="log_campaign")
    kinds = cols[1].multiselect("Kinds", data.event_kinds(path), key="log_kinds", placeholder="all kinds")
    limit = cols[2].selectbox("Rows", LIMITS, key="log_limit")
    live.live(lambda: body(campaign_id, tuple(kinds), limit))


main()
