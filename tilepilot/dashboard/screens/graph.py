"""Knowledge graph: experiments, hypotheses and learnings of one kernel, drawn around a centre.

The overview draws the hypotheses (those being tested first, then the validated ones) with their
evidence experiments and learnings, as many as fit in `network.MAX_NODES`; centred on a
hypothesis it draws its evidence, configs and learning; centred on an experiment, its
neighbourhood. Drag to pan, scroll to zoom, click a node to open it below; the learnings follow.
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
CHART_KEY, OPEN_KEY, TYPED_KEY = "graph_chart", "graph_open", "graph_experiment"
CENTRE_REQUEST = "graph_centre_request"  # a node id set by "Centre the graph here"
DRAW_ORDER = ("testing", "proposed", "validated", "ruled_out", "inconclusive")
PLURAL = {"hypothesis": "hypotheses"}
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


def _hypotheses(path: str, kernel: str, device: str | None, scope: str) -> list[HypothesisRow]:
    """The hypotheses of the filters in the order the overview draws them: being tested, proposed,
    validated (with their learnings), ruled out, inconclusive; the latest updated first in each."""
    rows = ledger_data.hypotheses(path, None, kernel, device)
    if scope.strip():
        wanted = Scope.parse(scope)
        rows = [h for h in rows if h.hypothesis.scope.overlaps(wanted)]
    return sorted(rows, key=lambda h: (DRAW_ORDER.index(str(h.state)), -h.updated_at))


def overview(path: str, kernel: str, device: str | None, scope: str) -> tuple[nx.MultiDiGraph, int]:
    """Hypotheses with their evidence (experiments and problems; configs are drawn once centred)
    and learnings, taken in `_hypotheses` order while they fit in `network.MAX_NODES`; returns
    the graph and the number of hypotheses left out."""
    g = nx.MultiDiGraph()
    rows = _hypotheses(path, kernel, device, scope)
    for i, h in enumerate(rows):
        part = ledger_data.support(path, h.id).graph.copy()
        _with_learning(part, path, h)
        part.remove_nodes_from([n for n, d in part.nodes(data=True) if d["kind"] in ("config", *network.HIDDEN)])
        if len(g) and len(set(g) | set(part)) > network.MAX_NODES:
            return g, len(rows) - i
        g.add_nodes_from(part.nodes(data=True))
        g.add_edges_from(part.edges(keys=True, data=True))
    return g, 0


def subgraph(path: str, kernel: str, device: str | None, scope: str,
             focus: str) -> tuple[nx.MultiDiGraph, str | None, int]:
    """The graph to draw, its centre and the hypotheses left out of an overview.
    Raises InputError for a bad scope or an unknown node."""
    kind, _, key = focus.partition(":")
    if kind == "hypothesis":
        support = ledger_data.support(path, key)
        g = support.graph.copy()
        _with_learning(g, path, support.hypothesis)
        return g, focus, 0
    if kind == "experiment":
        near = ledger_data.neighbourhood(path, key, RADIUS, PER_NODE)
        return near.graph, near.center, 0
    g, left_out = overview(path, kernel, device, scope)
    return g, None, left_out


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
    counts = {k: sum(d["kind"] == k for _, d in shown.nodes(data=True)) for k in network.NODE_STYLE}
    st.caption(" · ".join(f"{n} {k if n == 1 else PLURAL.get(k, k + 's')}" for k, n in counts.items() if n)
               + (f" · {left_out} more node(s) not drawn (at most {network.MAX_NODES})" if left_out else "")
               + " · drag to pan, scroll to zoom, double-click to reset, click a node to open it (the picture "
               "follows the store: turn Live refresh off in the sidebar to hold it while you explore)")
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
        g, centre, hypotheses_left_out = subgraph(path, kernel, device, scope, focus)
        if not len(g):
            st.info("No hypothesis for these filters yet: the overview draws hypotheses with their evidence and "
                    "learnings. Centre on an experiment by its key (from the Experiments page) to see what it "
                    "links to.")
        else:
            if hypotheses_left_out:
                st.caption(f"{hypotheses_left_out} more hypothesis(es) not drawn, to keep the picture within "
                           f"{network.MAX_NODES} nodes: centre on one to see it")
            draw(path, g, centre)
        learnings(path, kernel, device, scope)
    except InputError as e:
        st.error(str(e))


def _focus_options(path: str, kernel: str, device: str | None) -> tuple[list[str], Callable[[str], str]]:
    hyps = ledger_data.hypotheses(path, None, kernel, device)
    labels = {"": "overview: hypotheses with their evidence and learnings"}
    labels.update({f"hypothesis:{h.id}": f"hypothesis {h.id} · {h.state} · {h.hypothesis.text}" for h in hyps})
    current = st.session_state.get(FOCUS_KEY) or ""
    if current.startswith("experiment:"):
        labels[current] = f"experiment {current.partition(':')[2]} (its neighbourhood)"
    return list(labels), labels.__getitem__


def _centre_on_typed() -> None:
    typed = str(st.session_state.get(TYPED_KEY) or "").strip().lower().removeprefix("experiment:")
    if typed:
        st.session_state[FOCUS_KEY] = f"experiment:{typed}"


def _take_requests() -> None:
    """A centre asked for by a button (here, or on the Hypotheses page) becomes the chosen one,
    and its node stays open."""
    request = st.session_state.pop(ledger_view.GRAPH_REQUEST, None)
    if request:
        st.session_state[KERNEL_KEY], st.session_state[FOCUS_KEY] = request
        st.session_state[DEVICE_KEY] = None
        st.session_state[OPEN_KEY] = request[1]
    centre = st.session_state.pop(CENTRE_REQUEST, None)
    if centre:
        st.session_state[FOCUS_KEY] = st.session_state[OPEN_KEY] = centre


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
    cols = st.columns([3, 1])
    focus = cols[0].selectbox("Centre on", options, format_func=label, key=FOCUS_KEY)
    cols[1].text_input("or on an experiment", key=TYPED_KEY, on_change=_centre_on_typed,
                       placeholder="its key (6+ characters)")
    sources = sorted({source(c.backend, c.device) for c in data.campaigns(path) if c.kernel == kernel})
    st.caption("numbers: " + md_escape("; ".join(sources) or "no campaign of this kernel"))
    live.live(lambda: body(kernel, device, scope, focus))


main()
