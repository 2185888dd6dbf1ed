"""How far apart two recordings of the same matmul problems read: run to run in one order of the
timer's rounds, and between the orders.

For each pair of datasets (JSON Lines, gzipped or not, as bench/record.py writes them) and each
problem both hold: the configs timed in full (stop reason not "outclassed") within 20% of the
first dataset's best, the median and largest |log(time_b / time_a)| over them, and whether the
two agree on the best config (if not, how far the first one's best is from the second's in the
second). And whether the second recording moves some tile shapes against the others
(`shape_shift`): for each BLOCK_SIZE_M x BLOCK_SIZE_N x num_warps, the mean over the configs
both timed in full of log(time_b / time_a) less its problem's median, so that a level shift of
the whole problem (another clock, another day) cancels; noise averages out, an order or method
that favours a shape does not. The pairs are named NAME=A,B. With `--pool`, also the shape shift
over every pair's problems together ("pooled"; each problem's level still cancels on its own), and
in `tile_model.ORDER_MARK`'s form ("order_mark": (BLOCK_SIZE_M, BLOCK_SIZE_N, num_warps) -> shift,
rounded to 4 places) where the pairs are rotating recordings (A) against shuffled ones (B).

    python bench/order_compare.py --out bench/results/order-repeatability-h200.json \\
        rotating=bench/results/order-runs-h200/rotating-1.jsonl.gz,bench/results/order-runs-h200/rotating-2.jsonl.gz ...
"""
from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tilepilot.experiments.errors import InputError

NEAR_BEST = 1.2
Times = dict[str, dict[tuple[int, ...], float]]  # problem label -> config tile -> median ms
TILE = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def load(path: str) -> Times:
    """Problem label -> config tile -> median ms, for the configs timed in full."""
    opener = gzip.open if path.endswith(".gz") else open
    out: Times = {}
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                if row.get("status") != "ok" or row.get("stop_reason") == "outclassed" or (row.get("reps") or 0) < 6:
                    continue  # outclassed rows (recorded before stop reasons were) have 3 samples
                p = row["problem"]
                label = f"M={p['M']} N={p['N']} K={p['K']} {p['dtype']}"
                out.setdefault(label, {})[tuple(int(row["config"][k]) for k in TILE)] = float(row["median_ms"])
    except OSError as e:
        raise InputError(f"cannot read the dataset {path!r}: {e.strerror or e}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"{path!r} is not a dataset of bench/record.py (JSON Lines of matmul records): {e}") from None
    return out


def compare(a: Times, b: Times) -> dict[str, dict[str, Any]]:
    result = {}
    for label in sorted(set(a) & set(b)):
        ta, tb = a[label], b[label]
        best_a = min(ta.values())
        near = [c for c in ta if c in tb and ta[c] <= NEAR_BEST * best_a]
        diffs = [abs(math.log(tb[c] / ta[c])) for c in near]
        win_a, win_b = min(ta, key=ta.__getitem__), min(tb, key=tb.__getitem__)
        result[label] = {"near_best_configs": len(near), "median_abs_log_ratio": round(statistics.median(diffs), 4),
                         "max_abs_log_ratio": round(max(diffs), 4), "same_best": win_a == win_b,
                         "a_best_in_b_over_b_best": round(tb[win_a] / tb[win_b], 4) if win_a in tb else None}
    return result


def shape_shift(a: Times, b: Times) -> dict[str, dict[str, float]]:
    """Tile shape "BMxBN wW" -> the configs compared and the mean of log(time_b / time_a) less
    the problem's median (see the module docstring)."""
    shifts: dict[str, list[float]] = {}
    for label in sorted(set(a) & set(b)):
        common = [c for c in a[label] if c in b[label]]
        if len(common) < 2:
            continue
        logs = [math.log(b[label][c] / a[label][c]) for c in common]
        level = statistics.median(logs)
        for c, x in zip(common, logs, strict=True):
            shape = dict(zip(TILE, c, strict=True))
            key = f"{shape['BLOCK_SIZE_M']}x{shape['BLOCK_SIZE_N']} w{shape['num_warps']}"
            shifts.setdefault(key, []).append(x - level)
    return {shape: {"configs": len(xs), "mean_log_shift": round(statistics.fmean(xs), 4)}
            for shape, xs in sorted(shifts.items())}


def pooled(pairs: dict[str, tuple[Times, Times]]) -> dict[str, Any]:
    """The shape shift over the problems of every pair together (labels kept apart by pair name),
    and the same in `tile_model.ORDER_MARK`'s form."""
    a_all: Times = {}
    b_all: Times = {}
    for name, (a, b) in pairs.items():
        a_all.update({f"{name}/{label}": t for label, t in a.items()})
        b_all.update({f"{name}/{label}": t for label, t in b.items()})
    shift = shape_shift(a_all, b_all)
    mark = {}
    for shape, r in shift.items():
        bm_bn, warps = shape.split(" w")
        bm, bn = bm_bn.split("x")
        mark[f"{bm},{bn},{warps}"] = round(r["mean_log_shift"], 4)
    return {"pairs": sorted(pairs), "problems": len(set(a_all) & set(b_all)), "shape_shift": shift, "order_mark": mark}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("pairs", nargs="+", help="NAME=A,B: two datasets of the same problems")
    ap.add_argument("--pool", action="store_true", help="also the shape shift over every pair's problems together")
    args = ap.parse_args(argv)
    out: dict[str, Any] = {"command": " ".join(["python", "bench/order_compare.py", *sys.argv[1:]]),
                           "date": dt.date.today().isoformat(), "near_best": NEAR_BEST, "pairs": {}}
    loaded: dict[str, tuple[Times, Times]] = {}
    for spec in args.pairs:
        name, _, files = spec.partition("=")
        paths = files.split(",")
        if not name or len(paths) != 2:
            raise InputError(f"bad pair {spec!r}: give NAME=A,B (two datasets)")
        if name in loaded:
            raise InputError(f"pair name {name!r} given twice: name each pair once")
        a, b = loaded[name] = load(paths[0]), load(paths[1])
        out["pairs"][name] = {"a": paths[0], "b": paths[1], "problems": compare(a, b), "shape_shift": shape_shift(a, b)}
        for label, r in out["pairs"][name]["problems"].items():
            print(f"{name:34s} {label:28s} median {r['median_abs_log_ratio']:.3f} max {r['max_abs_log_ratio']:.3f} "
                  f"{'same best' if r['same_best'] else 'best differs: ' + str(r['a_best_in_b_over_b_best'])}")
        for shape, r in out["pairs"][name]["shape_shift"].items():
            print(f"{name:34s} {shape:28s} {r['configs']:4d} configs, mean shift {r['mean_log_shift']:+.3f}")
    if args.pool:
        out["pooled"] = pooled(loaded)
        print(f"pooled over {out['pooled']['problems']} problems: order_mark {out['pooled']['order_mark']}")
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
