"""Overview: every campaign with its progress and what it has gained; one campaign in detail, with
its convergence, its results on the roofline and the effect of each parameter."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from tilepilot.dashboard import charts, data, live, roofline
from tilepilot.dashboard.digest import RECENT, CampaignDigest, roofline_per_problem
from tilepilot.dashboard.reads import CampaignInfo
from tilepilot.dashboard.text import ago, clock, count, duration, md_escape, ms, params, source, usd

MAX_CHARTS = 8
X = st.column_config.NumberColumn(format="%.2f")
PCT = st.column_config.NumberColumn(format="%.0f", help=roofline.HELP)
ETA_HELP = (f"the trials left over the recent rate: the last {RECENT} trials over the time from the oldest of "
            "them until now (a stalled campaign's ETA grows); only while the campaign runs")
GPU_HELP = {"recorded": "GPU time the campaign's driver recorded",
            "timed": "summed from its results (the driver records it at the end): each measured result's timed_ms, "
                     "else repetitions × median; time spent timing on the GPU only (no compiling, verifying or "
                     "idle time)",
            "": "neither recorded by the driver nor by adaptive timing"}
PROBLEM_COLUMNS = {
    "best so far (ms)": st.column_config.NumberColumn(
        format="%.4g", help="the fastest trial's median: the chart's best so far"),
    "winner (ms)": st.column_config.NumberColumn(
        format="%.4g", help="the declared winner's median when re-measured interleaved with the "
        "other finalists (once the problem's budget is spent)"),
    "best config": st.column_config.TextColumn(help="the winner's once decided, else the fastest trial's"),
    "× vs median config": st.column_config.NumberColumn(
        format="%.2f", help="the median of the problem's ok results over the best (the winner's once decided)"),
    "× vs baseline": st.column_config.NumberColumn(
        format="%.2f", help="the vendor baseline's time over the winner's (below 1: the baseline is faster); "
        "known once the winner is decided"),
    "% of roofline": PCT,
}
CAMPAIGN_COLUMNS = {
    "× vs median (geomean)": X, "× vs baseline (geomean)": X,
    "% of roofline (median)": PCT, "ETA": st.column_config.TextColumn(help=ETA_HELP),
    "GPU time": st.column_config.TextColumn(help="recorded by the driver where it did, else summed from the "
                                            "results: the time spent timing on the GPU (see the campaign's details)"),
}


def digests(path: str, summaries: list[CampaignInfo]) -> dict[int, CampaignDigest]:
    out = {}
    for c in summaries:
        d = data.digest(path, c.id, c.updated_at)
        if d is not None:
            out[c.id] = d
    return out


def _eta(d: CampaignDigest) -> str:
    if d.campaign.state != "running":
        return "—"
    if d.spent >= d.total:
        return "budget spent"
    return "—" if d.eta_s is None else f"≈ {duration(d.eta_s)}"


def _gpu(d: CampaignDigest) -> str:
    return duration(d.gpu_s)


def _llm_tokens(d: CampaignDigest) -> str:
    if d.llm is None:
        return "none"
    return f"{count(d.llm.input_tokens)} / {count(d.llm.output_tokens)}"


def _llm_cost(d: CampaignDigest) -> str:
    if d.llm is None:
        return "—"
    return usd(d.llm.cost_usd) + (f" (+{d.llm.unpriced} unpriced)" if d.llm.unpriced else "")


def campaigns_table(summaries: list[CampaignInfo], digests: dict[int, CampaignDigest]) -> pd.DataFrame:
    rows = []
    for c in summaries:
        d = digests.get(c.id)
        if d is None:
            continue
        rows.append({
            "id": c.id, "campaign": c.name, "state": c.state, "kernel": c.kernel, "proposer": c.proposer,
            "problems": len(d.problems), "progress": f"{d.spent}/{d.total}", "ETA": _eta(d),
            "ok": d.ok, "failed": d.failed, "queued": c.queued, "running": c.running,
            "× vs median (geomean)": d.geomean("speedup_vs_median"),
            "× vs baseline (geomean)": d.geomean("speedup_vs_baseline"),
            "% of roofline (median)": d.median_roofline(), "GPU time": _gpu(d),
            "LLM tokens (in / out)": _llm_tokens(d), "LLM cost": _llm_cost(d),
            "source": source(c.backend, c.device), "updated": ago(c.updated_at),
        })
    return pd.DataFrame(rows)


def problems_table(d: CampaignDigest) -> pd.DataFrame:
    budget = d.campaign.budget
    return pd.DataFrame([{
        "problem": params(p.problem),
        "trials done / budget": f"{p.counted}/{budget}",
        "ok": p.ok, "failed": p.failed, "reused": p.reused,
        "best so far (ms)": p.best_ms,
        "winner (ms)": p.winner.median_ms if p.winner else None,
        "winner": ("tie" if p.winner.tie else "decided") if p.winner else "",
        "best config": params(p.config),
        "× vs median config": p.speedup_vs_median,
        "× vs baseline": p.speedup_vs_baseline,
        "baseline": p.baseline_name,
        "% of roofline": p.roofline_pct,
        "proposer of best": p.best_proposer,
    } for p in d.problems])


def campaign_detail(c: CampaignInfo, d: CampaignDigest) -> None:
    st.subheader(f"{md_escape(c.name)} · {md_escape(c.state)}")
    st.caption(f"kernel {md_escape(c.kernel)} · proposer {md_escape(c.proposer)} · "
               f"budget {c.budget} per problem · numbers: {md_escape(source(c.backend, c.device))}")
    if c.description:
        st.text(c.description)
    cols = st.columns([2, 1, 1, 1, 1])
    cols[0].metric("Trials (done / budget)", f"{d.spent}/{d.total}")
    cols[1].metric("OK", d.ok)
    cols[2].metric("Failed", d.failed)
    cols[3].metric("Queued", c.queued)
    cols[4].metric("Running", c.running)
    spend(d)
    st.progress(min(1.0, d.progress), text=f"{d.progress:.0%} of the budget spent")
    st.dataframe(problems_table(d), hide_index=True, width="stretch", column_config=PROBLEM_COLUMNS)
    st.caption(ceilings_caption(d))


def spend(d: CampaignDigest) -> None:
    cols = st.columns([1.4, 1.1, 1.1, 1.6, 1.1])
    rate = "" if d.rate_per_min is None else f"{d.rate_per_min:.3g} trials/min recently"
    cols[0].metric("ETA", _eta(d), help=ETA_HELP + (f" · now {rate}" if rate else ""))
    cols[1].metric("GPU time", _gpu(d), help=GPU_HELP[d.gpu_source])
    cols[2].metric("Compile time", duration(d.compile_s) if d.compile_s else "—",
                   help="the sum of its results' compile_ms (the compile pool's CPU time; reused results not counted)")
    cols[3].metric("LLM tokens (in / out)", _llm_tokens(d),
                   help="input and output tokens of the campaign's calls to a language model"
                   + ("" if d.llm is None else f" ({d.llm.calls} call(s), {d.llm.failed} failed; "
                                                f"{count(d.llm.cache_tokens)} prompt-cache tokens)"))
    cols[4].metric("LLM cost", _llm_cost(d), help="the cost the API's usage gives, over calls with a known price")


def ceilings_caption(d: CampaignDigest) -> str:
    c = d.ceilings
    if c is None:
        return (f"% of roofline: — (no ceilings stored for {md_escape(d.campaign.device or 'this device')}: "
                "they are measured once per device and driver on the gpu backend)")
    driver = f" driver {md_escape(c.driver)}" if c.driver else ""
    return (f"% of roofline against the ceilings of {md_escape(c.device)}{driver}, measured {clock(c.measured_at)}: "
            f"copy {c.copy_gbps:.0f} GB/s, {md_escape(c.matmul_dtype)} matmul {c.matmul_tflops:.0f} TFLOP/s")


def convergence(c: CampaignInfo, d: CampaignDigest) -> None:
    points, _ = data.chart_points(live.db(), c.id, c.updated_at)
    if points.empty:
        st.info("No trial has finished yet: the convergence charts appear with the first result.")
        return
    per_problem = dict(tuple(points.groupby("problem_key", sort=False)))  # problem key -> its trials
    st.markdown(f"**Best so far vs trials** ({md_escape(source(c.backend, c.device))})")
    labels = {p.problem_key: params(p.problem) for p in d.problems}
    keys = [p.problem_key for p in d.problems if p.problem_key in per_problem]  # the table's order
    if len(keys) > MAX_CHARTS:
        keys = st.multiselect("Problems to chart", keys, default=keys[:MAX_CHARTS],
                              format_func=lambda k: labels.get(k, k), key=f"chart_problems_{c.id}")
    y_title = "median ms" if c.backend != "interpret" else "median ms (CPU)"
    panels = {key: f"{labels.get(key, key)} · best {ms(per_problem[key]['best_so_far_ms'].iloc[-1])}" for key in keys}
    if panels:
        st.vega_lite_chart(charts.convergence_frame(points, panels), charts.convergence_spec(y_title))


def roofline_plot(c: CampaignInfo, d: CampaignDigest) -> None:
    _, points = data.chart_points(live.db(), c.id, c.updated_at)
    st.markdown(f"**Roofline** ({md_escape(source(c.backend, c.device))})")
    if points.empty:
        st.caption("No ok result with a work model yet: each result appears at its problem's arithmetic intensity.")
        return
    labels = {p.problem_key: params(p.problem) for p in d.problems}
    st.altair_chart(charts.roofline_chart(points, labels, d.ceilings), width="stretch")
    shown = "the ceilings drawn as the line" if d.ceilings else "no ceilings stored for this device, so none drawn"
    st.caption(f"each result at its problem's arithmetic intensity (the family's work model: FLOPs over the least "
               f"bytes moved) and the throughput it reached; each problem's best as a diamond; {shown}. "
               f"{len(points)} result(s) drawn (at most {roofline_per_problem(len(d.problems))} per problem, "
               "evenly spread over its times).")


def effects_plot(c: CampaignInfo) -> None:
    effects = data.parameter_effects(live.db(), c.id)
    st.markdown("**Effect of each parameter on time**")
    if effects.empty:
        st.caption("No ok result yet.")
        return
    values = effects.groupby("param")["value"].transform("size")
    varied, held = effects[values > 1], effects[values == 1]
    if not varied.empty:
        st.altair_chart(charts.effects_chart(varied))
    held_at = ", ".join(f"{p}={v}" for p, v in zip(held["param"], held["value"], strict=True))
    st.caption("for each parameter value, the ok results' time over the best time of the same problem (1 = the "
               "problem's best): box from the 25th to the 75th percentile, whiskers at the 10th and 90th, tick at "
               f"the median; recomputed every {data.EFFECTS_TTL_S:.0f} s at most."
               + (f" At one value in every ok result, so not drawn: {md_escape(held_at)}." if held_at else ""))


def body(selected: int | None) -> None:
    path = live.db()
    summaries = data.campaigns(path)
    if not summaries:
        st.info("No campaign in this database yet. Start one with `tilepilot tune CAMPAIGN.toml`.")
        return
    found = digests(path, summaries)
    st.dataframe(campaigns_table(summaries, found), hide_index=True, width="stretch", column_config=CAMPAIGN_COLUMNS)
    c = pick(summaries, selected)
    d = found.get(c.id)
    if d is None:
        return
    campaign_detail(c, d)
    convergence(c, d)
    roofline_plot(c, d)
    effects_plot(c)


def pick(summaries: list[CampaignInfo], selected: int | None) -> CampaignInfo:
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
