"""`tilepilot report`: the HTML report renders in headless Chromium (driven as in
test_dashboard_browser: DevTools over a pipe), every number in its tables and plot tooltips is
recomputed here from the store with plain SQL, its plots are drawn SVG, and text from users and
models is shown as text (no markup, no script). The Markdown report says the same.

SYNTHETIC store: a grid campaign replayed on the tiered synthetic dataset of `export_fixture`,
plus model calls and device ceilings written through the Store API with made-up values."""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import replay_fixture
from tests.cli_helpers import sql
from tests.export_fixture import PROBLEMS, tiered_ms
from tilepilot.cli import main
from tilepilot.experiments import DeviceCeilings, Problem
from tilepilot.experiments.llm_call import LlmCall
from tilepilot.kernels.registry import get_family
from tilepilot.storage.store import Store

HOSTILE = "<b id='injected'>bold</b> <script>window.pwned=1</script> **not bold** | [link](javascript:alert(1))"
MODEL_TEXT = "<img src=x onerror=\"window.pwned=2\"> BLOCK_SIZE_K=64 wins when K>=2048"
DEVICE = "synthetic device"


def num(v: float) -> str:
    return f"{v:.4g}"


def label(problem: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in problem.items() if k != "dtype") + f" {problem['dtype']}"


def build(folder: Path, *, ceilings: bool) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(replay_fixture, "PROBLEMS", PROBLEMS[:4])
        mp.setattr(replay_fixture, "synthetic_ms", tiered_ms)
        dataset = replay_fixture.write_dataset(folder / "tiered.jsonl")
    camp = replay_fixture.write_campaign(folder / "rep.toml", name="rep", proposer="grid", budget=24,
                                         extra=f"description = '''{HOSTILE}'''\n")
    db = folder / "r.db"
    assert main(["tune", str(camp), "--backend", "replay", "--dataset", str(dataset), "--db", str(db)]) == 0
    with Store(db) as store:
        cid = store.get_campaign("rep").id
        p = Problem.of(PROBLEMS[0])
        for model, tokens, usd in (("model-a", 1500, 0.021), ("model-a", 900, 0.012), ("model-b", 700, None)):
            store.add_llm_call(cid, LlmCall(ts=1.0, problem_key=p.key(), model=model, input_tokens=tokens,
                                            output_tokens=tokens // 5, cache_read_tokens=0, cache_creation_tokens=0,
                                            cost_usd=usd, stop_reason="end_turn", request_id=None, error="",
                                            duration_ms=5.0, learnings=(MODEL_TEXT,)))
        if ceilings:
            store.set_ceilings(DeviceCeilings(DEVICE, "", copy_gbps=1800.0, matmul_tflops=400.0,
                                              measured_at=1_700_000_000.0))
    return db


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {"plain": build(tmp_path_factory.mktemp("plain"), ceilings=False),
            "ceilings": build(tmp_path_factory.mktemp("ceil"), ceilings=True)}


def write_report(db: Path, folder: Path) -> tuple[Path, Path]:
    html, md = folder / "report.html", folder / "report.md"
    assert main(["report", "rep", "--db", str(db), "--out", str(html), "--markdown", str(md)]) == 0
    return html, md


