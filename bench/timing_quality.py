"""Ranking quality of the default timing plan against a plan ten times longer, on full grids.

For one or two problems of each kernel family (matmul on the recorded 162-config grid; every
other registered family on all the configs its space allows for the problem), in one run on one
GPU: every config is compiled ahead (CPU processes with no GPU), then timed with the evaluator's
default plan (batches of 4, interleaved, as a campaign does), then again, in another random order
and other batches, with a reference plan: 10× the minimum rounds, no early stop on spread, and a
time cap of 10× the GPU time the default plan spent per config on that problem (its median).
Reported per problem: Kendall's tau-b between the two rankings; whether the fastest config is
the same (and, if not, how much slower the default plan's pick is by the reference); the winner
each plan declares as a campaign does (its 5 fastest re-timed together, interleaved: the default
side with the evaluator's `remeasure`, the reference side with the reference plan; each finalist
judged on the geometric mean of its two medians), and where the two differ, the default winner's
time over the reference winner's, both timed together five times with the reference plan (the
ratio of each repeat; where the repeats disagree on which is faster, the two are a tie, as a
campaign reports one; the target counts a declared winner as right when it is the reference's,
a tie with it, or faster than it by every repeat); GPU
ms per config for both plans; how the default plan stopped; the timing methods; SM clocks. The device
ceilings are measured first and each problem's best config is given as a share of its roofline.

    python bench/timing_quality.py --out bench/results/timing-quality-h100.json

Needs a CUDA GPU. JSON is rewritten after every problem, so an interrupted run keeps what it did.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import datetime as dt
import json
import logging
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tilepilot.experiments import Config, Problem, Status  # noqa: E402
from tilepilot.kernels.registry import family_names, get_family  # noqa: E402

log = logging.getLogger("timing_quality")

MATMUL_GRID = {"BLOCK_SIZE_M": [64, 128, 256], "BLOCK_SIZE_N": [64, 128, 256], "BLOCK_SIZE_K": [32, 64, 128],
               "GROUP_SIZE_M": [8], "num_warps": [4, 8], "num_stages": [3, 4, 5],
               # the plain kernel, where the family has variants: the grid the recordings were measured on
               "VARIANT": ["grouped"], "SPLIT_K": [1], "ALIGN_HINT": [False]}
PROBLEMS: dict[str, list[dict[str, Any]]] = {
    "matmul": [{"M": 16, "N": 4096, "K": 4096, "dtype": "bf16"},  # ~20 µs, memory-bound: CUDA graphs
               {"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"}],  # ~0.2 ms, compute-bound: events
    "softmax": [{"rows": 4096, "cols": 4096, "dtype": "bf16"}],
    "rmsnorm": [{"rows": 4096, "cols": 4096, "dtype": "bf16"}],
    "layernorm": [{"rows": 4096, "cols": 4096, "dtype": "bf16"}],
    "silu_mul_fp8_quant": [{"T": 4096, "H": 4096, "dtype": "bf16"}],
    "fused_moe": [{"M": 256, "E": 64, "topk": 6, "N": 1408, "K": 2048, "dtype": "bf16"}],
    "attention": [{"B": 4, "H": 32, "S": 2048, "D": 128, "causal": True, "dtype": "bf16"}],
}
SKIP = ("matmul_faults",)  # the matmul kernel again, with planted faults
BATCH = 4
FINALISTS = 5  # re-timed together before a winner is declared, as the campaign driver does
JUDGE_REPEATS = 5
TAU_TARGET, MS_TARGET = 0.9, 15.0


def kendall_tau_b(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b of two paired samples (ties in either count as neither)."""
    concordant = discordant = ties_x = ties_y = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denom = ((concordant + discordant + ties_x) * (concordant + discordant + ties_y)) ** 0.5
    return (concordant - discordant) / denom if denom else float("nan")


def problems_for(name: str) -> list[dict[str, Any]]:
    """The bench's problems for a family, else the first problem of a campaign file that tunes it."""
    if name in PROBLEMS:
        return PROBLEMS[name]
    import tomllib

    for path in sorted((ROOT / "campaigns").glob("*.toml")):
        data = tomllib.loads(path.read_text())
        if data.get("campaign", {}).get("kernel") == name and data.get("problems"):
            return data["problems"][:1]
    return []


def grid(name: str, problem: Problem, max_configs: int, seed: int) -> tuple[list[Config], int]:
    """The configs to time (valid for the problem) and the size of the grid they come from."""
    family = get_family(name)
    space = family.space()
    if name == "matmul":
        space = space.narrowed({k: tuple(v) for k, v in MATMUL_GRID.items() if k in space.names})
    valid = [c for c in space if space.check(c, problem) is None]
    if len(valid) > max_configs:
        return sorted(random.Random(seed).sample(valid, max_configs), key=valid.index), len(valid)
    return valid, len(valid)


