"""Re-time, side by side, what `rules` finds in 8 configs against each recorded grid's optimum.

bench/search.py reads every time from the recorded grid, and the grid is a measurement too: each
config timed once, in its place in the recording order, so the fastest of 162 times tends to sit
below its config's own time (it won partly by its noise), and two configs within a percent of each
other can fall either way. "Within 2% of the optimum" is decided on those times. This script asks
what the GPU says when the two configs are timed together:

1. `plan` (CPU, before any GPU time): for every problem of the given grids, the fastest by the
   recorded times of the first 8 configs `rules` measures (the shipped constants, cold, seed 0,
   bench/search.py's BATCH at a time: the run bench/search.py scores) and the grid's recorded
   optimum, with the regret the grid gives; written to a JSON plan, to be committed before the run.
2. `run` (GPU): for every problem whose pick is not the recorded optimum, both configs are timed
   again together, interleaved (`Evaluator.remeasure`), `--repeats` times, in the plan's order;
   the median ratio pick / optimum is the re-timed regret. A pick that is the optimum has regret 0
   and is not timed. The result is written after every problem (a run cut short keeps what it did).

    python bench/arbitrate_sets.py plan --datasets data/replay/matmul-h200-fresh3.jsonl.gz,... \
        --out bench/results/arbitrate-sets-h200-plan.json
    python bench/arbitrate_sets.py run bench/results/arbitrate-sets-h200-plan.json --out $OUT/arbitrate.json

`run` needs a CUDA GPU of the grids' device, and only torch and triton besides tilepilot.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tilepilot.experiments import Config, InputError, Problem
from tilepilot.kernels import get_family
from tilepilot.orchestrator.replay import ReplayDataset, load_dataset

KERNEL = "matmul"
BUDGET = 8
TOLERANCE = 0.02


def pick_of(dataset: ReplayDataset, problem: Problem, budget: int) -> tuple[Config, float] | None:
    """The fastest of the first `budget` configs `rules` measures (bench/search.py's drive), and its
    recorded time; None when none of them ran."""
    import search

    trace = search.drive(dataset, problem, "rules", 0, budget)
    timed = [(t, c) for c, t in zip(trace.configs[:budget], trace.times_ms[:budget], strict=True) if t is not None]
    if not timed:
        return None
    t, c = min(timed, key=lambda x: (x[0], x[1].key()))
    return c, t


def plan(datasets: list[str], budget: int) -> dict[str, Any]:
    import search

    family = get_family(KERNEL)
    rows: list[dict[str, Any]] = []
    devices: set[str] = set()
    for path in datasets:
        ds = load_dataset(path, family)
        devices.add(ds.device)
        for problem in ds.problems:
            pick = pick_of(ds, problem, budget) if ds.optimum_ms(problem) is not None else None
            if pick is None:
                raise InputError(f"{path}: {problem.label()} has no timed config to compare")
            opt = search.recorded_winner(ds, problem)  # ties: the first config key
            rows.append({"dataset": path, "problem": problem.as_dict(), "label": problem.label(),
                         "pick": pick[0].as_dict(), "optimum": opt.config.as_dict(),
                         "regret_recorded": round(pick[1] / opt.median_ms - 1.0, 5), "same": pick[0] == opt.config})
    if len(devices) != 1:
        raise InputError(f"the grids were recorded on {len(devices)} devices ({', '.join(sorted(devices))}): "
                         "give grids of one device")
    return {
        "command": " ".join(["python", "bench/arbitrate_sets.py", *sys.argv[1:]]),
        "date": dt.date.today().isoformat(), "kernel": KERNEL, "device": devices.pop(), "budget": budget,
        "method": " ".join(__doc__.split("\n\n")[2].split()) if __doc__ else "",
        "problems": rows,
        "within_2pct_recorded": sum(r["regret_recorded"] <= TOLERANCE for r in rows),
        "to_retime": sum(not r["same"] for r in rows),
    }


def run(plan_path: Path, out: Path, repeats: int) -> dict[str, Any]:
    from bench_env import retimed_ratios

    from tilepilot.kernels.evaluate import Evaluator

    try:
        report = json.loads(plan_path.read_text(encoding="utf-8"))
        if not isinstance(report, dict) or not isinstance(report.get("problems"), list) or "device" not in report:
            raise ValueError("no device and problems")
    except ValueError as e:
        raise InputError(f"plan {str(plan_path)!r} is not a plan of this script ({type(e).__name__}: {e})") from None
    ev = Evaluator("gpu", spread_target=0.01, time_cap_ms=100.0)
    env = ev.environment()
    if env.device != report["device"]:
        raise InputError(f"the plan's grids were recorded on {report['device']!r}, this GPU is {env.device!r}")
    family = get_family(KERNEL)
    report["run"] = {"command": " ".join(["python", "bench/arbitrate_sets.py", *sys.argv[1:]]),
                     "date": dt.date.today().isoformat(), **env.as_dict(), "repeats": repeats,
                     "method": "pick and recorded optimum timed together (Evaluator.remeasure), "
                               f"{repeats} times; the median ratio"}
    t0 = time.perf_counter()
    for row in report["problems"]:
        if row["same"]:
            row["regret_retimed"], row["retimed_ratios"] = 0.0, []
            continue
        problem = family.parse_problem(row["problem"])
        pick, optimum = Config.of(row["pick"]), Config.of(row["optimum"])
        ratios = retimed_ratios(ev, KERNEL, problem, pick, optimum, repeats)
        row["retimed_ratios"] = [round(x, 5) for x in ratios]
        row["regret_retimed"] = round(statistics.median(ratios) - 1.0, 5) if ratios else None
        print(f"{row['label']}: recorded {100 * row['regret_recorded']:.1f}%, re-timed "
              f"{[round(100 * (x - 1), 1) for x in ratios]}%", flush=True)
        report["run"]["wall_s"] = round(time.perf_counter() - t0, 1)
        report["summary"] = summary(report["problems"])
        out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    report["summary"] = summary(report["problems"])
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per grid and over all: problems within 2% by the recorded times and when re-timed."""
    def of(group: list[dict[str, Any]]) -> dict[str, Any]:
        done = [r for r in group if r.get("regret_retimed") is not None]
        return {"problems": len(group), "within_2pct_recorded": sum(r["regret_recorded"] <= TOLERANCE for r in group),
                "retimed": len(done), "within_2pct_retimed": sum(r["regret_retimed"] <= TOLERANCE for r in done),
                "max_regret_retimed": max((r["regret_retimed"] for r in done), default=None)}
    grids = sorted({r["dataset"] for r in rows})
    return {"all": of(rows), **{g: of([r for r in rows if r["dataset"] == g]) for g in grids}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    sub = ap.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("plan", help="the pick and the recorded optimum of every problem (CPU)")
    p.add_argument("--datasets", required=True, help="recorded grids of one device, comma-separated")
    p.add_argument("--budget", type=int, default=BUDGET)
    p.add_argument("--out", required=True, type=Path)
    r = sub.add_parser("run", help="time each pick beside its recorded optimum (GPU)")
    r.add_argument("plan", type=Path)
    r.add_argument("--out", required=True, type=Path)
    r.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    if not args.out.parent.is_dir():
        raise InputError(f"--out {str(args.out)!r}: folder {str(args.out.parent)!r} does not exist")
    if args.verb == "plan":
        if args.budget < 1:
            raise InputError(f"--budget {args.budget} must be at least 1")
        report = plan([d for d in args.datasets.split(",") if d], args.budget)
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"{report['within_2pct_recorded']} of {len(report['problems'])} within 2% by the recorded times; "
              f"{report['to_retime']} to re-time")
        return 0
    if args.repeats < 1:
        raise InputError(f"--repeats {args.repeats} must be at least 1")
    if not args.plan.is_file():
        raise InputError(f"plan {str(args.plan)!r} does not exist (write one with `plan`)")
    report = run(args.plan, args.out, args.repeats)
    s = report["summary"]["all"]
    print(f"{s['within_2pct_retimed']} of {s['retimed']} re-timed within 2% "
          f"({s['within_2pct_recorded']} of {s['problems']} by the recorded times)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_env import run_main

    raise SystemExit(run_main(main))
