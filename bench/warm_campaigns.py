"""Warm start through whole campaigns on recorded data, with the store's learnings and without them.

`bench/search.py --arm history` measures the warm start in process: its store holds results only.
A user's store holds what earlier campaigns left: results, and the hypotheses the miner stated
and the ledger decided, validated ones as learnings, which the `rules` proposer reads as priors
(agents/rules.py, "Learnings"). This runs it as a user would, with `tilepilot tune --backend replay`:

1. the store: one `rules` campaign of `--store-budget` (32) configs a problem over each `--store`
   grid, cold, into one SQLite store (the campaigns leave their hypotheses and learnings there);
2. for each problem of `--dataset`, alone in a campaign of `--budget` (8) configs, in a copy of
   that store: `cold` (`tune --cold`: the store is not read), `warm` (the store as it is: its
   results correct the model, its winners go first, its learnings in scope are priors), and
   `warm-no-learnings` (the same store with its learnings deleted).

Each campaign is scored by what it measured, in order: configs until one is within 2% of the
grid's recorded optimum (inf where none of its configs is), and the best one's regret.

    python bench/warm_campaigns.py --dataset data/replay/matmul-h200-fresh5.jsonl.gz \\
        --store data/replay/matmul-h100.jsonl.gz,... --out bench/results/warm-campaigns-h200-fresh5.json

Deterministic: no seeds (the campaigns' seed is 0).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_env import campaign_toml, git, machine  # noqa: E402
from campaign_replay import recorded_space, tune  # noqa: E402

from tilepilot.experiments import InputError, Problem, Status  # noqa: E402
from tilepilot.kernels.registry import get_family  # noqa: E402
from tilepilot.orchestrator.replay import ReplayDataset, load_dataset  # noqa: E402
from tilepilot.storage.queries import history, open_db  # noqa: E402

KERNEL = "matmul"
TOLERANCE = 0.02
ARMS = ("cold", "warm", "warm-no-learnings")


def build_store(db: Path, grids: list[str], budget: int, work: Path) -> dict[str, int]:
    """One cold `rules` campaign over each grid into `db`; what the store then holds."""
    family = get_family(KERNEL)
    for path in grids:
        grid = load_dataset(path, family)
        name = "store-" + Path(path).name.split(".")[0]
        toml = work / f"{name}.toml"
        toml.write_text(campaign_toml(name, KERNEL, "rules", budget, space=recorded_space(grid),
                                      problems=[p.as_dict() for p in grid.problems]))
        tune(toml, path, db, "--cold")
    with sqlite3.connect(db) as conn:
        count = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # the three fixed names
                 for t in ("trials", "hypotheses", "learnings")}
        texts = [r[0] for r in conn.execute("SELECT text FROM learnings ORDER BY id")]
    return {**count, "learning_texts": texts}  # type: ignore[dict-item]


def score(dataset: ReplayDataset, problem: Problem, db: Path, campaign: str) -> dict[str, Any]:
    """Configs until one is within TOLERANCE of the grid optimum, the best regret, the configs measured."""
    family = get_family(KERNEL)
    space = dataset.space(family, problem)
    optimum = dataset.optimum_ms(problem)
    assert optimum
    with open_db(str(db)) as conn:
        rows = sorted(history(conn, campaign=campaign, limit=10_000), key=lambda h: h.seq or 0)
    times = [dataset.result(problem, space.parse(dict(h.config))).median_ms for h in rows if h.status is Status.OK]
    ran = [t for t in times if t is not None]
    reach = next((float(i) for i, t in enumerate(times, 1) if t is not None and t <= optimum * (1 + TOLERANCE)),
                 math.inf)
    return {"to_2pct": reach, "regret": round(min(ran) / optimum - 1, 5) if ran else None,
            "configs": [h.config_key for h in rows]}


def summary(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    regrets = [r["regret"] for r in rows.values() if r["regret"] is not None]
    reach = [r["to_2pct"] for r in rows.values()]
    return {"problems": len(rows), "within_2pct": sum(r <= TOLERANCE for r in regrets),
            "mean_regret": round(statistics.mean(regrets), 5) if regrets else None,
            "worst_regret": max(regrets) if regrets else None,
            "to_2pct_median": statistics.median(reach),
            "to_2pct_reached_within_budget": sum(math.isfinite(r) for r in reach)}


def run(dataset_path: str, grids: list[str], budget: int, store_budget: int) -> dict[str, Any]:
    family = get_family(KERNEL)
    dataset = load_dataset(dataset_path, family)
    space = recorded_space(dataset)
    per_arm: dict[str, dict[str, dict[str, Any]]] = {arm: {} for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = work / "store.db"
        held = build_store(store, grids, store_budget, work)
        for i, problem in enumerate(dataset.problems):
            for arm in ARMS:
                db = work / f"{arm}-{i}.db"
                shutil.copy(store, db)
                if arm == "warm-no-learnings":
                    with sqlite3.connect(db) as conn:
                        conn.execute("DELETE FROM learnings")
                name = f"{arm}-{i}"
                toml = work / f"{name}.toml"
                toml.write_text(campaign_toml(name, KERNEL, "rules", budget, space=space,
                                              problems=[problem.as_dict()]))
                tune(toml, dataset_path, db, *(["--cold"] if arm == "cold" else []))
                per_arm[arm][problem.label()] = score(dataset, problem, db, name)
    return {"store": held, "arms": {arm: {"summary": summary(rows), "per_problem": rows}
                                    for arm, rows in per_arm.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", required=True, help="the grid whose problems are tuned")
    ap.add_argument("--store", required=True, help="the grids the store's campaigns ran on, comma-separated")
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--store-budget", type=int, default=32)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    for flag, value in (("--budget", args.budget), ("--store-budget", args.store_budget)):
        if value < 1:
            raise InputError(f"{flag} {value}: must be at least 1")
    paths = [args.dataset, *(p for p in args.store.split(",") if p)]
    found_at: list[str] = []  # each path as a file here or in the repository
    for path in paths:
        at = Path(path) if Path(path).exists() else ROOT / path
        if not at.exists():
            raise InputError(f"{path}: no such file")
        found_at.append(str(at.resolve()))
    if found_at[0] in found_at[1:]:
        raise InputError(f"--store holds --dataset {args.dataset}: the store is to hold other grids only")
    if args.out is not None and not args.out.parent.is_dir():
        raise InputError(f"--out {args.out}: folder {args.out.parent} does not exist")
    t0 = time.monotonic()
    found = run(found_at[0], found_at[1:], args.budget, args.store_budget)
    for arm, r in found["arms"].items():
        s = r["summary"]
        print(f"{arm:18s} within 2% {s['within_2pct']}/{s['problems']}, mean regret {100 * s['mean_regret']:.2f}%, "
              f"worst {100 * s['worst_regret']:.2f}%, configs to 2% (median) {s['to_2pct_median']:g}")
    report = {"what": "warm start through whole campaigns (tune --backend replay), each problem alone: cold, warm, "
                      "and warm with the store's learnings deleted; scored by the recorded grid",
              "command": " ".join(["python", "bench/warm_campaigns.py", *(argv if argv is not None else sys.argv[1:])]),
              "date": dt.date.today().isoformat(), "commit": git("rev-parse", "--short", "HEAD"),
              "machine": machine(), "dataset": args.dataset, "store_grids": paths[1:], "budget": args.budget,
              "store_budget": args.store_budget, "tolerance": TOLERANCE, **found,
              "wall_s": round(time.monotonic() - t0, 1)}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