def _no_gpu() -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.pop("TRITON_INTERPRET", None)


def _compile(job: tuple[str, dict[str, Any], dict[str, Any], Any]) -> str:
    from tilepilot.kernels.evaluate import compile_config

    name, problem, config, target = job
    try:
        return compile_config(name, Problem.of(problem), Config.of(config), target).status.value
    except Exception as e:  # the evaluator meets it again and reports it; the cache fill goes on
        return f"{name}: {type(e).__name__}"


def compile_ahead(jobs: list[tuple[str, Problem, Config]], target: Any, workers: int) -> dict[str, int]:
    """Fill the Triton cache in CPU processes (each specialisation and config once)."""
    seen: dict[tuple[str, str, str], tuple[str, dict[str, Any], dict[str, Any], Any]] = {}
    for name, problem, config in jobs:
        key = (name, get_family(name).specialisation(problem, config), config.key())
        seen.setdefault(key, (name, problem.as_dict(), config.as_dict(), target))
    import multiprocessing as mp

    counts: dict[str, int] = {}
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_no_gpu) as pool:
        for status in pool.map(_compile, seen.values(), chunksize=4):
            counts[status] = counts.get(status, 0) + 1
    return counts


def time_all(ev: Any, name: str, problem: Problem, configs: list[Config], plan: Any) -> dict[Config, Any]:
    out: dict[Config, Any] = {}
    for i in range(0, len(configs), BATCH):
        for r in ev.evaluate(name, problem, configs[i:i + BATCH], plan=plan):
            out[r.config] = r
    return out


def declare(ev: Any, name: str, problem: Problem, first: dict[Config, Any], plan: Any) -> tuple[Config, float]:
    """The winner as a campaign declares it (see the module docstring), and the GPU ms that took.
    `plan` None: the evaluator's `remeasure`."""
    top = sorted((c for c, r in first.items() if r.status is Status.OK), key=lambda c: first[c].timing.median_ms)
    top = top[:FINALISTS]
    again = ev.remeasure(name, problem, top) if plan is None else ev.evaluate(name, problem, top, plan=plan)
    score = {r.config: (r.timing.median_ms * first[r.config].timing.median_ms) ** 0.5
             for r in again if r.status is Status.OK}
    return min(score, key=score.__getitem__), sum(r.timing.timed_ms for r in again if r.timing)


def judge(ev: Any, name: str, problem: Problem, a: Config, b: Config, plan: Any) -> list[float]:
    """a's time over b's, both timed together JUDGE_REPEATS times: the ratio of each repeat."""
    ratios = []
    for _ in range(JUDGE_REPEATS):
        ra, rb = ev.evaluate(name, problem, [a, b], plan=plan)
        ratios.append(ra.timing.median_ms / rb.timing.median_ms)
    return ratios


def separated(ratios: list[float]) -> bool:
    """Whether the head-to-head tells two configs apart: every repeat puts the same one ahead.
    Where the repeats disagree the two are within the measurement's noise: a tie, as a campaign
    reports one."""
    return all(r > 1 for r in ratios) or all(r < 1 for r in ratios)


def clocks(results: list[Any]) -> dict[str, float | None]:
    mhz = [r.telemetry.sm_clock_mhz for r in results if r.telemetry.sm_clock_mhz]
    return {"min": min(mhz), "median": statistics.median(mhz), "max": max(mhz)} if mhz else {"min": None}


