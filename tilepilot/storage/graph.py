"""The knowledge graph: a networkx view of the SQLite rows, never a second store.

Nodes (id "kind:key", attribute `kind`): campaign, kernel, problem, config, experiment,
hypothesis, learning, device. Edges (a `MultiDiGraph`, the edge key is its kind):

- `ran`: campaign → experiment; experiment → its problem, config, device and kernel;
- `tests`: experiment → the hypothesis it was queued to test;
- `supports` / `refutes`: experiment → hypothesis, from the evidence pairs;
- `learned_from`: learning → hypothesis;
- `applies_to`: hypothesis or learning → its kernel, device and the problems in its scope.

Queries build only the subgraph they need, from SQL: `knowledge` (what is known about a kernel
on a device for problems in a scope), `support` (the evidence of a hypothesis),
`neighbourhood` (a cut-off breadth-first search around an experiment; campaign, kernel and
device nodes are not expanded: they join everything) and `learnings_for` (the learnings that
apply to a problem). `build_graph` loads everything (for export); `export` writes node-link JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

from tilepilot.experiments import InputError, Problem, Value
from tilepilot.experiments.hypothesis import Scope
from tilepilot.storage import ledger
from tilepilot.storage.ledger import EvidenceRow, HypothesisRow, LearningRow
from tilepilot.storage.queries import ReadOnlyDB, problem_fields
from tilepilot.storage.rows import in_chunks, loads

NODE_KINDS = ("campaign", "kernel", "problem", "config", "experiment", "hypothesis", "learning", "device")
EDGE_KINDS = ("ran", "tests", "supports", "refutes", "learned_from", "applies_to")
HUBS = ("campaign", "kernel", "device")  # never expanded by a neighbourhood search
_EXPERIMENT = """SELECT e.key, e.kernel, e.problem, e.problem_key, e.config, e.config_key, e.device, e.backend,
r.status, r.median_ms FROM experiments e LEFT JOIN results r ON r.experiment_key = e.key"""


def node_id(kind: str, *key: str) -> str:
    return ":".join((kind, *key))


class Graph:
    """A `MultiDiGraph` under construction, with typed helpers for our nodes and edges."""

    def __init__(self) -> None:
        self.g = nx.MultiDiGraph()
        self._problems: dict[str, tuple[str, dict[str, Value]]] = {}  # node id -> (kernel, params)

    def node(self, kind: str, key: Sequence[str], label: str, **attrs: Any) -> str:
        nid = node_id(kind, *key)
        if nid not in self.g:
            self.g.add_node(nid, kind=kind, label=label, **attrs)
        return nid

    def edge(self, u: str, v: str, kind: str, **attrs: Any) -> None:
        if not self.g.has_edge(u, v, key=kind):
            self.g.add_edge(u, v, key=kind, kind=kind, **attrs)

    # ---- typed nodes --------------------------------------------------------------------------
    def kernel(self, name: str) -> str:
        return self.node("kernel", [name], name)

    def device(self, name: str) -> str:
        return self.node("device", [name], name)

    def campaign(self, name: str, state: str = "") -> str:
        return self.node("campaign", [name], name, state=state)

    def problem(self, kernel: str, problem: Mapping[str, Value], key: str) -> str:
        nid = node_id("problem", kernel, key)
        if nid not in self._problems:
            self.node("problem", [kernel, key], Problem.of(problem).label(), kernel=kernel, params=dict(problem))
            self._problems[nid] = (kernel, dict(problem))
        return nid

    def config(self, kernel: str, config: Mapping[str, Value], key: str) -> str:
        return self.node("config", [kernel, key], " ".join(f"{k}={v}" for k, v in config.items()), kernel=kernel,
                         params=dict(config))

    def experiment(self, r: Mapping[str, Any]) -> str:
        """An experiment row (`_EXPERIMENT` columns) with its `ran` edges."""
        kernel = r["kernel"]
        pid, cid = node_id("problem", kernel, r["problem_key"]), node_id("config", kernel, r["config_key"])
        if pid not in self.g:
            self.problem(kernel, loads(r["problem"]), r["problem_key"])
        if cid not in self.g:
            self.config(kernel, loads(r["config"]), r["config_key"])
        ms = f"{r['median_ms']:.4g} ms" if r["median_ms"] is not None else r["status"] or "no result"
        nid = self.node("experiment", [r["key"]], f"{self.g.nodes[pid]['label']} | {self.g.nodes[cid]['label']} | {ms}",
                        status=r["status"], median_ms=r["median_ms"], device=r["device"], backend=r["backend"])
        self.g.add_edges_from((nid, v, "ran", {"kind": "ran"}) for v in
                              (pid, cid, self.device(r["device"]), self.kernel(kernel)))
        return nid

    def hypothesis(self, h: HypothesisRow) -> str:
        hyp = h.hypothesis
        nid = self.node("hypothesis", [hyp.id], hyp.text, state=str(h.state), effect=h.effect, pairs=h.pairs,
                        scope=hyp.scope.as_list())
        self.edge(nid, self.kernel(hyp.kernel), "applies_to")
        self.edge(nid, self.device(hyp.device), "applies_to")
        return nid

    def learning(self, lrn: LearningRow) -> str:
        x = lrn.learning
        nid = self.node("learning", [x.id], x.text, effect=x.effect, pairs=x.pairs, scope=x.scope.as_list(),
                        torch=x.torch, triton=x.triton)
        self.edge(nid, node_id("hypothesis", x.hypothesis_id), "learned_from")
        self.edge(nid, self.kernel(x.kernel), "applies_to")
        self.edge(nid, self.device(x.device), "applies_to")
        return nid

    def scoped(self, nid: str, scope: Scope, kernel: str) -> None:
        """`applies_to` edges from a hypothesis or learning to the problems of the graph in its scope."""
        for pid, (k, params) in self._problems.items():
            if k == kernel and scope.contains(params):
                self.edge(nid, pid, "applies_to")


# ---- whole graph and export ------------------------------------------------------------------------

def build_graph(db: ReadOnlyDB, *, kernel: str | None = None, device: str | None = None) -> nx.MultiDiGraph:
    """Every row (of one kernel, on devices matching `device`, when given) as one graph."""
    where, params = ledger.kernel_device_filter("e", kernel, device)
    cond = " WHERE " + " AND ".join(where) if where else ""
    b = Graph()
    keys = set()
    for r in db.rows(_EXPERIMENT + cond, params):
        b.experiment(r)
        keys.add(r["key"])
    for t in db.rows("SELECT t.experiment_key, t.hypothesis_id, c.name, c.state FROM trials t "
                     "JOIN campaigns c ON c.id = t.campaign_id", []):
        if t["experiment_key"] in keys:
            b.edge(b.campaign(t["name"], t["state"]), node_id("experiment", t["experiment_key"]), "ran")
    hyps = ledger.select_hypotheses(db.rows, kernel=kernel, device=device)
    for h in hyps:
        b.scoped(b.hypothesis(h), h.hypothesis.scope, h.hypothesis.kernel)
    ids = {h.id for h in hyps}
    for t in db.rows("SELECT DISTINCT experiment_key, hypothesis_id FROM trials WHERE hypothesis_id IS NOT NULL", []):
        if t["experiment_key"] in keys and t["hypothesis_id"] in ids:
            b.edge(node_id("experiment", t["experiment_key"]), node_id("hypothesis", t["hypothesis_id"]), "tests")
    for e in db.rows("SELECT hypothesis_id, experiment_a, experiment_b, relation FROM evidence", []):
        for k in (e["experiment_a"], e["experiment_b"]):
            if k in keys and e["hypothesis_id"] in ids:
                b.edge(node_id("experiment", k), node_id("hypothesis", e["hypothesis_id"]), e["relation"])
    for lrn in ledger.select_learnings(db.rows, kernel=kernel, device=device):
        b.scoped(b.learning(lrn), lrn.learning.scope, lrn.learning.kernel)
    return b.g


def export(graph: nx.MultiDiGraph, path: str | Path) -> Path:
    """Write node-link JSON (edges under "edges"); raises InputError when the file cannot be written."""
    p = Path(path)
    data = nx.node_link_data(graph, edges="edges")
    try:
        p.write_text(json.dumps(data, default=str) + "\n", encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot write {str(p)!r}: {e.strerror or e}") from None
    return p


def load_export(path: str | Path) -> nx.MultiDiGraph:
    return nx.node_link_graph(json.loads(Path(path).read_text(encoding="utf-8")), edges="edges")


# ---- what do we know -------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProblemKnowledge:
    problem: dict[str, Any]
    problem_key: str
    device: str
    experiments: int
    ok: int
    best_ms: float | None
    best_config: dict[str, Any] | None
    best_experiment: str | None


@dataclass(frozen=True)
class Knowledge:
    kernel: str
    device: str | None
    scope: Scope
    problems: tuple[ProblemKnowledge, ...]
    hypotheses: tuple[HypothesisRow, ...]
    learnings: tuple[LearningRow, ...]
    graph: nx.MultiDiGraph = field(compare=False, repr=False)


def knowledge(db: ReadOnlyDB, *, kernel: str, device: str | None = None,
              scope: Scope | str | None = None) -> Knowledge:
    """What the store knows about `kernel` on devices matching `device` for problems in `scope`:
    the best result per problem, the hypotheses and learnings whose scope overlaps it.

    Raises InputError for an unknown kernel or device, or a filter on an unknown problem parameter.
    """
    s = _scope(scope)
    _check_kernel_device(db, kernel, device)
    _check_params(db, kernel, s)
    # problem_key is the problem's canonical JSON: the scope is tested on the (kernel, problem_key) index alone
    keys = [r["problem_key"] for r in db.rows("SELECT DISTINCT problem_key FROM experiments WHERE kernel = ?",
                                              [kernel]) if s.contains(json.loads(r["problem_key"]))]
    rows = []
    for chunk, marks in in_chunks(keys):
        where, params = ledger.kernel_device_filter("e", kernel, device)
        rows += db.rows("SELECT e.problem_key, MIN(e.problem) AS problem, e.device, COUNT(*) AS n, "
                        "SUM(r.status = 'ok') AS ok FROM experiments e JOIN results r ON r.experiment_key = e.key "
                        f"WHERE {' AND '.join(where)} AND e.problem_key IN ({marks}) "
                        "GROUP BY e.problem_key, e.device", [*params, *chunk])
    best = _best(db, kernel, device, [r["problem_key"] for r in rows])
    b = Graph()
    problems = []
    for r in sorted(rows, key=lambda r: (r["device"], r["problem_key"])):
        top = best.get((r["problem_key"], r["device"]))
        problems.append(ProblemKnowledge(loads(r["problem"]), r["problem_key"], r["device"], r["n"], r["ok"] or 0,
                                         top["median_ms"] if top else None, loads(top["config"]) if top else None,
                                         top["key"] if top else None))
        b.problem(kernel, loads(r["problem"]), r["problem_key"])
        if top:
            b.experiment(top)
    hyps = [h for h in ledger.select_hypotheses(db.rows, kernel=kernel, device=device)
            if h.hypothesis.scope.overlaps(s)]
    lrns = [x for x in ledger.select_learnings(db.rows, kernel=kernel, device=device)
            if x.learning.scope.overlaps(s)]
    for h in hyps:
        b.scoped(b.hypothesis(h), h.hypothesis.scope, kernel)
    for x in lrns:
        b.scoped(b.learning(x), x.learning.scope, kernel)
    return Knowledge(kernel, device, s, tuple(problems), tuple(hyps), tuple(lrns), b.g)


def _best(db: ReadOnlyDB, kernel: str, device: str | None, problem_keys: Sequence[str]) -> dict[tuple[str, str], Any]:
    out: dict[tuple[str, str], Any] = {}
    for chunk, marks in in_chunks(problem_keys):
        where, params = ledger.kernel_device_filter("e", kernel, device)
        where.append(f"e.problem_key IN ({marks}) AND r.status = 'ok'")
        # SQLite returns the bare columns of the row that holds the MIN()
        for r in db.rows(_EXPERIMENT.replace("r.median_ms", "MIN(r.median_ms) AS median_ms")
                         + f" WHERE {' AND '.join(where)} GROUP BY e.problem_key, e.device", [*params, *chunk]):
            out[(r["problem_key"], r["device"])] = r
    return out


# ---- evidence of a hypothesis ------------------------------------------------------------------------

@dataclass(frozen=True)
class Support:
    hypothesis: HypothesisRow
    evidence: tuple[EvidenceRow, ...]
    graph: nx.MultiDiGraph = field(compare=False, repr=False)


def support(db: ReadOnlyDB, hypothesis_id: str, *, relation: str | None = None) -> Support:
    """The pairs behind a hypothesis (`relation`: only 'supports' or 'refutes'), supporting first.

    Raises InputError for an unknown hypothesis or relation."""
    h = ledger.hypothesis(db, hypothesis_id)
    rows = ledger.select_evidence(db.rows, hypothesis_id, relation=relation)
    b = Graph()
    hid = b.hypothesis(h)
    keys = sorted({k for e in rows for k in (e.experiment_a, e.experiment_b)})
    for r in _experiments(db, keys):
        b.experiment(r)
    for e in rows:
        for k in (e.experiment_a, e.experiment_b):
            b.edge(node_id("experiment", k), hid, e.relation)
    b.scoped(hid, h.hypothesis.scope, h.hypothesis.kernel)
    return Support(h, tuple(rows), b.g)


def _experiments(db: ReadOnlyDB, keys: Sequence[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for chunk, marks in in_chunks(keys):
        out.extend(db.rows(_EXPERIMENT + f" WHERE e.key IN ({marks})", chunk))
    return out


# ---- learnings that apply to a problem ---------------------------------------------------------------

def learnings_for(db: ReadOnlyDB, *, kernel: str, problem: Mapping[str, Value],
                  device: str | None = None) -> tuple[list[LearningRow], nx.MultiDiGraph]:
    """The learnings whose kernel, device (a part of its name) and scope take in `problem`."""
    rows = ledger.learnings(db, kernel=kernel, device=device, problem=problem)
    b = Graph()
    key = Problem.of(problem).key()
    pid = b.problem(kernel, problem, key)
    for x in rows:
        b.edge(b.learning(x), pid, "applies_to")
    for h in ledger.select_hypotheses(db.rows, ids=[x.learning.hypothesis_id for x in rows]):
        b.hypothesis(h)
    return rows, b.g


# ---- neighbourhood ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Neighbour:
    node: str
    kind: str
    label: str
    distance: int


@dataclass(frozen=True)
class Neighbourhood:
    center: str
    radius: int
    nodes: tuple[Neighbour, ...]  # by distance, then kind, then id
    truncated: tuple[str, ...]  # nodes whose neighbours were cut at `limit`
    graph: nx.MultiDiGraph = field(compare=False, repr=False)


def neighbourhood(db: ReadOnlyDB, experiment: str, *, radius: int = 2, limit: int = 50) -> Neighbourhood:
    """Every node within `radius` edges of an experiment (given by its key or a unique prefix of
    at least 6 characters), edges taken in either direction. Campaign, kernel and device nodes
    are reached but not expanded; at most `limit` neighbours are loaded per node.

    Raises InputError for an unknown or ambiguous experiment, or a radius outside 1..6.
    """
    if isinstance(radius, bool) or not isinstance(radius, int) or not 1 <= radius <= 6:
        raise InputError(f"radius {radius!r} is not an integer from 1 to 6")
    key = _experiment_key(db, experiment)
    b = Graph()
    start = b.experiment(_experiments(db, [key])[0])
    frontier, expanded, truncated = [start], set(), []
    for _ in range(radius):  # nodes at distance d load those at d + 1
        for nid in frontier:
            if _expand(db, b, nid, limit):
                truncated.append(nid)
            expanded.add(nid)
        reached = {n for nid in frontier for n in nx.all_neighbors(b.g, nid)} - expanded
        frontier = sorted(n for n in reached if b.g.nodes[n]["kind"] not in HUBS)
    dist = nx.single_source_shortest_path_length(b.g.to_undirected(as_view=True), start, cutoff=radius)
    sub = b.g.subgraph(dist).copy()
    nodes = sorted((Neighbour(n, sub.nodes[n]["kind"], sub.nodes[n]["label"], d) for n, d in dist.items()),
                   key=lambda x: (x.distance, NODE_KINDS.index(x.kind), x.node))
    return Neighbourhood(start, radius, tuple(nodes), tuple(truncated), sub)


def _experiment_key(db: ReadOnlyDB, given: str) -> str:
    text = given.strip().removeprefix("experiment:")
    if len(text) < 6 or not all(c in "0123456789abcdef" for c in text.lower()):
        raise InputError(f"experiment {given!r} is not an experiment key (hex, at least 6 characters)")
    found = db.rows("SELECT key FROM experiments WHERE key >= ? AND key < ? ORDER BY key LIMIT 2",
                    [text.lower(), text.lower() + "g"])
    if not found:
        raise InputError(f"no experiment {given!r} (see `tilepilot history` for keys)")
    if len(found) > 1 and found[0]["key"] != text.lower():
        raise InputError(f"experiment prefix {given!r} is ambiguous ({found[0]['key']}, {found[1]['key']}, ...)")
    return str(found[0]["key"])


def _expand(db: ReadOnlyDB, b: Graph, nid: str, limit: int) -> bool:
    """Load the neighbours of one node into `b`; True when some were cut at `limit`."""
    kind, _, rest = nid.partition(":")
    if kind == "experiment":
        return _expand_experiment(db, b, nid, rest, limit)
    if kind in ("config", "problem"):
        kernel, _, key = rest.partition(":")
        column = "config_key" if kind == "config" else "problem_key"
        rows = db.rows(_EXPERIMENT + f" WHERE e.kernel = ? AND e.{column} = ? LIMIT ?", [kernel, key, limit + 1])
        for r in rows[:limit]:
            b.experiment(r)
        if kind == "problem":
            _scoped_to(db, b, nid, kernel, b.g.nodes[nid]["params"])
        return len(rows) > limit
    if kind == "hypothesis":
        return _expand_hypothesis(db, b, nid, rest, limit)
    if kind == "learning":
        for x in ledger.select_learnings(db.rows, ids=[rest]):
            b.learning(x)
            for h in ledger.select_hypotheses(db.rows, ids=[x.learning.hypothesis_id]):
                b.hypothesis(h)
    return False


def _expand_experiment(db: ReadOnlyDB, b: Graph, nid: str, key: str, limit: int) -> bool:
    for t in db.rows("SELECT DISTINCT c.name, c.state FROM trials t JOIN campaigns c ON c.id = t.campaign_id "
                     "WHERE t.experiment_key = ? LIMIT ?", [key, limit]):
        b.edge(b.campaign(t["name"], t["state"]), nid, "ran")
    links = [(t["hypothesis_id"], "tests") for t in db.rows(
        "SELECT DISTINCT hypothesis_id FROM trials WHERE experiment_key = ? AND hypothesis_id IS NOT NULL", [key])]
    links += [(e["hypothesis_id"], e["relation"]) for e in db.rows(
        "SELECT hypothesis_id, relation FROM evidence WHERE experiment_a = ? UNION "
        "SELECT hypothesis_id, relation FROM evidence WHERE experiment_b = ?", [key, key])]
    hyps = {h.id: h for h in ledger.select_hypotheses(db.rows, ids=sorted({h for h, _ in links}))}
    for hid, relation in links[:limit]:
        if hid in hyps:
            b.edge(nid, b.hypothesis(hyps[hid]), relation)
    return len(links) > limit


def _expand_hypothesis(db: ReadOnlyDB, b: Graph, nid: str, hid: str, limit: int) -> bool:
    found = ledger.select_hypotheses(db.rows, ids=[hid])
    if not found:
        return False
    b.hypothesis(found[0])
    links = db.rows("SELECT experiment_a AS key, relation FROM evidence WHERE hypothesis_id = ? UNION "
                    "SELECT experiment_b AS key, relation FROM evidence WHERE hypothesis_id = ? UNION "
                    "SELECT experiment_key AS key, 'tests' AS relation FROM trials WHERE hypothesis_id = ? "
                    "LIMIT ?", [hid, hid, hid, limit + 1])
    rows = {r["key"]: r for r in _experiments(db, sorted({x["key"] for x in links[:limit]}))}
    for x in links[:limit]:
        if x["key"] in rows:
            b.edge(b.experiment(rows[x["key"]]), nid, x["relation"])
    for lrn in ledger.select_learnings(db.rows, kernel=found[0].hypothesis.kernel):
        if lrn.learning.hypothesis_id == hid:
            b.learning(lrn)
    return len(links) > limit


def _scoped_to(db: ReadOnlyDB, b: Graph, pid: str, kernel: str, problem: Mapping[str, Value]) -> None:
    for h in ledger.select_hypotheses(db.rows, kernel=kernel):
        if h.hypothesis.scope.contains(problem):
            b.edge(b.hypothesis(h), pid, "applies_to")
    for x in ledger.select_learnings(db.rows, kernel=kernel):
        if x.learning.scope.contains(problem):
            b.edge(b.learning(x), pid, "applies_to")


# ---- checks ------------------------------------------------------------------------------------------------

def _scope(scope: Scope | str | None) -> Scope:
    if scope is None:
        return Scope()
    return Scope.parse(scope) if isinstance(scope, str) else scope


def _check_kernel_device(db: ReadOnlyDB, kernel: str, device: str | None) -> None:
    kernels = [r["kernel"] for r in db.rows("SELECT DISTINCT kernel FROM experiments ORDER BY kernel", [])]
    if kernel not in kernels:
        raise InputError(f"no experiments of kernel {kernel!r} in the store (known: {', '.join(kernels) or 'none'})")
    if device is None:
        return
    devices = [r["device"] for r in db.rows("SELECT DISTINCT device FROM experiments WHERE kernel = ? "
                                            "ORDER BY device", [kernel])]
    if not any(device.lower() in d.lower() for d in devices):
        raise InputError(f"no experiments of {kernel} on a device matching {device!r} (known: {'; '.join(devices)})")


def _check_params(db: ReadOnlyDB, kernel: str, scope: Scope) -> None:
    if not scope.bounds:
        return
    known = problem_fields(db, kernel)
    bad = [p for p in scope.params if p not in known]
    if bad:
        raise InputError(f"unknown problem parameter {bad[0]!r} in the filter (known for {kernel}: "
                         f"{', '.join(known)})")

