"""The tile model with and without its order mark, cold, on every recorded matmul grid.

For each grid and each weight of `Constants.order_mark` given (default 0, as before the mark, and
1, as shipped), `bench/search.py --protocol shipped --proposers rules` at 8 configs (batches of 4):
problems within 2% of the grid's optimum in every seed, mean regret, and configs to reach 2%
(median; mean) over problems, each grid with the order its rounds were recorded in. Compact: the
summaries only, per problem the regret at 8 configs.

    python bench/order_mark_sets.py --out bench/results/order-mark-sets.json [--seeds 3] [--jobs 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import search  # noqa: E402

# Each grid and the order of the timer's rounds it was recorded in (bench/results/record-*.json and
# the README's "The order of the rounds": everything before the shuffled timer was rotating).
GRIDS = {
    "matmul-h100-fresh": "rotating",
    "matmul-h100-fresh2": "rotating",
    "matmul-h200": "rotating",
    "matmul-h200-rerecord": "rotating",
    "matmul-h200-fresh": "rotating",
    "matmul-h200-rerecord-shuffled": "shuffled",
    "matmul-h200-fresh-shuffled": "shuffled",
    "matmul-h200-fresh3": "shuffled",
    "matmul-h200-fresh4": "shuffled",
    "matmul-h200-fresh5": "shuffled",
    "matmul-h200-fresh6": "shuffled",
    "matmul-h200-fresh7": "shuffled",
}
# The grids the mark was measured on (tile_model.ORDER_MARK): not held out from it.
MARK_FROM = ("matmul-h200", "matmul-h200-rerecord-shuffled")


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """One search.py result (rules, --protocol shipped) in brief."""
    rules = result["proposers"]["rules"]
    at8 = rules["regret"]["8"]["all"]
    reach = rules["to_2pct"]["all"]
    return {"within_2pct": at8["problems_within_2pct_every_seed"], "problems": at8["problems"],
            "mean_regret": round(at8["mean"], 5), "to_2pct_median": reach["median"],
            "to_2pct_mean": round(reach["mean"], 3),
            "per_problem": {k: round(v, 5) for k, v in rules["regret"]["8"]["per_problem"].items()}}


def totals(rows: dict[str, dict[str, Any]], grids: list[str]) -> dict[str, Any]:
    """Problems within 2% and the problem-weighted mean regret over `grids`."""
    n = sum(rows[g]["problems"] for g in grids)
    weighted = sum(rows[g]["mean_regret"] * rows[g]["problems"] for g in grids)
    return {"grids": len(grids), "within_2pct": sum(rows[g]["within_2pct"] for g in grids), "problems": n,
            "mean_regret": round(weighted / n, 5) if n else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--marks", default="0,1", help="order_mark weights, each from 0 to 1 (default 0,1)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    try:
        marks = [float(m) for m in args.marks.split(",")]
    except ValueError:
        ap.error(f"--marks {args.marks!r}: numbers from 0 to 1, separated by commas")
    if not marks or any(not 0 <= m <= 1 for m in marks):
        ap.error(f"--marks {args.marks!r}: numbers from 0 to 1, separated by commas")
    if args.seeds < 1:
        ap.error(f"--seeds {args.seeds}: must be 1 or more")
    if not Path(args.out).resolve().parent.is_dir():
        ap.error(f"--out {args.out}: its folder does not exist")
    data = ROOT.parent / "data" / "replay"
    t0 = time.perf_counter()
    out: dict[str, Any] = {"command": "python bench/order_mark_sets.py " + " ".join(sys.argv[1:]),
                           "date": dt.date.today().isoformat(), "method": __doc__.split("\n\n")[1].replace("\n", " "),
                           "seeds": args.seeds, "recorded_order": GRIDS, "mark_measured_on": list(MARK_FROM),
                           "marks": {}}
    for mark in marks:
        search.ORDER_MARK = mark
        rows: dict[str, dict[str, Any]] = {}
        for grid in GRIDS:
            ns = argparse.Namespace(dataset=str(data / f"{grid}.jsonl.gz"), protocol="shipped", proposers="rules",
                                    seeds=args.seeds, slow_seeds=args.seeds, jobs=args.jobs)
            rows[grid] = summary(search.run(ns))
            print(f"order_mark {mark:g} {grid:32s} {rows[grid]['within_2pct']:2d}/{rows[grid]['problems']:2d} "
                  f"{rows[grid]['mean_regret'] * 100:.2f}% {rows[grid]['to_2pct_median']}", flush=True)
        held = [g for g in GRIDS if g not in MARK_FROM]
        out["marks"][f"{mark:g}"] = {
            "grids": rows,
            "all": totals(rows, list(GRIDS)),
            "shuffled_held_out": totals(rows, [g for g in held if GRIDS[g] == "shuffled"]),
            "rotating_held_out": totals(rows, [g for g in held if GRIDS[g] == "rotating"]),
            "to_2pct_median_of_grid_medians": statistics.median(r["to_2pct_median"] for r in rows.values()),
        }
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
