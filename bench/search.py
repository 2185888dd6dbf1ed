"""Search efficiency of the proposers on recorded data: how few measurements reach the optimum.

    python bench/search.py --dataset data/replay/matmul-h100.jsonl.gz --out bench/results/search-h100.json \\
        [--protocol lopo|dev-split] [--proposers random,grid,optuna,optuna-gp,rules,portfolio] [--seeds 10]
        [--slow-seeds 3] [--jobs 2]
    python bench/search.py --arm warm --out bench/results/warm-start-h100.json \\
        [--proposers rules,portfolio,optuna,random] [--seeds 5]
    python bench/search.py --kernel softmax --protocol shipped --out bench/results/search-softmax-h100.json

`--kernel` (default matmul) searches another family's recorded grid (its own H100 grid unless
--dataset says otherwise) with the same drive and measures; there `rules` has the tile model where
the family is a GEMM (fused_moe), the row model for softmax, rmsnorm and layernorm, the attention
model for attention, and the rules constants are the shipped ones: another family is searched with
`--protocol shipped` alone, and `--arm search` or `--arm warm`.

Method. Every (proposer, problem, seed) is a fresh campaign of one problem on the replay
backend, driven in process by `drive` below: the driver's loop without the store and queue
(propose a batch of 4 (`--batch`) against a `SearchState`, mark it pending, settle configs that break the
space's constraints as `invalid` for free, answer the others from the dataset, hand each
result to `observe` one at a time as the driver does, count distinct configs measured). The
space of a problem is exactly its recorded configs (`ReplayDataset.space`), as in `tilepilot
tune --backend replay`. `optuna-gp` asks inline (`GpSettings(synchronous=True)`, deterministic;
a campaign asks ahead in a background thread instead) and, being slow (a GP fit per ask), runs
the first `--slow-seeds` seeds only; so does `portfolio+gp` (not in the default list): the
portfolio with `optuna-gp` as a fourth member beside rules, optuna and random.

Measures, for each proposer (the budget is the campaign's budget, so Optuna's startup size
follows it as it would in a real campaign):
- `to_2pct`: distinct configs measured until the best is within 2% of the dataset optimum,
  in a campaign whose budget is the whole recorded grid, stopped once it gets there (the count
  depends only on what came before; median over seeds per problem, then the median and the
  worst over problems);
- `regret@B`: best found / optimum - 1 after a campaign of budget B = 5%, 10%, 20% of the
  grid (8, 16, 32 of 162): mean over seeds and problems, median over problems, worst problem
  (its mean over seeds), worst single run, problems within 2% in every seed.
Baseline `fixed-list`: for each problem, the best fixed list of B configs chosen greedily on
the OTHER problems (leave one problem out): each step adds the config that most lowers the
worst regret of the list on the training problems, then the mean. Deterministic.

Held out. The `rules` tile model's fitted constants (bench/fit_rules.FITTED) are refitted
here so that no problem is scored with constants that saw it; the shipped defaults
(agents/tile_model.Constants, fitted on every recorded H100 problem) are used only on a dataset
they never saw (`--protocol shipped`). `--protocol
lopo` (the default): for each problem, the constants are fitted on all the OTHER problems
(leave one problem out) and every problem counts as held out. `--protocol dev-split`: one
fit on DEV_PROBLEMS, scored on the others ("held_out"; "all" adds the development problems).
`--protocol shipped`: the shipped constants, for a dataset they were not fitted on (the H200 grid
of problems the H100 grid lacks, `data/replay/matmul-h200.jsonl.gz`, and the fresh H100 grid of
twelve more, `data/replay/matmul-h100-fresh.jsonl.gz`): every problem is held out.
`--protocol folds`: the constants of bench/results/rules-constants-4fold.json, each fitted on the
three other folds of the H100 problems (as `bench/gpu_campaign.py` runs them); "per_fold" in
the output has each fold's regret and configs to 2%. The protocols that fit (all but `shipped`)
read the H100 grid, recorded in rotating order, without the order mark (`order_mark` 0, as
`fit_rules` fits); `shipped` scores the shipped model, mark and all, as a campaign runs it.
The portfolio's `rules` member gets the same constants. The rest of the rules proposer (the
model's form, the GP settings, the measured ceilings of agents/roofline.py) is fixed; the
fixed-list baseline is chosen leave one problem out in both protocols.

Warm start (`--arm warm`). For each problem, two campaigns of the whole grid per proposer and
seed: cold, and warm, where the configs `orchestrator/warm_start.py` picks go first (in the
first batch, the proposer filling the rest of it with them pending, as the driver queues them):
the winners of the nearest other problems in log-shape space, each taken as the recorded
optimum of that problem, as if the store held a campaign that found it; never the problem's own
data (leave one problem out; no learnings, the store of this benchmark holds none), in the order
of the proposer's predictions where it predicts them all (`warm_start.by_prediction`, as the driver
orders them). They count against the budget like any trial. The warm proposer also reads the store
as its history (`rules`, alone or in the portfolio, corrects its model by the nearest store problem
of its regime): there each other problem holds what a `rules` campaign of STORE_BUDGET configs
measured (`ReplayHistory`). Measure: distinct configs until one is within 2% of the
optimum (`to_2pct`), the median over seeds per problem, then the median, mean and worst over
problems; target: warm at most half of cold. A run stops once it reaches the target (the count
depends only on what came before); the proposers are built with the whole grid as budget.

History first (`--arm history`). The rules proposer at a budget of 8 configs (and, for
`to_2pct`, the whole grid) with a head of configs from a store of OTHER problems queued first,
as warm start queues them (HEADS: the current warm start, the nearest problems' winners, a
covering list — greedy set cover of "within 2% of that problem's best" over the store
problems, how the fixed-list baseline is built — of every store problem or of the 8 nearest,
and these after the rules proposer's own first four picks; `warm` keeps of the warm start only
what the proposer predicts no slower than its own first pick, as the driver does, `warmall` all
of it). Heads starting with `T` also hand the proposer the store as its history (the store's
correction of the tile model, agents/rules.py): each store problem holding what a `rules`
campaign of STORE_BUDGET configs measured there (`Tgrid`: every recorded result). Stores
("scopes"): every other problem of the dataset; with `--protocol folds` the problems of the
other three folds only; with `--history` every problem of another dataset: "other-device"
(for the `T` heads with the dataset's other problems added: the proposer reads the other device's
results where it is a sibling, `roofline.SIBLINGS`, as the H200 is to the H100 SXM, and none
elsewhere), or, where it was recorded on the same device, "same-device" with the dataset's other
problems added (`T` heads only); with several (`--history A,B,...`, as a store that has seen every
recorded grid), "stores": every problem of each and the dataset's other problems (`T` heads only,
the winners they queue first those of the campaign's device, as warm start takes them). Baseline in
the same run: the fixed list of 8 chosen greedily (worst, then mean regret) on the same store.
Regret and within-2% as in the search arm; "cold" is the rules proposer with no head.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import math
import multiprocessing as mp
import random
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_rules import NEUTRAL, fit, problem_data, recorded_versions

from tilepilot.agents.base import HistoryReader, Proposer, ProposerContext, SearchState
from tilepilot.agents.optuna_gp import GpSettings, OptunaGpProposer
from tilepilot.agents.portfolio import PortfolioProposer, PortfolioSettings
from tilepilot.agents.registry import get_proposer
from tilepilot.agents.rules import RulesProposer
from tilepilot.agents.tile_model import DEFAULT_CONSTANTS, Constants
from tilepilot.experiments import Candidate, Config, InputError, Problem, Result, Status
from tilepilot.kernels import get_family
from tilepilot.orchestrator.replay import ReplayDataset, load_dataset
from tilepilot.orchestrator.warm_start import by_prediction, warm_candidates
from tilepilot.storage.store import WinnerSource

log = logging.getLogger("search")
KERNEL = "matmul"
BATCH = 4
NOISE = 0.0  # --noise: log-normal spread of each measurement the proposer sees (0: the recorded times)
ORDER_MARK: float | None = None  # --order-mark: the shipped constants' order_mark replaced (None: as shipped)
TOLERANCE = 0.02
PROPOSERS = ("random", "grid", "optuna", "optuna-gp", "rules", "portfolio")
SLOW = ("optuna-gp", "portfolio+gp")  # run on the first --slow-seeds seeds only
GP_MEMBERS = ("rules", "optuna", "random", "optuna-gp")  # `portfolio+gp` (not a default proposer)
MODELLED = ("rules", "portfolio", "portfolio+gp")  # given the fitted rules constants
PROTOCOLS = ("lopo", "dev-split", "shipped", "folds")
FOLDS = Path(__file__).resolve().parent / "results" / "rules-constants-4fold.json"
BUDGET_FRACTIONS = (0.05, 0.10, 0.20)
# The development problems of `--protocol dev-split` (labels as Problem.label()): the first
# rules model was developed on these alone (the rest of the dataset unseen) and scored on
# the others (bench/results/search-h100-devsplit.json).
DEV_PROBLEMS = (
    "M=4096 N=4096 K=4096 bf16",
    "M=64 N=4096 K=4096 bf16",
    "M=16384 N=1024 K=1024 bf16",
    "M=1 N=4096 K=4096 bf16",
)


# ---- the loop ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Trace:
    """The configs of one campaign that gave a result, in order (measured, or reused from `free`), with
    their times."""

    configs: tuple[Config, ...]
    times_ms: tuple[float | None, ...]  # None: the config did not give a timing
    true_ms: tuple[float | None, ...] = ()  # with --noise: the recorded times under the noisy ones


def noisy(result: Result, seed: int, spread: float) -> Result:
    """The result as a measurement spread by a log-normal factor (sigma `spread`), drawn from the
    seed, problem and config alone, so every proposer of a seed sees the same draw for a config."""
    if result.timing is None or spread <= 0:
        return result
    key = f"{seed}|{result.problem.key()}|{result.config.key()}".encode()
    f = math.exp(random.Random(zlib.crc32(key)).gauss(0.0, spread))
    t = result.timing
    return dataclasses.replace(result, timing=dataclasses.replace(
        t, median_ms=t.median_ms * f, p20_ms=t.p20_ms * f, p80_ms=t.p80_ms * f, min_ms=t.min_ms * f))


def declared(trace: Trace) -> tuple[float | None, ...]:
    """After each config: the recorded time of the config the campaign would declare (the best it
    measured, by its noisy times)."""
    out: list[float | None] = []
    best: int | None = None
    for i, t in enumerate(trace.times_ms):
        if t is not None and (best is None or t < (trace.times_ms[best] or math.inf)):
            best = i
        out.append(trace.true_ms[best] if best is not None else None)
    return tuple(out)


def make_proposer(name: str, ctx: ProposerContext, constants: Constants | None) -> Proposer:
    """A registered proposer; `rules` (alone or in the portfolio) with the given model constants;
    `optuna-gp` asking inline; `portfolio+gp`: the portfolio with `optuna-gp` as a fourth member."""
    def gp(c: ProposerContext) -> Proposer:
        return OptunaGpProposer(c, GpSettings(synchronous=True))

    def rules(c: ProposerContext) -> Proposer:
        return RulesProposer(c, constants=constants) if constants else get_proposer("rules")(c)

    if name == "optuna-gp":
        return gp(ctx)
    if name == "portfolio+gp":
        return PortfolioProposer(ctx, PortfolioSettings(members=GP_MEMBERS, builders={"rules": rules, "optuna-gp": gp}))
    if constants is None:
        return get_proposer(name)(ctx)
    if name == "rules":
        return RulesProposer(ctx, constants=constants)
    if name == "portfolio":
        return PortfolioProposer(ctx, PortfolioSettings(builders={"rules": rules}))
    return get_proposer(name)(ctx)


def drive(dataset: ReplayDataset, problem: Problem, proposer: str, seed: int, budget: int,
          constants: Constants | None = None, *, first: Sequence[Config] = (),
          stop_ms: float | None = None, history: HistoryReader | None = None, bounded: bool = False,
          noise: float = 0.0, free: Collection[Config] = ()) -> Trace:
    """One campaign of one problem, in process (the driver's propose/observe cycle, see the docstring).

    `first`: configs measured first (warm start), the proposer filling the first batch; `bounded`:
    only those it predicts no slower than its own first pick (as the driver queues a warm start);
    `stop_ms`: stop once a config is at least this fast; `history`: the store the proposer reads;
    `noise`: the proposer sees each time spread by it (`noisy`); `free`: configs the store has a result
    of: one proposed is reused, in the trace but not counted against the budget (as the driver counts).
    """
    family = get_family(KERNEL)
    space = dataset.space(family, problem)
    ctx = ProposerContext(KERNEL, problem, space, seed, budget, device=dataset.device, history=history,
                          kernel_version=kernel_version(dataset))
    p = make_proposer(proposer, ctx, constants)
    state = SearchState()
    configs: list[Config] = []
    times: list[float | None] = []
    true: list[float | None] = []
    head = by_prediction([Candidate(problem, c, "warm-start", "") for c in first], p.score,
                         p.best_prediction() if bounded else None)[:budget]
    measured = 0  # configs counted against the budget: those of the trace not in `free`
    try:
        while measured < budget:
            if stop_ms is not None and any(t is not None and t <= stop_ms for t in times):
                break
            room = min(BATCH, budget - measured)
            now, head = head[:room], head[room:]
            ahead = SearchState(state.results, state.pending | {c.config for c in now + head})
            batch = now + p.propose(ahead, room - len(now)) if len(now) < room else now
            if not batch:
                break
            for cand in batch:
                if cand.config in state.seen:
                    raise RuntimeError(f"{proposer} proposed a seen config {cand.config.label()}")
                state.pending.add(cand.config)
            for cand in batch:
                reason = space.check(cand.config, problem)
                recorded = (Result(problem, cand.config, Status.INVALID, dataset.result(problem, cand.config).env,
                                   message=reason) if reason else dataset.result(problem, cand.config))
                result = noisy(recorded, seed, noise)
                state.pending.discard(cand.config)
                state.results[cand.config] = result
                p.observe([result])
                if result.status.counts_against_budget:
                    configs.append(cand.config)
                    times.append(result.median_ms)
                    true.append(recorded.median_ms)
                    measured += cand.config not in free
    finally:
        p.close()
    return Trace(tuple(configs), tuple(times), tuple(true))


def kernel_version(dataset: ReplayDataset) -> str:
    """The kernel version a dataset's records name ("" where they name none or several)."""
    versions = recorded_versions(dataset.path)
    return next(iter(versions)) if len(versions) == 1 else ""


def best_after(trace: Trace, n: int) -> float:
    ok = [t for t in trace.times_ms[:n] if t is not None]
    return min(ok) if ok else math.inf


def configs_to_reach(trace: Trace, target_ms: float) -> float:
    """Distinct configs measured until one is within the target; inf if never."""
    for i, t in enumerate(trace.times_ms, start=1):
        if t is not None and t <= target_ms:
            return float(i)
    return math.inf


# ---- the fixed-list baseline ---------------------------------------------------------------------
def regret_table(dataset: ReplayDataset, problems: Sequence[Problem]) -> dict[Problem, dict[Config, float]]:
    """Regret of every config that ran, per problem."""
    out: dict[Problem, dict[Config, float]] = {}
    for p in problems:
        opt = dataset.optimum_ms(p)
        assert opt is not None
        out[p] = {c: r.median_ms / opt - 1.0 for c, r in dataset.records(p).items() if r.median_ms is not None}
    return out


def greedy_list(table: dict[Problem, dict[Config, float]], size: int,
                keep: Callable[[Config], bool] | None = None) -> list[Config]:
    """Configs added one at a time, each lowering (worst, mean) regret over the problems the most;
    with `keep`, the first `size` of that order that `keep` accepts (a list pruned of the configs a
    problem cannot run, as an autotuner's list is: every config of a matmul grid runs on every problem,
    a row-wise grid's blocks depend on the row's length)."""
    configs = sorted({c for regrets in table.values() for c in regrets}, key=Config.key)
    chosen: list[Config] = []
    kept: list[Config] = []
    best = {p: math.inf for p in table}
    while len(kept) < size and len(chosen) < len(configs):
        pick = min((c for c in configs if c not in chosen), key=lambda c, best=best: _list_score(table, best, c))
        chosen.append(pick)
        if keep is None or keep(pick):
            kept.append(pick)
        best = {p: min(best[p], table[p].get(pick, math.inf)) for p in table}
    return kept


def _list_score(table: dict[Problem, dict[Config, float]], best: dict[Problem, float],
                c: Config) -> tuple[float, float]:
    after = [min(best[p], table[p].get(c, math.inf)) for p in table]
    return max(after), sum(after) / len(after)


def fixed_list_regret(dataset: ReplayDataset, problem: Problem, size: int) -> tuple[float, list[Config]]:
    others = [p for p in dataset.problems if p != problem]
    records = dataset.records(problem)
    chosen = greedy_list(regret_table(dataset, others), size,
                         keep=lambda c: c in records and records[c].status is not Status.INVALID)
    opt = dataset.optimum_ms(problem)
    assert opt is not None
    times = [r.median_ms for c in chosen if (r := records.get(c)) and r.median_ms is not None]
    return (min(times) / opt - 1.0 if times else math.inf), chosen


# ---- tasks ---------------------------------------------------------------------------------------
_DATASET: ReplayDataset | None = None


def _init(path: str, kernel: str = "matmul", batch: int = 4, noise: float = 0.0) -> None:
    global _DATASET, KERNEL, BATCH, NOISE
    logging.basicConfig(level=logging.WARNING)
    KERNEL, BATCH, NOISE = kernel, batch, noise
    _DATASET = load_dataset(path, get_family(KERNEL))


Task = tuple[str, str, int, int, Constants | None]


def _task(args: Task) -> tuple[str, str, int, int, list[float | None], float]:
    proposer, problem_key, seed, budget, constants = args
    assert _DATASET is not None
    problem = next(p for p in _DATASET.problems if p.key() == problem_key)
    reach = budget == len(_DATASET.records(problem))  # stop at the target: to_2pct reads no further
    stop_ms = (_DATASET.optimum_ms(problem) or math.inf) * (1 + TOLERANCE) if reach else None
    t0 = time.perf_counter()
    trace = drive(_DATASET, problem, proposer, seed, budget, constants, stop_ms=stop_ms, noise=NOISE)
    times = list(declared(trace)) if NOISE else list(trace.times_ms)
    return proposer, problem_key, seed, budget, times, time.perf_counter() - t0


def _fit_task(train_keys: list[str]) -> Constants:
    assert _DATASET is not None
    return fit(problem_data(_DATASET, [p for p in _DATASET.problems if p.key() in train_keys]))


def order_mark(protocol: str) -> float:
    """How much of the tile model's order mark the run's constants take on (`Constants.order_mark`):
    a fit's (`fit_rules.NEUTRAL`) where the constants are fitted, else the shipped one or --order-mark."""
    if protocol != "shipped":
        return NEUTRAL.order_mark
    return DEFAULT_CONSTANTS.order_mark if ORDER_MARK is None else ORDER_MARK


def fold_constants(pool: Any, dataset: ReplayDataset, protocol: str) -> dict[str, Constants]:
    """The rules model's constants each problem is scored with (problem key -> constants)."""
    keys = [p.key() for p in dataset.problems]
    if protocol == "dev-split":
        chosen = [p for p in dataset.problems if p.label() in DEV_PROBLEMS]
        if not chosen:
            raise ValueError(f"{dataset.path.name} holds none of the development problems {DEV_PROBLEMS}")
        dev = fit(problem_data(dataset, chosen))
        return dict.fromkeys(keys, dev)
    if protocol == "shipped":
        return dict.fromkeys(keys, dataclasses.replace(DEFAULT_CONSTANTS, order_mark=order_mark(protocol)))
    if protocol == "folds":
        return {p.key(): dataclasses.replace(DEFAULT_CONSTANTS, order_mark=order_mark(protocol), **f["constants"])
                for f in json.loads(FOLDS.read_text())["folds"] for p in dataset.problems if p.label() in f["held_out"]}
    fitted = pool.map(_fit_task, [[k for k in keys if k != held] for held in keys], chunksize=1)
    return dict(zip(keys, fitted, strict=True))


# ---- aggregation ---------------------------------------------------------------------------------
def summarise_regret(per_problem: dict[str, list[float]], held_out: Sequence[str]) -> dict[str, Any]:
    """per_problem: problem label -> regret of each seed."""
    rows = {k: v for k, v in per_problem.items() if k in held_out}
    if not rows:
        return {}
    means = [statistics.fmean(v) for v in rows.values()]
    everything = [x for v in rows.values() for x in v]
    return {
        "mean": statistics.fmean(everything),
        "median_problem": statistics.median(means),
        "worst_problem_mean": max(means),
        "worst_run": max(everything),
        "problems_within_2pct_every_seed": sum(max(v) <= TOLERANCE for v in rows.values()),
        "problems": len(rows),
    }


def summarise_reach(per_problem: dict[str, list[float]], held_out: Sequence[str]) -> dict[str, Any]:
    rows = {k: v for k, v in per_problem.items() if k in held_out}
    if not rows:
        return {}
    medians = [statistics.median(v) for v in rows.values()]
    return {"median": statistics.median(medians), "worst_problem": max(medians),
            "mean": statistics.fmean(medians), "problems": len(rows)}


def dataset_info(dataset: ReplayDataset) -> dict[str, Any]:
    first = next(iter(dataset.records(dataset.problems[0]).values()))
    recorded = sorted({r.env.device for p in dataset.problems for r in dataset.records(p).values()})
    problems = {}
    for p in dataset.problems:
        recs = dataset.records(p)
        opt = dataset.optimum_ms(p)
        ok = [r for r in recs.values() if r.median_ms is not None]
        base = dataset.baseline(p)
        problems[p.label()] = {
            "configs": len(recs), "ok": len(ok), "optimum_ms": opt,
            "within_2pct": sum(1 for r in ok if opt and r.median_ms and r.median_ms <= opt * (1 + TOLERANCE)),
            "statuses": dict(sorted(_count(str(r.status) for r in recs.values()).items())),
            "baseline": {"name": base[0], "median_ms": base[1].median_ms} if base else None,
            "dev": p.label() in DEV_PROBLEMS,
        }
    return {"path": str(dataset.path), "identity": dataset.identity, "devices": recorded,
            "torch": first.env.torch, "triton": first.env.triton, "driver": first.env.driver,
            "problems": problems}


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def table(result: dict[str, Any], scope: str) -> str:
    budgets = result["budgets"]
    head = (f"{'proposer':<11} {'to 2% med':>9} {'worst':>6} "
            + " ".join(f"{'reg@' + str(b) + ' mean':>12} {'med':>6} {'worst':>6}" for b in budgets))
    lines = [f"[{scope}]", head]
    for name, row in result["proposers"].items():
        reach = row["to_2pct"].get(scope, {})
        cells = [f"{name:<11}", f"{_fmt(reach.get('median')):>9}", f"{_fmt(reach.get('worst_problem')):>6}"]
        for b in budgets:
            r = row["regret"].get(str(b), {}).get(scope, {})
            cells += [f"{_pct(r.get('mean')):>12}", f"{_pct(r.get('median_problem')):>6}",
                      f"{_pct(r.get('worst_problem_mean')):>6}"]
        lines.append(" ".join(cells))
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else ("never" if math.isinf(x) else f"{x:g}")


def _pct(x: float | None) -> str:
    return "-" if x is None else ("inf" if math.isinf(x) else f"{100 * x:.2f}%")


# ---- main ----------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    dataset = load_dataset(args.dataset, get_family(KERNEL))
    problems = dataset.problems
    labels = [p.label() for p in problems]
    held_out = labels if args.protocol != "dev-split" else [lb for lb in labels if lb not in DEV_PROBLEMS]
    grid = max(len(dataset.records(p)) for p in problems)
    budgets = [max(1, round(f * grid)) for f in BUDGET_FRACTIONS]
    proposers = [s for s in args.proposers.split(",") if s]
    seeds = list(range(args.seeds))
    seeds_of = {name: seeds[:1] if name == "grid" else seeds[:args.slow_seeds] if name in SLOW else seeds
                for name in proposers}
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(args.jobs, initializer=_init,
                                      initargs=(str(args.dataset), KERNEL, BATCH, NOISE)) as pool:
        fitted = any(n in MODELLED for n in proposers)
        constants = fold_constants(pool, dataset, args.protocol) if fitted else {}
        if fitted:
            log.info("rules constants fitted (%s) in %.0f s", args.protocol, time.perf_counter() - t0)
        tasks: list[Task] = [  # with --noise, the budgets only: a noisy time is no stop
            (name, p.key(), s, b, constants[p.key()] if name in MODELLED else None)
            for name in proposers for p in problems for s in seeds_of[name]
            for b in [*budgets, *([] if NOISE else [len(dataset.records(p))])]]
        done = pool.map(_task, tasks, chunksize=1)
    wall = time.perf_counter() - t0
    by_key = {p.key(): p for p in problems}
    out: dict[str, Any] = {}
    for name in proposers:
        reach: dict[str, list[float]] = {}
        regret: dict[int, dict[str, list[float]]] = {b: {} for b in budgets}
        cpu = 0.0
        for prop, key, _seed, budget, times, secs in done:
            if prop != name:
                continue
            cpu += secs
            p = by_key[key]
            opt = dataset.optimum_ms(p) or math.inf
            trace = Trace((), tuple(times))
            if budget == len(dataset.records(p)):
                reach.setdefault(p.label(), []).append(configs_to_reach(trace, opt * (1 + TOLERANCE)))
            if budget in regret:
                at = (next((t for t in reversed(times[:budget]) if t is not None), math.inf) if NOISE
                      else best_after(trace, budget))  # noise: the declared winner's recorded time
                regret[budget].setdefault(p.label(), []).append(at / opt - 1.0)
        out[name] = {
            "seeds": len(seeds_of[name]),
            "to_2pct": {"held_out": summarise_reach(reach, held_out), "all": summarise_reach(reach, labels),
                        "per_problem": {k: statistics.median(v) for k, v in reach.items()}},
            "regret": {str(b): {"held_out": summarise_regret(regret[b], held_out),
                                "all": summarise_regret(regret[b], labels),
                                "per_problem": {k: statistics.fmean(v) for k, v in regret[b].items()}}
                       for b in budgets},
            "cpu_s": round(cpu, 1),
        }
        if args.protocol == "folds":
            out[name]["per_fold"] = {
                str(f["fold"]): {"to_2pct": summarise_reach(reach, f["held_out"]),
                                 "regret": {str(b): summarise_regret(regret[b], f["held_out"]) for b in budgets}}
                for f in json.loads(FOLDS.read_text())["folds"]}
    out["fixed-list"] = fixed_list_summary(dataset, budgets, held_out, labels)
    return {
        "command": "python " + " ".join(sys.argv),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "kernel": KERNEL,
        "dataset": dataset_info(dataset),
        "method": __doc__.split("Method. ")[1].split("\n\nHeld out.")[0].replace("\n", " "),
        "protocol": args.protocol, "order_mark": order_mark(args.protocol),
        "held_out_method": __doc__.split("Held out. ")[1].replace("\n", " ").strip(),
        "rules_constants": {p.label(): dataclasses.asdict(c) for p in problems if (c := constants.get(p.key()))},
        "dev_problems": list(DEV_PROBLEMS),
        "held_out_problems": held_out,
        "grid": grid, "budgets": budgets, "batch": BATCH, "noise": NOISE, "tolerance": TOLERANCE, "seeds": seeds,
        "proposers": out,
        "wall_s": round(wall, 1),
    }


def fixed_list_summary(dataset: ReplayDataset, budgets: Sequence[int], held_out: Sequence[str],
                       labels: Sequence[str]) -> dict[str, Any]:
    regret: dict[str, dict[str, Any]] = {}
    lists: dict[str, dict[str, list[str]]] = {}
    for b in budgets:
        per = {}
        for p in dataset.problems:
            r, chosen = fixed_list_regret(dataset, p, b)
            per[p.label()] = [r]
            lists.setdefault(str(b), {})[p.label()] = [c.label() for c in chosen]
        regret[str(b)] = {"held_out": summarise_regret(per, held_out), "all": summarise_regret(per, labels),
                          "per_problem": {k: v[0] for k, v in per.items()}}
    return {"seeds": 1, "to_2pct": {}, "regret": regret, "lists": lists}


# ---- warm start ----------------------------------------------------------------------------------
WARM_PROPOSERS = ("rules", "portfolio", "optuna", "random")
ARMS = ("cold", "warm")


def recorded_winner(dataset: ReplayDataset, problem: Problem) -> WinnerSource:
    """The recorded optimum of a problem, as the winner a campaign that found it would have left."""
    records = dataset.records(problem)
    config = dataset.optimum(problem)
    env = records[config].env
    return WinnerSource(problem, config, records[config].median_ms or math.inf, "recorded-grid", env.torch,
                        env.triton, 0.0)


def warm_configs(dataset: ReplayDataset, problem: Problem, budget: int) -> list[Candidate]:
    """What warm start queues first for `problem`, from the OTHER problems' winners only."""
    sources = [recorded_winner(dataset, q) for q in dataset.problems if q != problem]
    env = next(iter(dataset.records(problem).values())).env
    return warm_candidates(problem, dataset.space(get_family(KERNEL), problem), sources, budget=budget,
                           torch=env.torch, triton=env.triton, exclude_self=True)


WarmTask = tuple[str, str, int, str, Constants | None]


def _warm_task(args: WarmTask) -> tuple[str, str, int, str, float, float]:
    proposer, problem_key, seed, arm, constants = args
    assert _DATASET is not None
    problem = next(p for p in _DATASET.problems if p.key() == problem_key)
    budget = len(_DATASET.records(problem))
    first = [c.config for c in warm_configs(_DATASET, problem, budget)] if arm == "warm" else []
    history = (ReplayHistory({q: _DATASET for q in _DATASET.problems if q != problem}, STORE_BUDGET, constants)
               if arm == "warm" else None)
    target = (_DATASET.optimum_ms(problem) or math.inf) * (1 + TOLERANCE)
    t0 = time.perf_counter()
    trace = drive(_DATASET, problem, proposer, seed, budget, constants, first=first, stop_ms=target,
                  history=history, bounded=True)
    return proposer, problem_key, seed, arm, configs_to_reach(trace, target), time.perf_counter() - t0


def run_warm(args: argparse.Namespace) -> dict[str, Any]:
    dataset = load_dataset(args.dataset, get_family(KERNEL))
    problems = dataset.problems
    labels = [p.label() for p in problems]
    proposers = [s for s in (args.proposers or ",".join(WARM_PROPOSERS)).split(",") if s]
    seeds = list(range(args.seeds))
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(args.jobs, initializer=_init,
                                      initargs=(str(args.dataset), KERNEL, BATCH)) as pool:
        fitted = any(n in MODELLED for n in proposers)
        constants = fold_constants(pool, dataset, args.protocol) if fitted else {}
        if fitted:
            log.info("rules constants fitted (%s) in %.0f s", args.protocol, time.perf_counter() - t0)
        tasks: list[WarmTask] = [(name, p.key(), s, arm, constants.get(p.key()) if name in MODELLED
                                  else None) for name in proposers for p in problems for s in seeds for arm in ARMS]
        done = pool.map(_warm_task, tasks, chunksize=1)
    by_key = {p.key(): p for p in problems}
    out: dict[str, Any] = {}
    for name in proposers:
        reach: dict[str, dict[str, list[float]]] = {arm: {} for arm in ARMS}
        cpu = 0.0
        for prop, key, _seed, arm, n, secs in done:
            if prop == name:
                reach[arm].setdefault(by_key[key].label(), []).append(n)
                cpu += secs
        summary = {arm: summarise_reach(reach[arm], labels) for arm in ARMS}
        cold, warm = summary["cold"]["median"], summary["warm"]["median"]
        out[name] = {
            **summary,
            "warm_over_cold_median": warm / cold if cold and not math.isinf(cold) else None,
            "target_warm_at_most_half_cold": warm <= cold / 2,
            "per_problem": {lb: {arm: statistics.median(reach[arm][lb]) for arm in ARMS} for lb in labels},
            "cpu_s": round(cpu, 1),
        }
    firsts = {p.label(): [{"config": c.config.label(), "source": c.rationale}
                          for c in warm_configs(dataset, p, len(dataset.records(p)))] for p in problems}
    hits = sum(1 for p in problems if _first_hit(dataset, p) == 1)
    return {
        "command": "python " + " ".join(sys.argv),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "dataset": {"path": str(dataset.path), "identity": dataset.identity, "problems": len(problems)},
        "method": __doc__.split("Warm start (`--arm warm`). ")[1].replace("\n", " ").strip(),
        "protocol": args.protocol, "order_mark": order_mark(args.protocol), "batch": BATCH, "tolerance": TOLERANCE,
        "seeds": seeds,
        "warm_configs": firsts,
        "problems_whose_first_warm_config_is_within_2pct": hits,
        "proposers": out,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def _first_hit(dataset: ReplayDataset, problem: Problem) -> float:
    """Which warm-start config (1-based) first comes within 2% of the problem's optimum; inf if none."""
    target = (dataset.optimum_ms(problem) or math.inf) * (1 + TOLERANCE)
    for i, c in enumerate(warm_configs(dataset, problem, len(dataset.records(problem))), start=1):
        r = dataset.records(problem).get(c.config)
        if r is not None and r.median_ms is not None and r.median_ms <= target:
            return float(i)
    return math.inf


def warm_table(result: dict[str, Any]) -> str:
    lines = [f"{'proposer':<11} {'cold med':>8} {'mean':>6} {'worst':>6} {'warm med':>8} {'mean':>6} {'worst':>6} "
             f"{'warm/cold':>9}"]
    for name, row in result["proposers"].items():
        c, w = row["cold"], row["warm"]
        ratio = row["warm_over_cold_median"]
        lines.append(f"{name:<11} {_fmt(c['median']):>8} {c['mean']:>6.2f} {_fmt(c['worst_problem']):>6} "
                     f"{_fmt(w['median']):>8} {w['mean']:>6.2f} {_fmt(w['worst_problem']):>6} "
                     f"{'-' if ratio is None else f'{ratio:.2f}':>9}")
    return "\n".join(lines)


# ---- history first (--arm history) --------------------------------------------------------------
# A head is a string, one letter per config queued before the proposer's own picks: `r` the rules
# proposer's next cold pick, `n` the next winner of the nearest store problems (warm_start's
# order), `c` the next config of the covering list of every store problem, `s` the same over the
# NEAR_COVER store problems nearest in log-shape space; "warm" is what warm_start queues today.
# A head starting with `T` gives the proposer the store as its history (the rules model corrected by
# the nearest store problem of its regime, see agents/rules.py), the rest of it queued as above:
# `T` and `Twarm` read a store whose problems each hold what a `rules` campaign of STORE_BUDGET
# configs measured there, `Tgrid` one that holds every recorded result of each (an upper bound).
# `warm` and `Twarm` queue what warm start queues: of its configs those the proposer predicts no
# slower than its own first pick (`warm_start.by_prediction`); `warmall` and `Twarmall` all of them
# (warm start before that bound).
HEADS = ("", "warm", "n", "cc", "cccc", "ssss", "rrrrss", "rrrrssss", "rrrrnn", "T", "Twarm", "Tgrid",
         "warmall", "Twarmall")
NEAR_COVER = 8
HISTORY_BUDGET = 8
STORE_BUDGET = 32
_HISTORY: ReplayDataset | None = None  # --history: its datasets as one (merge)
_SOURCE: dict[Problem, ReplayDataset] = {}  # each --history problem -> the dataset it was recorded in
STORES = "stores"  # the scope of several --history datasets


def merge(datasets: Sequence[ReplayDataset]) -> ReplayDataset:
    """Several datasets of one kernel as one (a problem may be in one of them only); its devices are
    theirs, so a campaign is driven on the dataset a problem came from (`_SOURCE`), never on this."""
    if len(datasets) == 1:
        return datasets[0]
    seen: dict[Problem, str] = {}
    for d in datasets:
        for q in d.problems:
            if q in seen:
                raise InputError(f"--history: {q.label()} is in both {seen[q]} and {d.path.name} (a problem "
                                 "may be in one of the datasets only)")
            seen[q] = d.path.name
    records = [r for d in datasets for q in d.problems for r in d.records(q).values()]
    return ReplayDataset(Path("+".join(d.path.name for d in datasets)), datasets[0].kernel, records,
                         "+".join(d.identity for d in datasets))


def load_history(paths: str) -> tuple[ReplayDataset | None, dict[Problem, ReplayDataset]]:
    """--history A[,B...]: the datasets as one, and the dataset each problem came from."""
    datasets = [load_dataset(p, get_family(KERNEL)) for p in paths.split(",") if p]
    return (merge(datasets) if datasets else None), {q: d for d in datasets for q in d.problems}


class ReplayHistory:
    """A store of earlier campaigns on replay data (`HistoryReader`): each problem of `sources` (its
    dataset) holds what a campaign of `proposer` (default `rules`, with `constants`; seed `seed`) of
    `budget` configs measured there, or every recorded result where `budget` is None, on the dataset's
    device. The kernel is the datasets'."""

    def __init__(self, sources: dict[Problem, ReplayDataset], budget: int | None,
                 constants: Constants | None, *, proposer: str = "rules", seed: int = 0) -> None:
        self.sources, self.budget, self.constants = sources, budget, constants
        self.proposer, self.seed = proposer, seed
        self._measured: dict[Problem, list[tuple[Config, float]]] = {}

    def devices(self, kernel: str) -> list[str]:
        return sorted({d.device for d in self.sources.values()})

    def measured_problems(self, kernel: str, device: str) -> list[Problem]:
        return [q for q, d in self.sources.items() if d.device == device]

    def kernel_versions(self, kernel: str, device: str, problem: Problem) -> frozenset[str]:
        return recorded_versions(self.sources[problem].path)

    def measured(self, kernel: str, device: str, problem: Problem) -> list[tuple[Config, float]]:
        if problem not in self._measured:
            store = self.sources[problem]
            if self.budget is None:
                rows = [(c, r.median_ms) for c, r in store.records(problem).items()]
            else:
                trace = drive(store, problem, self.proposer, self.seed, self.budget, self.constants)
                rows = list(zip(trace.configs, trace.times_ms, strict=True))
            self._measured[problem] = [(c, t) for c, t in rows if t is not None]
        return self._measured[problem]


def cover_list(store: ReplayDataset, problems: Sequence[Problem], fits: Any, size: int) -> list[Config]:
    """Greedy set cover of "within TOLERANCE of the problem's best" over `problems` (ties: the lower
    mean regret of the list); once every problem is covered, a second cover starts."""
    table = regret_table(store, problems)
    configs = [c for c in sorted({c for t in table.values() for c in t}, key=Config.key) if fits(c)]
    chosen: list[Config] = []
    uncovered, best = set(table), dict.fromkeys(table, math.inf)
    while len(chosen) < size and len(chosen) < len(configs):
        def score(c: Config, uncovered: set[Problem] = uncovered,
                  best: dict[Problem, float] = best) -> tuple[int, float]:
            covered = sum(1 for q in uncovered if table[q].get(c, math.inf) <= TOLERANCE)
            return -covered, sum(min(best[q], table[q].get(c, math.inf)) for q in table)
        pick = min((c for c in configs if c not in chosen), key=score)
        chosen.append(pick)
        uncovered -= {q for q in uncovered if table[q].get(pick, math.inf) <= TOLERANCE}
        best = {q: min(best[q], table[q].get(pick, math.inf)) for q in table}
        uncovered = uncovered or set(table)
    return chosen


def history_head(problem: Problem, head: str, store: ReplayDataset, others: Sequence[Problem], budget: int,
                 constants: Constants | None) -> list[Config]:
    """The configs queued first for `problem` (see HEADS), from the store problems `others` only."""
    assert _DATASET is not None
    from tilepilot.orchestrator.warm_start import _fits, distance
    space = _DATASET.space(get_family(KERNEL), problem)
    env = next(iter(_DATASET.records(problem).values())).env
    sources = [recorded_winner(store, q) for q in others]
    warm = [c.config for c in warm_candidates(problem, space, sources, budget=budget, torch=env.torch,
                                              triton=env.triton, exclude_self=True)]
    if head in ("warm", "warmall"):
        return warm
    fits = lambda c: _fits(space, problem, c) is not None  # noqa: E731
    nearest = sorted(others, key=lambda q: (distance(problem, q), q.key()))[:NEAR_COVER]
    streams = {
        "r": iter(drive(_DATASET, problem, "rules", 0, budget, constants).configs) if "r" in head else iter(()),
        "n": iter(warm),
        "c": iter(cover_list(store, others, fits, budget) if "c" in head else ()),
        "s": iter(cover_list(store, nearest, fits, budget) if "s" in head else ()),
    }
    out: list[Config] = []
    for letter in head:
        pick = next((c for c in streams[letter] if c not in out), None)
        if pick is not None:
            out.append(pick)
    return out


HistoryTask = tuple[str, str, str, int, tuple[str, ...], Constants | None]


def _history_task(args: HistoryTask) -> tuple[str, str, str, int, float, float]:
    """(scope, head, problem, seed) -> best regret after HISTORY_BUDGET configs, configs to reach 2%."""
    scope, head, key, seed, others_keys, constants = args
    assert _DATASET is not None
    history = scope in ("other-device", "same-device", STORES)
    store = _HISTORY if history else _DATASET
    assert store is not None
    problem = next(p for p in _DATASET.problems if p.key() == key)
    others = [q for q in store.problems if q.key() in others_keys]
    opt = _DATASET.optimum_ms(problem) or math.inf
    full = len(_DATASET.records(problem))
    reader, queued = None, head
    if head.startswith("T"):
        sources = {q: _SOURCE[q] if history else store for q in others}
        if history:  # the other problems of the dataset too
            sources.update({q: _DATASET for q in _DATASET.problems if q != problem})
        reader = ReplayHistory(sources, None if head == "Tgrid" else STORE_BUDGET, constants)
        queued = "" if head == "Tgrid" else head[1:]
    if scope == STORES:  # the winners queued first: of the campaign's device only, as warm start takes them
        own = [q for q in others if _SOURCE[q].device == _DATASET.device]
        store = merge([_DATASET, *{id(_SOURCE[q]): _SOURCE[q] for q in own}.values()])
        others = own + [q for q in _DATASET.problems if q != problem]
    bounded = queued == "warm"  # as the driver queues a warm start; "warmall": all of it first (before)
    at = drive(_DATASET, problem, "rules", seed, HISTORY_BUDGET, constants, history=reader, bounded=bounded,
               first=history_head(problem, queued, store, others, HISTORY_BUDGET, constants) if queued else ())
    reach = drive(_DATASET, problem, "rules", seed, full, constants, stop_ms=opt * (1 + TOLERANCE),
                  history=reader, bounded=bounded,
                  first=history_head(problem, queued, store, others, full, constants) if queued else ())
    target = opt * (1 + TOLERANCE)
    return scope, head, key, seed, best_after(at, HISTORY_BUDGET) / opt - 1.0, configs_to_reach(reach, target)


def _init_history(path: str, history: str, batch: int = 4) -> None:
    global _HISTORY, _SOURCE
    _init(path, batch=batch)
    _HISTORY, _SOURCE = load_history(history)


def history_scopes(dataset: ReplayDataset, history: ReplayDataset | None, protocol: str,
                   several: bool = False) -> dict[str, dict[str, tuple[str, ...]]]:
    """scope -> problem key -> the keys of the store problems it may read (never its own); `several`:
    the history is several datasets (`merge`), the scope STORES."""
    keys = [p.key() for p in dataset.problems]
    scopes = {"other-problems": {k: tuple(q for q in keys if q != k) for k in keys}}
    if protocol == "folds":
        folds = json.loads(FOLDS.read_text())["folds"]
        fold_of = {lb: f["fold"] for f in folds for lb in f["held_out"]}
        label = {p.key(): p.label() for p in dataset.problems}
        scopes["other-folds"] = {k: tuple(q for q in keys if fold_of[label[q]] != fold_of[label[k]]) for k in keys}
    if history is not None:
        same = set(history.devices) == set(dataset.devices)
        name = STORES if several else "same-device" if same else "other-device"
        scopes[name] = {k: tuple(q.key() for q in history.problems) for k in keys}
    return scopes


def _runs(head: str, scope: str) -> bool:
    """Whether a head runs in a scope: with another dataset of the campaign's device as the store
    ("same-device"), the T heads only (history read by the proposer); with one of another device
    ("other-device"), every head: the T heads read its results with the dataset's other problems
    (the proposer reads a sibling device's, `roofline.SIBLINGS`), the others take its winners; with
    several (STORES), the T heads only, their winners those of the campaign's device."""
    return head.startswith("T") or scope not in ("same-device", STORES)


def run_history(args: argparse.Namespace) -> dict[str, Any]:
    heads = ("", *args.heads.split(",")) if args.heads else HEADS
    dataset = load_dataset(args.dataset, get_family(KERNEL))
    history, _ = load_history(args.history or "")
    if history is not None and (shared := [q.label() for q in dataset.problems if q in set(history.problems)]):
        raise InputError(f"--history {args.history}: holds {shared[0]} of --dataset {args.dataset} too (the store "
                         "may hold only other problems)")
    scopes = history_scopes(dataset, history, args.protocol, several="," in (args.history or ""))
    labels = [p.label() for p in dataset.problems]
    seeds = list(range(args.seeds))
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(args.jobs, initializer=_init_history,
                                      initargs=(str(args.dataset), args.history or "", BATCH)) as pool:
        constants = fold_constants(pool, dataset, args.protocol)
        tasks: list[HistoryTask] = [(scope, head, p.key(), s, others[p.key()], constants[p.key()])
                                    for scope, others in scopes.items() for head in heads
                                    for p in dataset.problems for s in seeds
                                    if (head or scope == next(iter(scopes))) and (not head or _runs(head, scope))]
        done = pool.map(_history_task, tasks, chunksize=1)
    label = {p.key(): p.label() for p in dataset.problems}
    out: dict[str, Any] = {}
    for scope, others in scopes.items():
        store = history if scope in ("other-device", "same-device", STORES) else dataset
        assert store is not None
        rows: dict[str, Any] = {}
        for head in heads:
            if head and not _runs(head, scope):
                continue
            regret: dict[str, list[float]] = {}
            reach: dict[str, list[float]] = {}
            for sc, hd, key, _s, r, n in done:
                if hd == head and (sc == scope or not head):
                    regret.setdefault(label[key], []).append(r)
                    reach.setdefault(label[key], []).append(n)
            rows[head or "cold"] = {"regret": summarise_regret(regret, labels),
                                    "to_2pct": summarise_reach(reach, labels),
                                    "per_problem": {lb: statistics.fmean(v) for lb, v in regret.items()},
                                    "to_2pct_per_problem": {lb: statistics.median(v) for lb, v in reach.items()}}
        fixed = {}
        for p in dataset.problems:
            chosen = greedy_list(regret_table(store, [q for q in store.problems if q.key() in others[p.key()]]),
                                 HISTORY_BUDGET)
            times = [r.median_ms for c in chosen if (r := dataset.records(p).get(c)) and r.median_ms is not None]
            fixed[p.label()] = [min(times) / (dataset.optimum_ms(p) or math.inf) - 1.0 if times else math.inf]
        rows["fixed-list"] = {"regret": summarise_regret(fixed, labels),
                              "per_problem": {lb: v[0] for lb, v in fixed.items()}}
        out[scope] = rows
    return {
        "command": "python " + " ".join(sys.argv),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "dataset": {"path": str(dataset.path), "identity": dataset.identity, "problems": len(labels)},
        "history": str(args.history or ""),
        "method": __doc__.split("History first (`--arm history`). ")[1].replace("\n", " ").strip(),
        "protocol": args.protocol, "order_mark": order_mark(args.protocol), "budget": HISTORY_BUDGET, "batch": BATCH,
        "tolerance": TOLERANCE,
        "seeds": seeds, "heads": list(heads), "near_cover": NEAR_COVER,
        "scopes": {s: "store: " + {"other-problems": "every other problem of the dataset",
                                  "other-folds": "the problems of the other three folds",
                                  "other-device": f"every problem of {args.history} (T heads: and every "
                                                  "other problem of the dataset)",
                                  "same-device": f"every problem of {args.history} and every other problem "
                                                 "of the dataset (T heads)",
                                  STORES: f"every problem of {args.history} and every other problem of the "
                                          "dataset (T heads; the winners queued first: of the campaign's "
                                          "device only)"}[s] for s in scopes},
        "results": out,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def history_table(result: dict[str, Any]) -> str:
    lines = []
    for scope, rows in result["results"].items():
        lines.append(f"[{scope}] {'head':<10} {'within 2%':>9} {'mean':>7} {'worst':>7} {'to 2% med':>9} {'mean':>6}")
        for head, row in rows.items():
            r, n = row["regret"], row.get("to_2pct", {})
            within = f"{r['problems_within_2pct_every_seed']:>4}/{r['problems']:<4}"
            lines.append(f"{'':<{len(scope) + 2}} {head:<10} {within} "
                         f"{_pct(r['mean']):>7} {_pct(r['worst_problem_mean']):>7} {_fmt(n.get('median')):>9} "
                         f"{'-' if n.get('mean') is None else format(n['mean'], '.2f'):>6}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    global KERNEL, BATCH, NOISE, ORDER_MARK
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arm", choices=("search", "warm", "history"), default="search",
                   help="search: every proposer's efficiency; warm: warm start against a cold start; "
                        "history: rules with history-first heads at 8 configs")
    p.add_argument("--history", help="--arm history: a dataset of other problems read as the store (several: "
                                     "A,B,...: the scope \"stores\")")
    p.add_argument("--heads", help=f"--arm history: which heads besides cold (default: all of "
                                   f"{','.join(h for h in HEADS if h)})")
    p.add_argument("--kernel", default="matmul",
                   help="the family whose recorded grid is searched (another than matmul: --protocol shipped, "
                        "--arm search or warm)")
    p.add_argument("--dataset", help="default: the family's own H100 grid, e.g. data/replay/matmul-h100.jsonl.gz")
    p.add_argument("--out", help="default: bench/results/search-h100.json (search), warm-start-h100.json (warm)")
    p.add_argument("--protocol", choices=PROTOCOLS, default="lopo")
    p.add_argument("--proposers", help=f"default: {','.join(PROPOSERS)} (search), {','.join(WARM_PROPOSERS)} (warm)")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--slow-seeds", type=int, default=3, help=f"seeds of the slow proposers ({', '.join(SLOW)})")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--batch", type=int, default=BATCH,
                   help=f"configs proposed before any of them is answered (default {BATCH}, the driver's batch; "
                        "8 is the driver's first fill, two batches, as a campaign of one problem asks at budget 8)")
    p.add_argument("--noise", type=float, default=0.0,
                   help="--arm search: each time the proposer sees is the recorded one spread by a log-normal "
                        "factor of this sigma (0.03: 3%%); regret is the recorded time of the config it would "
                        "declare; no configs-to-2%% (default 0: the recorded times)")
    p.add_argument("--order-mark", type=float,
                   help="--protocol shipped: how much of the tile model's order mark its times take on, from 0 "
                        "(as before it) to 1 (as shipped; the default)")
    args = p.parse_args(argv)
    if args.order_mark is not None and not 0 <= args.order_mark <= 1:
        p.error(f"--order-mark {args.order_mark}: must be from 0 to 1")
    if args.order_mark is not None and args.protocol != "shipped":
        p.error(f"--order-mark with --protocol {args.protocol}: only with --protocol shipped (the others fit "
                "and score the H100 grid as recorded, without the mark)")
    if args.batch < 1:
        p.error(f"--batch {args.batch}: must be 1 or more")
    if not 0 <= args.noise < 1:
        p.error(f"--noise {args.noise}: must be at least 0 and below 1")
    if args.noise and args.arm != "search":
        p.error(f"--noise {args.noise}: only for --arm search")
    BATCH, NOISE, ORDER_MARK = args.batch, args.noise, args.order_mark
    from tilepilot.kernels import family_names
    from tilepilot.orchestrator.replay import default_dataset

    if args.kernel not in family_names():
        p.error(f"unknown --kernel {args.kernel!r} (allowed: {', '.join(family_names())})")
    if args.kernel != "matmul" and args.protocol != "shipped":
        p.error(f"--kernel {args.kernel}: only --protocol shipped (the rules constants are fitted on matmul grids)")
    if args.kernel != "matmul" and args.arm == "history":
        p.error(f"--kernel {args.kernel}: --arm history is for matmul (allowed here: --arm search or warm)")
    KERNEL = args.kernel
    try:
        args.dataset = args.dataset or str(default_dataset(KERNEL))
    except InputError as e:
        p.error(str(e))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.arm == "warm":
        args.out = args.out or "bench/results/warm-start-h100.json"
        result = run_warm(args)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(_finite(result), indent=1) + "\n")
        sys.stdout.write(warm_table(result) + "\n")
        log.info("wrote %s (%.0f s)", args.out, result["wall_s"])
        return 0
    if args.arm == "history":
        bad = [h for h in args.heads.split(",") if h not in HEADS[1:]] if args.heads else []
        if bad:
            p.error(f"unknown --heads {bad[0]!r} (allowed: {', '.join(HEADS[1:])})")
        args.out = args.out or "bench/results/warm-start-history-h100.json"
        result = run_history(args)
        Path(args.out).write_text(json.dumps(_finite(result), indent=1) + "\n")
        sys.stdout.write(history_table(result) + "\n")
        log.info("wrote %s (%.0f s)", args.out, result["wall_s"])
        return 0
    args.out = args.out or "bench/results/search-h100.json"
    args.proposers = args.proposers or ",".join(PROPOSERS)
    result = run(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(_finite(result), indent=1) + "\n")
    for scope in ("held_out", "all"):
        sys.stdout.write(table(result, scope) + "\n\n")
    log.info("wrote %s (%.0f s)", args.out, result["wall_s"])
    return 0


def _finite(x: Any) -> Any:
    """JSON has no infinity: a proposer that never reached the target is written as "never"."""
    if isinstance(x, float) and math.isinf(x):
        return "never"
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
