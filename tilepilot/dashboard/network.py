"""The knowledge graph as an interactive chart: drag to pan, scroll to zoom, click a node to open it.

A bounded subgraph (`bounded`: at most `MAX_NODES`, the nearest to its centre first) is laid out
with networkx's spring layout and drawn with Vega-Lite through Altair: edges as rules, nodes as
points, a scale-bound interval for pan and zoom and a point selection (`SELECTION`) that
Streamlit hands back on click. The positions travel as data, no script comes from a CDN, so it
works offline. Kernel and device nodes are the page's filters: linked to everything, not drawn.
"""

from __future__ import annotations

from collections.abc import Mapping

import altair as alt
import networkx as nx
import pandas as pd

MAX_NODES = 300
SELECTION = "node"
HIDDEN = ("kernel", "device")
# kind -> (colour, shape, size); the order is the legend's and the order nodes are kept in
NODE_STYLE: dict[str, tuple[str, str, int]] = {
    "hypothesis": ("#ff7f0e", "diamond", 420),
    "learning": ("#2ca02c", "square", 320),
    "problem": ("#9467bd", "triangle-up", 220),
    "experiment": ("#1f77b4", "circle", 60),
    "campaign": ("#7f7f7f", "cross", 220),
    "config": ("#8c564b", "circle", 45),
    "kernel": ("#bcbd22", "circle", 220),
    "device": ("#17becf", "circle", 220),
}
EDGE_COLOURS = {"supports": "#2ca02c", "refutes": "#d62728", "tests": "#ff7f0e", "learned_from": "#9467bd",
                "ran": "#c7c7c7", "applies_to": "#dadaf0"}
TOOLTIP_CHARS = 240


def bounded(g: nx.MultiDiGraph, centre: str | None = None,
            limit: int | None = None) -> tuple[nx.MultiDiGraph, int]:
    """`g` without the hidden kinds, cut to `limit` (default `MAX_NODES`) nodes: the nearest to
    `centre` first (edges taken either way), then by kind (hypotheses, learnings, problems,
    experiments, campaigns, configs), then by id. Returns the subgraph and how many were left out."""
    shown = [n for n, d in g.nodes(data=True) if d["kind"] not in HIDDEN]
    view = g.subgraph(shown)
    dist: Mapping[str, int] = {}
    if centre is not None and centre in view:
        dist = nx.single_source_shortest_path_length(view.to_undirected(as_view=True), centre)
    far = len(shown) + 1
    rank = list(NODE_STYLE)
    order = sorted(shown, key=lambda n: (dist.get(n, far), rank.index(g.nodes[n]["kind"]), n))
    keep = order[:MAX_NODES if limit is None else limit]
    return g.subgraph(keep).copy(), len(shown) - len(keep)


def layout(g: nx.MultiDiGraph, seed: int = 0) -> dict[str, tuple[float, float]]:
    """Spring-layout positions; the same nodes and edges always get the same picture, whatever
    order the queries returned them in."""
    if not len(g):
        return {}
    simple = nx.Graph()
    simple.add_nodes_from(sorted(g))
    simple.add_edges_from(sorted(tuple(sorted((u, v))) for u, v in g.edges() if u != v))
    pos = nx.spring_layout(simple, seed=seed)
    return {n: (float(x), float(y)) for n, (x, y) in pos.items()}


def detail(d: Mapping[str, object]) -> str:
    """One line under a node's label in its tooltip: what the node measured or concluded."""
    kind = d["kind"]
    if kind == "experiment":
        ms = d.get("median_ms")
        timing = f"{ms:.4g} ms" if isinstance(ms, float) else "no time"
        return f"{d.get('status') or 'no result'} · {timing} · {d.get('backend', '')} on {d.get('device', '')}"
    if kind == "hypothesis":
        effect = d.get("effect")
        shown = f"effect {effect:.3f}x" if isinstance(effect, float) else "no effect measured yet"
        return f"{d.get('state', '')} · {shown} over {d.get('pairs', 0)} pair(s)"
    if kind == "learning":
        return f"{d.get('effect', 0.0):.3f}x over {d.get('pairs', 0)} pair(s)"
    if kind == "campaign":
        return str(d.get("state", ""))
    return ""


