"""Hypotheses: what is being tested, what was validated, ruled out or left inconclusive; one in detail."""

from __future__ import annotations

import streamlit as st

from tilepilot.dashboard import data, ledger_data, ledger_view, live
from tilepilot.storage.ledger import HypothesisRow

GROUPS = (  # heading, states, what an empty group says
    ("Active", ("proposed", "testing"), "Nothing is being tested now."),
    ("Validated", ("validated",), "Nothing validated yet."),
    ("Ruled out", ("ruled_out",), "Nothing ruled out yet."),
    ("Inconclusive", ("inconclusive",), "None left inconclusive."),
)
ORDER = {"testing": 0, "proposed": 1, "validated": 2, "ruled_out": 3, "inconclusive": 4}


def _label(h: HypothesisRow) -> str:
    return f"{h.id} · {h.state} · {h.hypothesis.text}"


def groups(rows: list[HypothesisRow]) -> None:
    for heading, states, empty in GROUPS:
        found = sorted((h for h in rows if str(h.state) in states), key=lambda h: (ORDER[str(h.state)], -h.updated_at))
        st.subheader(f"{heading} ({len(found)})")
        if found:
            st.dataframe(ledger_view.hypotheses_table(found), hide_index=True, width="stretch",
                         column_config=ledger_view.COLUMNS)
        else:
            st.caption(empty)


def detail(path: str, rows: list[HypothesisRow]) -> None:
    st.subheader("Drill down")
    ordered = sorted(rows, key=lambda h: (ORDER[str(h.state)], -h.updated_at))
    by_id = {h.id: h for h in ordered}
    hid = st.selectbox("Details of", list(by_id), format_func=lambda i: _label(by_id[i]), key="hypothesis_detail")
    ledger_view.hypothesis_detail(path, by_id[hid])


def body(campaign_id: int | None, kernel: str | None) -> None:
    path = live.db()
    rows = ledger_data.hypotheses(path, campaign_id, kernel)
    if not rows:
        st.info("No hypothesis yet. The hypothesis miner, the rules and the LLM agent state them as results come in "
                "(campaign.hypothesis_share sets the budget held back to test them).")
        return
    count = {heading: sum(str(h.state) in states for h in rows) for heading, states, _ in GROUPS}
    cols = st.columns(len(GROUPS))
    for col, (heading, n) in zip(cols, count.items(), strict=True):
        col.metric(heading, n)
    st.caption(f"{len(rows)} hypothesis(es) · effect (×): {ledger_view.EFFECT_HELP}; noise: "
               f"{ledger_view.NOISE_HELP}")
    groups(rows)
    detail(path, rows)


def main() -> None:
    st.title("Hypotheses")
    path = live.db()
    summaries = data.campaigns(path)
    options: dict[int | None, str] = {None: "all campaigns"}
    options.update({c.id: f"{c.name} ({c.state})" for c in summaries})
    cols = st.columns(2)
    campaign_id = cols[0].selectbox("Campaign", list(options), format_func=options.__getitem__,
                                    key="hypotheses_campaign")
    kernels = sorted({c.kernel for c in summaries})
    kernel = cols[1].selectbox("Kernel", [None, *kernels], format_func=lambda k: "all kernels" if k is None else k,
                               key="hypotheses_kernel")
    live.live(lambda: body(campaign_id, kernel))


main()
