"""Re-tuning a problem the store already holds: what a `rules` campaign of 8 configs finds when an
earlier campaign measured the same problem, under each way of using what the earlier one measured.

For every problem of each recorded grid and every seed: an earlier campaign (`--priors`: Optuna's
TPE, random, rules; 8 configs, that seed) measures the problem; then a `rules` campaign of 8 configs
(the shipped constants, seed 0, bench/search.py's BATCH at a time) runs with the earlier results in
the store, under each policy (ARMS):

- `cold`: the store is not read; a config the store holds, when proposed, is reused and counts
  against the budget (it is one of the 8).
- `own-transfer`: the earlier results of the problem correct the tile model before the first result
  (`rules` reads the store as its history: the problem's own earlier results, where the store holds
  them, are its transfer source), and the earlier winner goes first where the model predicts it no
  slower than its own first pick (warm start, `warm_start.by_prediction`); reused results count.
- `free`: the store is not read, and a config the store holds, when proposed, is reused without
  counting: the campaign measures 8 configs it has no result of, and every reused result is told to
  the proposer as one of its own.
- `free-head`: `free`, with the earlier winner first as warm start queues it (reused, free).
- `free-own-transfer`: `free`, with the problem's own earlier results read as `own-transfer` reads
  them, and the earlier winner first.

Scored by the campaign's own results (the 8 and those it reused): problems within 2% of the grid's
optimum (every run counts once) and the mean regret. `own-transfer` and `free-own-transfer` read the
store through `rules`' history, so they measure what the code they run with does with it.

    python bench/retune.py --out bench/results/retune.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import search
from bench_env import git, machine, run_main

from tilepilot.experiments import InputError
from tilepilot.kernels import get_family
from tilepilot.orchestrator.replay import load_dataset
from tilepilot.orchestrator.warm_start import warm_candidates
from tilepilot.storage.store import WinnerSource

DATASETS = ",".join(f"data/replay/matmul-{name}.jsonl.gz" for name in (
    "h100", "h100-fresh", "h100-fresh2", "h200", "h200-fresh", "h200-fresh-shuffled", "h200-fresh3", "h200-fresh4"))
PRIORS = ("optuna", "random", "rules")
ARMS = ("cold", "own-transfer", "free", "free-head", "free-own-transfer")
BUDGET = 8
TOLERANCE = search.TOLERANCE
log = logging.getLogger("retune")


Task = tuple[str, str, str, int]


def _task(args: Task) -> tuple[str, str, str, int, float, dict[str, float]]:
    """(dataset, prior, problem, seed) -> the earlier campaign's regret and each arm's."""
    path, prior, key, seed = args
    dataset = load_dataset(path, get_family(search.KERNEL))
    problem = next(q for q in dataset.problems if q.key() == key)
    optimum = dataset.optimum_ms(problem)
    assert optimum is not None
    own = search.ReplayHistory({problem: dataset}, BUDGET, None, proposer=prior, seed=seed)  # the earlier campaign
    rows = own.measured(search.KERNEL, dataset.device, problem)
    stored = {c for c, _ in rows}
    winner, winner_ms = min(rows, key=lambda r: (r[1], r[0].key()))
    env = next(iter(dataset.records(problem).values())).env
    source = WinnerSource(problem, winner, winner_ms, "earlier", env.torch, env.triton, 0.0)
    head = [c.config for c in warm_candidates(problem, dataset.space(get_family(search.KERNEL), problem), [source],
                                              budget=BUDGET, torch=env.torch, triton=env.triton)]

    def regret(times: Sequence[float | None]) -> float:
        return min(t for t in times if t is not None) / optimum - 1

    arms = {
        "cold": regret(search.drive(dataset, problem, "rules", 0, BUDGET).times_ms),
        "own-transfer": regret(search.drive(dataset, problem, "rules", 0, BUDGET, first=head, history=own,
                                            bounded=True).times_ms),
        "free": regret(search.drive(dataset, problem, "rules", 0, BUDGET, free=stored).times_ms),
        "free-head": regret(search.drive(dataset, problem, "rules", 0, BUDGET, first=head, bounded=True,
                                         free=stored).times_ms),
        "free-own-transfer": regret(search.drive(dataset, problem, "rules", 0, BUDGET, first=head, history=own,
                                                 bounded=True, free=stored).times_ms),
    }
    return Path(path).name, prior, problem.label(), seed, winner_ms / optimum - 1, arms


def summarise(runs: list[tuple[str, str, str, int, float, dict[str, float]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, prior in sorted({(r[0], r[1]) for r in runs}):
        mine = [r for r in runs if (r[0], r[1]) == (name, prior)]
        out.setdefault(name, {})[prior] = {
            "runs": len(mine),
            "earlier_within_2pct": sum(r[4] <= TOLERANCE for r in mine),
            **{arm: {"within_2pct": sum(r[5][arm] <= TOLERANCE for r in mine),
                     "mean_regret": sum(r[5][arm] for r in mine) / len(mine)} for arm in ARMS}}
    return out


def totals(summary: dict[str, Any]) -> dict[str, Any]:
    """Per prior, summed over the grids: runs and each arm's runs within 2%."""
    out: dict[str, Any] = {}
    for per_prior in summary.values():
        for prior, s in per_prior.items():
            t = out.setdefault(prior, {"runs": 0, **dict.fromkeys(ARMS, 0)})
            t["runs"] += s["runs"]
            for arm in ARMS:
                t[arm] += s[arm]["within_2pct"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default=DATASETS, help="recorded matmul grids, comma-separated")
    p.add_argument("--priors", default=",".join(PRIORS), help="the earlier campaigns' proposers")
    p.add_argument("--seeds", type=int, default=3, help="earlier campaigns per problem and prior (seeds 0..N-1)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    priors = [x for x in args.priors.split(",") if x]
    bad = [x for x in priors if x not in search.PROPOSERS]
    if bad:
        raise InputError(f"unknown --priors {bad[0]!r} (allowed: {', '.join(search.PROPOSERS)})")
    if args.seeds < 1 or args.jobs < 1:
        raise InputError(f"--seeds {args.seeds} --jobs {args.jobs}: both must be 1 or more")
    if not Path(args.out).parent.is_dir():
        raise InputError(f"--out {args.out}: its folder does not exist")
    paths = [x for x in args.datasets.split(",") if x]
    for path in paths:
        if not Path(path).is_file():
            raise InputError(f"--datasets: no such file {path!r}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tasks = [(path, prior, q.key(), seed) for path in paths
             for q in load_dataset(path, get_family(search.KERNEL)).problems
             for prior in priors for seed in range(args.seeds)]
    commit = git("rev-parse", "--short", "HEAD")  # the code that runs: read before, not after
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        runs = list(pool.map(_task, tasks, chunksize=4))
    summary = summarise(runs)
    result = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "method": " ".join(__doc__.split("\n\n")[1:4]).replace("\n", " "),
        "command": " ".join(["python", "bench/retune.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": dt.date.today().isoformat(), "commit": commit, "machine": machine(),
        "budget": BUDGET, "batch": search.BATCH, "tolerance": TOLERANCE, "seeds": args.seeds, "arms": list(ARMS),
        "totals": totals(summary), "per_grid": summary,
        "runs": [{"grid": r[0], "prior": r[1], "problem": r[2], "seed": r[3], "earlier": round(r[4], 5),
                  **{arm: round(v, 5) for arm, v in r[5].items()}} for r in runs],
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for prior, t in result["totals"].items():
        log.info("%-7s %4d runs: %s", prior, t["runs"], ", ".join(f"{arm} {t[arm]}" for arm in ARMS))
    log.info("wrote %s (%.0f s)", args.out, result["wall_s"])
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
