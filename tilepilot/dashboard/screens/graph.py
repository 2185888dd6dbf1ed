"""Knowledge graph: experiments, hypotheses and learnings of one kernel, drawn around a centre.

Centre on nothing (what is known: the best experiment per problem, the hypotheses with their
evidence, the learnings), on a hypothesis (its evidence and learning) or on an experiment (its
neighbourhood). Drag to pan, scroll to zoom, click a node to open it below; the learnings follow.
"""

from __future__ import annotations

from collections.abc import Callable

import networkx as nx
import streamlit as st

from tilepilot.dashboard import data, ledger_data, ledger_view, live, network
from tilepilot.dashboard.text import md_escape, source
from tilepilot.experiments import InputError
from tilepilot.experiments.hypothesis import Scope
from tilepilot.storage.graph import node_id
from tilepilot.storage.ledger import HypothesisRow

KERNEL_KEY, DEVICE_KEY, SCOPE_KEY, FOCUS_KEY = "graph_kernel", "graph_device", "graph_scope", "graph_focus"
CHART_KEY, OPEN_KEY = "graph_chart", "graph_open"
CENTRE_REQUEST = "graph_centre_request"  # a node id set by "Centre the graph here"
OVERVIEW_HYPOTHESES = 30  # the overview draws the evidence of the most recently updated ones
RADIUS, PER_NODE = 2, 40  # an experiment's neighbourhood


# ---- the subgraph ---------------------------------------------------------------------------

def _with_learning(g: nx.MultiDiGraph, path: str, h: HypothesisRow) -> None:
    x = ledger_data.learning_of(path, h)
    if x is None:
        return
    nid = node_id("learning", x.id)
    g.add_node(nid, kind="learning", label=x.learning.text, effect=x.learning.effect, pairs=x.learning.pairs,
               scope=x.learning.scope.as_list())
    g.add_edge(nid, node_id("hypothesis", h.id), key="learned_from", kind="learned_from")


def overview(path: str, kernel: str, device: str | None, scope: str) -> nx.MultiDiGraph:
    """The best experiment per problem, hypotheses and learnings (scoped), and the evidence of the
    `OVERVIEW_HYPOTHESES` most recently updated hypotheses."""
    known = ledger_data.knowledge(path, kernel, device, scope)
    g = known.graph.copy()
    recent = sorted(known.hypotheses, key=lambda h: -h.updated_at)[:OVERVIEW_HYPOTHESES]
    for h in recent:
        g = nx.compose(g, ledger_data.support(path, h.id).graph)
    return g


def subgraph(path: str, kernel: str, device: str | None, scope: str, focus: str) -> tuple[nx.MultiDiGraph, str | None]:
    """The graph to draw and its centre. Raises InputError for a bad scope or an unknown node."""
    kind, _, key = focus.partition(":")
    if kind == "hypothesis":
        support = ledger_data.support(path, key)
        g = support.graph.copy()
        _with_learning(g, path, support.hypothesis)
        return g, focus
    if kind == "experiment":
        return ledger_data.neighbourhood(path, key, RADIUS, PER_NODE).graph, focus
    return overview(path, kernel, device, scope), None


# ---- details of the open node -----------------------------------------------------------------

def open_node(path: str, g: nx.MultiDiGraph, nid: str) -> None:
    kind, _, key = nid.partition(":")
    d = g.nodes[nid]
    if kind == "hypothesis":
        ledger_view.hypothesis_detail(path, ledger_data.hypothesis(path, key), graph_button=False)
    elif kind == "learning":
        found = [x for x in ledger_data.learnings(path) if x.id == key]
        if found:
            ledger_view.learning_detail(path, found[0])
    elif kind == "experiment":
        experiment(path, key)
    else:
        st.markdown(f"**{md_escape(kind)}** · {g.degree(nid)} link(s) drawn")
        st.text(str(d.get("label", nid)))
        if isinstance(d.get("params"), dict):
            st.json(d["params"])
    if kind in ("hypothesis", "experiment") and st.button("Centre the graph here", key="graph_centre"):
        st.session_state[CENTRE_REQUEST] = nid
        st.rerun(scope="app")


def experiment(path: str, key: str) -> None:
    """An experiment with what it links to: problem, config, campaigns, hypotheses."""
    near = ledger_data.neighbourhood(path, key, 1, PER_NODE)
    g, nid = near.graph, near.center
    d = g.nodes[nid]
    st.markdown(f"**experiment** {md_escape(key)}")
    st.text(ledger_view.experiment_summary(d.get("median_ms"), d.get("status"), d.get("backend", ""),
                                           d.get("device", "")))
    by_kind: dict[str, list[str]] = {}
    for n in near.nodes:
        by_kind.setdefault(n.kind, []).append(n.node)
    left, right = st.columns(2)
    for col, kind in ((left, "problem"), (right, "config")):
        with col:
            st.markdown(f"**{kind.title()}**")
            for n in by_kind.get(kind, []):
                st.json(g.nodes[n].get("params", {}))
    campaigns = [g.nodes[n]["label"] for n in by_kind.get("campaign", [])]
    st.caption("campaign(s): " + md_escape(", ".join(campaigns) or "none"))
    links = [(k, g.nodes[v]["label"], v) for _, v, k in g.out_edges(nid, keys=True)
             if g.nodes[v]["kind"] == "hypothesis"]
    st.markdown(f"**Hypotheses** ({len(links)})")
    for relation, text, v in links:
        st.text(f"{relation} {v.partition(':')[2]}: {text}")


