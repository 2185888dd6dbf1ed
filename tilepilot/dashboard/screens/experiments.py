"""Experiments: every trial with its result, filtered by campaign, status and proposer; one in detail."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from tilepilot.dashboard import data, live
from tilepilot.dashboard.text import clock, ms, params, source
from tilepilot.experiments import Status
from tilepilot.storage.views import HistoryRow

LIMIT = 500
MS = st.column_config.NumberColumn(format="%.4g")


def table(rows: list[HistoryRow]) -> pd.DataFrame:
    return pd.DataFrame([{
        "campaign": r.campaign or "", "trial": r.seq, "problem": params(r.problem),
        "config": params(r.config), "status": r.status.value, "median (ms)": r.median_ms,
        "source": source(r.backend, r.device),
        "spread %": None if r.rel_spread is None else 100 * r.rel_spread,
        "max rel err": r.max_rel_err, "proposer": r.proposer or "", "predicted (ms)": r.predicted_ms,
        "reused": r.reused, "measured": clock(r.measured_at), "rationale": r.rationale or "",
        "message": r.message,
    } for r in rows])


def _label(r: HistoryRow) -> str:
    return f"{r.campaign or '—'} #{r.seq} · {params(r.problem)} · {params(r.config)} · {r.status.value}"


def detail(rows: list[HistoryRow]) -> None:
    by_key = {r.experiment_key: r for r in rows}
    key = st.selectbox("Details of", list(by_key), format_func=lambda k: _label(by_key[k]),
                       key="experiment_detail")
    r = by_key[key]
    cols = st.columns(4)
    cols[0].metric("Status", r.status.value)
    cols[1].metric("Median", ms(r.median_ms))
    cols[2].metric("Predicted", ms(r.predicted_ms))
    cols[3].metric("Compile", ms(r.compile_ms))
    st.caption(f"numbers: {source(r.backend, r.device)} · experiment {r.experiment_key}")
    left, right = st.columns(2)
    with left:
        st.markdown("**Problem**")
        st.json(r.problem)
    with right:
        st.markdown("**Config**")
        st.json(r.config)
    st.markdown("**Rationale** (from the proposer)")
    st.text(r.rationale or "—")
    if r.message:
        st.markdown("**Message**")
        st.code(r.message, language=None)


def body(campaign_id: int | None, statuses: tuple[str, ...], proposer: str | None) -> None:
    rows = data.history(live.db(), campaign_id, statuses or None, proposer, LIMIT)
    st.caption(f"{len(rows)} experiment(s)" + (f", the newest {LIMIT}" if len(rows) == LIMIT else ""))
    if not rows:
        st.info("No experiment matches these filters.")
        return
    st.dataframe(table(rows), hide_index=True, width="stretch",
                 column_config={"median (ms)": MS, "predicted (ms)": MS,
                                "spread %": st.column_config.NumberColumn(format="%.2f"),
                                "max rel err": st.column_config.NumberColumn(format="%.2e")})
    detail(rows)


def main() -> None:
    st.title("Experiments")
    path = live.db()
    summaries = data.campaigns(path)
    options: dict[int | None, str] = {None: "all campaigns"}
    options.update({c.id: c.name for c in summaries})
    cols = st.columns(3)
    campaign_id = cols[0].selectbox("Campaign", list(options), format_func=options.__getitem__,
                                    key="experiments_campaign")
    statuses = cols[1].multiselect("Status", [s.value for s in Status], key="experiments_status",
                                   placeholder="all statuses")
    proposer = cols[2].selectbox("Proposer", [None, *data.proposers(path, campaign_id)],
                                 key="experiments_proposer",
                                 format_func=lambda p: "all proposers" if p is None else p)
    live.live(lambda: body(campaign_id, tuple(statuses), proposer))


main()
