"""A `gpu` campaign over the recorded matmul problems, checked against the recorded grid.

Runs `python -m tilepilot tune` for real (Ray, compile-ahead pool, GPU worker with its child
process) on the `matmul_faults` family: the matmul kernel plus a FAULT parameter. The search
space is narrowed to the recorded grid with FAULT="none"; the campaign file also lists one
config with FAULT="oob" that writes out of bounds (an illegal memory access), measured first
for every problem, so each problem's child process dies once and the campaign must go on.

Afterwards each winner is looked up in the recorded grid (data/replay/matmul-h100.jsonl.gz):
its recorded time over the recorded optimum is the regret the search left. The measured
winner time and cuBLAS time come from this run. Re-running the command resumes the campaign.

Held out (`--folds K`, default 4): the `rules` model's shipped constants were fitted on every
recorded problem, so scoring them on those problems would flatter the search. The problems are
dealt into K folds (problem i goes to fold i mod K); each fold runs as its own campaign with
constants fitted (bench/fit_rules.fit) on the other folds' problems only, handed to `tune`
through TILEPILOT_RULES_CONSTANTS. The fits are CPU work: `--fit-folds FILE` writes them once
(about 15 s per fold), and `--constants FILE` reads them, so the GPU machine only measures.
`--folds 0` runs one campaign with the shipped constants. The folds' campaigns share the store
(`--db`), so from the second fold on a campaign starts warm, as a user's next one would: the
earlier folds' winners and results (warm start, and the store's correction of the `rules` model)
are there; their own problems are not (unless the command resumes a run the store already holds).
`--cold` runs every fold with `tune --cold`: nothing of the store is read.

Arbitration (`--arbitrate RESULT.json`): the recorded grid is itself a measurement, taken with an
earlier timing method on a GPU in another thermal state, so where a winner's recorded time and
the recorded optimum's disagree by more than the noise, time them again side by side: for every
problem of a campaign result, the winner and the recorded optimum are re-measured together
(interleaved, 3 independent re-measurements), and the median ratio winner / optimum is added to
the result as `regret_remeasured`. The recorded grid is the one the result names (its "dataset"),
unless `--dataset` gives another.

    python bench/gpu_campaign.py --arbitrate bench/results/gpu-campaign-h100.json --out $OUT/arbitrated.json

    python bench/gpu_campaign.py --fit-folds bench/results/rules-constants-4fold.json
    python bench/gpu_campaign.py --constants bench/results/rules-constants-4fold.json \
        --db $OUT/gpu.db --out bench/results/gpu-campaign-h100.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tilepilot.agents.tile_model import CONSTANTS_ENV, load_constants  # noqa: E402
from tilepilot.experiments import InputError, Problem  # noqa: E402
from tilepilot.kernels.registry import get_family  # noqa: E402
from tilepilot.orchestrator.replay import ReplayDataset, load_dataset  # noqa: E402
from tilepilot.storage.queries import best, events, history, open_db  # noqa: E402

GRID = {"BLOCK_SIZE_M": [64, 128, 256], "BLOCK_SIZE_N": [64, 128, 256], "BLOCK_SIZE_K": [32, 64, 128],
        "GROUP_SIZE_M": [8], "num_warps": [4, 8], "num_stages": [3, 4, 5], "FAULT": ["none"]}
OOB = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8, "num_warps": 4,
       "num_stages": 3, "FAULT": "oob"}


def campaign_text(name: str, proposer: str, budget: int, problems: list[dict]) -> str:
    from bench_env import campaign_toml

    return campaign_toml(name, "matmul_faults", proposer, budget, space=GRID, configs=[OOB], problems=problems)


def folds_of(problems: list[Problem], k: int) -> list[list[Problem]]:
    return [problems[i::k] for i in range(k)] if k else [problems]


def fit_folds(dataset: ReplayDataset, problems: list[Problem], k: int, out: Path) -> None:
    """Constants for each fold, fitted on the other folds' problems; written as JSON."""
    sys.path.insert(0, str(ROOT / "bench"))
    from fit_rules import SAVED, fit, problem_data

    folds = []
    for i, held in enumerate(folds_of(problems, k)):
        train = [p for p in problems if p not in held]
        t0 = time.monotonic()
        constants = fit(problem_data(dataset, train))
        folds.append({"fold": i, "held_out": [p.label() for p in held], "fitted_on": len(train),
                      "constants": {n: getattr(constants, n) for n in SAVED}})
        print(f"fold {i}: fitted on {len(train)} problems in {time.monotonic() - t0:.0f} s", flush=True)
    out.write_text(json.dumps({"what": "rules tile-model constants per fold, each fitted without its fold's problems",
                               "command": " ".join(["python", "bench/gpu_campaign.py", *sys.argv[1:]]),
                               "date": dt.date.today().isoformat(), "dataset": "matmul-h100.jsonl.gz",
                               "folds": folds}, indent=1) + "\n")


