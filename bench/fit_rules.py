"""Fit the `rules` tile model's constants on chosen problems of a dataset, and show how it ranks.

    python bench/fit_rules.py --dataset data/replay/matmul-h100.jsonl.gz [--problems dev|all] [--fit]

Without --fit: how the current constants (agents/tile_model.py `Constants`) rank the configs
of each chosen problem: the spread of the log-error, where the first config within 2% of the
optimum lies in the model's order, and the regret of the model's top 1, 4 and 8. With --fit:
Nelder-Mead in log space from the NEUTRAL constants, minimising a pairwise ranking
loss (see `loss`), then the same report; the printed constants are what `Constants` holds.
`launch_us` is not fitted: a constant added to every config changes no ranking.

`bench/search.py` calls `fit` once per held-out problem (leave one problem out), so that the
constants a problem is scored with never saw it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gzip
import json
import logging
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tilepilot.agents.tile_model import DEFAULT_CONSTANTS, VARIANT, Constants, element_wise_operands, estimate
from tilepilot.experiments import Config, Problem
from tilepilot.kernels import get_family
from tilepilot.orchestrator.replay import ReplayDataset, load_dataset

log = logging.getLogger("fit_rules")
KERNEL = "matmul"
FITTED = ("mma_half_area", "mma_half_n", "l2_gbps", "sm_gbps", "latency_us", "dup_gbps", "fill_us",
          "scalar_gbps", "overlap_power")
# The kernel_version of the recorded grids whose grouped kernel came before FEW_ROWS and wrapped
# A's rows past M, as Triton's tutorial does (data/replay/matmul-h100, -h200 and -h100-fresh).
ROWS_WRAPPED_VERSIONS = frozenset({"1+516ee1613431", "1+9c11706f12b3", "1+eab120ae5219"})
# Where every fit starts: round physical values set before any fitting, so a leave-one-out fit
# carries nothing of its held-out problem. A fit reads the times as the grid recorded them, without
# the order mark (tile_model.ORDER_MARK): the shipped fit and bench/search.py's fitting protocols
# fit the H100 grid, recorded in rotating order (the mark's reference), and score it so; the refits
# of bench/refit_sets.py read their grids without it too, as they did before the mark.
NEUTRAL = dataclasses.replace(DEFAULT_CONSTANTS, mma_half_area=4096.0, mma_half_n=32.0, l2_gbps=9000.0,
                              sm_gbps=120.0, latency_us=1.0, dup_gbps=1000.0, fill_us=1.0, scalar_gbps=16.0,
                              overlap_power=2.0, order_mark=0.0)
SAVED = (*FITTED, "scalar_error_var")  # what a fit sets (scalar_error_var measured, not searched)
BOUND = 8.0  # a fitted constant stays within this factor of its neutral value
MARGIN = 1.02  # pairs closer than this are ties, not ranked
SHARPNESS = 0.05  # log-units over which a wrong order starts to cost


@dataclasses.dataclass(frozen=True)
class ProblemData:
    problem: Problem
    configs: tuple[Config, ...]  # fastest first
    times_ms: np.ndarray
    pair_weights: np.ndarray  # [i, j]: weight of ranking config i before config j


def problem_data(dataset: ReplayDataset, problems: Sequence[Problem]) -> list[ProblemData]:
    """Each problem's valid recorded configs, fastest first, as the model is to read them: where
    the grid was recorded by a kernel that wrapped A's rows past M (`ROWS_WRAPPED_VERSIONS`),
    without their VARIANT, which the tile model reads as a kernel that wraps them."""
    family = get_family(KERNEL)
    wrapped = bool(recorded_versions(dataset.path) & ROWS_WRAPPED_VERSIONS)
    out = []
    for p in problems:
        space = dataset.space(family, p)
        rows = sorted(((r.median_ms, _as_run(c, wrapped)) for c, r in dataset.records(p).items()
                       if r.median_ms is not None and space.check(c, p) is None), key=lambda x: (x[0], x[1].key()))
        times = np.array([t for t, _ in rows])
        w = np.exp(-3.0 * (times / times[0] - 1.0))  # the order near the optimum matters most
        pairs = (times[None, :] > times[:, None] * MARGIN) * w[:, None]
        out.append(ProblemData(p, tuple(c for _, c in rows), times, pairs))
    return out


@functools.cache
def recorded_versions(path: Path) -> frozenset[str]:
    """The kernel versions a dataset's records name."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return frozenset(v for line in f if (v := json.loads(line).get("kernel_version")))


def _as_run(config: Config, wrapped: bool) -> Config:
    return Config.of({k: v for k, v in config.items() if k != VARIANT}) if wrapped else config


