"""Stability of a small gpu campaign: the same campaign three times declares the same winners,
and each winner re-measured five times spreads little.

The campaign: 3 matmul problems, the `random` proposer with a fixed seed (so every run measures
the same 16 configs per problem: what differs between runs is the measurement alone), budget 16
on the recorded 162-config grid, no hypothesis experiments. Each run is `python -m tilepilot
tune --backend gpu` in a subprocess on a fresh database. Then, in this process, the distinct
winners of each problem are re-measured together five times as a campaign re-measures its finalists
before it declares a winner (interleaved, the evaluator's `remeasure` plan: at least 5 rounds of
twice the block length, half the spread target, four times the time cap):
each winner's spread over the five medians is (max - min) / median, and where runs declared
different winners, the slowest of them over the fastest says whether they are within 0.5%.

    python bench/stability.py --work $OUT/stability --out bench/results/stability-h100.json

Needs a CUDA GPU. Targets: the same winner in every run (or one within 0.5%); a spread of at most
1% over five re-measurements.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tilepilot.experiments import Config, Problem, Status  # noqa: E402
from tilepilot.storage.queries import best, open_db  # noqa: E402

log = logging.getLogger("stability")

GRID = {"BLOCK_SIZE_M": [64, 128, 256], "BLOCK_SIZE_N": [64, 128, 256], "BLOCK_SIZE_K": [32, 64, 128],
        "GROUP_SIZE_M": [8], "num_warps": [4, 8], "num_stages": [3, 4, 5],
        # the plain kernel, where the family has variants: the recorded grid
        "VARIANT": ["grouped"], "SPLIT_K": [1], "ALIGN_HINT": [False]}
PROBLEMS = [{"M": 16, "N": 4096, "K": 4096, "dtype": "bf16"},  # ~20 µs: CUDA graphs
            {"M": 2048, "N": 2048, "K": 2048, "dtype": "bf16"},  # ~30 µs
            {"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"}]  # ~0.2 ms: events
REMEASURES = 5
SAME_WITHIN, SPREAD_TARGET = 0.005, 0.01


def campaign_text(name: str, budget: int, seed: int) -> str:
    from bench_env import campaign_toml

    from tilepilot.kernels.registry import get_family

    names = get_family("matmul").space().names
    return campaign_toml(name, "matmul", "random", budget, seed=seed, hypothesis_share=0,
                         space={k: v for k, v in GRID.items() if k in names}, problems=PROBLEMS)


def run_campaign(work: Path, run: int, budget: int, seed: int, timeout_s: float) -> dict[str, Any]:
    db = work / f"run{run}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    toml = work / "stability.toml"
    toml.write_text(campaign_text("stability", budget, seed))
    cmd = [sys.executable, "-m", "tilepilot", "tune", str(toml), "--backend", "gpu", "--db", str(db)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False, timeout=timeout_s)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"run {run}: tune exited with {proc.returncode}: {proc.stderr[-2000:]}")
    with open_db(db) as rdb:
        rows = best(rdb, campaign="stability")
        env = rdb.rows("SELECT DISTINCT device, driver, torch, triton FROM experiments WHERE backend = 'gpu'")
        ceilings = rdb.rows("SELECT device, driver, copy_gbps, matmul_tflops FROM devices")
        timed = rdb.rows("SELECT r.stop_reason, r.timing_method, r.timed_ms FROM results r WHERE r.status = 'ok'")
    winners = {json.dumps(r.problem, sort_keys=True): {
        "config": r.config, "median_ms": r.median_ms, "rel_spread": r.rel_spread, "tie": r.tie,
        "margin": r.margin, "roofline_pct": r.roofline_pct, "decided": r.decided} for r in rows}
    stops: dict[str, int] = {}
    for t in timed:
        stops[t["stop_reason"] or "-"] = stops.get(t["stop_reason"] or "-", 0) + 1
    return {"run": run, "wall_s": round(wall, 1), "winners": winners, "environment": env, "ceilings": ceilings,
            "stop_reasons": stops, "mean_timed_ms": statistics.fmean(t["timed_ms"] for t in timed) if timed else None}


def remeasure(problem: Problem, configs: list[Config]) -> tuple[dict[Config, list[float]], list[dict[str, Any]]]:
    """Each config's median in each of the REMEASURES re-measurements, and the NVML readings
    taken right after each (SM clock, power, temperature), to tell drift of the GPU from noise."""
    from tilepilot.kernels.evaluate import Evaluator

    ev = Evaluator("gpu")
    medians: dict[Config, list[float]] = {c: [] for c in configs}
    readings: list[dict[str, Any]] = []
    for _ in range(REMEASURES):
        results = ev.remeasure("matmul", problem, configs)
        for r in results:
            if r.status is not Status.OK:
                raise RuntimeError(f"{problem.label()} {r.config.label()}: {r.status} {r.message}")
            medians[r.config].append(r.timing.median_ms)
        t = results[0].telemetry
        readings.append({"sm_clock_mhz": t.sm_clock_mhz, "power_w": t.power_w, "temp_c": t.temp_c})
    return medians, readings


def judge(problem: Problem, runs: list[dict[str, Any]]) -> dict[str, Any]:
    key = json.dumps(problem.as_dict(), sort_keys=True)
    picked = [Config.of(r["winners"][key]["config"]) for r in runs]
    distinct = list(dict.fromkeys(picked))
    medians, readings = remeasure(problem, distinct)
    per = {c: statistics.median(v) for c, v in medians.items()}
    spreads = {c: (max(v) - min(v)) / statistics.median(v) for c, v in medians.items()}
    slowest_over_fastest = max(per.values()) / min(per.values()) - 1
    return {
        "problem": problem.as_dict(),
        "winners_by_run": [c.as_dict() for c in picked],
        "declared_ms_by_run": [r["winners"][key]["median_ms"] for r in runs],
        "same_winner": len(distinct) == 1,
        "distinct_winners_slowest_over_fastest": slowest_over_fastest,
        "within_0.5pct": len(distinct) == 1 or slowest_over_fastest <= SAME_WITHIN,
        "remeasured": [{"config": c.as_dict(), "medians_ms": medians[c], "spread_max_min_over_median": spreads[c]}
                       for c in distinct],
        "remeasure_telemetry": readings,
        "max_remeasure_spread": max(spreads.values()),
        "remeasure_spread_ok": max(spreads.values()) <= SPREAD_TARGET,
        "roofline_pct_by_run": [r["winners"][key]["roofline_pct"] for r in runs],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, help="a folder for the campaign files and databases")
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-timeout-s", type=float, default=200.0, help="each campaign's limit")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    runs = []
    for run in range(1, args.runs + 1):
        runs.append(run_campaign(work, run, args.budget, args.seed, args.run_timeout_s))
        log.info("run %d: %.0f s, stops %s", run, runs[-1]["wall_s"], runs[-1]["stop_reasons"])
    problems = [judge(Problem.of(p), runs) for p in PROBLEMS]
    report = {
        "what": "the same small gpu campaign (3 matmul problems, random proposer with a fixed seed, budget "
                f"{args.budget}, fresh database each) run {args.runs} times: same winner or within 0.5%; each "
                f"winner re-measured {REMEASURES} times (the campaign's re-measure plan, interleaved): "
                "(max - min) / median <= 1%",
        "command": " ".join(["python", "bench/stability.py", *sys.argv[1:]]),
        "date": dt.date.today().isoformat(),
        "environment": runs[0]["environment"], "ceilings": runs[0]["ceilings"],
        "runs": [{k: v for k, v in r.items() if k not in ("environment", "ceilings")} for r in runs],
        "problems": problems,
        "summary": {"same_or_within_0.5pct": sum(p["within_0.5pct"] for p in problems),
                    "same_winner": sum(p["same_winner"] for p in problems),
                    "remeasure_spread_ok": sum(p["remeasure_spread_ok"] for p in problems),
                    "max_remeasure_spread": max(p["max_remeasure_spread"] for p in problems),
                    "problems": len(problems)},
        "wall_s": round(time.monotonic() - t0, 1),
    }
    Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")
    for p in problems:
        label = " ".join(f"{k}={v}" for k, v in p["problem"].items())
        print(f"{label:32} same winner {p['same_winner']!s:5} within 0.5% {p['within_0.5pct']!s:5} "
              f"re-measure spread {p['max_remeasure_spread']:.2%}")
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