def started(db: str, name: str) -> bool:
    if not Path(db).exists():
        return False
    with open_db(db) as conn:
        return bool(conn.rows("SELECT 1 FROM campaigns WHERE name = ?", [name]))


def run_campaign(toml: Path, name: str, db: str, env: dict[str, str], cold: bool = False) -> int:
    cmd = [sys.executable, "-m", "tilepilot", "tune", str(toml), "--backend", "gpu", "--db", db]
    if cold:
        cmd.append("--cold")
    if started(db, name):
        cmd.append("--resume")
    return subprocess.call(cmd, cwd=ROOT, env=env)


def dataset_of(result_path: Path | None) -> str:
    """The recorded grid a campaign result was checked against (its "dataset", a file of
    data/replay/, compressed since the earliest results named it); the H100 grid where no result is
    given. InputError, in a line, where the result cannot be read or names no grid there is."""
    if result_path is None:
        return str(ROOT / "data/replay/matmul-h100.jsonl.gz")
    try:
        name = json.loads(result_path.read_text())["dataset"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"--arbitrate {result_path}: not a campaign result this script wrote ({e})") from None
    replay = ROOT / "data" / "replay"
    for path in (replay / Path(str(name)).name, replay / f"{Path(str(name)).name}.gz"):  # early results: .jsonl
        if path.is_file():
            return str(path)
    raise InputError(f"--arbitrate {result_path}: its dataset {name!r} is not in data/replay/ (give --dataset)")