def quality(name: str, problem: Problem, configs: list[Config], grid_size: int, ev: Any, ceilings: Any,
            seed: int) -> dict[str, Any]:
    from tilepilot.kernels.timing import TimingPlan

    fast_plan = ev.plan
    t0 = time.monotonic()
    fast = time_all(ev, name, problem, configs, None)
    fast_wall = time.monotonic() - t0
    ok = [c for c in configs if fast[c].status is Status.OK]
    fast_ms = [fast[c].timing.timed_ms for c in ok]
    ref_plan = TimingPlan(rounds=10 * fast_plan.rounds, block_ms=fast_plan.block_ms, spread_target=0.0,
                          time_cap_ms=10 * statistics.median(fast_ms), graph_below_ms=fast_plan.graph_below_ms)
    order = list(ok)
    random.Random(seed).shuffle(order)
    t0 = time.monotonic()
    ref = time_all(ev, name, problem, order, ref_plan)
    ref_wall = time.monotonic() - t0
    both = [c for c in ok if ref[c].status is Status.OK]
    a = [fast[c].timing.median_ms for c in both]
    b = [ref[c].timing.median_ms for c in both]
    top_fast = min(both, key=lambda c: fast[c].timing.median_ms)
    top_ref = min(both, key=lambda c: ref[c].timing.median_ms)
    work = get_family(name).work(problem)
    best_ms = ref[top_ref].timing.median_ms
    stops: dict[str, int] = {}
    methods: dict[str, int] = {}
    for c in ok:
        stops[fast[c].timing.stop_reason] = stops.get(fast[c].timing.stop_reason, 0) + 1
        methods[fast[c].timing.method] = methods.get(fast[c].timing.method, 0) + 1
    statuses: dict[str, int] = {}
    for c in configs:
        statuses[fast[c].status.value] = statuses.get(fast[c].status.value, 0) + 1
    ref_ms = [ref[c].timing.timed_ms for c in both]
    won_default, declare_ms = declare(ev, name, problem, {c: fast[c] for c in both}, None)
    won_ref, _ = declare(ev, name, problem, {c: ref[c] for c in both}, ref_plan)
    ratios = [1.0] if won_default == won_ref else judge(ev, name, problem, won_default, won_ref, ref_plan)
    declared_ratio = statistics.median(ratios)
    # Not the same winner but not worse either: a tie (the repeats disagree) or the default's pick
    # faster by every repeat. Only a pick slower by every repeat is a miss.
    declared_ok = won_default == won_ref or not (separated(ratios) and declared_ratio > 1)
    return {
        "kernel": name, "problem": problem.as_dict(), "grid_configs": grid_size, "timed_configs": len(configs),
        "ok_configs": len(both), "statuses_default_plan": statuses,
        "kendall_tau_b": kendall_tau_b(a, b),
        "top1_same": top_fast == top_ref,
        "top1_default": top_fast.as_dict(), "top1_reference": top_ref.as_dict(),
        "top1_default_over_reference_best_by_reference": ref[top_fast].timing.median_ms / best_ms,
        "declared_same": won_default == won_ref,
        "declared_default": won_default.as_dict(), "declared_reference": won_ref.as_dict(),
        "declared_default_over_reference_interleaved": declared_ratio,
        "declared_judge_ratios": ratios,
        "declared_same_or_not_worse": declared_ok,
        "gpu_ms_declaring_default": declare_ms,
        "gpu_ms_per_config_default_with_declaring": (sum(fast_ms) + declare_ms) / len(fast_ms),
        "best_ms_reference": best_ms, "best_roofline_pct": ceilings.roofline_pct(work.flops, work.bytes, best_ms),
        "gpu_ms_per_config_default": {"mean": statistics.fmean(fast_ms), "median": statistics.median(fast_ms),
                                      "max": max(fast_ms)},
        "gpu_ms_per_config_reference": {"mean": statistics.fmean(ref_ms), "median": statistics.median(ref_ms),
                                        "max": max(ref_ms)},
        "reference_over_default_gpu_ms": statistics.fmean(ref_ms) / statistics.fmean(fast_ms),
        "stop_reasons_default": stops, "methods_default": methods,
        "cold_copies": fast[ok[0]].extra.get("cold_copies", 0) if ok else 0,
        "median_rel_spread_default": statistics.median(fast[c].timing.rel_spread for c in both),
        "wall_s": {"default": round(fast_wall, 1), "reference": round(ref_wall, 1)},
        "sm_clock_mhz": {"default": clocks([fast[c] for c in both]), "reference": clocks([ref[c] for c in both])},
        "reference_plan": dataclasses.asdict(ref_plan),
        "configs_ms": [{"config": c.as_dict(), "default_ms": fast[c].timing.median_ms,
                        "reference_ms": ref[c].timing.median_ms, "default_timed_ms": fast[c].timing.timed_ms,
                        "stop": fast[c].timing.stop_reason, "method": fast[c].timing.method,
                        "default_sm_mhz": fast[c].telemetry.sm_clock_mhz,
                        "reference_sm_mhz": ref[c].telemetry.sm_clock_mhz} for c in both],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--families", default="", help="comma-separated (default: every registered family)")
    ap.add_argument("--problems", type=int, default=2, help="at most this many problems per family")
    ap.add_argument("--max-configs", type=int, default=400, help="a seeded sample of larger grids")
    ap.add_argument("--deadline-s", type=float, default=1e9, help="start no problem after this many seconds")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    start = time.monotonic()
    names = [n for n in (args.families.split(",") if args.families else family_names()) if n and n not in SKIP]
    todo = [(n, get_family(n).parse_problem(p)) for n in names for p in problems_for(n)[: args.problems]]
    skipped = [n for n in names if not problems_for(n)]
    grids = {(n, p): grid(n, p, args.max_configs, args.seed) for n, p in todo}

    import torch
    import triton

    from tilepilot.kernels import telemetry
    from tilepilot.kernels.ceilings import measure_ceilings
    from tilepilot.kernels.evaluate import Evaluator

    ev = Evaluator("gpu", seed=args.seed)
    compiled = compile_ahead([(n, p, c) for (n, p), (cs, _) in grids.items() for c in cs], ev.target(),
                             max(1, (os.cpu_count() or 2) - 2))
    log.info("compiled ahead: %s in %.0f s", compiled, time.monotonic() - start)
    ceilings = measure_ceilings()
    report: dict[str, Any] = {
        "what": "Kendall tau-b between the rankings of the default timing plan and a 10x longer reference plan "
                "over full config grids, top-1 agreement, and GPU ms per config",
        "command": " ".join(["python", "bench/timing_quality.py", *sys.argv[1:]]),
        "date": dt.date.today().isoformat(),
        "device": torch.cuda.get_device_name(0), "driver": telemetry.driver_version(),
        "torch": torch.__version__, "triton": triton.__version__,
        "default_plan": dataclasses.asdict(ev.plan),
        "ceilings": {"copy_gbps": ceilings.copy_gbps, "matmul_tflops": ceilings.matmul_tflops,
                     "details": ceilings.details},
        "compile_ahead": compiled, "families_without_a_problem": skipped, "problems": [], "not_run": [],
    }
    for name, problem in todo:
        if time.monotonic() - start > args.deadline_s:
            report["not_run"].append({"kernel": name, "problem": problem.as_dict(), "why": "deadline"})
            continue
        configs, size = grids[(name, problem)]
        try:
            row = quality(name, problem, configs, size, ev, ceilings, args.seed)
        except Exception as e:  # one family's failure is recorded; the others still run
            log.exception("%s %s failed", name, problem.label())
            report["not_run"].append({"kernel": name, "problem": problem.as_dict(), "why": f"{type(e).__name__}: {e}"})
            continue
        report["problems"].append(row)
        log.info("%s %s: tau %.3f, top-1 same %s, declared same %s (%.4f), default %.1f ms/config (ref %.1f), %s",
                 name, problem.label(), row["kendall_tau_b"], row["top1_same"], row["declared_same"],
                 row["declared_default_over_reference_interleaved"], row["gpu_ms_per_config_default"]["mean"],
                 row["gpu_ms_per_config_reference"]["mean"], row["stop_reasons_default"])
        report["summary"] = summary(report["problems"])
        report["wall_s"] = round(time.monotonic() - start, 1)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    report["summary"] = summary(report["problems"])
    report["wall_s"] = round(time.monotonic() - start, 1)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print_table(report["problems"])
    return 0


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    if not rows:
        return {}
    taus = [r["kendall_tau_b"] for r in rows]
    ms = [r["gpu_ms_per_config_default"]["mean"] for r in rows]
    return {"problems": len(rows), "min_tau": min(taus), "top1_same": sum(r["top1_same"] for r in rows),
            "declared_same": sum(r["declared_same"] for r in rows),
            "declared_same_or_not_worse": sum(r.get("declared_same_or_not_worse", r["declared_same"]) for r in rows),
            "worst_declared_default_over_reference": max(r["declared_default_over_reference_interleaved"]
                                                         for r in rows),
            "max_mean_gpu_ms_per_config": max(ms),
            "targets": f"tau >= {TAU_TARGET}, the same declared winner (or one the reference plan cannot tell "
                       f"apart from it, or faster), <= {MS_TARGET} GPU ms per config",
            "all_met": all(t >= TAU_TARGET for t in taus)
            and all(r.get("declared_same_or_not_worse", r["declared_same"]) for r in rows)
            and max(ms) <= MS_TARGET}


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'kernel':20} {'problem':32} {'n':>4} {'tau':>6} {'top1':>5} {'winner':>14} {'ms/cfg':>7} "
          f"{'ref ms':>7} stops")
    for r in rows:
        label = " ".join(f"{k}={v}" for k, v in r["problem"].items())
        won = "same" if r["declared_same"] else f"{r['declared_default_over_reference_interleaved'] - 1:+.2%}"
        print(f"{r['kernel']:20} {label:32} {r['ok_configs']:>4} {r['kendall_tau_b']:>6.3f} "
              f"{'same' if r['top1_same'] else 'diff':>5} {won:>14} {r['gpu_ms_per_config_default']['mean']:>7.2f} "
              f"{r['gpu_ms_per_config_reference']['mean']:>7.1f} {r['stop_reasons_default']}")


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