def loss(data: Sequence[ProblemData], k: Constants) -> float:
    """Pairwise ranking loss: for two configs whose times differ by more than 2%, a smooth
    penalty when the model orders them the other way, weighted by the faster one's closeness
    to the optimum."""
    total = weight = 0.0
    for d in data:
        pred = np.log([estimate(d.problem, c, k=k).predicted_ms for c in d.configs])
        diff = (pred[:, None] - pred[None, :]) / SHARPNESS
        total += float(np.sum(d.pair_weights * np.logaddexp(0.0, diff)))
        weight += float(np.sum(d.pair_weights))
    return total / weight


def fit(data: Sequence[ProblemData], start: Constants = NEUTRAL, evals: int = 600) -> Constants:
    """Nelder-Mead over the log of the FITTED constants, each kept within BOUND of NEUTRAL."""
    x0 = np.log([getattr(start, n) for n in FITTED])
    lo = np.log([getattr(NEUTRAL, n) / BOUND for n in FITTED])
    hi = np.log([getattr(NEUTRAL, n) * BOUND for n in FITTED])

    def f(x: np.ndarray) -> float:
        return loss(data, _constants(np.clip(x, lo, hi)))

    simplex = [x0] + [x0 + np.eye(len(x0))[i] * math.log(2.0) for i in range(len(x0))]
    values = [f(x) for x in simplex]
    for _ in range(evals):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centre = np.mean(simplex[:-1], axis=0)
        reflected = centre + (centre - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centre + 2.0 * (centre - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centre + 0.5 * (simplex[-1] - centre)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:  # shrink towards the best
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
        if max(values) - min(values) < 1e-6:
            break
    best = _constants(np.clip(simplex[int(np.argmin(values))], lo, hi))
    return dataclasses.replace(best, scalar_error_var=error_variance_ratio(data, best))


def both_scalar(problem: Problem) -> bool:
    """Both operands load element by element (tile_model.element_wise_operands)."""
    return len(element_wise_operands(problem)) == 2


def error_variance_ratio(data: Sequence[ProblemData], k: Constants) -> float:
    """The variance of the model's log-error over each problem's configs, averaged over the problems
    whose operands both load element by element, over its average on the others; 1.0 when the data
    hold no problem of either kind. The rules proposer widens its prior by it on such problems."""
    def variance(d: ProblemData) -> float:
        pred = np.log([estimate(d.problem, c, k=k).predicted_ms for c in d.configs])
        return float(np.var(np.log(d.times_ms) - pred))

    scalar = [variance(d) for d in data if both_scalar(d.problem)]
    other = [variance(d) for d in data if not both_scalar(d.problem)]
    if not scalar or not other:
        return 1.0
    return max(1.0, statistics.fmean(scalar) / statistics.fmean(other))


def _constants(x: np.ndarray) -> Constants:
    return dataclasses.replace(NEUTRAL, **{n: float(math.exp(v)) for n, v in zip(FITTED, x, strict=True)})


def report(data: Sequence[ProblemData], k: Constants) -> None:
    for d in data:
        opt = float(d.times_ms[0])
        times = dict(zip(d.configs, d.times_ms, strict=True))
        order = sorted(d.configs, key=lambda c: estimate(d.problem, c, k=k).predicted_ms)
        first = next(i for i, c in enumerate(order, 1) if times[c] <= opt * MARGIN)
        top = {n: min(times[c] for c in order[:n]) / opt - 1 for n in (1, 4, 8)}
        errs = [math.log(times[c] / estimate(d.problem, c, k=k).predicted_ms) for c in d.configs]
        log.info("%-28s rank of first within 2%%: %3d; top1 %5.1f%% top4 %5.1f%% top8 %5.1f%%; "
                 "log-error sd %.2f", d.problem.label(), first, 100 * top[1], 100 * top[4], 100 * top[8],
                 statistics.pstdev(errs))


def main(argv: list[str] | None = None) -> int:
    from search import DEV_PROBLEMS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="data/replay/matmul-h100.jsonl.gz")
    ap.add_argument("--problems", choices=("dev", "all"), default="dev")
    ap.add_argument("--fit", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ds = load_dataset(args.dataset, get_family(KERNEL))
    chosen = [p for p in ds.problems if args.problems == "all" or p.label() in DEV_PROBLEMS]
    data = problem_data(ds, chosen)
    k = DEFAULT_CONSTANTS
    log.info("current constants: loss %.4f on %d problems", loss(data, k), len(data))
    if args.fit:
        k = fit(data)
        log.info("fitted (loss %.4f): %s", loss(data, k), ", ".join(f"{n}={getattr(k, n):.4g}" for n in SAVED))
    report(data, k)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_env import run_main

    raise SystemExit(run_main(main))
