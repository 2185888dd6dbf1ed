"""The knowledge graph built from the store's rows: node and edge kinds, the queries, the
`tilepilot graph` command, and query times on a generated 100k-experiment store.

The campaign data is SYNTHETIC (tests/hypothesis_fixture.py); the 100k store is generated rows.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import networkx as nx
import pytest

from tests import hypothesis_fixture as fx
from tests.replay_fixture import write_campaign
from tilepilot.cli import main
from tilepilot.experiments import Campaign, HypothesisState, InputError
from tilepilot.orchestrator.tune import TuneOptions, tune
from tilepilot.storage import Store, graph, ledger, open_db
from tilepilot.storage.graph import EDGE_KINDS, NODE_KINDS


@pytest.fixture(scope="module")
def db_path(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("graph")
    dataset = fx.write_dataset(tmp / "matmul-synthetic.jsonl")
    tune(TuneOptions(campaign=write_campaign(tmp / "c.toml", name="g", proposer="random", budget=24,
                                             extra="hypothesis_share = 0.25\n"),
                     backend="replay", dataset=dataset, db=tmp / "t.db"))
    return tmp / "t.db"


@pytest.fixture()
def db(db_path):
    with open_db(db_path) as handle:
        yield handle


def _validated(db) -> ledger.HypothesisRow:
    rows = ledger.hypotheses(db, state="validated")
    assert rows, "the synthetic campaign validates at least one hypothesis"
    return rows[0]


def test_whole_graph_has_every_node_and_edge_kind(db):
    g = graph.build_graph(db)
    kinds = {d["kind"] for _, d in g.nodes(data=True)}
    assert kinds == set(NODE_KINDS)
    edges = {k for _, _, k in g.edges(keys=True)}
    assert {"ran", "tests", "supports", "applies_to", "learned_from"} <= edges <= set(EDGE_KINDS)
    n_exp = db.rows("SELECT COUNT(*) AS n FROM experiments", [])[0]["n"]
    assert sum(d["kind"] == "experiment" for _, d in g.nodes(data=True)) == n_exp
    for u, v, k in g.edges(keys=True):
        ku, kv = g.nodes[u]["kind"], g.nodes[v]["kind"]
        if k in ("supports", "refutes", "tests"):
            assert (ku, kv) == ("experiment", "hypothesis")
        if k == "learned_from":
            assert (ku, kv) == ("learning", "hypothesis")


def test_export_is_node_link_json_that_loads_back(db, tmp_path):
    g = graph.build_graph(db)
    path = graph.export(g, tmp_path / "g.json")
    data = json.loads(path.read_text())
    assert "edges" in data and "links" not in data
    back = graph.load_export(path)
    assert back.number_of_nodes() == g.number_of_nodes() and back.number_of_edges() == g.number_of_edges()
    with pytest.raises(InputError, match="cannot write"):
        graph.export(g, tmp_path / "missing" / "g.json")


def test_knowledge_keeps_problems_hypotheses_and_learnings_in_scope(db):
    k = graph.knowledge(db, kernel="matmul", device="synthetic", scope="M<=64")
    assert {p.problem["M"] for p in k.problems} == {16, 32, 64}
    for p in k.problems:
        ok = db.rows("SELECT MIN(r.median_ms) AS m FROM experiments e JOIN results r ON r.experiment_key = e.key "
                     "WHERE e.problem_key = ? AND r.status = 'ok'", [p.problem_key])[0]["m"]
        assert p.best_ms == ok and p.best_config is not None
    everything = ledger.hypotheses(db)
    assert {h.id for h in k.hypotheses} == {h.id for h in everything if h.hypothesis.scope.overlaps(k.scope)}
    assert all(x.learning.scope.overlaps(k.scope) for x in k.learnings)
    assert {d["kind"] for _, d in k.graph.nodes(data=True)} >= {"problem", "experiment", "hypothesis"}
    nothing = graph.knowledge(db, kernel="matmul", scope="M>=100000")
    assert nothing.problems == ()


@pytest.mark.parametrize("kw,match", [
    ({"kernel": "softmax"}, "no experiments of kernel 'softmax'"),
    ({"kernel": "matmul", "device": "H200"}, "no experiments of matmul on a device matching 'H200'"),
    ({"kernel": "matmul", "scope": "Q<=3"}, "unknown problem parameter 'Q'"),
    ({"kernel": "matmul", "scope": "M<=abc"}, "'abc' is not a number"),
])
def test_knowledge_rejects_bad_filters_in_one_line(db, kw, match):
    with pytest.raises(InputError, match=match) as e:
        graph.knowledge(db, **kw)
    assert "\n" not in str(e.value)


def test_support_lists_the_experiments_that_support_a_hypothesis(db):
    h = _validated(db)
    s = graph.support(db, h.id, relation="supports")
    assert s.evidence and all(e.relation == "supports" and e.ratio > 1 for e in s.evidence)
    hid = f"hypothesis:{h.id}"
    supporters = {u for u, _, k in s.graph.in_edges(hid, keys=True) if k == "supports"}
    assert supporters == {f"experiment:{k}" for e in s.evidence for k in (e.experiment_a, e.experiment_b)}
    with pytest.raises(InputError, match="no hypothesis"):
        graph.support(db, "H-00000000")


def test_neighbourhood_is_a_cut_off_search_around_an_experiment(db):
    h = _validated(db)
    key = graph.support(db, h.id).evidence[0].experiment_a
    one = graph.neighbourhood(db, key[:10], radius=1)
    assert one.center == f"experiment:{key}" and max(n.distance for n in one.nodes) == 1
    kinds = {n.kind for n in one.nodes if n.distance == 1}
    assert {"problem", "config", "device", "kernel", "campaign", "hypothesis"} <= kinds
    two = graph.neighbourhood(db, key, radius=2)
    assert {n.node for n in one.nodes} < {n.node for n in two.nodes}
    und = two.graph.to_undirected(as_view=True)
    lengths = nx.single_source_shortest_path_length(und, two.center)
    assert all(lengths[n.node] == n.distance <= 2 for n in two.nodes)
    same_problem = db.rows("SELECT COUNT(*) AS n FROM experiments WHERE problem_key = "
                           "(SELECT problem_key FROM experiments WHERE key = ?)", [key])[0]["n"]
    assert sum(n.kind == "experiment" for n in two.nodes) >= same_problem  # via the problem node
    capped = graph.neighbourhood(db, key, radius=2, limit=3)
    assert capped.truncated and len(capped.nodes) < len(two.nodes)


@pytest.mark.parametrize("given,match", [("zz", "not an experiment key"), ("abcdef12", "no experiment"),
                                         ("0" * 32, "no experiment")])
def test_neighbourhood_of_an_unknown_experiment_is_an_input_error(db, given, match):
    with pytest.raises(InputError, match=match):
        graph.neighbourhood(db, given)


def test_learnings_that_apply_to_a_new_problem(db):
    problem = {"M": 48, "N": 4096, "K": 4096, "dtype": "bf16"}  # not in the campaign
    rows, g = graph.learnings_for(db, kernel="matmul", problem=problem)
    every = ledger.learnings(db)
    assert {x.id for x in rows} == {x.id for x in every if x.learning.scope.contains(problem)}
    assert all(x.learning.applies_to("matmul", "synthetic", problem) for x in rows)
    assert graph.learnings_for(db, kernel="matmul", problem=problem, device="H200")[0] == []
    for x in rows:
        assert g.has_edge(f"learning:{x.id}", f"hypothesis:{x.learning.hypothesis_id}", key="learned_from")


# ---- the command ---------------------------------------------------------------------------------

def test_cli_graph_knowledge_table_and_json(db_path, capsys):
    assert main(["graph", "--db", str(db_path), "--kernel", "matmul", "--device", "synthetic",
                 "--problem", "M<=64"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("matmul on devices matching 'synthetic', M ≤ 64: 3 problem(s)")
    assert "hypotheses:" in out and "learnings:" in out and "M=16 N=4096 K=4096 dtype=bf16" in out
    assert main(["graph", "--db", str(db_path), "--kernel", "matmul", "--problem", "M<=64", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {p["problem"]["M"] for p in doc["problems"]} == {16, 32, 64}
    assert all(h["state"] in {s.value for s in HypothesisState} for h in doc["hypotheses"])


def test_cli_graph_hypothesis_experiment_learnings_and_export(db_path, tmp_path, capsys):
    with open_db(db_path) as handle:
        h = _validated(handle)
        key = graph.support(handle, h.id).evidence[0].experiment_a
    assert main(["graph", "--db", str(db_path), "--hypothesis", h.id, "--relation", "supports"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{h.id} (validated)") and "supports" in out and key in out
    assert main(["graph", "--db", str(db_path), "--experiment", key[:8], "--radius", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["center"] == f"experiment:{key}" and {n["distance"] for n in doc["nodes"]} == {0, 1}
    assert main(["graph", "--db", str(db_path), "--kernel", "matmul",
                 "--learnings-for", "M=48,N=4096,K=4096,dtype=bf16"]) == 0
    assert "learning(s) apply to matmul" in capsys.readouterr().out
    assert main(["graph", "--db", str(db_path), "--export", str(tmp_path / "all.json")]) == 0
    assert "wrote" in capsys.readouterr().err
    assert graph.load_export(tmp_path / "all.json").number_of_nodes() > 0


@pytest.mark.parametrize("argv,match", [
    (["--kernel", "matmul", "--problem", "M<=abc"], "'abc' is not a number"),
    (["--kernel", "matmul", "--problem", "M=>3"], "unknown operator"),
    (["--hypothesis", "H-nope"], "no hypothesis 'H-nope'"),
    (["--experiment", "xyz"], "not an experiment key"),
    (["--experiment", "abcdef", "--radius", "9"], "radius 9 is not an integer from 1 to 6"),
    (["--learnings-for", "M<=4", "--kernel", "matmul"], "is not KEY=VALUE pairs"),
    (["--learnings-for", "M=4"], "needs --kernel"),
    (["--relation", "supports", "--kernel", "matmul"], "--relation goes with --hypothesis"),
    (["--hypothesis", "H-1", "--relation", "maybe"], "invalid choice"),
    ([], "needs --kernel, --hypothesis"),
])
def test_cli_graph_errors_are_one_line_and_exit_2(db_path, capsys, argv, match):
    assert main(["graph", "--db", str(db_path), *argv]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1


def test_cli_graph_on_a_missing_database_is_one_line(tmp_path, capsys):
    assert main(["graph", "--db", str(tmp_path / "none.db"), "--kernel", "matmul"]) == 2
    assert "no tilepilot database" in capsys.readouterr().err


# ---- 100k experiments ----------------------------------------------------------------------------

def _generate(path: Path, n_problems: int = 625, n_configs: int = 160) -> dict[str, str]:
    """A store with n_problems x n_configs experiments (ok results, one trial each), 200 hypotheses
    with 10 evidence pairs each and 50 learnings, written in bulk."""
    rng = random.Random(0)
    store = Store(path)
    cid = store.create_campaign(Campaign("big", "matmul", "random", n_configs, 0, ()), backend="replay",
                                dataset="", device="NVIDIA H100 80GB HBM3")
    problems = [{"M": 16 * (1 + i // 25), "N": 4096, "K": 256 * (1 + i % 25), "dtype": "bf16"}
                for i in range(n_problems)]
    configs = [{"BLOCK_SIZE_M": 16 * (1 + j % 8), "BLOCK_SIZE_N": 64 * (1 + j // 8 % 4), "num_warps": 4,
                "num_stages": 2 + j // 32} for j in range(n_configs)]
    pj = [(json.dumps(p), json.dumps(p, sort_keys=True, separators=(",", ":"))) for p in problems]
    cj = [(json.dumps(c), json.dumps(c, sort_keys=True, separators=(",", ":"))) for c in configs]
    exps, results, trials = [], [], []
    for i, (p, pk) in enumerate(pj):
        for j, (c, ck) in enumerate(cj):
            key = f"{i * n_configs + j:032x}"
            exps.append((key, "matmul", "v", p, pk, c, ck, "replay", "NVIDIA H100 80GB HBM3", "2.11", "3.6", 0.0))
            ms = rng.uniform(0.01, 1.0)
            results.append((key, "ok", ms, ms * 0.99, ms * 1.01, ms * 0.98, 50, 0.02, 0.0))
            trials.append((cid, pk, key, j + 1, "random", 0.0))
    hyps, evidence, learnings = [], [], []
    for h in range(200):
        hid = f"H-{h:08x}"
        scope = json.dumps([["M", "<=", 16 * (1 + h % 25)]])
        hyps.append((hid, cid, hid, "matmul", "NVIDIA H100 80GB HBM3", "num_stages", "3", "2", scope, f"h{h}",
                     "miner", "validated" if h < 50 else "ruled_out", 10, 0.0, 0.0))
        for _ in range(10):
            i = rng.randrange(n_problems)
            a, b = i * n_configs + rng.randrange(32), i * n_configs + 32 + rng.randrange(32)
            evidence.append((hid, f"{a:032x}", f"{b:032x}", pj[i][1], 1.1, "supports", 0.0))
        if h < 50:
            learnings.append((f"L-{h:08x}", hid, "matmul", "NVIDIA H100 80GB HBM3", "2.11", "3.6", scope,
                              f"learning {h}", 1.1, 10, 0.0))
    with store.transaction():
        c = store.db.conn
        c.executemany("INSERT INTO experiments (key, kernel, kernel_version, problem, problem_key, config, "
                      "config_key, backend, device, torch, triton, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", exps)
        c.executemany("INSERT INTO results (experiment_key, status, median_ms, p20_ms, p80_ms, min_ms, reps, "
                      "rel_spread, measured_at) VALUES (?,?,?,?,?,?,?,?,?)", results)
        c.executemany("INSERT INTO trials (campaign_id, problem_key, experiment_key, seq, proposer, created_at) "
                      "VALUES (?,?,?,?,?,?)", trials)
        c.executemany("INSERT INTO hypotheses (id, campaign_id, statement_key, kernel, device, param, value_a, "
                      "value_b, scope, text, source, state, pairs, created_at, updated_at) "
                      "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", hyps)
        c.executemany("INSERT INTO evidence VALUES (?,?,?,?,?,?,?)", evidence)
        c.executemany("INSERT INTO learnings VALUES (?,?,?,?,?,?,?,?,?,?,?)", learnings)
    store.close()
    return {"experiment": exps[12345][0], "hypothesis": hyps[7][0]}


@pytest.mark.slow
def test_graph_queries_stay_fast_at_100k_experiments(tmp_path):
    names = _generate(tmp_path / "big.db")
    with open_db(tmp_path / "big.db") as db:
        assert db.rows("SELECT COUNT(*) AS n FROM experiments", [])[0]["n"] == 100_000
        timings = {}
        t = time.perf_counter()
        k = graph.knowledge(db, kernel="matmul", device="H100", scope="M<=64")
        timings["knowledge"] = time.perf_counter() - t
        assert len(k.problems) == 4 * 25 and len(k.hypotheses) == 200 and len(k.learnings) == 50
        t = time.perf_counter()
        s = graph.support(db, names["hypothesis"])
        timings["support"] = time.perf_counter() - t
        assert len(s.evidence) == 10
        t = time.perf_counter()
        n = graph.neighbourhood(db, names["experiment"], radius=2)
        timings["neighbourhood"] = time.perf_counter() - t
        assert n.truncated and len(n.nodes) < 1000  # capped per node, never the whole store
        t = time.perf_counter()
        rows, _ = graph.learnings_for(db, kernel="matmul", problem={"M": 48, "N": 4096, "K": 512, "dtype": "bf16"})
        timings["learnings_for"] = time.perf_counter() - t
        assert len(rows) == 46  # scopes M <= 16 * (1 + h % 25): all but h % 25 in (0, 1)
    print(timings)
    assert max(timings.values()) < 2.0, timings