def arbitrate(result_path: Path, dataset: ReplayDataset, out: Path) -> None:
    """Re-time each problem's winner beside the recorded optimum (see the module docstring)."""
    import statistics

    from bench_env import retimed_ratios

    from tilepilot.kernels.evaluate import Evaluator

    report = json.loads(result_path.read_text())
    family = get_family("matmul")
    ev = Evaluator("gpu", spread_target=0.01, time_cap_ms=100.0)
    for row in report["per_problem"]:
        problem = family.parse_problem(row["problem"])
        space = dataset.space(family, problem)
        winner = space.parse({k: v for k, v in row["winner"].items() if k != "FAULT"})
        optimum = dataset.optimum(problem)
        if winner == optimum:
            row["regret_remeasured"], row["remeasured_ratios"] = 0.0, []
            continue
        ratios = retimed_ratios(ev, "matmul", problem, winner, optimum, 3)
        row["recorded_optimum"] = optimum.as_dict()
        row["remeasured_ratios"] = [round(x, 5) for x in ratios]
        row["regret_remeasured"] = round(statistics.median(ratios) - 1, 5) if ratios else None
        print(f"{problem.label()}: winner / recorded optimum re-measured {ratios}", flush=True)
    rem = [r["regret_remeasured"] for r in report["per_problem"] if r.get("regret_remeasured") is not None]
    report["arbitration"] = {
        "command": " ".join(["python", "bench/gpu_campaign.py", *sys.argv[1:]]),
        "date": dt.date.today().isoformat(), **ev.environment().as_dict(),
        "method": "winner and recorded optimum re-measured together (Evaluator.remeasure), 3 times; median ratio",
        "problems_within_3pct_remeasured": sum(r <= 0.03 for r in rem),
        "max_regret_remeasured": max(rem) if rem else None,
    }
    out.write_text(json.dumps(report, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", help="the recorded grid (default: with --arbitrate, the result's own; else "
                                      "data/replay/matmul-h100.jsonl.gz)")
    ap.add_argument("--db")
    ap.add_argument("--out")
    ap.add_argument("--folds", type=int, default=4, help="held-out folds for the rules constants (0: shipped ones)")
    ap.add_argument("--fit-folds", type=Path, help="fit each fold's constants, write them here, and stop")
    ap.add_argument("--constants", type=Path, help="the fold constants --fit-folds wrote")
    ap.add_argument("--arbitrate", type=Path, help="a campaign result to re-time against the recorded optima")
    ap.add_argument("--proposer", default="portfolio")
    ap.add_argument("--budget", type=int, default=32, help="distinct configs per problem (20%% of 162)")
    ap.add_argument("--name", default="gpu-check")
    ap.add_argument("--problems", type=int, default=0, help="only the first N recorded problems (0: all)")
    ap.add_argument("--cold", action="store_true",
                    help="every fold starts cold: tune --cold, no warm start and no history from the store")
    args = ap.parse_args()

    dataset = load_dataset(args.dataset or dataset_of(args.arbitrate), get_family("matmul"))
    problems = dataset.problems[: args.problems or None]
    if args.fit_folds:
        fit_folds(dataset, problems, args.folds, args.fit_folds)
        return 0
    if args.arbitrate:
        if not args.out:
            ap.error("--arbitrate needs --out")
        arbitrate(args.arbitrate, dataset, Path(args.out))
        return 0
    if not (args.db and args.out):
        ap.error("--db and --out are required to run the campaign")
    folds = folds_of(problems, args.folds)
    fold_constants: list[dict[str, float] | None] = [None] * len(folds)
    if args.folds:
        if not args.constants:
            ap.error("--folds needs --constants (the file --fit-folds wrote), or --folds 0")
        saved = json.loads(args.constants.read_text())["folds"]
        if [f["held_out"] for f in saved] != [[p.label() for p in fold] for fold in folds]:
            ap.error(f"{args.constants} was fitted for other folds")
        fold_constants = [f["constants"] for f in saved]
    names = [args.name if not args.folds else f"{args.name}-fold{i}" for i in range(len(folds))]
    t0 = time.monotonic()
    for name, fold, constants in zip(names, folds, fold_constants, strict=True):
        toml = Path(args.db).with_name(f"{name}.toml")
        toml.write_text(campaign_text(name, args.proposer, args.budget, [p.as_dict() for p in fold]))
        env = dict(os.environ)
        if constants is not None:
            path = toml.with_suffix(".constants.json")
            path.write_text(json.dumps(constants))
            load_constants(path)  # the file tune will read
            env[CONSTANTS_ENV] = str(path)
        rc = run_campaign(toml, name, args.db, env, cold=args.cold)
        if rc != 0:
            print(f"tune exited with {rc} ({name})", file=sys.stderr)
            return rc
    wall_s = time.monotonic() - t0

    with open_db(args.db) as db:
        winners = [w for name in names for w in best(db, campaign=name)]
        rows = [r for name in names for r in history(db, campaign=name)]
        log = events(db, kinds=["failed", "worker_restarted", "campaign_finished"], limit=10_000)
        versions = db.rows("SELECT DISTINCT device, driver, torch, triton FROM experiments WHERE backend = 'gpu'")
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
    per_problem = []
    for w in winners:
        problem = next(p for p in problems if p.key() == w.problem_key)
        config = {k: v for k, v in w.config.items() if k != "FAULT"}
        recorded = dataset.result(problem, dataset.space(get_family("matmul"), problem).parse(config))
        optimum = dataset.optimum_ms(problem)
        per_problem.append({
            "problem": problem.as_dict(), "winner": w.config, "measured_ms": w.median_ms,
            "winner_recorded_ms": recorded.median_ms, "grid_optimum_ms": optimum,
            "regret_vs_recorded_grid": recorded.median_ms / optimum - 1 if recorded.median_ms and optimum else None,
            "measured_vs_recorded_optimum": w.median_ms / optimum - 1 if optimum else None,
            "cublas_ms": w.baseline_ms, "speedup_vs_cublas": w.speedup_vs_baseline, "tie": w.tie,
            "recheck_passed": w.recheck_passed, "trials": w.trials})
    regrets = [p["regret_vs_recorded_grid"] for p in per_problem if p["regret_vs_recorded_grid"] is not None]
    report = {
        "what": f"gpu campaign over the recorded matmul problems, budget {args.budget} configs a problem "
                "(the 162-config grid), one out-of-bounds config (FAULT=oob) measured first for every problem",
        "cold": args.cold,
        "command": " ".join(["python", "bench/gpu_campaign.py", *sys.argv[1:]]),
        "date": dt.date.today().isoformat(),
        "environment": versions,
        "dataset": Path(args.dataset).name, "proposer": args.proposer, "budget": args.budget,
        "rules_constants": (f"held out: {args.folds} folds, each fitted on the other folds' problems "
                            f"({args.constants.name})" if args.folds else "shipped (fitted on every recorded problem)"),
        "campaigns": names,
        "problems": len(problems), "wall_s": round(wall_s, 1), "statuses": statuses,
        "crash_events": sum(1 for e in log if e.kind == "failed" and "crashed" in e.message),
        "max_regret_vs_recorded_grid": max(regrets) if regrets else None,
        "problems_within_3pct": sum(r <= 0.03 for r in regrets),
        "problems_within_2pct": sum(r <= 0.02 for r in regrets),
        "mean_regret_vs_recorded_grid": sum(regrets) / len(regrets) if regrets else None,
        "per_problem": per_problem,
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"{len(per_problem)} winners; worst regret vs recorded grid {report['max_regret_vs_recorded_grid']:.2%}; "
          f"{report['problems_within_3pct']}/{len(regrets)} within 3%; statuses {statuses}; {wall_s:.0f} s")
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
