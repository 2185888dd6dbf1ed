"""Does the kernel that runs just before a config change its time? The order of interleaved rounds.

Under the power cap a GPU's clocks follow what it ran in the last milliseconds. The timer gives
each kernel one block of about 10 ms a round; in the "rotating" order (A B C, B C A, ...) a kernel
follows the same one in nearly every round, in "shuffled" (the default now) every round draws a new order. Here
two fast configs of a problem, Y (128x256x64, 8 warps, 4 stages) and Z (256x128x32, 8 warps, 5
stages), plus a third peer W (128x128x64, 8 warps, 4 stages), are timed together with a low-power
kernel ("cool": a spin of one thread block, about 0.3 ms a launch) in two successions, cool Y Z W
and cool Z Y W, each in both orders, and without the cool kernel ("peers": Y Z W, shuffled). The
arms run REPEATS times, interleaved, with the recording's timing plan (4 rounds at least, blocks of
10 ms, spread target 1%, 60 ms cap, cold L2 by copies) or, with `--campaign-plan`, a campaign's
(3 rounds, blocks of 1 ms, 2%, 15 ms). For each problem and arm: the medians of
Y, Z and W in every repeat and Y/Z, and the NVML readings after each arm. If the order carries no
bias, Y/Z is the same in every arm.

    python bench/order_probe.py bench/results/order-probe-h200.json
    python bench/order_probe.py --campaign-plan bench/results/order-probe-campaign-plan-h200.json

Needs a CUDA GPU. Times kernels through GpuTimer directly; a probe, not a campaign.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tilepilot.experiments import Config, Problem
from tilepilot.kernels import get_family, telemetry
from tilepilot.kernels.base import Target
from tilepilot.kernels.evaluate import Evaluator, cold_copies
from tilepilot.kernels.timing import GpuTimer, TimingPlan

REPEATS = 4
COOL_MS = 0.3
PROBLEMS = ((4096, 6144, 4096, "bf16"), (2048, 3584, 3584, "fp16"), (8192, 4096, 14336, "bf16"))
TILES = {"Y": (128, 256, 64, 8, 4), "Z": (256, 128, 32, 8, 5), "W": (128, 128, 64, 8, 4)}
ARMS = {  # name: (order, succession)
    "rotating cool-Y-Z-W": ("rotating", ("cool", "Y", "Z", "W")),
    "rotating cool-Z-Y-W": ("rotating", ("cool", "Z", "Y", "W")),
    "shuffled cool-Y-Z-W": ("shuffled", ("cool", "Y", "Z", "W")),
    "shuffled cool-Z-Y-W": ("shuffled", ("cool", "Z", "Y", "W")),
    "shuffled peers": ("shuffled", ("Y", "Z", "W")),
}


def tile(bm: int, bn: int, bk: int, warps: int, stages: int) -> Config:
    return get_family("matmul").space().parse({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk,
                                               "GROUP_SIZE_M": 8, "num_warps": warps, "num_stages": stages})


def launches(problem: Problem) -> dict[str, list[Any]]:
    """Each config's launches rotated over copies of the data (cold L2), and the cool kernel's."""
    import torch

    family = get_family("matmul")
    inputs = [family.make_inputs(problem, s, "cuda") for s in range(3)]
    out = family.make_output(problem, inputs[0])
    copies = cold_copies(family, problem, inputs, out, GpuTimer().l2_bytes)
    if not copies:
        raise SystemExit(f"{problem.label()}: the copies for a cold L2 do not fit")
    major, minor = torch.cuda.get_device_capability()
    target = Target(arch=10 * major + minor)
    result: dict[str, list[Any]] = {}
    for name, t in TILES.items():
        config = tile(*t)
        compiled = family.compile(problem, config, target)
        result[name] = [family.launcher(problem, config, i, o, compiled) for i, o in copies]
    cycles = int(2e6 * COOL_MS)  # about COOL_MS at 2 GHz
    result["cool"] = [lambda: torch.cuda._sleep(cycles)]
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the JSON file to write, e.g. bench/results/order-probe-h200.json")
    ap.add_argument("--campaign-plan", action="store_true", help="time with a campaign's plan, not the recorder's")
    args = ap.parse_args(argv)
    plan_args = (dict(rounds=3, block_ms=1.0, spread_target=0.02, time_cap_ms=15.0) if args.campaign_plan
                 else dict(rounds=4, block_ms=10.0, spread_target=0.01, time_cap_ms=60.0))
    import torch

    env = Evaluator("gpu").environment()
    uuid = Evaluator("gpu").gpu_uuid()
    timer = GpuTimer()
    out: dict[str, Any] = {**env.as_dict(), "command": " ".join(["python", "bench/order_probe.py", *sys.argv[1:]]),
                           "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                           "tiles": {k: "x".join(map(str, v[:3])) + f" w{v[3]} s{v[4]}" for k, v in TILES.items()},
                           "cool_ms": COOL_MS, "repeats": REPEATS, "plan": plan_args, "problems": {}}
    for m, n, k, dtype in PROBLEMS:
        problem = get_family("matmul").parse_problem({"M": m, "N": n, "K": k, "dtype": dtype})
        fns = launches(problem)
        arms: dict[str, Any] = {name: {"Y": [], "Z": [], "W": [], "clocks": []} for name in ARMS}
        for _ in range(REPEATS):
            for name, (order, succession) in ARMS.items():
                plan = TimingPlan(**plan_args, order=order)
                timings = timer.time([fns[s] for s in succession], plan, lambda i: None, cold=[True] * len(succession))
                for s, t in zip(succession, timings, strict=True):
                    if s != "cool":
                        arms[name][s].append(round(t.median_ms, 5))
                r = telemetry.result_telemetry(uuid)
                arms[name]["clocks"].append({"mhz": r.sm_clock_mhz, "w": r.power_w})
        for name, a in arms.items():
            a["Y_over_Z"] = [round(y / z, 4) for y, z in zip(a["Y"], a["Z"], strict=True)]
            a["median_Y_over_Z"] = round(statistics.median(a["Y_over_Z"]), 4)
            print(f"{problem.label():28s} {name:22s} Y/Z {a['median_Y_over_Z']:.3f}  "
                  f"Y {statistics.median(a['Y']):.4f} Z {statistics.median(a['Z']):.4f} "
                  f"W {statistics.median(a['W']):.4f} ms  {[c['mhz'] for c in a['clocks']]}", flush=True)
        out["problems"][problem.label()] = arms
        del fns
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
