"""Refit the `rules` tile model's constants on other recorded grids and score the grid left out:
does the model gain from more data, or from data recorded with today's timer, than from the one
grid its shipped constants were fitted on?

    python bench/refit_sets.py --out bench/results/refit-sets-newer.json [--held-out C.gz] A.gz B.gz C.gz ...

For each dataset given (or each named by --held-out): the constants fitted (`bench/fit_rules.fit`,
from its NEUTRAL start) on the problems of every other dataset given, then `rules` cold at 8
configs on each of its problems (`bench/search.drive`, batches of 4; one seed: `rules` picks the
same configs for every seed), scored with those constants and with the shipped ones in the same
run. Per dataset and arm: problems within 2% of the recorded optimum at 8 configs, mean and worst
regret there, and the configs it took to come within 2% (median and mean over the problems; a
campaign runs to 32, and a problem not within 2% by then counts as infinite in the median and
leaves the mean out).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_env import git, machine, run_main
from fit_rules import SAVED, fit, problem_data
from search import BATCH, KERNEL, TOLERANCE, best_after, configs_to_reach, drive

from tilepilot.agents.tile_model import DEFAULT_CONSTANTS, Constants
from tilepilot.experiments import InputError
from tilepilot.kernels import get_family
from tilepilot.orchestrator.replay import ReplayDataset, load_dataset

log = logging.getLogger("refit_sets")
BUDGET = 8
LONGEST = 32  # configs a campaign runs to find how many it takes to come within 2% (20% of the grid)


def score(dataset: ReplayDataset, constants: Constants) -> dict[str, Any]:
    """`rules` cold at BUDGET configs on every problem of the dataset, with these constants."""
    regret: dict[str, float] = {}
    reach: dict[str, float] = {}
    for p in dataset.problems:
        best = dataset.optimum_ms(p)
        assert best is not None  # main refuses a dataset with a problem no config was timed on
        trace = drive(dataset, p, "rules", 0, LONGEST, constants)
        regret[p.label()] = round(best_after(trace, BUDGET) / best - 1.0, 5)
        reach[p.label()] = configs_to_reach(trace, best * (1.0 + TOLERANCE))
    finite = [x for x in reach.values() if math.isfinite(x)]
    median = statistics.median(reach.values())
    return {"within_2pct": sum(r <= TOLERANCE for r in regret.values()), "problems": len(regret),
            "mean_regret": round(statistics.fmean(regret.values()), 5), "worst_regret": max(regret.values()),
            "configs_to_2pct_median": median if math.isfinite(median) else None,  # None: most never came within 2%
            "configs_to_2pct_mean": round(statistics.fmean(finite), 3) if len(finite) == len(reach) else None,
            "per_problem_regret": regret,
            "per_problem_configs_to_2pct": {k: (v if math.isfinite(v) else None) for k, v in reach.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--held-out", action="append", default=[], metavar="DATASET",
                    help="score only this one of the datasets (repeatable; default: each in turn)")
    ap.add_argument("datasets", nargs="+", help="recorded matmul grids (bench/record.py), at least two")
    args = ap.parse_args(argv)
    if len(args.datasets) < 2:
        raise InputError(f"give at least two datasets (got {len(args.datasets)}): each is scored with constants "
                         "fitted on the others")
    for path in args.held_out:
        if path not in args.datasets:
            raise InputError(f"--held-out {path!r} is not among the datasets given ({', '.join(args.datasets)})")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    family = get_family(KERNEL)
    sets = {path: load_dataset(path, family) for path in args.datasets}
    for path, ds in sets.items():
        for p in ds.problems:
            if ds.optimum_ms(p) is None:
                raise InputError(f"{path}: {p.label()} has no timed config, so no optimum to score or fit against")
    data = {path: problem_data(ds, ds.problems) for path, ds in sets.items()}
    out: dict[str, Any] = {
        "command": " ".join(["python", "bench/refit_sets.py", *sys.argv[1:]]), "date": dt.date.today().isoformat(),
        "commit": git("rev-parse", "--short", "HEAD"), "machine": machine(), "budget": BUDGET, "batch": BATCH,
        "shipped_constants": {n: getattr(DEFAULT_CONSTANTS, n) for n in SAVED}, "held_out": {}}
    for path, ds in sets.items():
        if args.held_out and path not in args.held_out:
            continue
        t0 = time.perf_counter()
        train = [d for other, ds_data in data.items() if other != path for d in ds_data]
        refit = fit(train)
        fitted_s = time.perf_counter() - t0
        arms = {"shipped": score(ds, DEFAULT_CONSTANTS), "refit": score(ds, refit)}
        out["held_out"][path] = {"fitted_on": [o for o in sets if o != path], "fit_problems": len(train),
                                 "fit_s": round(fitted_s, 1), "refit_constants": {n: getattr(refit, n) for n in SAVED},
                                 **arms}
        for arm, r in arms.items():
            log.info("%-48s %-7s within 2%% %2d of %2d, mean %.2f%%, worst %.1f%%, configs to 2%%: median %s",
                     Path(path).name, arm, r["within_2pct"], r["problems"], 100 * r["mean_regret"],
                     100 * r["worst_regret"], r["configs_to_2pct_median"])
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
