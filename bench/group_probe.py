"""Does the tile order (GROUP_SIZE_M) of the tuned matmul configs matter, which the recorded grids fix at 8?

    python bench/group_probe.py --out bench/results/group-probe-h100.json [--problems all]

Every recorded grid holds GROUP_SIZE_M = 8 (`bench/record.py`'s `tile_config`): the tutorial's
order, which walks 8 tile-rows column by column so that the tiles running at once share A's and
B's tiles in L2. Where the operands are small and C is large (16384x16384x256: 16 MB read, 512 MB
written), or the tiles few, another order could matter more: 1 walks the tiles row by row along
N. For each matmul problem, the tuned config of the table's run (`bench/results/kernels-all-h100.json`)
is timed with GROUP_SIZE_M 1, 4, 8 and 16 beside cuBLAS, side by side, by the timer and plan of
bench/kernels.py (L2 cold); each arm is checked against the reference first.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

GROUPS = (1, 4, 8, 16)
TABLE = ROOT / "bench" / "results" / "kernels-all-h100.json"


def tuned_configs() -> dict[str, dict[str, Any]]:
    """Problem label -> the tuned config of the table's run."""
    rows = json.loads(TABLE.read_text())["rows"]
    return {r["label"]: r["arms"]["tuned"]["config"] for r in rows if r["kernel"] == "matmul"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--problems", default="all", help="as bench/record.py takes them")
    args = ap.parse_args(argv)

    from kernels import Arms, gpu_probe, write_probe
    from record import problems_for

    tuned = tuned_configs()
    fam, ev, target, timer = gpu_probe("matmul")
    rows = []
    for problem in problems_for("matmul", args.problems):
        config = tuned.get(problem.label())
        if config is None:
            continue
        arms = Arms(fam, problem, target)
        arms.baseline("cublas")
        for g in GROUPS:
            arms.config(f"group-{g}", fam.space().parse({**config, "GROUP_SIZE_M": g}))
        row = {"problem": problem.label(), "config": config,
               "arms": arms.medians(arms.time(timer, fam.l2_flush))}
        rows.append(row)
        base = row["arms"].get("group-8", {}).get("median_ms")
        print(problem.label(), {a: v.get("median_ms") or v.get("error") for a, v in row["arms"].items()},
              {a: round(base / v["median_ms"], 3) for a, v in row["arms"].items()
               if a.startswith("group") and base and v.get("median_ms")}, flush=True)
    write_probe(args.out, __doc__, "group_probe.py", argv, ev, rows)
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
