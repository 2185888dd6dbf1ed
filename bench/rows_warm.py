"""Warm start against cold on the row-wise families' recorded grids (and flash attention's, `--families
attention`), through whole replay campaigns.

For each family and each problem P of `data/replay/FAMILY-SET.jsonl.gz`: a cold campaign of the
default proposer over the grid's other problems fills a store; then two campaigns of P alone, each
`--budget` configs and each on its own copy of that store: one warm (the store's winners of nearby
problems queued first, as a user's next campaign starts) and one `--cold`. Reported: each
campaign's winner over the grid's optimum (recorded times), and the problems within 2% either way.

    python bench/rows_warm.py --set h200-fresh --out bench/results/rows-warm-h200-fresh.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_env import campaign_toml, run_main  # noqa: E402
from campaign_replay import tune  # noqa: E402
from rows_gpu_campaign import row_arguments, row_grids  # noqa: E402

from tilepilot.experiments import InputError  # noqa: E402
from tilepilot.kernels.registry import get_family  # noqa: E402
from tilepilot.orchestrator.replay import load_dataset  # noqa: E402
from tilepilot.storage.queries import best, open_db  # noqa: E402

TOLERANCE = 0.02


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    row_arguments(ap)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    paths = row_grids(args)
    if not Path(args.out).parent.is_dir():
        raise InputError(f"folder {Path(args.out).parent} does not exist")
    t0 = time.monotonic()
    report: dict[str, object] = {
        "what": f"warm against cold: per problem of each {args.set} grid, a store of a cold {args.proposer} campaign "
                f"over the grid's other problems, then a warm and a --cold campaign of the problem alone, "
                f"{args.budget} configs each; regret of each winner by the recorded times",
        "command": " ".join(["python", "bench/rows_warm.py", *sys.argv[1:]]),
        "date": dt.date.today().isoformat(), "families": {}}
    for family, path in paths.items():
        dataset = load_dataset(path, get_family(family))
        rows = {}
        for p in dataset.problems:
            optimum = dataset.optimum_ms(p)
            assert optimum is not None
            with tempfile.TemporaryDirectory() as tmp:
                db = Path(tmp) / "store.db"
                toml = Path(tmp) / "store.toml"
                others = [q.as_dict() for q in dataset.problems if q != p]
                toml.write_text(campaign_toml("store", family, args.proposer, args.budget, problems=others))
                tune(toml, str(path), db, "--cold")
                regret = {}
                for arm, flags in (("warm", ()), ("cold", ("--cold",))):
                    # each arm in its own copy of the store: a campaign reuses the results of P it finds
                    # there (free of its budget), so the second arm would start from the first's
                    arm_db = Path(tmp) / f"{arm}.db"
                    shutil.copyfile(db, arm_db)
                    toml = Path(tmp) / f"{arm}.toml"
                    toml.write_text(campaign_toml(arm, family, args.proposer, args.budget, problems=[p.as_dict()]))
                    tune(toml, str(path), arm_db, *flags)
                    with open_db(str(arm_db)) as conn:
                        regret[arm] = round(best(conn, campaign=arm)[0].median_ms / optimum - 1, 5)
            rows[p.label()] = regret
            print(f"{family} {p.label()}: {regret}", flush=True)
        report["families"][family] = {  # type: ignore[index]
            "dataset": str(path.relative_to(ROOT)),
            **{f"{arm}_within_2pct": sum(r[arm] <= TOLERANCE for r in rows.values()) for arm in ("warm", "cold")},
            **{f"{arm}_mean_regret": round(sum(r[arm] for r in rows.values()) / len(rows), 5)
               for arm in ("warm", "cold")},
            "per_problem": rows}
    report["wall_s"] = round(time.monotonic() - t0, 1)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
