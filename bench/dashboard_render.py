"""How long each dashboard page takes to render with 100k experiments in the store.

    .venv/bin/python bench/dashboard_render.py [--experiments 100000] [--repeats 3] [--db PATH]
                                               [--out bench/results/dashboard-render.json]

1. Builds a store of `--experiments` experiments through the `Store` API, as campaign drivers
   would have written it (every write a `Store` method or `storage.cost.record_actual`, grouped in
   `Store.transaction()` blocks of `BATCH` experiments; no raw insert). SYNTHETIC: every timing,
   reading, message and ceiling in it is made
   up from a simple model (`synthetic_ms`); nothing was measured. Its shape is that of a busy
   store: one running gpu campaign holding 40% of the experiments (25 problems), finished
   campaigns for the rest (matmul and softmax, two devices, gpu and replay), a queue row per
   trial (done) plus a live queue, an event per result, queue re-orderings, hypotheses with
   verdicts and evidence, learnings, calls to a model, and NVML samples of 2 nodes × 4 GPUs over
   the last 30 minutes.
2. Renders every page with Streamlit's AppTest (the full script: page, filters and the live
   fragment's first run) `--repeats` times and keeps the median and the worst of three runs:
   `first`: every Streamlit cache emptied (data and resources: the server just started, nothing
   read yet); `refresh`: a new trial of the running campaign written through the `Store`, then
   `data.TTL_S` waited, so that every short-lived query has expired: what each live refresh of
   an open page costs while a campaign runs; `warm`: the same page again at once.
   This is server-side time on the CPU; the browser's drawing is not included.
   With `--browser`, also each page in headless Chromium against a real `tilepilot dashboard`
   server, until its content shows and its charts have drawn (`time_browser`), `--browser-runs`
   servers one after the other.
3. Writes `--out` (JSON): the machine, versions, date, command, store size, the load average
   before and after, and per-page seconds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_env import git, machine  # noqa: E402
from tilepilot.experiments import (  # noqa: E402
    Campaign,
    Candidate,
    Config,
    DeviceCeilings,
    Environment,
    Evidence,
    GpuSample,
    Hypothesis,
    HypothesisState,
    Learning,
    Problem,
    Result,
    Scope,
    Status,
    Telemetry,
    Timing,
    Verdict,
    experiment_key,
)
from tilepilot.experiments.llm_call import LlmCall  # noqa: E402
from tilepilot.kernels.registry import get_family  # noqa: E402
from tilepilot.storage import Store, WinnerRow  # noqa: E402
from tilepilot.storage.cost import record_actual  # noqa: E402

log = logging.getLogger("dashboard_render")

APP = ROOT / "tilepilot" / "dashboard" / "app.py"
OUT = ROOT / "bench" / "results" / "dashboard-render.json"
BATCH = 500  # experiments per write transaction
VERSION = "1+synthetic"
H100 = Environment("gpu", "NVIDIA H100 80GB HBM3", "2.11.0", "3.6.0", "570.86")
H200 = Environment("gpu", "NVIDIA H200", "2.11.0", "3.6.0", "570.86")
CEILINGS = {H100.device: (2900.0, 700.0), H200.device: (4000.0, 720.0)}  # copy GB/s, bf16 TFLOP/s: SYNTHETIC
NODES = (("node-a", 4), ("node-b", 4))
RUNNING_SHARE = 0.4
RUNNING_PROBLEMS = 25
FINISHED_PROBLEMS, FINISHED_TRIALS = 30, 160
LIVE_QUEUE = 300
PAGES = {"overview": "Overview", "gpus": "GPUs", "queue": "Queue", "experiments": "Experiments",
         "hypotheses": "Hypotheses", "graph": "Knowledge graph", "log": "Log"}  # file: title


# ---- the synthetic store -------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    name: str
    kernel: str
    env: Environment
    problems: tuple[Problem, ...]
    trials: int  # per problem
    budget: int
    proposer: str
    running: bool


def matmul_problems(n: int, rng: random.Random) -> tuple[Problem, ...]:
    shapes = [(m, nn, k) for m in (1, 16, 64, 256, 1024, 4096, 16384) for nn in (1024, 4096, 14336)
              for k in (1024, 4096, 8192)]
    rng.shuffle(shapes)
    return tuple(Problem.of({"M": m, "N": nn, "K": k, "dtype": "bf16"}) for m, nn, k in shapes[:n])


def softmax_problems(n: int, rng: random.Random) -> tuple[Problem, ...]:
    shapes = [(r, c) for r in (1, 64, 512, 4096, 16384, 32768) for c in (256, 1024, 4096, 8192, 16384, 32000)]
    rng.shuffle(shapes)
    return tuple(Problem.of({"rows": r, "cols": c, "dtype": "bf16"}) for r, c in shapes[:n])


def plans(experiments: int, rng: random.Random) -> list[Plan]:
    big = int(experiments * RUNNING_SHARE) // RUNNING_PROBLEMS
    out = [Plan("mm-big", "matmul", H100, matmul_problems(RUNNING_PROBLEMS, rng), big, big + 400, "portfolio",
                True)]
    left = experiments - big * RUNNING_PROBLEMS
    i = 0
    while left > 0:
        per = min(FINISHED_TRIALS, max(1, left // FINISHED_PROBLEMS))
        count = min(FINISHED_PROBLEMS, math.ceil(left / per))
        kernel = "softmax" if i % 4 == 3 else "matmul"
        problems = (softmax_problems if kernel == "softmax" else matmul_problems)(count, rng)
        env = (H100, H200, Environment("replay", H100.device, "2.11.0", "3.6.0", "570.86"))[i % 3]
        out.append(Plan(f"{kernel[:2]}-{i:02d}", kernel, env, problems, per, per,
                        ("optuna", "rules", "grid", "llm")[i % 4], False))
        left -= per * count
        i += 1
    return out


def synthetic_ms(kernel: str, problem: Problem, config: Config, device: str, rng: random.Random) -> float:
    """SYNTHETIC: the roofline time of the problem on the device, times made-up penalties per
    parameter value, times noise."""
    work = get_family(kernel).work(problem)
    gbps, tflops = CEILINGS[device]
    ideal = max(work.flops / (tflops * 1e12), work.bytes / (gbps * 1e9)) * 1e3
    c = config.as_dict()
    penalty = 1.15
    for name, value in c.items():
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            penalty *= 1 + 0.07 * abs(math.log2(value) - {"num_stages": 2, "num_warps": 2}.get(name, 6)) / 2
    return ideal * penalty * rng.lognormvariate(0, 0.08)


def result(plan: Plan, problem: Problem, config: Config, rng: random.Random) -> Result:
    roll = rng.random()
    tel = Telemetry(1755.0 - 60 * rng.random(), 450 + 250 * rng.random(), 55 + 20 * rng.random())
    if roll < 0.06:
        return Result(problem, config, Status.COMPILE_ERROR, plan.env, message="PassManager::run failed",
                      compile_ms=900 + 300 * rng.random())
    if roll < 0.10:
        return Result(problem, config, Status.OUT_OF_RESOURCES, plan.env,
                      message="out of resource: shared memory, Required: 262144, Hardware limit: 232448",
                      compile_ms=700 + 300 * rng.random())
    if roll < 0.11:
        return Result(problem, config, Status.WRONG_RESULT, plan.env, max_rel_err=0.31,
                      message="max relative error 0.31 > tolerance 0.016", compile_ms=800.0)
    median = synthetic_ms(plan.kernel, problem, config, plan.env.device, rng)
    spread = 0.004 + 0.03 * rng.random()
    reps = int(50 + 200 * rng.random())
    timing = Timing(median, median * (1 - spread / 2), median * (1 + spread / 2), median * (1 - spread), reps,
                    plan.kernel != "matmul", "replay" if plan.env.backend == "replay" else "cuda-graph",
                    spread_target=0.02, time_cap_ms=200.0, stop_reason="spread" if spread < 0.02 else "cap",
                    timed_ms=None if plan.env.backend == "replay" else reps * median * 1.1)
    extra = {"n_regs": rng.choice((96, 128, 168, 232, 255)), "n_spills": rng.choice((0, 0, 0, 0, 8)),
             "shared_bytes": rng.choice((32768, 65536, 98304, 131072))}
    return Result(problem, config, Status.OK, plan.env, timing, max_rel_err=1e-3 * rng.random(),
                  compile_ms=600 + 900 * rng.random(), telemetry=tel, extra=extra)


def configs(kernel: str, rng: random.Random, n: int, seen: set[str] | None = None) -> list[Config]:
    """`n` random configs of the kernel's space, none of `seen` (which they join)."""
    space = get_family(kernel).space()
    seen = set() if seen is None else seen
    out: list[Config] = []
    while len(out) < n:
        c = Config.of({p.name: rng.choice(p.choices) for p in space.params})
        if c.key() not in seen:
            seen.add(c.key())
            out.append(c)
    return out


def chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


TAKEN: dict[tuple[str, str], set[str]] = {}  # (environment, problem) -> configs measured: one experiment each


def write_plan(store: Store, plan: Plan, rng: random.Random) -> dict[str, list[str]]:
    """The campaign, its trials, queue rows (done), events and winners; returns the ok keys per problem.
    Configs are drawn anew for each environment and problem, so every trial is a new experiment."""
    c = Campaign(plan.name, plan.kernel, plan.proposer, plan.budget, 0, plan.problems,
                 f"SYNTHETIC campaign of {plan.kernel} for the render benchmark")
    cid = store.create_campaign(c, backend=plan.env.backend, dataset="", device=plan.env.device)
    store.log_event("campaign_started", f"campaign {plan.name} started on 8 GPUs", campaign_id=cid)
    family = get_family(plan.kernel)
    ok_keys: dict[str, list[str]] = {}
    work = [(p, cfg) for p in plan.problems
            for cfg in configs(plan.kernel, rng, plan.trials, TAKEN.setdefault((repr(plan.env), p.key()), set()))]
    rng.shuffle(work)  # trials of all problems interleave, as the driver runs them
    for batch in chunks(work, BATCH):
        with store.transaction():
            cands = [Candidate(p, cfg, plan.proposer, f"{plan.proposer}: SYNTHETIC rationale",
                               None if rng.random() < 0.3 else 0.01 + rng.random()) for p, cfg in batch]
            ids = store.enqueue(cid, cands, priorities=[1.0] * len(cands), reasons=["in proposal order"] * len(cands))
            for cand, qid in zip(cands, ids, strict=True):
                r = result(plan, cand.problem, cand.config, rng)
                key = experiment_key(plan.kernel, VERSION, cand.problem, cand.config, plan.env)
                worker = f"gpu-{rng.randrange(8)}"
                store.record_result(r, key=key, kernel=plan.kernel, kernel_version=VERSION, worker=worker)
                store.add_trial(cid, key, cand, reused=False)
                store.set_queue_state(qid, "done", worker=worker, experiment_key=key)
                store.log_event("finished" if r.status is Status.OK else "failed",
                                f"{cand.problem.label()} {cand.config.label()}: {r.status.value}",
                                campaign_id=cid, data={"experiment": key, "median_ms": r.median_ms})
                if r.status is Status.OK:
                    ok_keys.setdefault(cand.problem.key(), []).append(key)
    if not plan.running:
        for p in plan.problems:
            keys = ok_keys.get(p.key(), [])
            if keys:
                best = min(keys, key=lambda k: store.lookup_result(k).median_ms)  # type: ignore[union-attr]
                res = store.lookup_result(best)
                assert res is not None and res.median_ms is not None
                baseline = res.median_ms * rng.uniform(0.85, 1.2)
                store.set_winner(WinnerRow(cid, p.key(), best, res.median_ms, 0.01, None, None, 0.03,
                                           baseline_ms=baseline, baseline_name=family.baseline_name))
        store.log_event("campaign_finished", f"campaign {plan.name} finished", campaign_id=cid)
        store.set_campaign_state(cid, "finished")
        record_actual(store, cid)
    else:
        live_queue(store, cid, plan, rng)
    return ok_keys


