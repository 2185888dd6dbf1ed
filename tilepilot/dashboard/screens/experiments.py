"""Experiments: current (running), future (queued) and past experiments (every trial with its
result), filtered by campaign, kernel, problem, status and proposer, with summary figures over all
the past ones the filters keep; one in detail (config, timings with their spread, telemetry,
correctness, compile time, registers and spills where known, how the timing stopped, the
hypotheses it tested and the campaigns that tried it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pandas as pd
import streamlit as st

from tilepilot.dashboard import data, live, roofline
from tilepilot.dashboard.reads import CampaignInfo, ExperimentDetail, HypothesisLink, QueueEntry, TrialListRow, TrialOf
from tilepilot.dashboard.text import ago, clock, count, ms, num, params, source
from tilepilot.experiments import Status, canonical_json

LIMIT = 500
NEXT_SHOWN = 25
MS = st.column_config.NumberColumn(format="%.4g")
NOW = {"predicted (ms)": MS}
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
        ("stopped by", {"spread": "spread reached the target", "cap": "time cap reached",
                        "outclassed": "not timed: its verification launches took at least twice the best time"
                        }.get(e.stop_reason)),
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


@dataclass(frozen=True)
class Filters:
    campaign_id: int | None
    kernel: str | None
    problem_key: str | None
    statuses: tuple[str, ...]
    proposer: str | None

    def scope(self, summaries: list[CampaignInfo]) -> tuple[int, ...]:
        """The campaigns the campaign and kernel filters keep."""
        return tuple(c.id for c in summaries if (self.campaign_id is None or c.id == self.campaign_id)
                     and (self.kernel is None or c.kernel == self.kernel))

    def keeps(self, q: QueueEntry, scope: tuple[int, ...]) -> bool:
        """Whether a queue row (running or queued: no result, so no status yet) passes the filters."""
        return (q.campaign_id in scope and not self.statuses and (self.proposer is None or q.proposer == self.proposer)
                and (self.problem_key is None or canonical_json(q.problem) == self.problem_key))


def summary(path: str, f: Filters, scope: tuple[int, ...]) -> None:
    s = data.trial_summary(path, scope, f.problem_key, f.statuses, f.proposer)
    cols = st.columns([1, 0.8, 0.8, 0.8, 1.3, 1.3])  # times need the room
    cols[0].metric("Past experiments", count(s.trials), help="trials with a result that the filters keep")
    cols[1].metric("OK", count(s.ok))
    cols[2].metric("Failed", count(s.failed), help="every status but ok (see below)")
    cols[3].metric("Problems", s.problems)
    cols[4].metric("Fastest", ms(s.best_ms), help="the fastest ok median among them (any problem)")
    cols[5].metric("Median time", ms(s.median_ms), help="the median of their ok medians")
    if s.by_status:
        st.caption("by status: " + " · ".join(f"{status} {n}" for status, n in s.by_status)
                   + (f" · {s.reused} answered from an earlier measurement (reused)" if s.reused else ""))


def running_table(rows: list[QueueEntry], names: dict[int, str]) -> pd.DataFrame:
    return pd.DataFrame([{
        "worker": q.worker, "state": q.state, "started": ago(q.started_at), "proposer": q.proposer,
        "predicted (ms)": q.predicted_ms, "hypothesis": q.hypothesis_id or "", "problem": params(q.problem),
        "config": params(q.config), "rationale": q.rationale, "campaign": names.get(q.campaign_id, ""),
    } for q in rows])


def queued_table(rows: list[QueueEntry], names: dict[int, str]) -> pd.DataFrame:
    return pd.DataFrame([{
        "#": i, "proposer": q.proposer, "predicted (ms)": q.predicted_ms, "hypothesis": q.hypothesis_id or "",
        "problem": params(q.problem), "config": params(q.config), "reason": q.reason, "rationale": q.rationale,
        "campaign": names.get(q.campaign_id, ""),
    } for i, q in enumerate(rows, start=1)])


def current_and_future(path: str, f: Filters, scope: tuple[int, ...], names: dict[int, str]) -> None:
    running = [q for q in data.running(path, f.campaign_id) if f.keeps(q, scope)]
    queued = [q for q in data.queued(path, f.campaign_id, NEXT_SHOWN * 4) if f.keeps(q, scope)][:NEXT_SHOWN]
    only_past = "A status filter keeps only past experiments (those have a result)."
    st.markdown(f"**Running now** ({len(running)})")
    if running:
        st.dataframe(running_table(running, names), hide_index=True, width="stretch", column_config=NOW)
    else:
        st.caption(only_past if f.statuses else "Nothing running matches the filters.")
    st.markdown(f"**Queued next** ({len(queued)}{' shown' if len(queued) == NEXT_SHOWN else ''})")
    if queued:
        st.dataframe(queued_table(queued, names), hide_index=True, width="stretch", column_config=NOW)
    else:
        st.caption(only_past if f.statuses else "Nothing queued matches the filters.")


def body(f: Filters) -> None:
    path = live.db()
    summaries = data.campaigns(path)
    scope = f.scope(summaries)
    names = {c.id: c.name for c in summaries}
    summary(path, f, scope)
    current_and_future(path, f, scope, names)
    st.markdown("**Past experiments**")
    rows = data.trial_list(path, f.campaign_id, f.statuses, f.proposer, LIMIT, f.kernel, f.problem_key)
    st.caption(f"{len(rows)} experiment(s), newest first" + (f" (the newest {LIMIT})" if len(rows) == LIMIT else ""))
    if not rows:
        st.info("No experiment matches these filters.")
        return
    st.dataframe(table(rows), hide_index=True, width="stretch",
                 column_config={"median (ms)": MS, "predicted (ms)": MS,
                                "spread %": st.column_config.NumberColumn(format="%.2f"),
                                "max rel err": st.column_config.NumberColumn(format="%.2e")})
    detail(path, rows)


def problem_labels(summaries: list[CampaignInfo], keys: list[str]) -> dict[str, str]:
    """Problem key -> its label, its parameters in the order the campaign lists them (a key's own
    JSON sorts them)."""
    listed = {canonical_json(p): p for c in summaries for p in c.problems}
    out = {}
    for key in keys:
        try:
            out[key] = params(listed.get(key) or json.loads(key))
        except ValueError:
            out[key] = key
    return out


def filters(path: str) -> Filters:
    summaries = data.campaigns(path)
    options: dict[int | None, str] = {None: "all campaigns"}
    options.update({c.id: c.name for c in summaries})
    cols = st.columns([1, 1, 2])
    campaign_id = cols[0].selectbox("Campaign", list(options), format_func=options.__getitem__,
                                    key="experiments_campaign")
    kernel = cols[1].selectbox("Kernel", [None, *sorted({c.kernel for c in summaries})], key="experiments_kernel",
                               format_func=lambda k: "all kernels" if k is None else k)
    scope = Filters(campaign_id, kernel, None, (), None).scope(summaries)
    keys = data.problem_keys(path, scope)
    labels = problem_labels(summaries, keys)
    problem_key = cols[2].selectbox("Problem", [None, *keys], key="experiments_problem",
                                    format_func=lambda k: "all problems" if k is None else labels.get(k, k))
    cols = st.columns([2, 1])
    statuses = cols[0].multiselect("Status", [s.value for s in Status], key="experiments_status",
                                   placeholder="all statuses")
    proposer = cols[1].selectbox("Proposer", [None, *data.proposers(path, campaign_id)],
                                 key="experiments_proposer",
                                 format_func=lambda p: "all proposers" if p is None else p)
    return Filters(campaign_id, kernel, problem_key, tuple(statuses), proposer)


def main() -> None:
    st.title("Experiments")
    chosen = filters(live.db())
    live.live(lambda: body(chosen))


main()
