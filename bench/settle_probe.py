"""Does an untimed launch at the start of each block make a campaign's timings better or cheaper?

bench/block_probe.py found the first sample of every block of the timer's rounds 6-25% slow on a
0.3 ms matmul (0-15% on a 1.3 ms one: about 40 µs more, whichever kernel ran before, the same
config included), and the rest of the block steadier. A campaign's blocks are 1 ms: a config
of 0.3 ms has three or four samples a block, so one in three or four is slow: does that lift its
median, or widen (p80 - p20) / median past the spread target? `TimingPlan.settle_launches`
runs that many launches of the kernel untimed at the start of each block (their GPU time counted
against the cap).

Here 8 configs of each problem (cold L2 by copies) are timed together with a campaign's plan (3
rounds at least, blocks of 1 ms, spread target 2%, cap 15 ms), with 0 and with 1 settle launch,
REPEATS times each, the two arms alternating (A B, B A, ...), and once with a long reference plan
(blocks of 10 ms, 20 rounds, no stop on spread). Per arm: each config's median over the
reference's (median over configs and repeats, and the worst), the spread of a config's medians over
the repeats (p80 - p20 over median, the median over configs), Kendall's tau-b of each repeat's
ranking against the reference, how many stopped on the spread target, and the GPU ms spent per
config.

    python bench/settle_probe.py bench/results/settle-probe-h200.json

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
from tilepilot.kernels import get_family
from tilepilot.kernels.base import Target
from tilepilot.kernels.evaluate import Evaluator, cold_copies
from tilepilot.kernels.timing import GpuTimer, TimingPlan, quantile

REPEATS = 6
PROBLEMS = ((16, 4096, 4096, "bf16"), (4096, 4096, 4096, "bf16"), (8192, 4096, 14336, "bf16"))
TILES = ((64, 64, 32, 4, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 4), (256, 128, 32, 8, 5),
         (128, 128, 64, 4, 3), (64, 128, 64, 4, 4), (128, 64, 128, 4, 3), (256, 64, 64, 8, 3))
CAMPAIGN = dict(rounds=3, block_ms=1.0, spread_target=0.02, time_cap_ms=15.0)
REFERENCE = dict(rounds=20, block_ms=10.0, spread_target=0.0, time_cap_ms=400.0)
ARMS = {"settle 0": 0, "settle 1": 1}


def config_of(bm: int, bn: int, bk: int, warps: int, stages: int) -> Config:
    return get_family("matmul").space().parse({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk,
                                               "GROUP_SIZE_M": 8, "num_warps": warps, "num_stages": stages})


def launches(problem: Problem) -> list[list[Any]]:
    """Each config's launches rotated over copies of the data (cold L2)."""
    import torch

    family = get_family("matmul")
    inputs = [family.make_inputs(problem, s, "cuda") for s in range(3)]
    out = family.make_output(problem, inputs[0])
    copies = cold_copies(family, problem, inputs, out, GpuTimer().l2_bytes)
    if not copies:
        raise SystemExit(f"{problem.label()}: the copies for a cold L2 do not fit")
    major, minor = torch.cuda.get_device_capability()
    target = Target(arch=10 * major + minor)
    result = []
    for t in TILES:
        config = config_of(*t)
        compiled = family.compile(problem, config, target)
        result.append([family.launcher(problem, config, i, o, compiled) for i, o in copies])
    return result


def kendall_tau_b(a: list[float], b: list[float]) -> float:
    concordant = discordant = ties_a = ties_b = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            da, db = a[i] - a[j], b[i] - b[j]
            if da == 0 and db == 0:
                continue
            if da == 0:
                ties_a += 1
            elif db == 0:
                ties_b += 1
            elif (da > 0) == (db > 0):
                concordant += 1
            else:
                discordant += 1
    n = concordant + discordant
    return (concordant - discordant) / (((n + ties_a) * (n + ties_b)) ** 0.5) if n else 1.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the JSON file to write, e.g. bench/results/settle-probe-h200.json")
    args = ap.parse_args(argv)
    import torch

    env = Evaluator("gpu").environment()
    timer = GpuTimer()
    out: dict[str, Any] = {**env.as_dict(), "command": " ".join(["python", "bench/settle_probe.py", *sys.argv[1:]]),
                           "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                           "tiles": ["x".join(map(str, t[:3])) + f" w{t[3]} s{t[4]}" for t in TILES],
                           "campaign_plan": CAMPAIGN, "reference_plan": REFERENCE, "repeats": REPEATS,
                           "problems": {}}
    cold = [True] * len(TILES)
    for m, n, k, dtype in PROBLEMS:
        problem = get_family("matmul").parse_problem({"M": m, "N": n, "K": k, "dtype": dtype})
        fns = launches(problem)
        runs: dict[str, list[Any]] = {name: [] for name in ARMS}
        for r in range(REPEATS):
            for name in (list(ARMS) if r % 2 == 0 else list(reversed(ARMS))):
                plan = TimingPlan(**CAMPAIGN, settle_launches=ARMS[name])
                runs[name].append(timer.time(fns, plan, lambda i: None, cold=cold))
        ref = [t.median_ms for t in timer.time(fns, TimingPlan(**REFERENCE, settle_launches=1), lambda i: None,
                                               cold=cold)]
        arms: dict[str, Any] = {}
        for name, timings in runs.items():
            medians = [[t.median_ms for t in run] for run in timings]
            over_ref = [m / r for run in medians for m, r in zip(run, ref, strict=True)]
            per_config = [sorted(run[c] for run in medians) for c in range(len(TILES))]
            spreads = [(quantile(v, 0.8) - quantile(v, 0.2)) / quantile(v, 0.5) for v in per_config]
            arms[name] = {
                "medians_ms": [[round(x, 5) for x in run] for run in medians],
                "median_over_reference": round(statistics.median(over_ref), 4),
                "worst_over_reference": round(max(over_ref, key=lambda x: abs(x - 1)), 4),
                "repeat_spread_median": round(statistics.median(spreads), 4),
                "tau_b_vs_reference": [round(kendall_tau_b(run, ref), 3) for run in medians],
                "stopped_on_spread": sum(t.stop_reason == "spread" for run in timings for t in run),
                "configs_timed": sum(len(run) for run in timings),
                "gpu_ms_per_config": round(statistics.mean(t.timed_ms or 0.0 for run in timings for t in run), 3),
                "samples_spread_median": round(statistics.median(
                    (t.p80_ms - t.p20_ms) / t.median_ms for run in timings for t in run), 4),
            }
            a = arms[name]
            print(f"{problem.label():28s} {name}: median/ref {a['median_over_reference']:.4f} (worst "
                  f"{a['worst_over_reference']:.4f}), repeat spread {a['repeat_spread_median']:.4f}, tau "
                  f"{statistics.median(a['tau_b_vs_reference']):.3f}, spread stops {a['stopped_on_spread']}/"
                  f"{a['configs_timed']}, {a['gpu_ms_per_config']:.2f} GPU ms/config, sample spread "
                  f"{a['samples_spread_median']:.4f}", flush=True)
        out["problems"][problem.label()] = {"reference_ms": [round(x, 5) for x in ref], "arms": arms}
        del fns
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