def live_queue(store: Store, cid: int, plan: Plan, rng: random.Random) -> None:
    """The running campaign's queue: `LIVE_QUEUE` rows queued, 8 running (one per GPU), re-orderings."""
    cands = []
    for _ in range(LIVE_QUEUE + 8):
        problem = rng.choice(plan.problems)
        cfg = configs(plan.kernel, rng, 1, TAKEN.setdefault((repr(plan.env), problem.key()), set()))[0]
        cands.append(Candidate(problem, cfg, rng.choice(("optuna", "rules", "llm")), "SYNTHETIC: near the best so far",
                               0.05 + rng.random()))
    ids = store.enqueue(cid, cands, priorities=[rng.random() * 3 for _ in cands],
                        reasons=["predicted faster than the best"] * len(cands))
    for i, qid in enumerate(ids[:8]):
        store.set_queue_state(qid, "running", worker=f"gpu-{i}")
    for round_ in range(200):
        moved = rng.sample(ids[8:], 5)
        moves = [{"queue_id": q, "from": rng.randrange(1, 300), "to": rng.randrange(1, 20),
                  "reason": "SYNTHETIC: a new best on a neighbouring config"} for q in moved]
        store.log_event("reordered", f"re-scored after result {round_}: {len(moves)} moved", campaign_id=cid,
                        data={"moves": moves})