# ---- the page in Chromium -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.test_dashboard_browser import Chromium

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is not installed: the report's browser tests must run under CI")
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    chromium = Chromium(binary, tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield chromium
    finally:
        chromium.close()


PAGE = """(() => {
  const cells = t => Array.from(t.rows).map(r => Array.from(r.cells).map(c => c.innerText.trim()));
  return {
    title: document.title,
    sections: Array.from(document.querySelectorAll('section')).map(s => ({
      id: s.id, text: s.innerText,
      tables: Array.from(s.querySelectorAll('table')).map(cells),
      charts: Array.from(s.querySelectorAll('figure')).map(f => {
        const svg = f.querySelector('svg'); const box = svg.getBoundingClientRect();
        return {name: f.dataset.chart, width: box.width, height: box.height,
                drawn: Array.from(svg.querySelectorAll('circle, rect, path')).filter(e => {
                  const b = e.getBBox(); return b.width > 0 || b.height > 0; }).length,
                tips: Array.from(svg.querySelectorAll('circle > title, rect > title')).map(t => t.textContent)};
      })})),
    body: document.body.innerText,
    active: document.querySelectorAll('script, img, iframe, object, embed, [onerror], [onload], #injected').length,
    pwned: window.pwned === undefined ? null : window.pwned,
  };
})()"""


def page(browser: Any, html: Path) -> dict[str, Any]:
    session = browser.open(html.resolve().as_uri())
    browser.wait_for(session, "Cost", timeout=30)
    return browser.eval(session, PAGE)


def section(doc: dict[str, Any], anchor: str) -> dict[str, Any]:
    return next(s for s in doc["sections"] if s["id"] == anchor)


def rows_by_first(table: list[list[str]]) -> dict[str, dict[str, str]]:
    head = table[0]
    return {r[0]: dict(zip(head, r, strict=True)) for r in table[1:]}


@pytest.fixture(scope="module")
def rendered(stores: dict[str, Path], browser: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = {}
    for name, db in stores.items():
        html, md = write_report(db, tmp_path_factory.mktemp(f"report-{name}"))
        out[name] = {"db": db, "doc": page(browser, html), "md": md}
    return out


def test_report_renders_every_section_with_drawn_plots(rendered):
    doc = rendered["plain"]["doc"]
    assert doc["title"] == "tilepilot report: campaign rep"
    assert [s["id"] for s in doc["sections"]] == ["tuned", "winners", "convergence", "roofline", "effects",
                                                  "hypotheses", "learnings", "failures", "cost"]
    charts = [c for s in doc["sections"] for c in s["charts"]]
    assert len(charts) >= len(PROBLEMS[:4]) + 6 + 1  # convergence per problem, 6 parameters, statuses
    for c in charts:
        assert c["width"] > 100 and c["height"] > 50 and c["drawn"] > 0, c


def test_user_and_model_text_is_shown_as_text(rendered):
    for r in rendered.values():
        doc = r["doc"]
        assert doc["active"] == 0 and doc["pwned"] is None
        assert HOSTILE in section(doc, "tuned")["text"]
        assert MODEL_TEXT in section(doc, "learnings")["text"]


def test_winner_and_problem_numbers_match_the_store(rendered):
    doc, db = rendered["plain"]["doc"], rendered["plain"]["db"]
    winners = rows_by_first(section(doc, "winners")["tables"][0])
    stored = sql(db, "SELECT w.*, e.problem, e.config FROM winners w JOIN experiments e ON e.key = w.experiment_key")
    assert len(winners) == len(stored) == len(PROBLEMS[:4])
    for w in stored:
        row = winners[label(json.loads(w["problem"]))]
        trials = sql(db, "SELECT r.status, r.median_ms FROM trials t JOIN results r ON r.experiment_key = "
                         "t.experiment_key WHERE t.problem_key = ?", (w["problem_key"],))
        ok = [t["median_ms"] for t in trials if t["status"] == "ok"]
        assert row["median ms"] == num(w["median_ms"])
        assert row["winner"] == " ".join(f"{k}={v}" for k, v in json.loads(w["config"]).items())
        assert row["noise"] == f"{100 * w['rel_spread']:.1f}%" and row["margin"] == f"{100 * w['margin']:.1f}%"
        assert row["vs median config"] == f"{statistics.median(ok) / w['median_ms']:.2f}x"
        assert row["ok/trials"] == f"{len(ok)}/{len(trials)}"
        assert row["declared"] == ("tie" if w["tie"] else "yes")
    problems = rows_by_first(section(doc, "tuned")["tables"][2])
    for p in PROBLEMS[:4]:
        trials = sql(db, "SELECT r.status, r.median_ms FROM trials t JOIN results r ON r.experiment_key = "
                         "t.experiment_key JOIN experiments e ON e.key = t.experiment_key WHERE e.problem = ?",
                     (json.dumps(p),))
        ok = [t["median_ms"] for t in trials if t["status"] == "ok"]
        row = problems[label(p)]
        assert (row["trials"], row["ok"], row["failed"]) == (str(len(trials)), str(len(ok)), str(len(trials) - len(ok)))
        assert row["best ms"] == num(min(ok))


def test_convergence_plots_each_ok_trial_and_the_best_so_far(rendered):
    doc, db = rendered["plain"]["doc"], rendered["plain"]["db"]
    conv = section(doc, "convergence")
    table = rows_by_first(conv["tables"][0])
    by_title = {c["name"]: c for c in conv["charts"]}
    for i, p in enumerate(PROBLEMS[:4], start=1):
        trials = sql(db, "SELECT t.seq, r.status, r.median_ms FROM trials t JOIN results r ON r.experiment_key = "
                         "t.experiment_key JOIN experiments e ON e.key = t.experiment_key WHERE e.problem = ? "
                         "ORDER BY t.seq", (json.dumps(p),))
        ok = [t for t in trials if t["status"] == "ok"]
        best = min(t["median_ms"] for t in ok)
        row = table[label(p)]
        assert row["best ms"] == num(best) and row["failed"] == str(len(trials) - len(ok))
        assert row["found at trial"] == str(next(t["seq"] for t in ok if t["median_ms"] == best))
        tips = by_title[f"convergence-{i}"]["tips"]
        points = [t for t in tips if t.startswith("trial ")]
        assert sorted(t.split(":")[0] for t in points) == sorted(f"trial {t['seq']}" for t in ok)
        for t in ok:
            assert any(x.startswith(f"trial {t['seq']}: {num(t['median_ms'])} ms") for x in points)
        running, expected = math.inf, []
        for t in trials:  # a failed trial keeps the best so far
            if t["status"] == "ok":
                running = min(running, t["median_ms"])
            if running < math.inf:
                expected.append(f"best after trial {t['seq']}: {num(running)} ms")
        assert [t for t in tips if t.startswith("best after")] == expected


def test_parameter_effects_match_the_store(rendered):
    doc, db = rendered["plain"]["doc"], rendered["plain"]["db"]
    ok = sql(db, "SELECT t.problem_key, e.config, r.median_ms FROM trials t JOIN results r ON r.experiment_key = "
                 "t.experiment_key JOIN experiments e ON e.key = t.experiment_key WHERE r.status = 'ok'")
    best = defaultdict(lambda: math.inf)
    for r in ok:
        best[r["problem_key"]] = min(best[r["problem_key"]], r["median_ms"])
    logs = defaultdict(list)
    for r in ok:
        for k, v in json.loads(r["config"]).items():
            logs[(k, str(v))].append(math.log(r["median_ms"] / best[r["problem_key"]]))
    winners = defaultdict(int)
    for w in sql(db, "SELECT e.config FROM winners w JOIN experiments e ON e.key = w.experiment_key"):
        for k, v in json.loads(w["config"]).items():
            winners[(k, str(v))] += 1
    table = section(doc, "effects")["tables"][0]
    assert len(table) - 1 == len(logs)
    for param, value, n, rel, won in table[1:]:
        xs = logs[(param, value)]
        assert (n, rel, won) == (str(len(xs)), num(math.exp(sum(xs) / len(xs))), str(winners[(param, value)]))


def test_failures_hypotheses_and_cost_match_the_store(rendered):
    doc, db = rendered["plain"]["doc"], rendered["plain"]["db"]
    statuses = rows_by_first(section(doc, "failures")["tables"][0])
    for r in sql(db, "SELECT r.status, COUNT(*) AS n, MIN(t.id) AS first FROM trials t JOIN results r ON "
                     "r.experiment_key = t.experiment_key GROUP BY r.status"):
        msg = sql(db, "SELECT r.message FROM trials t JOIN results r ON r.experiment_key = t.experiment_key "
                      "WHERE t.id = ?", (r["first"],))[0]["message"]
        assert statuses[r["status"]]["trials"] == str(r["n"]) and statuses[r["status"]]["first message"] == (msg or "-")
    assert "out_of_resources" in statuses  # the fixture has failures
    hyps = rows_by_first(section(doc, "hypotheses")["tables"][0])
    stored = sql(db, "SELECT h.*, (SELECT COUNT(*) FROM evidence v WHERE v.hypothesis_id = h.id AND v.relation = "
                     "'supports') AS sup, (SELECT COUNT(*) FROM evidence v WHERE v.hypothesis_id = h.id AND "
                     "v.relation = 'refutes') AS ref FROM hypotheses h")
    assert len(hyps) == len(stored) > 0
    for h in stored:
        row = hyps[h["id"]]
        assert (row["statement"], row["verdict"], row["pairs"]) == (h["text"], h["state"], str(h["pairs"]))
        assert (row["supporting"], row["refuting"]) == (str(h["sup"]), str(h["ref"]))
        assert row["effect"] == ("-" if h["effect"] is None else num(h["effect"]))
    pairs = section(doc, "hypotheses")["tables"][1][1:]
    evidence = sql(db, "SELECT hypothesis_id, relation, ratio, experiment_a, experiment_b FROM evidence")
    shown = {(p[0], p[1], p[2], p[8]) for p in pairs}
    assert shown == {(e["hypothesis_id"], e["relation"], num(e["ratio"]),
                      f"{e['experiment_a'][:10]}, {e['experiment_b'][:10]}") for e in evidence}  # < 8 per hypothesis
    cost = section(doc, "cost")
    devices = rows_by_first(cost["tables"][0])
    gpu = sum(r["reps"] * r["median_ms"] / 1e3 for r in sql(
        db, "SELECT r.reps, r.median_ms FROM trials t JOIN results r ON r.experiment_key = t.experiment_key "
            "WHERE t.reused = 0 AND r.status = 'ok'"))
    measured = sql(db, "SELECT COUNT(*) AS n FROM trials t JOIN results r ON r.experiment_key = t.experiment_key "
                       "WHERE t.reused = 0 AND r.status != 'invalid'")[0]["n"]
    assert devices[DEVICE]["GPU-seconds"] == num(gpu) and devices[DEVICE]["measured results"] == str(measured)
    models = rows_by_first(cost["tables"][1])
    assert models["model-a"]["calls"] == "2" and models["model-a"]["input tokens"] == "2400"
    assert models["model-a"]["cost"] == "$0.0330" and models["model-b"]["cost"] == "$0.0000"
    assert f"{num(gpu)} GPU-seconds over {measured} result(s)" in cost["text"]


def test_roofline_says_no_ceilings_measured_without_them(rendered):
    roof = section(rendered["plain"]["doc"], "roofline")
    assert f"No ceilings measured for {DEVICE}" in roof["text"]
    assert all(r[-1] == "-" for r in roof["tables"][0][1:])


def test_roofline_places_each_winner_against_the_measured_ceilings(rendered):
    doc, db = rendered["ceilings"]["doc"], rendered["ceilings"]["db"]
    roof = section(doc, "roofline")
    assert "copy 1800 GB/s, bf16 matmul 400 TFLOP/s; ridge point 222.2 FLOP/byte" in roof["text"]
    table = rows_by_first(roof["tables"][0])
    family = get_family("matmul")
    for w in sql(db, "SELECT w.median_ms, e.problem FROM winners w JOIN experiments e ON e.key = w.experiment_key"):
        problem = json.loads(w["problem"])
        work = family.work(family.parse_problem(problem))
        seconds = w["median_ms"] / 1e3
        bound_ms = max(work.flops / 400e12, work.bytes / 1800e9) * 1e3
        row = table[label(problem)]
        assert row["FLOP/byte"] == num(work.flops / work.bytes) and row["TFLOP/s"] == num(work.flops / seconds / 1e12)
        assert row["% of roofline"] == f"{100 * bound_ms / w['median_ms']:.1f}%"
    (chart,) = roof["charts"]
    assert chart["name"] == "roofline" and len(chart["tips"]) == len(table)


def test_markdown_report_says_the_same_and_writes_its_plots(rendered):
    r = rendered["plain"]
    text = r["md"].read_text()
    doc = r["doc"]
    assert text.startswith("# tilepilot report: campaign rep\n")
    for row in section(doc, "winners")["tables"][0][1:]:
        assert row[2] in text and row[0] in text  # median ms, problem
    assert "<b id" not in text and "<script>" not in text and "&lt;b id='injected'&gt;" in text
    assert "\\| \\[link\\]" in text  # a table separator or a link in user text is escaped
    folder = r["md"].with_name("report_files")
    svgs = sorted(folder.glob("*.svg"))
    charts = [c["name"] for s in doc["sections"] for c in s["charts"]]
    assert sorted(p.stem for p in svgs) == sorted(charts)
    for p in svgs:
        assert ET.parse(p).getroot().tag == "{http://www.w3.org/2000/svg}svg"
        assert f"](report_files/{p.name})" in text


def test_report_mistakes_are_one_line(stores, tmp_path, capsys):
    capsys.readouterr()
    assert main(["report", "nope", "--db", str(stores["plain"])]) == 2
    assert "'nope'" in capsys.readouterr().err
    assert main(["report", "rep", "--db", str(stores["plain"]), "--out", str(tmp_path / "no" / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
    assert main(["report", "rep", "--db", str(stores["plain"])]) == 0  # Markdown on standard output
    out = capsys.readouterr().out
    assert out.startswith("# tilepilot report: campaign rep") and "see the HTML report" in out
