"""Real gpu campaigns of the row-wise families (softmax, rmsnorm, layernorm) and of flash attention
(`--families attention`: the families a space model of `rules` ranks besides GEMMs) on a recorded
grid's problems, checked against that grid.

For each family, one campaign over every problem of `data/replay/FAMILY-SET.jsonl.gz`: `python -m
tilepilot tune` for real (Ray, the compile-ahead pool, the GPU worker), `--cold` (nothing of the
store read), the given proposer (default the default, `portfolio`) and budget a problem. Each
winner is then looked up in the grid (its recorded time over the recorded optimum), and re-timed
beside the recorded optimum (interleaved, 3 independent re-measurements, the median ratio), as
`bench/gpu_campaign.py --arbitrate` does for matmul: the grid is a measurement of its own, taken
earlier in another thermal state.

    python bench/rows_gpu_campaign.py --set h200-fresh --budget 8 --db $OUT/rows.db \\
        --out bench/results/rows-gpu-campaign-h200-fresh.json

Needs a CUDA GPU (of the grid's device, for the comparison to mean anything).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_env import campaign_toml, retimed_ratios, run_main  # noqa: E402
from gpu_campaign import run_campaign  # noqa: E402

from tilepilot.experiments import BackendUnavailable, InputError  # noqa: E402
from tilepilot.kernels.registry import get_family  # noqa: E402
from tilepilot.orchestrator.replay import ReplayDataset, load_dataset  # noqa: E402

ROW_FAMILIES = ("softmax", "rmsnorm", "layernorm")
FAMILIES = (*ROW_FAMILIES, "attention")
REPEATS = 3


def grid_path(family: str, name: str) -> Path:
    path = ROOT / "data" / "replay" / f"{family}-{name}.jsonl.gz"
    if not path.is_file():
        raise InputError(f"--set {name}: no recorded grid {path.relative_to(ROOT)} for {family}")
    return path


def row_arguments(ap: argparse.ArgumentParser) -> None:
    """The options this script shares with bench/rows_warm.py: the grids, the families, the campaigns."""
    ap.add_argument("--set", default="h200-fresh", help="grids data/replay/FAMILY-SET.jsonl.gz (default h200-fresh)")
    ap.add_argument("--families", default=",".join(ROW_FAMILIES),
                    help=f"comma-separated, of {', '.join(FAMILIES)} (default the row-wise ones)")
    ap.add_argument("--proposer", default="portfolio")
    ap.add_argument("--budget", type=int, default=8, help="distinct configs a problem (default 8)")


def row_grids(args: argparse.Namespace) -> dict[str, Path]:
    """Each family asked for and its recorded grid; InputError, in a line, for a bad value."""
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    if not families or any(f not in FAMILIES for f in families):
        raise InputError(f"--families {args.families!r}: each must be one of {', '.join(FAMILIES)}")
    if args.budget < 1:
        raise InputError(f"--budget {args.budget}: a positive number of configs")
    return {f: grid_path(f, args.set) for f in families}


def retime(family: str, dataset: ReplayDataset, rows: list[dict[str, Any]]) -> None:
    """Each winner re-measured beside its problem's recorded optimum (see the module docstring)."""
    from tilepilot.kernels.evaluate import Evaluator

    fam = get_family(family)
    ev = Evaluator("gpu", spread_target=0.01, time_cap_ms=100.0)
    for row in rows:
        problem = fam.parse_problem(row["problem"])
        space = dataset.space(fam, problem)
        winner = space.parse(row["winner"])
        optimum = dataset.optimum(problem)
        row["recorded_optimum"] = optimum.as_dict()
        if winner == optimum:
            row["remeasured_ratios"], row["regret_remeasured"] = [], 0.0
            continue
        ratios = retimed_ratios(ev, family, problem, winner, optimum, REPEATS)
        row["remeasured_ratios"] = [round(x, 5) for x in ratios]
        row["regret_remeasured"] = round(statistics.median(ratios) - 1, 5) if ratios else None
        print(f"{family} {problem.label()}: winner / recorded optimum re-measured {row['remeasured_ratios']}",
              flush=True)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    grid = [r["regret_vs_recorded_grid"] for r in rows if r["regret_vs_recorded_grid"] is not None]
    again = [r["regret_remeasured"] for r in rows if r.get("regret_remeasured") is not None]
    return {"problems": len(rows),
            "within_2pct_recorded": sum(x <= 0.02 for x in grid),
            "mean_regret_recorded": sum(grid) / len(grid) if grid else None,
            "max_regret_recorded": max(grid) if grid else None,
            "within_2pct_remeasured": sum(x <= 0.02 for x in again),
            "max_regret_remeasured": max(again) if again else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    row_arguments(ap)
    ap.add_argument("--db", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    grids = row_grids(args)
    for where in (Path(args.db).parent, Path(args.out).parent):
        if not where.is_dir():
            raise InputError(f"folder {where} does not exist")
    datasets = {f: load_dataset(path, get_family(f)) for f, path in grids.items()}
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailable("no CUDA GPU visible to torch: these campaigns run on a GPU")

    from tilepilot.storage.queries import best, events, open_db

    report: dict[str, Any] = {
        "what": f"cold gpu campaigns of {', '.join(datasets)} over the problems of their {args.set} grids, "
                f"{args.budget} configs a problem, proposer {args.proposer}; winners looked up in the grid and "
                f"re-timed beside the recorded optimum ({REPEATS} interleaved re-measurements, the median ratio)",
        "command": " ".join(["python", "bench/rows_gpu_campaign.py", *sys.argv[1:]]),
        "date": dt.date.today().isoformat(), "families": {}}
    for family, dataset in datasets.items():
        name = f"{'rows-' if family in ROW_FAMILIES else ''}{family}-{args.set}"
        toml = Path(args.db).with_name(f"{name}.toml")
        toml.write_text(campaign_toml(name, family, args.proposer, args.budget,
                                      problems=[p.as_dict() for p in dataset.problems]))
        t0 = time.monotonic()
        rc = run_campaign(toml, name, args.db, env=dict(os.environ), cold=True)
        if rc != 0:
            print(f"tune exited with {rc} ({name})", file=sys.stderr)
            return rc
        wall_s = time.monotonic() - t0
        with open_db(args.db) as db:
            winners = best(db, campaign=name)
            crashes = sum(1 for e in events(db, kinds=["failed"], limit=10_000) if "crashed" in e.message)
            env = db.rows("SELECT DISTINCT device, driver, torch, triton FROM experiments WHERE backend = 'gpu'")
        fam = get_family(family)
        rows = []
        for w in winners:
            problem = next(p for p in dataset.problems if p.key() == w.problem_key)
            recorded = dataset.result(problem, dataset.space(fam, problem).parse(w.config))
            optimum = dataset.optimum_ms(problem)
            rows.append({"problem": problem.as_dict(), "winner": w.config, "measured_ms": w.median_ms,
                         "winner_recorded_ms": recorded.median_ms, "grid_optimum_ms": optimum,
                         "regret_vs_recorded_grid": (recorded.median_ms / optimum - 1
                                                     if recorded.median_ms and optimum else None),
                         "trials": w.trials})
        retime(family, dataset, rows)
        report["environment"] = env
        report["families"][family] = {"campaign": name, "dataset": f"data/replay/{family}-{args.set}.jsonl.gz",
                                      "wall_s": round(wall_s, 1), "crash_events": crashes, **summary(rows),
                                      "per_problem": rows}
        print(f"{family}: {summary(rows)}", flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