def tag(node: str, kind: str) -> str:
    """The short name written beside hypotheses and learnings ("H-1a2b3c4d")."""
    return node.partition(":")[2] if kind in ("hypothesis", "learning") else ""


def frames(g: nx.MultiDiGraph, pos: Mapping[str, tuple[float, float]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The nodes (id, kind, label, detail, tag, x, y) and the edges (kind, x, y, x2, y2) to draw."""
    nodes = pd.DataFrame([{
        "id": n, "kind": d["kind"], "label": _clip(str(d.get("label", n))), "detail": detail(d),
        "tag": tag(n, d["kind"]), "x": pos[n][0], "y": pos[n][1],
    } for n, d in g.nodes(data=True)], columns=["id", "kind", "label", "detail", "tag", "x", "y"])
    edges = pd.DataFrame([{
        "kind": k, "source": u, "target": v, "x": pos[u][0], "y": pos[u][1], "x2": pos[v][0], "y2": pos[v][1],
    } for u, v, k in g.edges(keys=True)], columns=["kind", "source", "target", "x", "y", "x2", "y2"])
    return nodes, edges


def _clip(text: str) -> str:
    return text if len(text) <= TOOLTIP_CHARS else text[:TOOLTIP_CHARS - 1] + "…"


def _domain(values: pd.Series) -> list[float]:
    lo, hi = (float(values.min()), float(values.max())) if len(values) else (-1.0, 1.0)
    pad = max(0.08 * (hi - lo), 0.1)
    return [lo - pad, hi + pad]


def chart(nodes: pd.DataFrame, edges: pd.DataFrame, height: int = 620) -> alt.LayerChart:
    """Edges under nodes under the hypothesis and learning tags; pan, zoom and a click selection."""
    x = alt.X("x:Q", axis=None, scale=alt.Scale(domain=_domain(nodes["x"]), nice=False, zero=False))
    y = alt.Y("y:Q", axis=None, scale=alt.Scale(domain=_domain(nodes["y"]), nice=False, zero=False))
    kinds = [k for k in NODE_STYLE if k in set(nodes["kind"])]
    style = {k: NODE_STYLE[k] for k in kinds}
    pick = alt.selection_point(name=SELECTION, fields=["id"], on="click", nearest=True, empty=False)
    zoom = alt.selection_interval(name="zoom", bind="scales")
    edge_kinds = [k for k in EDGE_COLOURS if k in set(edges["kind"])]
    lines = alt.Chart(edges).mark_rule(strokeWidth=1.2, opacity=0.8).encode(
        x=x, y=y, x2="x2:Q", y2="y2:Q",
        color=alt.Color("kind:N", title="edge", scale=alt.Scale(domain=edge_kinds,
                                                                range=[EDGE_COLOURS[k] for k in edge_kinds]),
                        legend=alt.Legend(orient="bottom")))
    points = alt.Chart(nodes).mark_point(filled=True, opacity=0.95, stroke="#111111").encode(
        x=x, y=y,
        color=alt.Color("kind:N", title="node", scale=alt.Scale(domain=kinds, range=[s[0] for s in style.values()]),
                        legend=alt.Legend(orient="bottom")),
        shape=alt.Shape("kind:N", title="node", scale=alt.Scale(domain=kinds, range=[s[1] for s in style.values()])),
        size=alt.Size("kind:N", scale=alt.Scale(domain=kinds, range=[s[2] for s in style.values()]), legend=None),
        strokeWidth=alt.when(pick).then(alt.value(3.0)).otherwise(alt.value(0.0)),
        tooltip=[alt.Tooltip("kind:N"), alt.Tooltip("label:N", title="what"), alt.Tooltip("detail:N", title="result"),
                 alt.Tooltip("id:N")],
    ).add_params(pick, zoom)
    tags = alt.Chart(nodes).transform_filter("datum.tag != ''").mark_text(dy=-14, fontSize=11).encode(
        x=x, y=y, text="tag:N")
    return (alt.layer(lines, points, tags).resolve_scale(color="independent")
            .properties(height=height).configure_view(strokeWidth=0))
