"""Orchestration throughput: what the campaign machinery costs per trial, and what compiling ahead buys.

    .venv/bin/python bench/throughput.py --part cpu [--proposers random,rules,grid,optuna] [--problems 8]
        [--budget 100] [--repeats 3] [--out bench/results/throughput-cpu.json]
    python bench/throughput.py --part gpu [--configs 64] [--out bench/results/throughput-gpu.json]

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
measured two ways,
each from a cold Triton cache of its own:
- `ahead`: a campaign through the driver and `RayExecutor` (one GPU worker, the compile pool on
  the node's other CPUs compiling batches ahead while the GPU measures earlier ones);
- `inline`: a compile-then-time loop: one GPU worker, no compile pool, one config per request,
  so the worker's child compiles each config and then times it, the GPU idle while it compiles.
Each arm reports trials/s and the GPU busy fraction: NVML's utilisation of the worker's GPU
(the share of time a kernel ran), sampled every SAMPLE_S in this process during the arm, averaged;
and the ratio of the two arms' trials/s.

Both parts write JSON with the machine, versions, date and command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_env import git, machine  # noqa: E402
from tilepilot.agents.registry import get_proposer  # noqa: E402
from tilepilot.orchestrator.driver import Progress  # noqa: E402
from tilepilot.orchestrator.hypothesis_hook import HypothesisHook  # noqa: E402
from tilepilot.orchestrator.replay_executor import ReplayExecutor  # noqa: E402
from tilepilot.orchestrator.tune import TuneOptions, tune  # noqa: E402
from tilepilot.storage.store import Store  # noqa: E402

log = logging.getLogger("throughput")

DATASET = ROOT / "data" / "replay" / "matmul-h100.jsonl"
OUT = {"cpu": ROOT / "bench" / "results" / "throughput-cpu.json",
       "gpu": ROOT / "bench" / "results" / "throughput-gpu.json"}
TARGET_MS = 5.0
SAMPLE_S = 0.1
GPU_PROBLEM = {"M": 4096, "N": 4096, "K": 4096, "dtype": "fp16"}


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
    rows = "".join("\n[[problems]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in p.items()) for p in problems)
    path.write_text(f'[campaign]\nname = "throughput-{proposer}"\nkernel = "matmul"\nproposer = "{proposer}"\n'
                    f"budget = {budget}\nseed = 0\n{rows}")
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


def arm_ahead(problem: Any, configs: list[Any], cache: Path) -> dict[str, Any]:
    """The driver and RayExecutor (compile pool ahead), the configs as the campaign file's [[configs]]."""
    from tilepilot.kernels import get_family
    from tilepilot.orchestrator.driver import Driver
    from tilepilot.orchestrator.executor import record_ceilings
    from tilepilot.orchestrator.ray_executor import RayExecutor
    from tilepilot.orchestrator.tune import TuneOptions as Opts
    from tilepilot.orchestrator.tune import plan

    family = get_family("matmul")
    with tempfile.TemporaryDirectory() as tmp:
        toml = Path(tmp) / "c.toml"
        toml.write_text(f'[campaign]\nname = "ahead"\nkernel = "matmul"\nproposer = "grid"\nbudget = {len(configs)}\n'
                        "seed = 0\nhypothesis_share = 0\n[[problems]]\n"
                        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in GPU_PROBLEM.items()))
        p = plan(Opts(campaign=toml, backend="gpu", db=Path(tmp) / "t.db"))
        executor = RayExecutor(family, "gpu", workers=1, worker_env={"TRITON_CACHE_DIR": str(cache)}, shared=False)
        store = Store(Path(tmp) / "t.db")
        try:
            cid = store.create_campaign(p.campaign, backend="gpu", dataset="", device=executor.environment.device)
            record_ceilings(executor, store, cid)  # before the clock: the driver then finds them stored
            stamps: list[float] = []
            driver = Driver(p.campaign, family, store, executor, spaces=p.spaces, campaign_id=cid,
                            first=tuple(configs), on_progress=lambda _: stamps.append(time.perf_counter()))
            uuid = executor.slots[0].info.gpu_uuid
            with GpuSampler(uuid) as sampler:
                t0 = time.perf_counter()
                driver.run()  # the clock stops at the last batch collected, before winners are re-measured
            trials = len(store.campaign_results(cid))
        finally:
            executor.close()
            store.close()
    wall = stamps[-1] - t0
    busy, samples = sampler.busy(t0, stamps[-1])
    return {"trials": trials, "wall_s": round(wall, 3), "trials_per_s": trials / wall, "gpu_busy": busy,
            "samples": samples, "compile_workers": "the node's CPUs but the GPU worker's one"}


def arm_inline(problem: Any, configs: list[Any], cache: Path) -> dict[str, Any]:
    """One GPU worker, one config per request: its child compiles, then times."""
    import ray

    from tilepilot.orchestrator.worker import GPU_WORKER_CPUS, EvalWorker

    worker = EvalWorker.options(num_gpus=1, num_cpus=GPU_WORKER_CPUS,
                                runtime_env={"env_vars": {"TRITON_CACHE_DIR": str(cache)}}).remote("gpu")
    try:
        info = ray.get(worker.info.remote())
        with GpuSampler(info.gpu_uuid) as sampler:
            t0 = time.perf_counter()
            results = [ray.get(worker.evaluate.remote("matmul", problem, [c], 60.0))[0] for c in configs]
            t1 = time.perf_counter()
    finally:
        ray.kill(worker)
    busy, samples = sampler.busy(t0, t1)
    return {"trials": len(results), "wall_s": round(t1 - t0, 3), "trials_per_s": len(results) / (t1 - t0),
            "gpu_busy": busy, "samples": samples,
            "statuses": {s: sum(r.status.value == s for r in results) for s in {r.status.value for r in results}}}


def part_gpu(args: argparse.Namespace) -> dict[str, Any]:
    from tilepilot.orchestrator.ray_runtime import start_ray

    start_ray(None)
    problem, configs = gpu_configs(args.configs)
    with tempfile.TemporaryDirectory() as tmp:
        ahead = arm_ahead(problem, configs, Path(tmp) / "cache-ahead")
        inline = arm_inline(problem, configs, Path(tmp) / "cache-inline")
    return {"what": "compile ahead (driver, RayExecutor, compile pool) vs a compile-then-time loop, the same "
                    "configs from a cold Triton cache each", "problem": GPU_PROBLEM, "configs": len(configs),
            "ahead": ahead, "inline": inline, "ratio_trials_per_s": ahead["trials_per_s"] / inline["trials_per_s"]}


# ---- the record ---------------------------------------------------------------------------------------
def versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {p: version(p) for p in ("ray", "optuna", "sqlite-utils", "torch", "triton")}
    out["tilepilot_commit"] = git("rev-parse", "--short", "HEAD")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("cpu", "gpu"), required=True)
    parser.add_argument("--proposers", default="random,rules,grid,optuna")
    parser.add_argument("--problems", type=int, default=8)
    parser.add_argument("--budget", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--configs", type=int, default=64)
    parser.add_argument("--store-dir", type=Path, help="where the campaign's SQLite store is written "
                        "(default: the system's temporary folder)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("tilepilot").setLevel(logging.WARNING)
    command = " ".join([Path(sys.executable).name, *sys.argv]) if argv is None else " ".join(argv)
    started = {"machine": machine(), "versions": versions(),
               "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "command": command}
    body = part_cpu(args) if args.part == "cpu" else part_gpu(args)
    record = {**started, "load_average_at_end": [round(x, 2) for x in os.getloadavg()], **body}
    out = args.out or OUT[args.part]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    log.info("wrote %s", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