def ledger(store: Store, campaign_ids: list[int], ok_keys: dict[str, list[str]], rng: random.Random) -> None:
    """Hypotheses (300) with verdicts and evidence, and a learning for each validated one."""
    states = (HypothesisState.VALIDATED, HypothesisState.RULED_OUT, HypothesisState.INCONCLUSIVE,
              HypothesisState.TESTING, HypothesisState.PROPOSED)
    problems = [k for k, v in ok_keys.items() if len(v) >= 10]
    for i in range(300):
        h = Hypothesis.new(origin=f"bench-{i}", kernel="matmul", device=H100.device, param="num_stages",
                           a=3 + i % 2, b=2, scope=Scope.parse(f"K>={1024 * (1 + i % 8)}"),
                           rationale="SYNTHETIC hypothesis")
        cid = campaign_ids[i % len(campaign_ids)]
        with store.transaction():
            store.add_hypothesis(cid, h)
            state = states[i % len(states)]
            pk = problems[i % len(problems)]
            keys = ok_keys[pk]
            evidence = [Evidence(h.id, keys[j], keys[j + 1], pk, rng.uniform(0.8, 1.4),
                                 rng.choice(("supports", "refutes"))) for j in range(0, 10, 2)]
            if state is not HypothesisState.PROPOSED:
                v = Verdict(h.id, state, len(evidence), 3, 2, 1.1, 1.02, 1.2, 0.02, f"SYNTHETIC verdict {state}")
                store.record_verdict(v, evidence)
                if state is HypothesisState.VALIDATED:
                    store.add_learning(Learning.from_verdict(h, v, torch="2.11.0", triton="3.6.0",
                                                             evidence=[e.experiment_a for e in evidence]))


def llm_calls(store: Store, cid: int, problem_keys: list[str], rng: random.Random) -> None:
    with store.transaction():
        for _ in range(1000):
            tokens_in, tokens_out = rng.randrange(4000, 12000), rng.randrange(300, 1500)
            store.add_llm_call(cid, LlmCall(time.time(), rng.choice(problem_keys), "claude-sonnet-5-5", tokens_in,
                                            tokens_out, 0, 0, 3e-6 * tokens_in + 15e-6 * tokens_out, "end_turn",
                                            "req_synthetic", "", 4000.0, 3, 1, 1, ("SYNTHETIC rejection",)))


def devices(store: Store) -> None:
    for env in (H100, H200):
        gbps, tflops = CEILINGS[env.device]
        store.set_ceilings(DeviceCeilings(env.device, env.driver, gbps, tflops))


