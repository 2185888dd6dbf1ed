"""The report as sections of plain text: paragraphs, tables (cells as text) and charts (SVG).

Both renderers (`html`, `markdown`) draw these, so the two formats say the same thing with the
same numbers. Numbers are written with four significant digits (`svg.num`), percentages with
one decimal, times in ms, dates in UTC. Text from users and models stays raw here: each
renderer escapes it for its format.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tilepilot.report.data import EVIDENCE_SHOWN, Report, problem_label
from tilepilot.report.svg import PALETTE, Series, bar_chart, num, xy_chart


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str = ""


@dataclass(frozen=True)
class Chart:
    name: str  # a file name stem: letters, digits, '-'
    svg: str
    alt: str


@dataclass(frozen=True)
class Section:
    title: str
    anchor: str
    paragraphs: tuple[str, ...] = ()
    tables: tuple[Table, ...] = ()
    charts: tuple[Chart, ...] = ()
    items: tuple[str, ...] = field(default=())  # a bulleted list


def sections(r: Report) -> list[Section]:
    return [_tuned(r), _winners(r), _convergence(r), _roofline(r), _effects(r), _hypotheses(r), _learnings(r),
            _failures(r), _cost(r)]


def title(r: Report) -> str:
    return f"tilepilot report: campaign {r.campaign.name}"


def pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def opt(v: float | None, unit: str = "") -> str:
    return "-" if v is None else num(v) + unit


def when(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def cfg(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


# ---- sections ---------------------------------------------------------------------------------

def _tuned(r: Report) -> Section:
    c = r.campaign
    source = {"replay": f"replayed from measurements recorded on {c.device}",
              "interpret": "Triton interpreter on the CPU: CPU timings, not GPU",
              "gpu": f"measured on {c.device}"}.get(c.backend, c.backend)
    facts = Table(("what", "value"), (
        ("kernel", c.kernel), ("proposer", c.proposer), ("backend", f"{c.backend} ({source})"),
        ("device", c.device), ("budget", f"{c.budget} configs per problem"), ("problems", str(len(c.problems))),
        ("trials", str(c.trials)), ("ok", str(c.ok)), ("failed", str(c.failed)), ("seed", str(r.seed)),
        ("state", c.state), ("created", when(c.created_at)), ("finished", when(c.finished_at)),
        ("dataset", c.dataset or "-")))
    chains = Table(("device", "backend", "torch", "triton", "driver", "kernel version", "experiments"),
                   tuple((t.device, t.backend, t.torch, t.triton, t.driver or "-", t.kernel_version, str(t.experiments))
                         for t in r.toolchains), "devices and toolchains of the campaign's experiments")
    problems = Table(("problem", "trials", "counted", "ok", "failed", "reused", "best ms"),
                     tuple((problem_label(p.problem), str(p.trials), str(p.counted), str(p.ok), str(p.failed),
                            str(p.reused), opt(p.best_ms)) for p in c.problems), "problems")
    paragraphs = (c.description,) if c.description else ()
    return Section("What was tuned, and on what", "tuned", paragraphs, (facts, chains, problems))


def _winners(r: Report) -> Section:
    rows = []
    for w in r.winners:
        base = f"{w.speedup_vs_baseline:.2f}x ({w.baseline_name})" if w.speedup_vs_baseline else "-"
        rows.append((problem_label(w.problem), cfg(w.config), num(w.median_ms), pct(w.rel_spread), pct(w.margin),
                     "tie" if w.tie else ("yes" if w.decided else "not declared"),
                     f"{w.speedup_vs_median:.2f}x" if w.speedup_vs_median else "-", base,
                     _roofline_pct(getattr(w, "roofline_pct", None)), f"{w.ok}/{w.trials}"))
    table = Table(("problem", "winner", "median ms", "noise", "margin", "declared", "vs median config", "vs baseline",
                   "roofline", "ok/trials"), tuple(rows))
    text = ("The declared winner per problem: re-measured interleaved with the runner-up; the margin is the "
            "runner-up's time over the winner's, a tie when within the measured noise.")
    return Section("Winners", "winners", (text,) if rows else ("No problem has an ok result yet.",), (table,))


def _roofline_pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}%"


def _convergence(r: Report) -> Section:
    charts, rows = [], []
    for i, points in enumerate(r.convergence.values(), start=1):
        label = problem_label(points[0].problem)
        ok = tuple((float(p.seq), p.median_ms, f"trial {p.seq}: {num(p.median_ms)} ms {cfg(p.config)}")
                   for p in points if p.median_ms is not None)
        steps = tuple((float(p.seq), p.best_so_far_ms, f"best after trial {p.seq}: {num(p.best_so_far_ms)} ms")
                      for p in points if p.best_so_far_ms is not None)
        failed = sum(p.median_ms is None for p in points)
        if ok:
            ys = [y for _, y, _ in ok]
            svg = xy_chart([Series("ok trial", ok, "points", PALETTE[0]), Series("best so far", steps, "step",
                                                                                 PALETTE[1])],
                           title=f"Convergence: {label}", x_label="trial", y_label="median ms",
                           log_y=max(ys) / min(ys) > 20)
            charts.append(Chart(f"convergence-{i}", svg, f"convergence of {label}"))
        final = steps[-1][1] if steps else None
        first = next((p.seq for p in points if p.improved and p.median_ms == final), None)
        rows.append((label, str(len(points)), str(failed), opt(final), "-" if first is None else str(first)))
    table = Table(("problem", "trials", "failed", "best ms", "found at trial"), tuple(rows))
    return Section("Convergence", "convergence", ("The best time so far after each trial, per problem (failed "
                                                  "trials have no time and are not drawn).",), (table,), tuple(charts))


def _roofline(r: Report) -> Section:
    pts = r.roofline
    c = r.ceilings
    headers = ("problem", "FLOP/byte", "TFLOP/s", "GB/s", "bound TFLOP/s", "% of roofline")
    rows = tuple((problem_label(p.problem), num(p.intensity), num(p.tflops), num(p.gbps), opt(p.bound_tflops),
                  _roofline_pct(p.pct)) for p in pts)
    if c is None:
        text = (f"No ceilings measured for {r.campaign.device}: the winners' throughput is shown without a roofline "
                "(ceilings are measured on the GPU: copy bandwidth and the vendor matmul rate).")
        charts: tuple[Chart, ...] = ()
        if pts:
            svg = xy_chart([Series("winners", tuple((p.intensity, p.tflops, f"{problem_label(p.problem)}: "
                                                    f"{num(p.tflops)} TFLOP/s at {num(p.intensity)} FLOP/byte")
                                                   for p in pts))],
                           title="Winners' throughput (no ceilings measured)", x_label="FLOP/byte",
                           y_label="TFLOP/s", log_x=True, log_y=True)
            charts = (Chart("throughput", svg, "winners' throughput"),)
        return Section("Roofline position of the winners", "roofline", (text,), (Table(headers, rows),), charts)
    ridge = c.matmul_tflops * 1e3 / c.copy_gbps
    text = (f"Ceilings of {c.device} (driver {c.driver or '-'}, measured {when(c.measured_at)}): copy "
            f"{num(c.copy_gbps)} GB/s, {c.matmul_dtype} matmul {num(c.matmul_tflops)} TFLOP/s; ridge point "
            f"{num(ridge)} FLOP/byte.")
    if not pts:
        return Section("Roofline position of the winners", "roofline", (text, "No winner to place."))
    xs = [p.intensity for p in pts]
    lo, hi = min(min(xs), ridge) / 4, max(max(xs), ridge) * 4
    steps = [lo * (hi / lo) ** (i / 60) for i in range(61)]
    roof = Series("roofline", tuple((x, min(c.matmul_tflops, c.copy_gbps * x / 1e3), "") for x in steps), "line",
                  "#555555")
    svg = xy_chart([Series("winners", tuple((p.intensity, p.tflops, f"{problem_label(p.problem)}: {num(p.tflops)} "
                                            f"TFLOP/s, {_roofline_pct(p.pct)} of the roofline") for p in pts))],
                   title=f"Roofline: {c.device}", x_label="FLOP/byte", y_label="TFLOP/s", log_x=True, log_y=True,
                   extra=[roof])
    return Section("Roofline position of the winners", "roofline", (text,), (Table(headers, rows),),
                   (Chart("roofline", svg, "roofline position of the winners"),))


def _effects(r: Report) -> Section:
    by_param: dict[str, list[Any]] = {}
    for e in r.effects:
        by_param.setdefault(e.param, []).append(e)
    charts = []
    for i, (param, effects) in enumerate(by_param.items(), start=1):
        bars = [(f"{param}={e.value}", e.rel_time, f"{param}={e.value}: {num(e.rel_time)}x the best, "
                 f"{e.results} result(s), {e.winners} winner(s)") for e in effects]
        charts.append(Chart(f"effect-{i}", bar_chart(bars, title=f"Effect of {param}", x_label="time / best (geomean)",
                                                      reference=1.0), f"effect of {param}"))
    table = Table(("parameter", "value", "ok results", "time / best (geomean)", "winners"),
                  tuple((e.param, str(e.value), str(e.results), num(e.rel_time), str(e.winners)) for e in r.effects))
    text = ("For each parameter value, over the campaign's ok results: the geometric mean of each result's time "
            "over its problem's best time (1 is as fast as the best), and how many winners have that value. "
            "Configs were not drawn independently, so read it as a summary, not a controlled effect (the "
            "hypotheses below compare configs that differ in one parameter).")
    return Section("Effect of each parameter", "effects", (text,), (table,), tuple(charts))


def _hypotheses(r: Report) -> Section:
    rows = []
    items = []
    for h in r.hypotheses:
        d = h.row.as_dict()
        ci = f"{num(d['ci_low'])}-{num(d['ci_high'])}" if d["ci_low"] is not None and d["ci_high"] is not None else "-"
        rows.append((d["id"], d["text"], d["state"], str(d["pairs"]), f"{d['wins']}/{d['losses']}",
                     opt(d["effect"]), ci, str(h.supports), str(h.refutes), d["reason"]))
        for v in h.verdicts:
            items.append(f"{d['id']}: {v.state} at {when(v.decided_at)} after {v.pairs} pair(s) - {v.reason}")
    table = Table(("id", "statement", "verdict", "pairs", "wins/losses", "effect", "95% CI", "supporting",
                   "refuting", "why"), tuple(rows))
    pairs = Table(("hypothesis", "relation", "time b / a", "problem", "a", "b", "a ms", "b ms", "experiments a, b"),
                  tuple((h.row.id, e.relation, num(e.ratio), problem_label(e.problem), _differs(e.config_a, e.config_b),
                         _differs(e.config_b, e.config_a), opt(e.median_a_ms), opt(e.median_b_ms),
                         f"{e.experiment_a[:10]}, {e.experiment_b[:10]}") for h in r.hypotheses for e in h.evidence),
                  f"evidence: the pairs behind each verdict (at most {EVIDENCE_SHOWN} per hypothesis; "
                  "tilepilot show KEY tells all about one experiment)")
    text = ("Each hypothesis compares configs that differ only in one parameter (pairs); the effect is the "
            "geometric mean of time(b) / time(a); the supporting and refuting pairs are its stored evidence.")
    if not rows:
        return Section("Hypotheses, verdicts and evidence", "hypotheses", ("The campaign stated no hypothesis.",))
    return Section("Hypotheses, verdicts and evidence", "hypotheses", (text,),
                   (table, pairs) if pairs.rows else (table,), (), tuple(items))


def _differs(config: dict[str, Any], other: dict[str, Any]) -> str:
    """The parameters in which `config` differs from `other`, as name=value."""
    return " ".join(f"{k}={v}" for k, v in config.items() if other.get(k) != v) or "same"


def _learnings(r: Report) -> Section:
    rows = tuple((x.learning.id, x.learning.text, x.learning.scope.text(), num(x.learning.effect),
                  str(x.learning.pairs), f"torch {x.learning.torch}, triton {x.learning.triton}") for x in r.learnings)
    table = Table(("id", "learning", "scope", "effect", "pairs", "toolchain"), rows)
    paragraphs = [] if rows else ["No validated hypothesis, so no learning yet."]
    if r.model_learnings:
        paragraphs.append("The model's own conclusions (unverified text, as it wrote them):")
    return Section("Learnings", "learnings", tuple(paragraphs), (table,) if rows else (), (), r.model_learnings)


def _failures(r: Report) -> Section:
    table = Table(("status", "trials", "first message"), tuple((s.status, str(s.trials), s.example or "-")
                                                               for s in r.statuses))
    bars = [(s.status, float(s.trials), f"{s.status}: {s.trials} trial(s)") for s in r.statuses]
    failed = sum(s.trials for s in r.statuses if s.status != "ok")
    chart = Chart("statuses", bar_chart(bars, title="Trials by status", x_label="trials"), "trials by status")
    return Section("Failures by status", "failures", (f"{failed} of {r.campaign.trials} trial(s) failed; failed "
                                                      "configs are data: the proposers learn from them.",),
                   (table,), (chart,) if bars else ())


def _cost(r: Report) -> Section:
    c = r.cost
    devices = Table(("device", "backend", "measured results", "GPU-seconds"),
                    tuple((d.device, d.backend, str(d.results), num(d.gpu_seconds)) for d in c.devices))
    models = Table(("model", "calls", "failed", "input tokens", "output tokens", "cache read", "cache write", "cost"),
                   tuple((m.model, str(m.calls), str(m.failed), str(m.input_tokens), str(m.output_tokens),
                          str(m.cache_read_tokens), str(m.cache_creation_tokens), f"${m.cost_usd:.4f}")
                         for m in c.models))
    wall = "-" if c.wall_s is None else f"{num(c.wall_s)} s"
    text = [f"{num(c.gpu_seconds)} GPU-seconds over {c.measured} result(s) measured by this campaign ({c.reused} "
            f"reused from the store, at no cost); model calls ${c.llm_cost_usd:.4f}; wall time {wall}.",
            "GPU-seconds are the time the workers spent timing results (timed_ms, else repetitions x median): "
            "busy time in measurement, a lower bound of the time GPUs were held."]
    e = r.estimate.get("estimate")
    if e:
        a = r.estimate.get("actual") or {}
        ratio = (r.estimate.get("ratio") or {}).get("gpu_seconds")
        usd = e.get("llm_cost_usd")
        model = "model cost unknown" if usd is None else f"model ${usd:.4f}"
        text.append(f"Estimated from the history before it ran: {opt(e.get('gpu_seconds'))} GPU-seconds, {model}; "
                    f"from {e.get('basis', '-')}.")
        if a:
            text.append(f"Actual / estimate (GPU-seconds): {opt(ratio)}.")
    tables = (devices,) + ((models,) if c.models else ())
    return Section("Cost", "cost", tuple(text), tables)