# ---- the page -----------------------------------------------------------------------------------

def on_click() -> None:
    """The chart's click: open the clicked node (an empty click keeps the open one)."""
    picked = st.session_state[CHART_KEY]["selection"].get(network.SELECTION) or []
    if picked and picked[0].get("id"):
        st.session_state[OPEN_KEY] = picked[0]["id"]


def _option(g: nx.MultiDiGraph) -> Callable[[str], str]:
    def label(nid: str) -> str:
        if not nid:
            return "nothing (click a node)"
        d = g.nodes[nid]
        return f"{d['kind']} · {network.tag(nid, d['kind']) or ''} {str(d.get('label', nid))[:120]}".replace("  ", " ")
    return label


def draw(path: str, g: nx.MultiDiGraph, centre: str | None) -> None:
    shown, left_out = network.bounded(g, centre)
    if not len(shown):
        st.info("Nothing to draw for these filters yet.")
        return
    counts = {k: sum(d["kind"] == k for _, d in shown.nodes(data=True)) for k in network.NODE_STYLE}
    st.caption(" · ".join(f"{n} {k}(s)" for k, n in counts.items() if n)
               + (f" · {left_out} more node(s) not drawn (at most {network.MAX_NODES})" if left_out else "")
               + " · drag to pan, scroll to zoom, double-click to reset, click a node to open it")
    nodes, edges = network.frames(shown, network.layout(shown))
    st.altair_chart(network.chart(nodes, edges), key=CHART_KEY, on_select=on_click,
                    selection_mode=[network.SELECTION], width="stretch")
    options = ["", *sorted(shown, key=lambda n: (list(network.NODE_STYLE).index(shown.nodes[n]["kind"]), n))]
    if st.session_state.get(OPEN_KEY) not in options:
        st.session_state[OPEN_KEY] = ""
    nid = st.selectbox("Open", options, format_func=_option(shown), key=OPEN_KEY)
    if nid:
        with st.container(border=True):
            open_node(path, shown, nid)


def learnings(path: str, kernel: str, device: str | None, scope: str) -> None:
    rows = ledger_data.learnings(path, kernel, device)
    if scope.strip():
        wanted = Scope.parse(scope)
        rows = [x for x in rows if x.learning.scope.overlaps(wanted)]
    st.subheader(f"Learnings ({len(rows)})")
    if rows:
        st.dataframe(ledger_view.learnings_table(rows), hide_index=True, width="stretch",
                     column_config=ledger_view.COLUMNS)
    else:
        st.caption("No learning yet: a hypothesis becomes one when the results validate it.")


def body(kernel: str, device: str | None, scope: str, focus: str) -> None:
    path = live.db()
    try:
        g, centre = subgraph(path, kernel, device, scope, focus)
        draw(path, g, centre)
        learnings(path, kernel, device, scope)
    except InputError as e:
        st.error(str(e))


def _focus_options(path: str, kernel: str, device: str | None) -> tuple[list[str], Callable[[str], str]]:
    hyps = ledger_data.hypotheses(path, None, kernel, device)
    labels = {"": "what is known (best per problem, hypotheses, learnings)"}
    labels.update({f"hypothesis:{h.id}": f"hypothesis {h.id} · {h.state} · {h.hypothesis.text}" for h in hyps})
    current = st.session_state.get(FOCUS_KEY) or ""
    if current.startswith("experiment:"):
        labels[current] = f"experiment {current.partition(':')[2]} (its neighbourhood)"
    return list(labels), labels.__getitem__


def _take_requests() -> None:
    """A centre asked for by a button (here, or on the Hypotheses page) becomes the chosen one."""
    request = st.session_state.pop(ledger_view.GRAPH_REQUEST, None)
    if request:
        st.session_state[KERNEL_KEY], st.session_state[FOCUS_KEY] = request
        st.session_state[DEVICE_KEY] = None
    centre = st.session_state.pop(CENTRE_REQUEST, None)
    if centre:
        st.session_state[FOCUS_KEY] = centre


def main() -> None:
    st.title("Knowledge graph")
    path = live.db()
    _take_requests()
    pairs = ledger_data.kernels_devices(path)
    if not pairs:
        st.info("No campaign in this database yet. Start one with `tilepilot tune CAMPAIGN.toml`.")
        return
    cols = st.columns([1, 2, 2])
    kernel = cols[0].selectbox("Kernel", sorted({k for k, _ in pairs}), key=KERNEL_KEY)
    devices = [None, *sorted({d for k, d in pairs if k == kernel})]
    device = cols[1].selectbox("Device", devices, format_func=lambda d: "all devices" if d is None else d,
                               key=DEVICE_KEY)
    scope = cols[2].text_input("Problems", key=SCOPE_KEY, placeholder="all problems, or e.g. M<=64, K>=4096",
                               help="a filter on the problems of the overview and on the learnings")
    options, label = _focus_options(path, kernel, device)
    if st.session_state.get(FOCUS_KEY, "") not in options:
        st.session_state[FOCUS_KEY] = ""
    focus = st.selectbox("Centre on", options, format_func=label, key=FOCUS_KEY)
    sources = sorted({source(c.backend, c.device) for c in data.campaigns(path) if c.kernel == kernel})
    st.caption("numbers: " + md_escape("; ".join(sources) or "no campaign of this kernel"))
    live.live(lambda: body(kernel, device, scope, focus))


main()