def gpu_samples(store: Store, rng: random.Random, minutes: float = 30) -> int:
    now = time.time()
    samples = []
    for t in range(int(minutes * 30)):
        ts = now - minutes * 60 + 2 * t
        gpu = 0
        for node, count in NODES:
            for index in range(count):
                samples.append(GpuSample(ts, node, f"GPU-synthetic-{node}-{index}", index, H100.device,
                                         80 + 20 * rng.random(), 40000 + 20000 * rng.random(), 81559.0,
                                         1700 + 80 * rng.random(), 450 + 250 * rng.random(), 60 + 15 * rng.random(),
                                         "sw_power_cap" if rng.random() < 0.05 else "", f"gpu-{gpu}", ""))
                gpu += 1
    store.add_gpu_samples(samples)
    return len(samples)


def build(path: Path, experiments: int, seed: int = 0) -> dict[str, Any]:
    """The synthetic store (see the module docstring); returns what it holds and how long it took."""
    rng = random.Random(seed)
    started = time.perf_counter()
    store = Store(path)
    try:
        devices(store)
        all_ok: dict[str, list[str]] = {}
        ids = []
        for plan in plans(experiments, rng):
            log.info("writing %s: %d problems × %d trials", plan.name, len(plan.problems), plan.trials)
            for k, v in write_plan(store, plan, rng).items():
                all_ok.setdefault(k, []).extend(v)
            ids.append(store.get_campaign(plan.name).id)  # type: ignore[union-attr]
        ledger(store, ids, all_ok, rng)
        llm_calls(store, ids[0], list(all_ok), rng)
        samples = gpu_samples(store, rng)
        counts = {t: store.db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                  for t in ("campaigns", "experiments", "results", "trials", "queue", "events", "hypotheses",
                            "evidence", "learnings", "llm_calls", "gpu_samples", "winners")}
    finally:
        store.close()
    log.info("built %s in %.0f s (%d gpu samples)", path, time.perf_counter() - started, samples)
    return {"rows": counts, "build_s": round(time.perf_counter() - started, 1),
            "bytes": path.stat().st_size}


# ---- timing the pages ----------------------------------------------------------------------------

class Advance:
    """Writes one more trial of the running campaign, as its driver would (through the `Store`)."""

    def __init__(self, db: Path) -> None:
        self.store = Store(db)
        row = next(r for r in self.store.db.query("SELECT name FROM campaigns WHERE state = 'running'"))
        c = self.store.get_campaign(row["name"])
        assert c is not None
        self.campaign_id = c.id
        self.plan = Plan(c.name, c.kernel, H100, c.problems, 0, c.budget, c.proposer, True)
        self.rng = random.Random(7)

    def __call__(self) -> None:
        while True:  # a config not measured yet: a new experiment, a new trial
            problem = self.rng.choice(self.plan.problems)
            config = configs(self.plan.kernel, self.rng, 1)[0]
            key = experiment_key(self.plan.kernel, VERSION, problem, config, self.plan.env)
            if self.store.lookup_result(key) is None:
                break
        r = result(self.plan, problem, config, self.rng)
        with self.store.transaction():
            self.store.record_result(r, key=key, kernel=self.plan.kernel, kernel_version=VERSION, worker="gpu-3")
            self.store.add_trial(self.campaign_id, key, Candidate(problem, config, "optuna", "SYNTHETIC"),
                                 reused=False)
            self.store.log_event("finished", f"{problem.label()} {config.label()}: {r.status.value}",
                                 campaign_id=self.campaign_id, data={"experiment": key})

    def close(self) -> None:
        self.store.close()


