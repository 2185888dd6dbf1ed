"""Overview: every campaign with its progress, and one campaign's progress and convergence per problem."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from tilepilot.dashboard import charts, data, live
from tilepilot.dashboard.text import ago, md_escape, ms, params, source
from tilepilot.storage.views import BestRow, CampaignSummary, ConvergencePoint

MAX_CHARTS = 8
PROBLEM_COLUMNS = {
    "best so far (ms)": st.column_config.NumberColumn(
        format="%.4g", help="the fastest trial's median: the chart's best so far"),
    "winner (ms)": st.column_config.NumberColumn(
        format="%.4g", help="the declared winner's median when re-measured interleaved with the "
        "other finalists (once the problem's budget is spent)"),
    "best config": st.column_config.TextColumn(help="the winner's once decided, else the fastest trial's"),
    "× vs median config": st.column_config.NumberColumn(format="%.2f"),
}


def campaigns_table(summaries: list[CampaignSummary]) -> pd.DataFrame:
    return pd.DataFrame([{
        "id": c.id, "campaign": c.name, "state": c.state, "kernel": c.kernel,
        "proposer": c.proposer, "problems": len(c.problems),
        "progress": f"{_spent(c)}/{c.budget * len(c.problems)}",
        "ok": c.ok, "failed": c.failed, "queued": c.queued, "running": c.running,
        "source": source(c.backend, c.device), "updated": ago(c.updated_at),
    } for c in summaries])


def _spent(c: CampaignSummary) -> int:
    return sum(min(p.counted, c.budget) for p in c.problems)


def problems_table(c: CampaignSummary, best: list[BestRow]) -> pd.DataFrame:
    by_problem = {b.problem_key: b for b in best}
    rows = []
    for p in c.problems:
        b = by_problem.get(p.problem_key)
        rows.append({
            "problem": params(p.problem),
            "trials done / budget": f"{p.counted}/{c.budget}",
            "ok": p.ok, "failed": p.failed, "reused": p.reused,
            "best so far (ms)": p.best_ms,
            "winner (ms)": b.median_ms if b and b.decided else None,
            "winner": ("tie" if b.tie else "decided") if b and b.decided else "",
            "best config": params(b.config) if b else "",
            "× vs median config": b.speedup_vs_median if b else None,
            "proposer of best": b.proposer if b else "",
        })
    return pd.DataFrame(rows)


def campaign_detail(c: CampaignSummary) -> None:
    path = live.db()
    st.subheader(f"{md_escape(c.name)} · {md_escape(c.state)}")
    st.caption(f"kernel {md_escape(c.kernel)} · proposer {md_escape(c.proposer)} · "
               f"budget {c.budget} per problem · numbers: {md_escape(source(c.backend, c.device))}")
    if c.description:
        st.text(c.description)
    cols = st.columns(5)
    cols[0].metric("Trials (done / budget)", f"{_spent(c)}/{c.budget * len(c.problems)}")
    cols[1].metric("OK", c.ok)
    cols[2].metric("Failed", c.failed)
    cols[3].metric("Queued", c.queued)
    cols[4].metric("Running", c.running)
    st.progress(min(1.0, c.progress), text=f"{c.progress:.0%} of the budget spent")
    best = data.best(path, c.id)
    st.dataframe(problems_table(c, best), hide_index=True, width="stretch", column_config=PROBLEM_COLUMNS)
    convergence(c)


def convergence(c: CampaignSummary) -> None:
    points = data.convergence(live.db(), c.id)
    if not points:
        st.info("No trial has finished yet: the convergence charts appear with the first result.")
        return
    per_problem: dict[str, list[ConvergencePoint]] = {}
    for p in points:
        per_problem.setdefault(p.problem_key, []).append(p)
    st.markdown(f"**Best so far vs trials** ({md_escape(source(c.backend, c.device))})")
    keys = [p.problem_key for p in c.problems if p.problem_key in per_problem]  # the table's order
    keys += [k for k in per_problem if k not in keys]
    if len(keys) > MAX_CHARTS:
        labels = {k: params(per_problem[k][0].problem) for k in keys}
        keys = st.multiselect("Problems to chart", keys, default=keys[:MAX_CHARTS],
                              format_func=labels.__getitem__, key=f"chart_problems_{c.id}")
    y_title = "median ms" if c.backend != "interpret" else "median ms (CPU)"
    cols = st.columns(2)
    for i, key in enumerate(keys):
        pts = per_problem[key]
        best = pts[-1].best_so_far_ms
        with cols[i % 2]:
            st.caption(f"{md_escape(params(pts[0].problem))} · best {ms(best)}")
            st.altair_chart(charts.convergence_chart(pts, y_title), width="stretch")


def body(selected: int | None) -> None:
    summaries = data.campaigns(live.db())
    if not summaries:
        st.info("No campaign in this database yet. Start one with `tilepilot tune CAMPAIGN.toml`.")
        return
    st.dataframe(campaigns_table(summaries), hide_index=True, width="stretch")
    campaign_detail(pick(summaries, selected))


def pick(summaries: list[CampaignSummary], selected: int | None) -> CampaignSummary:
    """The chosen campaign; with none chosen, the newest running one, else the last updated
    (so a campaign that just ended stays on screen)."""
    chosen = [c for c in summaries if c.id == selected]
    running = [c for c in summaries if c.state == "running"]
    return (chosen or running or [max(summaries, key=lambda c: c.updated_at)])[0]


def main() -> None:
    st.title("Overview")
    summaries = data.campaigns(live.db())
    selected = None
    if len(summaries) > 1:
        names: dict[int | None, str] = {None: "follow the running campaign (else the last updated)"}
        names.update({c.id: f"{c.name} ({c.state})" for c in summaries})
        selected = st.selectbox("Campaign", list(names), format_func=names.__getitem__,
                                key="overview_campaign")
    live.live(lambda: body(selected))


main()
