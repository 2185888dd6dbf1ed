"""Within one block of the timer's rounds, do a config's first samples carry the kernel before it?

bench/order_probe.py found that in the "rotating" order a config's median carries the mark of the
kernel that runs before it in nearly every round. This probe looks inside the blocks: the same
three fast configs of a problem and the low-power "cool" kernel (order_probe's Y, Z, W and cool)
timed with the recording's blocks of 10 ms (8 rounds at least, for more blocks; cold L2 by copies), in the
rotating order (cool Y Z W) and in the shuffled one. For every block it keeps the kernel that ran
before it and the block's samples in order; it reports, per config and predecessor, the mean of each
of the first samples and of the block's last quarter relative to the config's median over all its
blocks. If the first samples after "cool" read faster (clocks up after a low-power spell) or slower
and the rest do not, the mark fades within the block and untimed launches at the block's start
would remove it; if the whole block is shifted, the mark lasts longer than a block.

    python bench/block_probe.py bench/results/block-probe-h200.json

Needs a CUDA GPU. Drives GpuTimer's steps directly (a probe of the timer, not a campaign).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from order_probe import launches

from tilepilot.kernels import get_family
from tilepilot.kernels.evaluate import Evaluator
from tilepilot.kernels.timing import ORDER_SEED, GpuTimer, TimingPlan, Track, interleave

PROBLEMS = ((4096, 6144, 4096, "bf16"), (8192, 4096, 14336, "bf16"))
SUCCESSION = ("cool", "Y", "Z", "W")
ORDERS = ("rotating", "shuffled")
REPEATS = 5
FIRST = 6  # the leading samples of a block reported one by one
PLAN = dict(rounds=8, block_ms=10.0, spread_target=0.01, time_cap_ms=100.0)


def run_arm(timer: GpuTimer, fns: dict[str, list[Any]], order: str, seed: int) -> dict[str, list[dict[str, Any]]]:
    """One timing of the succession in `order`: per kernel, its blocks (predecessor, samples)."""
    import torch

    plan = TimingPlan(**PLAN, order=order)
    tracks = [Track(list(fns[s]), False) for s in SUCCESSION]
    ran: list[int] = []
    blocks: dict[str, list[dict[str, Any]]] = {s: [] for s in SUCCESSION}

    def block(i: int) -> None:
        t = tracks[i]
        before = len(t.samples)
        timer._block(t)
        prev = SUCCESSION[ran[-1]] if ran else ""
        ran.append(i)
        blocks[SUCCESSION[i]].append({"after": prev, "samples": [round(x, 5) for x in t.samples[before:]]})

    torch.cuda.synchronize()
    timer._wake()
    with torch.cuda.stream(timer._stream):
        for t in tracks:
            timer._prepare(t, plan)
        interleave(tracks, plan, lambda i: None, block, random.Random(ORDER_SEED + seed))
    for t in tracks:
        t.graphs.clear()
    return blocks


def shape(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per predecessor: each leading sample's and the last quarter's mean over the config's median."""
    median = statistics.median(x for b in blocks for x in b["samples"])
    out: dict[str, Any] = {}
    for prev in sorted({b["after"] for b in blocks}):
        mine = [b["samples"] for b in blocks if b["after"] == prev]
        n = min(len(s) for s in mine)
        lead = [round(statistics.mean(s[j] for s in mine) / median, 4) for j in range(min(FIRST, n))]
        tail = [x for s in mine for x in s[len(s) - max(1, len(s) // 4):]]
        out[prev or "(first)"] = {"blocks": len(mine), "samples_per_block": n, "lead": lead,
                                  "last_quarter": round(statistics.mean(tail) / median, 4)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the JSON file to write, e.g. bench/results/block-probe-h200.json")
    args = ap.parse_args(argv)
    import torch

    env = Evaluator("gpu").environment()
    timer = GpuTimer()
    out: dict[str, Any] = {**env.as_dict(), "command": " ".join(["python", "bench/block_probe.py", *sys.argv[1:]]),
                           "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "plan": PLAN,
                           "succession": SUCCESSION, "repeats": REPEATS, "problems": {}}
    for m, n, k, dtype in PROBLEMS:
        problem = get_family("matmul").parse_problem({"M": m, "N": n, "K": k, "dtype": dtype})
        fns = launches(problem)
        arms: dict[str, Any] = {}
        for order in ORDERS:
            runs = [run_arm(timer, fns, order, r) for r in range(REPEATS)]
            per_kernel = {s: [b for run in runs for b in run[s]] for s in SUCCESSION if s != "cool"}
            arms[order] = {"shape": {s: shape(b) for s, b in per_kernel.items()}, "blocks": per_kernel}
            for s, sh in arms[order]["shape"].items():
                for prev, v in sh.items():
                    print(f"{problem.label():28s} {order:9s} {s} after {prev:7s} n={v['blocks']:3d} "
                          f"lead {v['lead']} last quarter {v['last_quarter']}", flush=True)
        out["problems"][problem.label()] = arms
        del fns
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