def time_pages(db: Path, repeats: int, pages: tuple[str, ...] = tuple(PAGES)) -> dict[str, Any]:
    """Per page, the seconds of an AppTest run `first`, on `refresh` and `warm` (see the module
    docstring); median and worst over `repeats`."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from tilepilot.dashboard import data

    logging.getLogger("streamlit").setLevel(logging.ERROR)
    sys.argv = [str(APP), "--db", str(db)]
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()  # imports
    advance = Advance(db)
    out: dict[str, Any] = {}
    try:
        for name in pages:
            runs: dict[str, list[float]] = {"first_s": [], "refresh_s": [], "warm_s": []}
            for _ in range(repeats):
                st.cache_data.clear()
                st.cache_resource.clear()
                runs["first_s"].append(_timed(lambda n=name: at.switch_page(f"screens/{n}.py").run()))
                advance()
                time.sleep(data.TTL_S + 0.1)
                runs["refresh_s"].append(_timed(lambda: at.run()))
                runs["warm_s"].append(_timed(lambda: at.run()))
                if at.exception or [t.value for t in at.title] != [PAGES[name]]:
                    raise RuntimeError(f"page {name} did not render: {[e.value for e in at.exception]}")
            out[name] = {k: _summary(v) for k, v in runs.items()}
            log.info("%-12s first %.2f s (worst %.2f)  refresh %.2f s (worst %.2f)  warm %.2f s", name,
                     out[name]["first_s"]["median"], out[name]["first_s"]["max"], out[name]["refresh_s"]["median"],
                     out[name]["refresh_s"]["max"], out[name]["warm_s"]["median"])
    finally:
        advance.close()
    return out


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "max": round(max(values), 3)}


# ---- the browser -----------------------------------------------------------------------------------

# text each page shows once its live part has drawn: its first figures and the last thing it writes
CONTENT = {"overview": ("Trials (done / budget)", "Best so far vs trials", "recomputed every"),
           "gpus": ("Utilisation", "Node node-b"), "queue": ("Running (", "Why the queue changed"),
           "experiments": ("experiment(s), newest first", "Tried by"), "hypotheses": ("Active (", "Verdict history"),
           "graph": ("drag to pan", "Learnings ("), "log": ("event(s), newest first",)}
# Vega-Lite charts each page draws: a page counts as shown once each of them has drawn its marks
CHARTS = {"overview": 3, "graph": 1}
CHARTS_DRAWN_JS = """(() => {
  const charts = Array.from(document.querySelectorAll('[data-testid="stVegaLiteChart"]'));
  return charts.length >= %d && charts.every(c => c.querySelector('.marks') !== null);
})()"""


def time_browser(db: Path, repeats: int, pages: tuple[str, ...], runs: int = 1) -> dict[str, Any]:
    """Per page, the seconds from opening it in headless Chromium (a new tab on a running
    `tilepilot dashboard` server) until it shows its own content (`CONTENT`) and has drawn its
    charts (`CHARTS`): the server's work, the websocket and the browser's drawing. `runs` times
    over: a server starts (it reads every campaign's trials in the background as it starts:
    `dashboard/server.py`), a first tab (the Log) warms up the browser and the server's imports
    (`start_s`); then the first visit to each page is `first_s`, later visits `again_s`. Each tab
    is closed once measured, so that no open page polls the server meanwhile. Medians over the
    runs (and over the visits, for `again_s`), and the worst."""
    per_run = [_browser_run(db, repeats, pages) for _ in range(runs)]
    out: dict[str, Any] = {"runs": runs, "start_s": _summary([r["start_s"] for r in per_run])}
    for name in pages:
        again = [v for r in per_run for v in r[name][1:]] or [r[name][0] for r in per_run]
        out[name] = {"first_s": _summary([r[name][0] for r in per_run]), "again_s": _summary(again)}
        log.info("%-12s browser first %.2f s (worst %.2f)  again %.2f s (worst %.2f)", name,
                 out[name]["first_s"]["median"], out[name]["first_s"]["max"], out[name]["again_s"]["median"],
                 out[name]["again_s"]["max"])
    return out


def _browser_run(db: Path, repeats: int, pages: tuple[str, ...]) -> dict[str, Any]:
    """One server and one browser: `start_s`, and per page the seconds of each visit in order."""
    import shutil

    from tests.test_dashboard_browser import Chromium, free_port, wait_healthy
    from tilepilot.dashboard import launch

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        raise RuntimeError("--browser needs Chromium (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        port, server_log = free_port(), Path(tmp) / "server.log"
        with server_log.open("wb") as sink:
            server = launch.start(str(db), port=port, output=sink)
        browser = None
        try:
            wait_healthy(f"http://127.0.0.1:{port}", server, server_log)
            browser = Chromium(binary, Path(tmp) / "profile")
            url = f"http://127.0.0.1:{port}/"
            start = _visit(browser, url + "log", CONTENT["log"])
            runs: dict[str, list[float]] = {name: [] for name in pages}
            for _ in range(repeats):
                for name in pages:
                    runs[name].append(_visit(browser, url + ("" if name == "overview" else name), CONTENT[name],
                                             CHARTS.get(name, 0)))
        finally:
            if browser is not None:
                browser.close()
            launch.stop(server)
    return {"start_s": start, **runs}


def _visit(browser: Any, url: str, content: tuple[str, ...], charts: int = 0) -> float:
    t0 = time.perf_counter()
    target = browser.send("Target.createTarget", {"url": url})["targetId"]
    tab = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    while not (all(c in browser.text(tab) for c in content)  # polled every 50 ms
               and (not charts or browser.eval(tab, CHARTS_DRAWN_JS % charts) is True)):
        if time.perf_counter() - t0 > 120:
            raise RuntimeError(f"{url} never showed {content}")
        time.sleep(0.05)
    seconds = time.perf_counter() - t0
    browser.send("Target.closeTarget", {"targetId": target})
    return seconds


# ---- the record ----------------------------------------------------------------------------------

def versions() -> dict[str, str]:
    from importlib.metadata import version
    out = {p: version(p) for p in ("streamlit", "altair", "pandas", "sqlite-utils")}
    import sqlite3
    out["sqlite"] = sqlite3.sqlite_version
    out["tilepilot_commit"] = git("rev-parse", "--short", "HEAD")
    out["dashboard_commit"] = git("log", "-1", "--format=%h", "--", "tilepilot/dashboard")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--db", type=Path, help="reuse this store if it exists, else build it here")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--pages", nargs="+", default=list(PAGES), choices=PAGES)
    parser.add_argument("--browser", action="store_true",
                        help="also time each page in headless Chromium against a real server")
    parser.add_argument("--browser-runs", type=int, default=3, help="servers started, one after the other")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    command = " ".join([Path(sys.executable).name, *sys.argv]) if argv is None else " ".join(argv)
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "render.db"
        store_info: dict[str, Any] = {"reused": True} if db.exists() else build(db, args.experiments)
        if store_info.get("reused"):
            log.info("reusing %s (NVML samples older than 5 minutes show as no GPU)", db)
        load_before = [round(x, 2) for x in os.getloadavg()]
        pages = time_pages(db, args.repeats, tuple(args.pages))
        browser = time_browser(db, args.repeats, tuple(args.pages), args.browser_runs) if args.browser else None
        load_after = [round(x, 2) for x in os.getloadavg()]
    record = {
        "what": "server-side render time of each dashboard page (Streamlit AppTest: the page script and its "
                "live fragment's first run), on a SYNTHETIC store written through the Store API",
        "measured_on": "CPU only (no GPU involved: the dashboard reads SQLite)",
        "machine": machine(), "versions": versions(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command, "experiments": args.experiments, "store": store_info, "repeats": args.repeats,
        "load_average": {"before": load_before, "after": load_after,
                         "note": "1, 5 and 15 minute load averages of the 2-core machine, other work included"},
        "first": "every Streamlit cache emptied before the run (data and resources): a server that just started",
        "refresh": "one more trial of the running campaign written, data.TTL_S waited: each live refresh of an open "
                   "page while a campaign runs",
        "warm": "the same page rendered again at once, its queries cached",
        "pages": pages, "limit_s": 2.0,
        "within_limit": all(p[k]["max"] <= 2.0 for p in pages.values() for k in ("first_s", "refresh_s")),
    }
    if browser is not None:
        record["browser"] = {"what": "seconds from opening the page in headless Chromium until it shows its own "
                                     "content and has drawn its charts (server, websocket and drawing), against "
                                     "`tilepilot dashboard`; first_s: the first visit to the page after the server "
                                     "started (it reads the trials in the background as it starts); again_s: later "
                                     "visits in new tabs",
                             "content": CONTENT, "charts": CHARTS, "pages": browser,
                             "within_limit": all(v[k]["max"] <= 2.0 for n, v in browser.items() if n in PAGES
                                                 for k in ("first_s", "again_s"))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
