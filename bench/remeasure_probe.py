"""Does heating the GPU first, or re-measuring longer, steady five re-measurements of a winner?

For two problems of bench/stability.py (2048³ bf16, whose winners spread 9.5% there, and M=16,
1.3%), the configs those runs declared are re-measured five times as a campaign re-measures its
finalists (`Evaluator.remeasure`), with the NVML readings after each: `cold` (after 3 s idle),
`hot` (right after 6 s of back-to-back evaluations, the SM clock and power traced through them in
`heat_trace`), `hot2` (again), and `long` (re-measures of 300 ms of GPU time per config instead
of 60). For each series the spread of the five medians, p20s and minima, (max - min) / median.

    python bench/remeasure_probe.py bench/results/remeasure-probe-h100.json

Needs a CUDA GPU. Uses the evaluator's internals; a probe, not a campaign.
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

from tilepilot.experiments import Config, Problem
from tilepilot.kernels import telemetry
from tilepilot.kernels.evaluate import Evaluator

REMEASURES = 5
HEAT_S = 6.0


def tile(bm: int, bn: int, bk: int, warps: int, stages: int) -> Config:
    return Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 8,
                      "num_warps": warps, "num_stages": stages})


CASES = {
    "2048": (Problem.of({"M": 2048, "N": 2048, "K": 2048, "dtype": "bf16"}),
             [tile(256, 128, 64, 8, 4), tile(128, 128, 32, 4, 5)]),
    "m16": (Problem.of({"M": 16, "N": 4096, "K": 4096, "dtype": "bf16"}), [tile(64, 64, 128, 8, 5)]),
}


def reading(uuid: str | None) -> dict[str, Any]:
    t = telemetry.result_telemetry(uuid)
    return {"mhz": t.sm_clock_mhz, "w": t.power_w, "c": t.temp_c}


def spreads(values: dict[Config, list[float]]) -> list[float]:
    return [round((max(v) - min(v)) / statistics.median(v), 4) for v in values.values()]


def series(ev: Evaluator, problem: Problem, configs: list[Config]) -> dict[str, Any]:
    """REMEASURES re-measurements of `configs` together, and the NVML readings after each."""
    med: dict[Config, list[float]] = {c: [] for c in configs}
    p20: dict[Config, list[float]] = {c: [] for c in configs}
    mins: dict[Config, list[float]] = {c: [] for c in configs}
    readings, reps = [], []
    t0 = time.monotonic()
    for _ in range(REMEASURES):
        for r in ev.remeasure("matmul", problem, configs):
            assert r.timing is not None, r.message
            med[r.config].append(r.timing.median_ms)
            p20[r.config].append(r.timing.p20_ms)
            mins[r.config].append(r.timing.min_ms)
            reps.append((r.timing.reps, r.timing.method, round(r.timing.timed_ms or 0, 1)))
        readings.append(reading(ev.gpu_uuid()))
    return {"medians": list(med.values()), "spreads": spreads(med), "p20_spreads": spreads(p20),
            "min_spreads": spreads(mins), "clocks": readings, "reps": reps[:4],
            "wall_s": round(time.monotonic() - t0, 2)}


def heat(ev: Evaluator, problem: Problem, configs: list[Config], seconds: float) -> list[tuple[float, Any, Any]]:
    """Evaluate `configs` back to back for `seconds`; the SM clock and power after each."""
    trace = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        ev.evaluate("matmul", problem, configs)
        r = reading(ev.gpu_uuid())
        trace.append((round(time.monotonic() - t0, 2), r["mhz"], r["w"]))
    return trace


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the JSON file to write, e.g. bench/results/remeasure-probe-h100.json")
    args = ap.parse_args(argv)
    import torch

    ev = Evaluator("gpu")
    ev_long = Evaluator("gpu", time_cap_ms=75.0)  # re-measures of 300 ms of GPU time per config
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "command": " ".join(["python", *sys.argv]),
                           "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                           "torch": torch.__version__, "driver": telemetry.driver_version()}
    for name, (problem, configs) in CASES.items():
        ev.evaluate("matmul", problem, configs)
        ev_long.evaluate("matmul", problem, configs)
        time.sleep(3)
        arms: dict[str, Any] = {"cold": series(ev, problem, configs),
                                "heat_trace": heat(ev, problem, configs, HEAT_S)}
        arms["hot"] = series(ev, problem, configs)
        arms["hot2"] = series(ev, problem, configs)
        arms["long"] = series(ev_long, problem, configs)
        out[name] = arms
        for k, v in arms.items():
            if k != "heat_trace":
                print(name, k, "median", v["spreads"], "p20", v["p20_spreads"], "min", v["min_spreads"],
                      [[round(x * 1e3, 2) for x in m] for m in v["medians"]], [c["mhz"] for c in v["clocks"]],
                      flush=True)
    Path(args.out).write_text(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
