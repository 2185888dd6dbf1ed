"""Fit the `rules` tile model's constants on the development problems only, and show how it ranks.

    python bench/fit_rules.py --dataset data/replay/matmul-h100.jsonl [--fit]

Without --fit: how the current constants (agents/tile_model.py `Constants`) rank the configs
of each development problem (`bench/search.py` DEV_PROBLEMS): rank correlation, the spread of
the log-error, where the first config within 2% of the optimum lies in the model's order, and
the regret of the model's top 1, 4 and 8. With --fit: coordinate descent in log space on the
constants, minimising a pairwise ranking loss (see `loss`), then the same report; the printed
constants are what `Constants` holds. `launch_us` is not fitted: a constant added to every
config changes no ranking. The held-out problems are never read.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from search import DEV_PROBLEMS, KERNEL

from tilepilot.agents.tile_model import DEFAULT_CONSTANTS, Constants, estimate
from tilepilot.experiments import Config, Problem
from tilepilot.kernels import get_family
from tilepilot.orchestrator.replay import load_dataset

log = logging.getLogger("fit_rules")
FITTED = ("mma_half_area", "mma_half_n", "l2_gbps", "sm_gbps", "latency_us", "dup_gbps", "fill_us")
Data = list[tuple[Problem, dict[Config, float]]]


def dev_data(path: str) -> Data:
    family = get_family(KERNEL)
    ds = load_dataset(path, family)
    out = []
    for p in ds.problems:
        if p.label() not in DEV_PROBLEMS:
            continue
        space = ds.space(family, p)
        times = {c: r.median_ms for c, r in ds.records(p).items()
                 if r.median_ms is not None and space.check(c, p) is None}
        out.append((p, times))
    return out


def loss(data: Data, k: Constants) -> float:
    """Pairwise ranking loss: for two configs whose times differ by more than 2%, a smooth
    penalty when the model orders them the other way, weighted towards the faster one's
    closeness to the optimum (the order near the top is what a search needs)."""
    total = weight = 0.0
    for p, times in data:
        opt = min(times.values())
        rows = sorted((t, math.log(estimate(p, c, k=k).predicted_ms)) for c, t in times.items())
        for i, (ti, pi) in enumerate(rows):
            w = math.exp(-3 * (ti / opt - 1))
            for tj, pj in rows[i + 1:]:
                if tj > ti * 1.02:
                    total += w * _softplus((pi - pj) / 0.05)
                    weight += w
    return total / weight


def _softplus(x: float) -> float:
    return x + math.log1p(math.exp(-x)) if x > 0 else math.log1p(math.exp(x))


def fit(data: Data, k: Constants) -> Constants:
    best = loss(data, k)
    for factor in (2.0, 1.4, 1.15, 1.05):
        improved = True
        while improved:
            improved = False
            for name in FITTED:
                for f in (factor, 1 / factor):
                    trial = dataclasses.replace(k, **{name: getattr(k, name) * f})
                    value = loss(data, trial)
                    if value < best - 1e-9:
                        k, best, improved = trial, value, True
        log.info("step %.2f: loss %.4f", factor, best)
    return k


def report(data: Data, k: Constants) -> None:
    for p, times in data:
        opt = min(times.values())
        order = sorted(times, key=lambda c: estimate(p, c, k=k).predicted_ms)
        first = next(i for i, c in enumerate(order, 1) if times[c] <= opt * 1.02)
        top = {n: min(times[c] for c in order[:n]) / opt - 1 for n in (1, 4, 8)}
        errs = [math.log(times[c] / estimate(p, c, k=k).predicted_ms) for c in times]
        log.info("%-28s rank of first within 2%%: %3d; top1 %5.1f%% top4 %5.1f%% top8 %5.1f%%; "
                 "log-error sd %.2f", p.label(), first, 100 * top[1], 100 * top[4], 100 * top[8],
                 statistics.pstdev(errs))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="data/replay/matmul-h100.jsonl")
    ap.add_argument("--fit", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    data = dev_data(args.dataset)
    k = DEFAULT_CONSTANTS
    log.info("current constants: loss %.4f", loss(data, k))
    if args.fit:
        k = fit(data, k)
        log.info("fitted: %s", ", ".join(f"{n}={getattr(k, n):.4g}" for n in FITTED))
    report(data, k)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
