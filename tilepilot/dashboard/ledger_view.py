"""How hypotheses, their evidence and verdicts, and learnings are shown: tables and drill-downs
shared by the Hypotheses and Knowledge-graph pages.

The effect of a hypothesis "param=a beats param=b" is the geometric mean, over paired configs
that differ only in that parameter, of median_ms(b) / median_ms(a): above 1, `a` is faster.
Statements, reasons and rationales may come from a model: they go through `st.text` and
`st.dataframe`, never markdown.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import streamlit as st

from tilepilot.dashboard import data, ledger_data
from tilepilot.dashboard.text import clock, md_escape, ms, params, source
from tilepilot.storage.ledger import EvidenceRow, HypothesisRow, LearningRow, VerdictRow

EFFECT_HELP = ("geometric mean over the pairs of median_ms(b) / median_ms(a), for configs that differ only in "
               "the hypothesis' parameter: above 1, the claimed value a is faster")
NOISE_HELP = "the typical spread of paired ratios in the campaign: an effect must exceed it to count"
X = st.column_config.NumberColumn(format="%.3f")
COLUMNS = {"effect (×)": st.column_config.NumberColumn(format="%.3f", help=EFFECT_HELP),
           "noise %": st.column_config.NumberColumn(format="%.1f", help=NOISE_HELP),
           "ratio b/a": X, "a (ms)": st.column_config.NumberColumn(format="%.4g"),
           "b (ms)": st.column_config.NumberColumn(format="%.4g"), "speed-up (×)": X,
           "statement": st.column_config.TextColumn(width="large"),
           "learning": st.column_config.TextColumn(width="large")}
GRAPH_REQUEST = "graph_focus_request"  # read by the Knowledge-graph page: (kernel, node id) to centre on


def ci(low: float | None, high: float | None, digits: int = 3) -> str:
    return "" if low is None or high is None else f"{low:.{digits}f}–{high:.{digits}f}"


def _noise(value: float | None) -> float | None:
    return None if value is None else 100 * value


def hypotheses_table(rows: Sequence[HypothesisRow]) -> pd.DataFrame:
    return pd.DataFrame([{
        "id": h.id, "state": str(h.state), "statement": h.hypothesis.text, "scope": h.hypothesis.scope.text(),
        "effect (×)": h.effect, "95% CI": ci(h.ci_low, h.ci_high), "a faster in": f"{h.wins} of {h.pairs}",
        "noise %": _noise(h.noise), "reason": h.reason, "pairs": h.pairs, "proposed by": h.hypothesis.source,
        "campaign": h.campaign, "kernel": h.hypothesis.kernel, "device": h.hypothesis.device,
        "updated": clock(h.updated_at),
    } for h in rows])


def evidence_table(rows: Sequence[EvidenceRow]) -> pd.DataFrame:
    return pd.DataFrame([{
        "relation": e.relation, "ratio b/a": e.ratio, "problem": params(e.problem),
        "config a": params(e.config_a), "config b": params(e.config_b), "a (ms)": e.median_a_ms,
        "b (ms)": e.median_b_ms, "experiment a": e.experiment_a, "experiment b": e.experiment_b,
    } for e in rows])


def verdicts_table(rows: Sequence[VerdictRow]) -> pd.DataFrame:
    return pd.DataFrame([{
        "time": clock(v.decided_at), "state": str(v.state), "pairs": v.pairs, "a faster in": f"{v.wins} of {v.pairs}",
        "effect (×)": v.effect, "95% CI": ci(v.ci_low, v.ci_high), "noise %": _noise(v.noise), "reason": v.reason,
    } for v in rows])


def learnings_table(rows: Sequence[LearningRow]) -> pd.DataFrame:
    return pd.DataFrame([{
        "learning": x.learning.text, "scope": x.learning.scope.text(), "speed-up (×)": x.learning.effect,
        "pairs": x.learning.pairs, "evidence experiments": list(x.learning.evidence),
        "hypothesis": x.learning.hypothesis_id, "campaign": x.campaign, "device": x.learning.device,
        "torch": x.learning.torch, "triton": x.learning.triton, "learned": clock(x.created_at),
    } for x in rows])


def numbers_source(path: str, campaign_id: int) -> str:
    c = next((c for c in data.campaigns(path) if c.id == campaign_id), None)
    return source(c.backend, c.device) if c else "campaign not found"


def hypothesis_detail(path: str, h: HypothesisRow, *, graph_button: bool = True) -> None:
    """The drill-down: statement, effect and noise, reason, evidence, verdict history, learning."""
    hyp = h.hypothesis
    st.markdown(f"**{md_escape(h.id)}** · {md_escape(str(h.state))}")
    st.text(hyp.text)
    cols = st.columns(4)
    cols[0].metric("Effect (×)", "—" if h.effect is None else f"{h.effect:.3f}", help=EFFECT_HELP)
    cols[1].metric("95% CI", ci(h.ci_low, h.ci_high, 2) or "—")
    cols[2].metric("Pairs (a faster)", f"{h.pairs} ({h.wins})")
    cols[3].metric("Noise", "—" if h.noise is None else f"{100 * h.noise:.1f} %", help=NOISE_HELP)
    st.caption(f"{md_escape(hyp.kernel)} on {md_escape(hyp.device)} · scope: {md_escape(hyp.scope.text())} · "
               f"proposed by {md_escape(hyp.source)} in {md_escape(h.campaign)} · "
               f"numbers: {md_escape(numbers_source(path, h.campaign_id))}")
    st.markdown("**Reason** (the latest verdict)")
    st.text(h.reason or "not judged yet")
    st.markdown("**Rationale** (why it was proposed)")
    st.text(hyp.rationale or "—")
    evidence = ledger_data.evidence(path, h.id)
    supports = sum(e.relation == "supports" for e in evidence)
    st.markdown(f"**Evidence** ({len(evidence)} pair(s): {supports} support, {len(evidence) - supports} refute)")
    if evidence:
        st.dataframe(evidence_table(evidence), hide_index=True, width="stretch", column_config=COLUMNS)
    else:
        st.caption("No pair measured yet.")
    st.markdown("**Verdict history**")
    history = ledger_data.verdicts(path, h.id)
    if history:
        st.dataframe(verdicts_table(history), hide_index=True, width="stretch", column_config=COLUMNS)
    else:
        st.caption("Proposed, not judged yet.")
    learning_of(path, h)
    if graph_button and st.button("Show in the knowledge graph", key=f"graph_{h.id}"):
        st.session_state[GRAPH_REQUEST] = (hyp.kernel, f"hypothesis:{h.id}")
        st.switch_page("screens/graph.py")


def learning_of(path: str, h: HypothesisRow) -> None:
    st.markdown("**Learning**")
    found = ledger_data.learning_of(path, h)
    if found is None:
        st.caption("None: only a validated hypothesis becomes a learning." if str(h.state) != "validated"
                   else "None recorded.")
        return
    st.text(found.learning.text)
    st.caption(f"{md_escape(found.id)} · {len(found.learning.evidence)} supporting experiment(s)")


def learning_detail(path: str, x: LearningRow) -> None:
    """A learning: its statement, scope, toolchain, and the supporting pairs it rests on."""
    lrn = x.learning
    st.markdown(f"**{md_escape(lrn.id)}** · learned from {md_escape(lrn.hypothesis_id)}")
    st.text(lrn.text)
    cols = st.columns(4)
    cols[0].metric("Speed-up (×)", f"{lrn.effect:.3f}", help=EFFECT_HELP)
    cols[1].metric("Pairs", lrn.pairs)
    cols[2].metric("Evidence experiments", len(lrn.evidence))
    cols[3].metric("Learned", clock(x.created_at))
    st.caption(f"{md_escape(lrn.kernel)} on {md_escape(lrn.device)} · scope: {md_escape(lrn.scope.text())} · "
               f"torch {md_escape(lrn.torch)} · triton {md_escape(lrn.triton)} · campaign {md_escape(x.campaign)}")
    st.markdown("**Hypothesis**")
    st.text(x.hypothesis_text)
    rows = [e for e in ledger_data.evidence(path, lrn.hypothesis_id) if e.relation == "supports"]
    st.markdown(f"**Evidence** ({len(rows)} supporting pair(s))")
    if rows:
        st.dataframe(evidence_table(rows), hide_index=True, width="stretch", column_config=COLUMNS)


def experiment_summary(median_ms: float | None, status: str | None, backend: str, device: str) -> str:
    return f"{status or 'no result'} · {ms(median_ms)} · {source(backend, device)}"
