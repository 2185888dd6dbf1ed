"""Experiments: every trial with its result, filtered by campaign, status and proposer; one in detail
(config, timings with their spread, telemetry, correctness, compile time, registers and spills where
known, how the timing stopped, the hypotheses it tested and the campaigns that tried it)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from tilepilot.dashboard import data, live, roofline
from tilepilot.dashboard.reads import ExperimentDetail, HypothesisLink, TrialListRow, TrialOf
from tilepilot.dashboard.text import clock, ms, num, params, source
from tilepilot.experiments import Status

LIMIT = 500
MS = st.column_config.NumberColumn(format="%.4g")
# extra fields a worker may store with a result, shown as metrics when present
RESOURCES = (("n_regs", "Registers / thread"), ("n_spills", "Spills"), ("shared_bytes", "Shared memory (B)"))


def table(rows: list[TrialListRow]) -> pd.DataFrame:
    return pd.DataFrame([{
        "campaign": r.campaign, "trial": r.seq, "status": r.status, "median (ms)": r.median_ms,
        "spread %": None if r.rel_spread is None else 100 * r.rel_spread, "proposer": r.proposer,
        "predicted (ms)": r.predicted_ms, "rationale": r.rationale, "message": r.message,
        "problem": params(r.problem), "config": params(r.config), "hypothesis": r.hypothesis_id or "",
        "max rel err": r.max_rel_err, "reused": r.reused, "measured": clock(r.measured_at),
        "source": source(r.backend, r.device),
    } for r in rows])


def _label(r: TrialListRow) -> str:
    return f"{r.campaign} #{r.seq} · {params(r.problem)} · {params(r.config)} · {r.status}"


def timing_table(e: ExperimentDetail) -> pd.DataFrame:
    """The timing of an ok result as (what, value) rows: quantiles, repetitions, how they stopped."""
    spread = None if e.rel_spread is None else f"{100 * e.rel_spread:.2f} % (p80 − p20 over the median)"
    rows: list[tuple[str, Any]] = [
        ("median", ms(e.median_ms)), ("p20 – p80", f"{ms(e.p20_ms)} – {ms(e.p80_ms)}"), ("min", ms(e.min_ms)),
        ("spread", spread), ("repetitions", e.reps), ("method", e.timing_method),
        ("L2 flushed", None if e.l2_flushed is None else ("yes" if e.l2_flushed else "no")),
        ("spread target", None if e.spread_target is None else f"{100 * e.spread_target:.2f} %"),
        ("time cap", None if e.time_cap_ms is None else ms(e.time_cap_ms)),
        ("stopped by", {"spread": "spread reached the target", "cap": "time cap reached"}.get(e.stop_reason)),
        ("GPU time timing it", None if e.timed_ms is None else ms(e.timed_ms)),
    ]
    return pd.DataFrame([{"timing": k, "value": str(v)} for k, v in rows if v not in (None, "", "—", "— – —")])


def hypotheses_table(rows: list[HypothesisLink]) -> pd.DataFrame:
    return pd.DataFrame([{
        "hypothesis": h.id, "how": "its trial tests it" if h.relation == "tested" else f"{h.relation} (as {h.side})",
        "ratio b/a": h.ratio, "state": h.state, "statement": h.text,
    } for h in rows])


def trials_table(rows: list[TrialOf]) -> pd.DataFrame:
    return pd.DataFrame([{"campaign": t.campaign, "trial": t.seq, "proposer": t.proposer,
                          "predicted (ms)": t.predicted_ms, "reused": t.reused, "rationale": t.rationale}
                         for t in rows])


def resources(e: ExperimentDetail) -> None:
    found = [(label, e.extra[k]) for k, label in RESOURCES if isinstance(e.extra.get(k), int | float)]
    cols = st.columns(4)
    cols[0].metric("Max relative error", "—" if e.max_rel_err is None else f"{e.max_rel_err:.2e}",
                   help="the family's error measure against the float32/float64 reference")
    for col, (label, value) in zip(cols[1:], found, strict=False):
        col.metric(label, f"{value:.0f}")
    if not found:
        cols[1].metric("Registers / spills", "—", help="known once the kernel has been loaded on a GPU")


def telemetry(e: ExperimentDetail, pct: float | None) -> None:
    cols = st.columns(4)
    cols[0].metric("SM clock", num(e.sm_clock_mhz, "MHz"))
    cols[1].metric("Power", num(e.power_w, "W"))
    cols[2].metric("Temperature", num(e.temp_c, "°C"))
    cols[3].metric("% of roofline", "—" if pct is None else f"{pct:.0f} %", help=roofline.HELP)


def detail(path: str, rows: list[TrialListRow]) -> None:
    by_key = {r.experiment_key: r for r in rows}
    key = st.selectbox("Details of", list(by_key), format_func=lambda k: _label(by_key[k]),
                       key="experiment_detail")
    e, trials, hyps = data.experiment(path, key)
    if e is None:
        st.info("This experiment is no longer in the store.")
        return
    r = by_key[key]
    cols = st.columns(4)
    cols[0].metric("Status", e.status or "not measured")
    cols[1].metric("Median", ms(e.median_ms))
    cols[2].metric("Predicted", ms(r.predicted_ms))
    cols[3].metric("Compile", ms(e.compile_ms))
    pct = roofline.pct(roofline.work(e.kernel, e.problem), roofline.pick(data.ceilings(path), e.device, e.driver),
                       e.median_ms)
    telemetry(e, pct)
    resources(e)
    st.caption(f"numbers: {source(e.backend, e.device)} · experiment {e.key} · {e.kernel} {e.kernel_version} · "
               f"torch {e.torch} · triton {e.triton}" + (f" · driver {e.driver}" if e.driver else "")
               + (f" · worker {e.worker}" if e.worker else "") + f" · measured {clock(e.measured_at)}")
    left, right = st.columns(2)
    with left:
        st.markdown("**Problem**")
        st.json(e.problem)
        st.markdown("**Config**")
        st.json(e.config)
    with right:
        st.markdown("**Timing**")
        timing = timing_table(e)
        if len(timing):
            st.dataframe(timing, hide_index=True, width="stretch")
        else:
            st.caption("No timing: the config did not run correctly.")
        if e.extra:
            st.markdown("**Extra** (as the worker stored it)")
            st.json(e.extra, expanded=False)
    st.markdown("**Rationale** (from the proposer)")
    st.text(r.rationale or "—")
    st.markdown(f"**Hypotheses** ({len(hyps)})")
    if hyps:
        st.dataframe(hypotheses_table(hyps), hide_index=True, width="stretch",
                     column_config={"ratio b/a": st.column_config.NumberColumn(format="%.3f")})
    else:
        st.caption("It tested no hypothesis and is no hypothesis' evidence.")
    st.markdown(f"**Tried by** ({len(trials)} campaign(s))")
    st.dataframe(trials_table(trials), hide_index=True, width="stretch", column_config={"predicted (ms)": MS})
    if e.message:
        st.markdown("**Message**")
        st.code(e.message, language=None)


def body(campaign_id: int | None, statuses: tuple[str, ...], proposer: str | None) -> None:
    path = live.db()
    rows = data.trial_list(path, campaign_id, statuses, proposer, LIMIT)
    st.caption(f"{len(rows)} experiment(s), newest first" + (f" (the newest {LIMIT})" if len(rows) == LIMIT else ""))
    if not rows:
        st.info("No experiment matches these filters.")
        return
    st.dataframe(table(rows), hide_index=True, width="stretch",
                 column_config={"median (ms)": MS, "predicted (ms)": MS,
                                "spread %": st.column_config.NumberColumn(format="%.2f"),
                                "max rel err": st.column_config.NumberColumn(format="%.2e")})
    detail(path, rows)


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
