"""Orchestration throughput: what the campaign machinery costs per trial, and what compiling ahead buys.

    .venv/bin/python bench/throughput.py --part cpu [--proposers random,rules,grid,optuna] [--problems 8]
        [--budget 100] [--repeats 3] [--out bench/results/throughput-cpu.json]
    python bench/throughput.py --part gpu [--configs 128] [--batch 4] [--out bench/results/throughput-gpu.json]
    python bench/throughput.py --part scale --gpus N [--window-s 120] [--campaign-s 300] [--problems 8]
        [--batch 4] [--out bench/results/throughput-scale.json]

Part one (`--part cpu`, runs anywhere). A campaign of `tilepilot tune` on the replay backend,
through `orchestrator.tune.tune` exactly as the command runs it (a real SQLite store in a temporary
folder, the queue and its re-scoring, the hypothesis machinery at the campaign's default share,
the proposer, events, winners), over the first `--problems` problems of the shipped H100 matmul
recording with `--budget` distinct configs each. The replay executor answers a batch from the
recording in microseconds, so the driver's wall time per trial IS the orchestration overhead.
Reported per proposer (median of `--repeats` runs, and the best): `per_trial_ms` = the whole `tune()` call /
trials (start, warm start, ceilings, winners and all); `steady_per_trial_ms` = from the first
batch collected to the last, / the trials collected in between (the loop alone); and a split of
the whole call by where the time went: `proposer` (propose, observe, score, and the store reads
they make), `store` (Store methods the driver calls), `executor` (the replay executor),
`hypotheses` (the driver's hypothesis hook: mining, judging, the ledger's writes), `driver` (the
rest: queue re-scoring, the loop itself); `without_proposer_ms` = `per_trial_ms` less the
proposer's share (what the machinery costs whatever proposes). The target is at most 5 ms per
trial. On a shared machine other processes slow every run: the load average at the start and at
the end is recorded, and `cpu_per_trial_ms` (this process's CPU time / trials) is the figure
they do not inflate (the driver is one thread and, on replay, never waits).

Part two (`--part gpu`, needs one CUDA GPU; not run on a CPU machine). The same configs of the
matmul family (the first `--configs` valid ones of its random proposer, seed 0, for one problem) are
measured two ways, each from a cold Triton cache of its own, start-up (workers, compile pool, the
device's ceilings) timed apart, before the clock:
- `ahead`: a campaign through the driver and `RayExecutor` (one GPU worker, the compile pool on
  the node's other CPUs compiling batches ahead while the GPU measures earlier ones), the configs
  as the campaign file's [[configs]], `--batch` configs a batch;
- `inline`: a compile-then-time loop: one GPU worker, no compile pool, one config per request,
  so the worker's child compiles each config and then times it, the GPU idle while it compiles.
And `compile_pool`: the pool alone, every config at once into a third cold cache (configs/s).
Each arm reports trials/s and `gpu_busy`: NVML's utilisation of the worker's GPU (the share of time
a kernel ran), sampled every SAMPLE_S in this process during the arm, averaged. The ahead arm also
says where its time went, from the executor's batch traces (RayExecutor(trace=True)) and the
results: `steady` (from the first batch back, without the pipeline's fill); `gpu_process`, the GPU
child's share of the wall time (`busy_fraction`) and its time per trial split into loading the
compiled kernel from the cache (`cache_load_ms_per_config`, the results' compile_ms), timing
(`timing_gpu_ms_per_config`, the GPU time the timer spent, Timing.timed_ms) and the rest
(verification, inputs, host work); `compiles`, the Triton compiles the GPU process made (counted by
Triton's compilation listener: must be 0, else the command exits 1); `wakes_after_idle`, the
timer's warm-ups after the GPU idled; `idle_with_compiled_work`, the time the GPU process sat
idle while a compiled batch waited; `per_batch`, each batch's compile latency, wait for the GPU,
time in the GPU process, the way back to the driver, and the turnaround to the next batch held in
the worker; `pipeline_depth`, batches in flight, compiled and waiting, compiling, at each batch
back; `compiled_per_s`, configs compiled per second while the campaign ran (demand-bound: the
pool runs only so far ahead); `orchestration_ms_per_trial`, the driver thread's time not blocked
waiting on Ray, per trial. `checks` compares with the targets: ≥ 8× the loop's trials/s, ≥ 10
configs/s compiled, nothing compiled in the GPU process, ≤ 5 ms orchestration per trial.

Part three (`--part scale`, needs `--gpus` CUDA GPUs on this machine). The same campaign (random
proposer, seed 0, `--problems` fp16 matmul problems of one specialisation, so that a config
compiled once serves them all) on one GPU and on `--gpus`, each from a cold Triton cache, the
workers and compile pool started once and before the clock (start-up reported apart). The one-GPU
arm runs `--window-s` seconds, then is stopped (the person's stop: running batches finish);
the all-GPU arm runs a campaign of `--campaign-s` seconds of one-GPU work at the rate just measured,
stopped once STEADY_SHARE of it is done (so no arm's tail, with GPUs running dry, is counted).
Steady-state trials/s of each (from the first batch back to the stop request), their ratio, the
per-GPU efficiency, and for each arm the same breakdown as part two.

Every part writes JSON with the machine, versions, date and command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ray  # noqa: E402

from bench.bench_env import campaign_toml, git, machine  # noqa: E402
from tilepilot.agents.registry import get_proposer  # noqa: E402
from tilepilot.orchestrator.driver import Progress  # noqa: E402
from tilepilot.orchestrator.executor import BatchTrace, idle_with_work  # noqa: E402
from tilepilot.orchestrator.hypothesis_hook import HypothesisHook  # noqa: E402
from tilepilot.orchestrator.replay_executor import ReplayExecutor  # noqa: E402
from tilepilot.orchestrator.tune import TuneOptions, tune  # noqa: E402
from tilepilot.storage.store import Store  # noqa: E402

log = logging.getLogger("throughput")

DATASET = ROOT / "data" / "replay" / "matmul-h100.jsonl.gz"
OUT = {"cpu": ROOT / "bench" / "results" / "throughput-cpu.json",
       "gpu": ROOT / "bench" / "results" / "throughput-gpu.json",
       "scale": ROOT / "bench" / "results" / "throughput-scale.json"}
TARGET_MS = 5.0
SAMPLE_S = 0.1
GPU_PROBLEM = {"M": 4096, "N": 4096, "K": 4096, "dtype": "fp16"}
STEADY_SHARE = 0.95  # the all-GPU arm of --part scale is stopped once this share of its campaign is done
ONE_GPU_BUDGET = 100_000  # per problem: the one-GPU arm of --part scale is stopped by time, never by budget
# --part scale searches a part of matmul's space (grouped, persistent and TMA tiles with their
# defaults otherwise), enough for 16 problems x 500 configs, small enough that the driver's start
# (which enumerates each problem's valid configs twice) takes seconds, not minutes
SCALE_SPACE = {"BLOCK_SIZE_M": [64, 128, 256], "BLOCK_SIZE_N": [64, 128, 256], "BLOCK_SIZE_K": [32, 64, 128],
               "GROUP_SIZE_M": [1, 8], "num_warps": [2, 4, 8], "num_stages": [2, 3, 4, 5],
               "VARIANT": ["grouped", "persistent", "tma"]}


# ---- part one: the driver on a zero-cost executor --------------------------------------------------
class Split:
    """Wall time by component: the outermost timed call owns the time (a store read made by a
    proposer is the proposer's)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._depth = 0

    @contextmanager
    def patched(self, parts: dict[str, list[type]]) -> Iterator[None]:
        saved: list[tuple[type, str, Any]] = []
        try:
            for part, classes in parts.items():
                for cls in classes:
                    for name, fn in list(vars(cls).items()):
                        if callable(fn) and not name.startswith("__") and not isinstance(fn, (staticmethod,
                                                                                               classmethod, type)):
                            saved.append((cls, name, fn))
                            setattr(cls, name, self._timed(part, fn))
            yield
        finally:
            for cls, name, fn in saved:
                setattr(cls, name, fn)

    def _timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        if fn.__name__ == "transaction":  # a context manager: its commit happens on exit
            return self._timed_context(part, fn)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - t0
                self._depth -= 1

        return timed

    def _timed_context(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Entering and leaving the context (BEGIN, COMMIT) count for `part`; the body for its callers."""
        split = self

        class Timed:
            def __init__(self, inner: Any) -> None:
                self.inner = inner

            def __enter__(self) -> Any:
                return split._timed(part, self.inner.__enter__)()

            def __exit__(self, *exc: Any) -> Any:
                return split._timed(part, self.inner.__exit__)(*exc)

        def timed(*args: Any, **kwargs: Any) -> Any:
            return Timed(fn(*args, **kwargs))

        return timed


def write_campaign(path: Path, proposer: str, problems: list[dict[str, Any]], budget: int) -> Path:
    path.write_text(campaign_toml(f"throughput-{proposer}", "matmul", proposer, budget, problems=problems))
    return path


def proposer_classes(name: str) -> list[type]:
    cls = get_proposer(name)
    return [c for c in cls.__mro__ if c.__module__.startswith("tilepilot.agents")]


def cpu_run(proposer: str, problems: list[dict[str, Any]], budget: int, folder: Path | None = None) -> dict[str, Any]:
    stamps: list[tuple[float, int]] = []

    def progress(p: Progress) -> None:
        stamps.append((time.perf_counter(), p.done))

    split = Split()
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        toml = write_campaign(Path(tmp) / "c.toml", proposer, problems, budget)
        opts = TuneOptions(campaign=toml, backend="replay", dataset=DATASET, db=Path(tmp) / "t.db", cold=True)
        with split.patched({"proposer": proposer_classes(proposer), "store": [Store], "executor": [ReplayExecutor],
                            "hypotheses": [HypothesisHook]}):
            t0, c0 = time.perf_counter(), time.process_time()
            tune(opts, on_progress=progress)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        with Store.open_readonly(Path(tmp) / "t.db") as store:
            trials = len(store.campaign_results(store.get_campaign(f"throughput-{proposer}").id))
    steady = (stamps[-1][0] - stamps[0][0]) / (stamps[-1][1] - stamps[0][1]) if len(stamps) > 1 else None
    parts = {k: v / trials * 1e3 for k, v in split.seconds.items()}
    parts["driver"] = wall / trials * 1e3 - sum(parts.values())
    return {"trials": trials, "wall_s": round(wall, 3), "per_trial_ms": wall / trials * 1e3,
            "cpu_per_trial_ms": cpu / trials * 1e3, "steady_per_trial_ms": None if steady is None else steady * 1e3,
            "split_ms_per_trial": {k: round(v, 4) for k, v in sorted(parts.items())}}


def part_cpu(args: argparse.Namespace) -> dict[str, Any]:
    from tilepilot.kernels import get_family
    from tilepilot.orchestrator.replay import load_dataset

    dataset = load_dataset(DATASET, get_family("matmul"))
    problems = [p.as_dict() for p in dataset.problems[: args.problems]]
    out: dict[str, Any] = {}
    for proposer in args.proposers.split(","):
        runs = []
        for r in range(args.repeats):
            runs.append(cpu_run(proposer, problems, args.budget, args.store_dir))
            log.info("%s run %d: %d trials, %.2f ms per trial (steady %.2f ms)", proposer, r + 1, runs[-1]["trials"],
                     runs[-1]["per_trial_ms"], runs[-1]["steady_per_trial_ms"] or float("nan"))
        out[proposer] = {
            "trials": runs[0]["trials"],
            "per_trial_ms": round(statistics.median(x["per_trial_ms"] for x in runs), 3),
            "steady_per_trial_ms": round(statistics.median(x["steady_per_trial_ms"] for x in runs), 3),
            "within_target": {"cpu": statistics.median(x["cpu_per_trial_ms"] for x in runs) <= TARGET_MS,
                              "best_wall": min(x["per_trial_ms"] for x in runs) <= TARGET_MS,
                              "median_wall": statistics.median(x["per_trial_ms"] for x in runs) <= TARGET_MS},
            "best_per_trial_ms": round(min(x["per_trial_ms"] for x in runs), 3),
            "cpu_per_trial_ms": round(statistics.median(x["cpu_per_trial_ms"] for x in runs), 3),
            "without_proposer_ms": round(statistics.median(
                x["per_trial_ms"] - x["split_ms_per_trial"].get("proposer", 0.0) for x in runs), 3),
            "split_ms_per_trial": {k: round(statistics.median(x["split_ms_per_trial"].get(k, 0.0) for x in runs), 3)
                                   for k in runs[0]["split_ms_per_trial"]},
            "runs": runs,
        }
    return {"what": "orchestration overhead per trial: `tilepilot tune` on the replay backend (answers in "
                    "microseconds), so the driver's wall time per trial is the queue, store, proposer and events",
            "dataset": str(DATASET.relative_to(ROOT)), "problems": len(problems), "budget_per_problem": args.budget,
            "store_dir": str(args.store_dir or tempfile.gettempdir()),
            "repeats": args.repeats, "target_ms": TARGET_MS, "proposers": out}


# ---- part two: compile ahead vs compile then time, on a GPU ---------------------------------------
class GpuSampler:
    """NVML utilisation of one GPU, sampled every SAMPLE_S in a thread."""

    def __init__(self, uuid: str) -> None:
        self.uuid = uuid
        self.samples: list[tuple[float, float]] = []  # (perf_counter, utilisation %)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from tilepilot.kernels.telemetry import sample_gpu

        while not self._stop.wait(SAMPLE_S):
            self.samples.append((time.perf_counter(), sample_gpu(self.uuid, "", "").util_pct))

    def __enter__(self) -> GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def busy(self, start: float, end: float) -> tuple[float | None, int]:
        """The mean utilisation (0 to 1) of the samples between `start` and `end`, and their number."""
        inside = [u for t, u in self.samples if start <= t <= end]
        return (statistics.fmean(inside) / 100 if inside else None), len(inside)


def gpu_configs(n: int) -> tuple[Any, list[Any]]:
    from tilepilot.agents.base import ProposerContext, SearchState
    from tilepilot.experiments import Problem
    from tilepilot.kernels import get_family

    family = get_family("matmul")
    problem = Problem.of(GPU_PROBLEM)
    space = family.space()
    ctx = ProposerContext(kernel="matmul", problem=problem, space=space, seed=0, budget=n, device="", ledger=None)
    proposer = get_proposer("random")(ctx)
    configs = [c.config for c in proposer.propose(SearchState(), 4 * n) if not space.check(c.config, problem)][:n]
    return problem, configs


class Watch:
    """What a campaign on RayExecutor did, from its progress callbacks: when each batch came back
    and the pipeline's depth then; `stop(since_first_s, done)` (seconds since the first batch came
    back, trials done) asks the campaign to stop (the person's control: running batches finish,
    nothing new starts) once it says so."""

    def __init__(self, executor: Any, store: Store, stop: Callable[[float, int], bool] | None = None) -> None:
        self.executor, self.store, self._stop = executor, store, stop
        self.campaign_id = 0
        self.t0 = 0.0
        self.stamps: list[tuple[float, int]] = []  # (perf_counter, trials done)
        self.depth: list[tuple[int, int, int]] = []  # (batches in flight, compiled and waiting, compiling)
        self.stopped_at: float | None = None

    def __call__(self, p: Progress) -> None:
        now = time.perf_counter()
        ex = self.executor
        self.stamps.append((now, p.done))
        self.depth.append((ex.in_flight(), len(ex.ready), len(ex.compiling)))
        since = now - self.stamps[0][0]
        if self.stopped_at is None and self._stop is not None and self._stop(since, p.done):
            self.stopped_at = now
            self.store.set_control(self.campaign_id, "stop")

    def window(self) -> tuple[float, float, int]:
        """The steady window: from the first batch back to the stop request (or the last batch);
        its start, end and the trials collected in it (the first batch's not counted)."""
        end = self.stopped_at or self.stamps[-1][0]
        inside = [d for t, d in self.stamps if t <= end]
        return self.stamps[0][0], end, inside[-1] - self.stamps[0][1]


def campaign_file(folder: Path, name: str, budget: int, problems: list[dict[str, Any]], proposer: str,
                  space: dict[str, list[Any]] | None = None) -> Path:
    toml = folder / f"{name}.toml"
    toml.write_text(campaign_toml(name, "matmul", proposer, budget, hypothesis_share=0, space=space,
                                  problems=problems))
    return toml


def run_campaign(name: str, cache: Path, *, workers: int, batch_size: int, configs: list[Any] | None = None,
                 problems: list[dict[str, Any]] | None = None, budget: int = 0,
                 stop: Callable[[float, int], bool] | None = None, keep_db: Path | None = None) -> dict[str, Any]:
    """A campaign through the driver and RayExecutor (compile pool ahead) on `workers` GPUs, from
    a cold Triton cache: `configs` as the campaign file's [[configs]] for GPU_PROBLEM, or the
    random proposer (seed 0) on `problems` with `budget` each. Start-up (workers, compile pool,
    ceilings) is timed apart, before the clock; the clock stops at the last batch collected,
    before winners are re-measured. `keep_db`: where to copy the campaign's store afterwards."""
    from tilepilot.kernels import get_family
    from tilepilot.orchestrator.driver import Driver
    from tilepilot.orchestrator.executor import record_ceilings
    from tilepilot.orchestrator.ray_executor import RayExecutor
    from tilepilot.orchestrator.tune import TuneOptions as Opts
    from tilepilot.orchestrator.tune import plan

    family = get_family("matmul")
    with tempfile.TemporaryDirectory() as tmp:
        toml = (campaign_file(Path(tmp), name, len(configs), [GPU_PROBLEM], "grid") if configs is not None
                else campaign_file(Path(tmp), name, budget, problems or [], "random", SCALE_SPACE))
        p = plan(Opts(campaign=toml, backend="gpu", db=Path(tmp) / "t.db"))
        s0 = time.perf_counter()
        executor = RayExecutor(family, "gpu", workers=workers, worker_env={"TRITON_CACHE_DIR": str(cache)},
                               shared=False, trace=True)
        store = Store(Path(tmp) / "t.db")
        try:
            pool_up = _compile_pool_up(executor)
            startup_s = time.perf_counter() - s0
            cid = store.create_campaign(p.campaign, backend="gpu", dataset="", device=executor.environment.device)
            record_ceilings(executor, store, cid)  # before the clock: the driver then finds them stored
            watch = Watch(executor, store, stop)
            watch.campaign_id = cid
            driver = Driver(p.campaign, family, store, executor, spaces=p.spaces, campaign_id=cid,
                            first=tuple(configs or ()), batch_size=batch_size, on_progress=watch)
            with GpuSampler(executor.slots[0].info.gpu_uuid) as sampler:
                watch.t0, e0 = time.perf_counter(), time.time()
                driver.run()
            results = [r for _, r in store.campaign_results(cid)]
            infos = [ray.get(s.actor.info.remote()) for s in executor.slots if s.actor is not None]
        finally:
            executor.close()
            store.close()
        if keep_db is not None:
            keep_db.parent.mkdir(parents=True, exist_ok=True)
            for suffix in ("", "-wal"):
                if (db := Path(tmp) / f"t.db{suffix}").exists():
                    shutil.copyfile(db, Path(f"{keep_db}{suffix}"))
    traces = executor.traces or []
    driver_start = min(t.submitted for t in traces) - e0  # the driver's own start (proposers, estimate)
    first = watch.t0 + driver_start
    wall = watch.stamps[-1][0] - first
    busy, samples = sampler.busy(first, watch.stamps[-1][0])
    w0, w1, in_window = watch.window()
    out = {"workers": workers, "batch_size": batch_size, "startup_s": round(startup_s, 3),
           "compile_pool_up_s": pool_up, "compile_workers": executor.pool.size if executor.pool else 0,
           "driver_start_s": round(driver_start, 3), "target": executor.target,
           "trials": len(results), "wall_s": round(wall, 3), "trials_per_s": len(results) / wall,
           "first_result_s": round(watch.stamps[0][0] - first, 3),
           "steady": {"window_s": round(w1 - w0, 3), "trials": in_window,
                      "trials_per_s": in_window / (w1 - w0) if w1 > w0 else None},
           "gpu_busy": busy, "gpu_busy_samples": samples,
           "statuses": dict(Counter(str(r.status) for r in results)),
           "stop_reasons": stop_reasons(results),
           "orchestration_ms_per_trial": (wall - executor.waited_s) / len(results) * 1e3,
           "gpu_process_compiles_total": _sum_or_none(i.compiles for i in infos),
           "pipeline_depth": _depth(watch.depth)}
    out |= breakdown(traces, results, e0 + driver_start, e0 + driver_start + wall)
    log.info("%s: %d trials in %.1f s (%.2f/s; steady %.2f/s), start-up %.1f s, driver start %.1f s", name,
             len(results), wall, len(results) / wall, out["steady"]["trials_per_s"] or 0, startup_s, driver_start)
    return out


def _compile_pool_up(executor: Any) -> float:
    """Seconds until every compile worker answered (its child has imported Triton)."""
    t0 = time.perf_counter()
    if executor.pool is not None:
        ray.get([w.info.remote() for ws in executor.pool.workers.values() for w in ws])
    return round(time.perf_counter() - t0, 3)


def _sum_or_none(values: Iterable[int | None]) -> int | None:
    total = 0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def _depth(depth: list[tuple[int, int, int]]) -> dict[str, Any]:
    if not depth:
        return {}
    return {name: {"mean": round(statistics.fmean(d[i] for d in depth), 2), "max": max(d[i] for d in depth)}
            for i, name in enumerate(("batches_in_flight", "compiled_waiting", "compiling"))}


def _ms(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"mean": round(statistics.fmean(values) * 1e3, 2), "median": round(statistics.median(values) * 1e3, 2),
            "max": round(max(values) * 1e3, 2)}


FIRST_BATCHES = 4  # the first batches the GPU ran, their steps in seconds from the clock's start


def breakdown(traces: list[BatchTrace], results: list[Any], start: float, end: float) -> dict[str, Any]:
    """Where the time went, from the executor's batch traces and the results (see the docstring)."""
    trials = max(1, len(results))
    wall = end - start
    by_worker: dict[str, list[BatchTrace]] = {}
    for t in sorted(traces, key=lambda t: t.started):
        by_worker.setdefault(t.worker, []).append(t)
    handoff = [b.started - a.ended for ts in by_worker.values() for a, b in pairwise(ts)
               if b.dispatched <= a.ended]  # the next batch waited in the actor: the child's turnaround
    child_s = sum(t.ended - t.started for t in traces)
    ok = [r for r in results if r.timing is not None]
    load_ms = [r.compile_ms for r in ok if r.compile_ms is not None]
    timed_ms = [r.timing.timed_ms for r in ok if r.timing.timed_ms is not None]
    idle = idle_with_work(traces, start, end)
    compiled = [t.compiled for t in traces]
    return {
        "gpu_process": {
            "busy_fraction": child_s / (wall * max(1, len(by_worker))),
            "ms_per_trial": child_s / trials * 1e3,
            "cache_load_ms_per_config": round(statistics.fmean(load_ms), 3) if load_ms else None,
            "timing_gpu_ms_per_config": round(statistics.fmean(timed_ms), 3) if timed_ms else None,
            "verify_and_host_ms_per_trial": (child_s * 1e3 - sum(load_ms) - sum(timed_ms)) / trials,
            "compiles": _sum_or_none(t.compiles for t in traces),
            "wakes_after_idle": sum(t.wakes for t in traces)},
        "idle_with_compiled_work": {"seconds": round(sum(idle.values()), 3),
                                    "fraction": sum(idle.values()) / (wall * max(1, len(idle)))},
        "per_batch": {"batches": len(traces),
                      "compile_latency": _ms([t.compiled - t.submitted for t in traces]),
                      "compiled_to_started": _ms([t.started - t.compiled for t in traces]),
                      "in_gpu_process": _ms([t.ended - t.started for t in traces]),
                      "ended_to_returned": _ms([t.returned - t.ended for t in traces]),
                      "handoff_to_next": _ms(handoff)},
        "compiled_per_s": len(results) / (max(compiled) - min(t.submitted for t in traces)) if traces else None,
        "first_batches": [{"configs": t.configs, **{k: round(getattr(t, k) - start, 3) for k in (
            "submitted", "compiled", "dispatched", "started", "ended", "returned")}}
            for t in sorted(traces, key=lambda t: t.started)[:FIRST_BATCHES]],
    }


def arm_pool(configs: list[Any], problem: Any, target: Any, cache: Path) -> dict[str, Any]:
    """The compile pool alone, every config at once, cold cache: its capacity in configs/s."""
    from tilepilot.orchestrator.compile_pool import CompilePool

    s0 = time.perf_counter()
    pool = CompilePool(env={"TRITON_CACHE_DIR": str(cache)})
    try:
        infos = ray.get([w.info.remote() for ws in pool.workers.values() for w in ws])
        startup = time.perf_counter() - s0
        t0 = time.perf_counter()
        outcomes = ray.get([pool.submit("matmul", problem, c, target) for c in configs])
        wall = time.perf_counter() - t0
        infos = ray.get([w.info.remote() for ws in pool.workers.values() for w in ws])
    finally:
        pool.close()
    ms = [o.compile_ms for o in outcomes]
    log.info("compile pool: %d configs in %.1f s on %d workers (%.1f/s)", len(configs), wall, len(infos),
             len(configs) / wall)
    return {"workers": len(infos), "startup_s": round(startup, 3), "configs": len(configs), "wall_s": round(wall, 3),
            "configs_per_s": len(configs) / wall, "compile_ms": {"median": round(statistics.median(ms), 1),
                                                                  "mean": round(statistics.fmean(ms), 1),
                                                                  "max": round(max(ms), 1)},
            "triton_compiles": _sum_or_none(i.compiles for i in infos),
            "statuses": dict(Counter(str(o.status) for o in outcomes))}


def arm_inline(problem: Any, configs: list[Any], cache: Path) -> dict[str, Any]:
    """One GPU worker, one config per request: its child compiles, then times."""
    from tilepilot.orchestrator.worker import GPU_WORKER_CPUS, EvalWorker

    s0 = time.perf_counter()
    worker = EvalWorker.options(num_gpus=1, num_cpus=GPU_WORKER_CPUS,
                                runtime_env={"env_vars": {"TRITON_CACHE_DIR": str(cache)}}).remote("gpu")
    try:
        info = ray.get(worker.info.remote())
        startup = time.perf_counter() - s0
        with GpuSampler(info.gpu_uuid) as sampler:
            t0 = time.perf_counter()
            results = [ray.get(worker.evaluate.remote("matmul", problem, [c], 60.0))[0] for c in configs]
            t1 = time.perf_counter()
        after = ray.get(worker.info.remote())
    finally:
        ray.kill(worker)
    busy, samples = sampler.busy(t0, t1)
    log.info("inline: %d trials in %.1f s (%.2f/s)", len(results), t1 - t0, len(results) / (t1 - t0))
    compile_ms = [r.compile_ms for r in results if r.compile_ms is not None]
    return {"startup_s": round(startup, 3), "trials": len(results), "wall_s": round(t1 - t0, 3),
            "trials_per_s": len(results) / (t1 - t0), "gpu_busy": busy, "gpu_busy_samples": samples,
            "compile_ms_per_config": round(statistics.fmean(compile_ms), 1) if compile_ms else None,
            "gpu_process_compiles": None if after.compiles is None else after.compiles - (info.compiles or 0),
            "wakes_after_idle": after.wakes - info.wakes,
            "statuses": dict(Counter(str(r.status) for r in results)), "stop_reasons": stop_reasons(results)}


def stop_reasons(results: list[Any]) -> dict[str, int]:
    """How the timings of the ok results ended (spread, cap, outclassed: not timed beyond verification)."""
    return dict(Counter(r.timing.stop_reason for r in results if r.timing is not None))


def part_gpu(args: argparse.Namespace) -> dict[str, Any]:
    from tilepilot.orchestrator.ray_runtime import start_ray

    start_ray(None)
    problem, configs = gpu_configs(args.configs)
    with tempfile.TemporaryDirectory() as tmp:
        ahead = run_campaign("ahead", Path(tmp) / "cache-ahead", workers=1, batch_size=args.batch, configs=configs)
        target = ahead.pop("target")
        pool = arm_pool(configs, problem, target, Path(tmp) / "cache-pool") if not args.no_pool else None
        inline = arm_inline(problem, configs, Path(tmp) / "cache-inline")
    ratio = ahead["trials_per_s"] / inline["trials_per_s"]
    checks = {"ratio_at_least_8": ratio >= 8,
              "compiled_per_s_at_least_10": (pool or ahead)["configs_per_s" if pool else "compiled_per_s"] >= 10,
              "gpu_process_compiled_nothing": ahead["gpu_process"]["compiles"] == 0,
              "orchestration_at_most_5_ms": ahead["orchestration_ms_per_trial"] <= TARGET_MS,
              "gpu_idle_with_compiled_work_s": ahead["idle_with_compiled_work"]["seconds"]}
    return {"what": "compile ahead (driver, RayExecutor, compile pool) vs a compile-then-time loop, the same "
                    "configs from a cold Triton cache each; start-up timed apart, before the clock",
            "problem": GPU_PROBLEM, "configs": len(configs), "ahead": ahead, "compile_pool": pool, "inline": inline,
            "ratio_trials_per_s": ratio,
            "ratio_steady_trials_per_s": (ahead["steady"]["trials_per_s"] or 0) / inline["trials_per_s"],
            "checks": checks}


# ---- part three: one GPU against all of them -------------------------------------------------------
def scale_problems(n: int) -> list[dict[str, Any]]:
    """`n` fp16 matmul problems, every dimension a multiple of 16 (one specialisation, so a config
    compiled once serves them all): M in 2048..5120, then N in 4096 and 2048, then K in 2048..5120."""
    shapes = [(m, nn, k) for k in (4096, 2048, 3072, 5120) for nn in (4096, 2048) for m in (4096, 2048, 3072, 5120)]
    if not 1 <= n <= len(shapes):
        raise SystemExit(f"--problems {n}: from 1 to {len(shapes)}")
    return [{"M": m, "N": nn, "K": k, "dtype": "fp16"} for m, nn, k in shapes[:n]]


def scale_valid(problems: list[dict[str, Any]]) -> int:
    """The fewest valid configs of SCALE_SPACE among the problems."""
    from tilepilot.experiments import Problem
    from tilepilot.kernels import get_family

    space = get_family("matmul").space().narrowed(SCALE_SPACE)
    return min(len(space.valid(Problem.of(p))) for p in problems)


def part_scale(args: argparse.Namespace) -> dict[str, Any]:
    from tilepilot.orchestrator.ray_runtime import start_ray

    start_ray(None)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if not 1 <= args.gpus <= gpus:
        raise SystemExit(f"--gpus {args.gpus}: the machine has {gpus} GPU(s)")
    problems = scale_problems(args.problems)
    with tempfile.TemporaryDirectory() as tmp:
        one = run_campaign("scale-1", Path(tmp) / "cache-one", workers=1, batch_size=args.batch, problems=problems,
                           budget=ONE_GPU_BUDGET, stop=lambda since, done: since >= args.window_s)
        rate = one["steady"]["trials_per_s"]
        if not rate:
            raise SystemExit(f"the one-GPU arm collected nothing in its window: {one}")
        budget = math.ceil(rate * args.campaign_s / len(problems))
        if budget > (valid := scale_valid(problems)):
            log.warning("a budget of %d per problem is more than the %d valid configs of the campaign's space: the "
                        "campaign ends early; pass more --problems", budget, valid)
        stop_at = int(STEADY_SHARE * budget * len(problems))
        one.pop("target")
        many = run_campaign(f"scale-{args.gpus}", Path(tmp) / "cache-all", workers=args.gpus,
                            batch_size=args.batch, problems=problems, budget=budget,
                            stop=lambda since, done: done >= stop_at, keep_db=args.keep_db)
    many.pop("target")
    ratio = (many["steady"]["trials_per_s"] or 0) / rate
    return {"what": f"the same campaign (random proposer, seed 0, {len(problems)} fp16 matmul problems of one "
                    f"specialisation) on 1 GPU and on {args.gpus}, each from a cold Triton cache; workers and "
                    "compile pool started before the clock (start-up reported apart); steady-state trials/s from "
                    "the first batch back to the stop request; gpu_busy is the first worker's GPU",
            "gpus": args.gpus, "problems": problems, "one_gpu_window_s": args.window_s,
            "campaign_trials": budget * len(problems), "campaign_one_gpu_s": budget * len(problems) / rate,
            "stopped_at_trials": stop_at, "one_gpu": one, "all_gpus": many, "ratio_steady_trials_per_s": ratio,
            "per_gpu_efficiency": ratio / args.gpus,
            "checks": {"orchestration_at_most_5_ms": many["orchestration_ms_per_trial"] <= TARGET_MS,
                       "gpu_processes_compiled_nothing": many["gpu_process"]["compiles"] == 0
                       and one["gpu_process"]["compiles"] == 0}}


# ---- the record ---------------------------------------------------------------------------------------
def versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {p: version(p) for p in ("ray", "optuna", "sqlite-utils", "torch", "triton")}
    out["tilepilot_commit"] = git("rev-parse", "--short", "HEAD")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("cpu", "gpu", "scale"), required=True)
    parser.add_argument("--proposers", default="random,rules,grid,optuna")
    parser.add_argument("--budget", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--configs", type=int, default=128, help="gpu: configs in the campaign")
    parser.add_argument("--batch", type=int, default=4, help="gpu, scale: configs per batch (the driver's default: 4)")
    parser.add_argument("--no-pool", action="store_true", help="gpu: skip the compile pool's own measurement")
    parser.add_argument("--gpus", type=int, default=1, help="scale: GPUs of the all-GPU arm")
    parser.add_argument("--window-s", type=float, default=120.0, help="scale: the one-GPU arm's steady window")
    parser.add_argument("--campaign-s", type=float, default=300.0,
                        help="scale: the all-GPU arm's campaign, in seconds of one-GPU work")
    parser.add_argument("--problems", type=int, default=8, help="cpu, scale: problems in the campaign")
    parser.add_argument("--store-dir", type=Path, help="where the campaign's SQLite store is written "
                        "(default: the system's temporary folder)")
    parser.add_argument("--keep-db", type=Path, help="scale: copy the all-GPU arm's store here")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("tilepilot").setLevel(logging.WARNING)
    command = " ".join([Path(sys.executable).name, *sys.argv]) if argv is None else " ".join(argv)
    started = {"machine": machine(), "versions": versions(),
               "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "command": command}
    body = {"cpu": part_cpu, "gpu": part_gpu, "scale": part_scale}[args.part](args)
    record = {**started, "load_average_at_end": [round(x, 2) for x in os.getloadavg()], **body}
    out = args.out or OUT[args.part]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    log.info("wrote %s", out)
    failed = [k for k, v in body.get("checks", {}).items() if k.startswith("gpu_process") and v is not True]
    if failed:  # the one check that is an assertion, not a target: the GPU processes compile nothing
        log.error("failed: %s", ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
