"""Whole campaigns on recorded data: `tilepilot tune --backend replay`, scored against the grid.

`bench/search.py` drives one problem at a time through a loop of its own (4 configs proposed,
answered, 4 more). A user's campaign is the driver: several problems at once, a queue, batches
handed out as the executor has room, each proposer as far ahead of its results as the driver
lets it. This runs that, unchanged, on the replay backend, cold (`tune --cold`), and scores
each problem's declared winner by its recorded time over the grid optimum.

    python bench/campaign_replay.py --out bench/results/campaign-replay-h100.json \\
        [--dataset data/replay/matmul-h100.jsonl.gz --dataset ...] [--protocol auto|folds|shipped] \\
        [--proposers rules,portfolio] [--budget 8]

The default datasets: the H100 grid, the fresh H100 grid and the H200 grid. `--protocol auto`:
folds for the H100 grid, shipped for the others. `folds`: the problems are dealt into the 4 folds of
`bench/results/rules-constants-4fold.json` and each fold is one campaign, run with the
constants fitted without it, as `bench/gpu_campaign.py` runs them on the GPU. `shipped`: one
campaign of every problem with the shipped constants (the grids never fitted on). The space is
each problem's recorded grid (as in `bench/search.py`). Deterministic: no seeds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_env import campaign_toml, git  # noqa: E402
from fit_rules import NEUTRAL  # noqa: E402

from tilepilot.agents.tile_model import CONSTANTS_ENV  # noqa: E402
from tilepilot.experiments import Problem  # noqa: E402
from tilepilot.kernels.registry import get_family  # noqa: E402
from tilepilot.orchestrator.replay import ReplayDataset, load_dataset  # noqa: E402
from tilepilot.storage.queries import best, open_db  # noqa: E402

FOLDS = ROOT / "bench/results/rules-constants-4fold.json"
FOLDS_DATASET = "matmul-h100.jsonl.gz"  # the grid the folds deal
DATASETS = ("data/replay/matmul-h100.jsonl.gz", "data/replay/matmul-h100-fresh.jsonl.gz",
            "data/replay/matmul-h200.jsonl.gz")
TOLERANCE = 0.02


def recorded_space(dataset: ReplayDataset) -> dict[str, list[object]]:
    """Every value each parameter takes in the dataset (the grid)."""
    values: dict[str, set[object]] = {}
    for p in dataset.problems:
        for config in dataset.records(p):
            for k, v in config.items():
                values.setdefault(k, set()).add(v)
    return {k: sorted(v, key=lambda x: (str(type(x)), x)) for k, v in values.items()}  # type: ignore[arg-type]


def campaigns(dataset: ReplayDataset, protocol: str) -> list[tuple[list[Problem], dict[str, float] | None]]:
    if protocol == "shipped":
        return [(list(dataset.problems), None)]
    folds = json.loads(FOLDS.read_text())["folds"]
    out = []
    for fold in folds:
        held = [p for p in dataset.problems if p.label() in fold["held_out"]]
        if held:
            out.append((held, fold["constants"]))
    if sum(len(h) for h, _ in out) != len(dataset.problems):
        raise SystemExit(f"{FOLDS.name} does not deal every problem of {dataset.path.name} into a fold")
    return out


def tune(toml: Path, dataset: str, db: Path, *flags: str, env: dict[str, str] | None = None) -> None:
    """`tilepilot tune TOML --backend replay --dataset DATASET --db DB FLAGS`; a failure ends the run
    with its exit code and the tail of its stderr."""
    cmd = [sys.executable, "-m", "tilepilot", "tune", str(toml), "--backend", "replay", "--dataset", dataset,
           "--db", str(db), *flags]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"tune exited with {done.returncode}: {done.stderr.strip()[-500:]}")


def run(dataset_path: str, protocol: str, proposer: str, budget: int) -> dict[str, object]:
    family = get_family("matmul")
    dataset = load_dataset(dataset_path, family)
    space = recorded_space(dataset)
    regret: dict[str, float] = {}
    winners: dict[str, str] = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "campaign.db"
        for i, (problems, constants) in enumerate(campaigns(dataset, protocol)):
            name = f"{proposer}-{i}"
            toml = Path(tmp) / f"{name}.toml"
            toml.write_text(campaign_toml(name, "matmul", proposer, budget, space=space,
                                            problems=[p.as_dict() for p in problems]))
            env = dict(os.environ)
            if constants is not None:
                path = Path(tmp) / f"{name}.constants.json"
                path.write_text(json.dumps({**constants, "order_mark": NEUTRAL.order_mark}))  # fitted: a fit's mark
                env[CONSTANTS_ENV] = str(path)
            tune(toml, dataset_path, db, "--cold", env=env)
            with open_db(str(db)) as conn:
                for w in best(conn, campaign=name):
                    problem = next(p for p in problems if p.key() == w.problem_key)
                    config = dataset.space(family, problem).parse(dict(w.config))
                    recorded = dataset.result(problem, config).median_ms
                    optimum = dataset.optimum_ms(problem)
                    assert recorded is not None and optimum
                    regret[problem.label()] = recorded / optimum - 1
                    winners[problem.label()] = config.label()
    values = list(regret.values())
    return {"proposer": proposer, "problems": len(values),
            "within_2pct": sum(r <= TOLERANCE for r in values),
            "mean_regret": sum(values) / len(values), "worst_regret": max(values),
            "wall_s": round(time.monotonic() - t0, 1),
            "per_problem": {k: {"regret": round(v, 5), "winner": winners[k]} for k, v in sorted(regret.items())}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", action="append", help="repeat for several (default: the three matmul grids)")
    ap.add_argument("--protocol", choices=("auto", "folds", "shipped"), default="auto")
    ap.add_argument("--note", default="", help="stored with the result (say, what differs from the commit)")
    ap.add_argument("--proposers", default="rules,portfolio")
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.budget < 1:
        ap.error(f"--budget {args.budget}: must be at least 1")
    grids = []
    for path in args.dataset or DATASETS:
        found = Path(path) if Path(path).exists() else ROOT / path
        if not found.exists():
            ap.error(f"--dataset {path}: no such file")
        path = str(found.resolve())
        protocol = args.protocol if args.protocol != "auto" else ("folds" if Path(path).name == FOLDS_DATASET
                                                                  else "shipped")
        rows = []
        for proposer in args.proposers.split(","):
            row = run(path, protocol, proposer, args.budget)
            rows.append(row)
            worst = max(row["per_problem"].items(), key=lambda kv: kv[1]["regret"])  # type: ignore[union-attr]
            print(f"{Path(path).name:28s} {protocol:7s} {proposer:10s} {row['within_2pct']}/{row['problems']} "
                  f"within 2%, mean regret {100 * row['mean_regret']:.2f}%, worst {100 * row['worst_regret']:.2f}% "
                  f"({worst[0]})", flush=True)
        grids.append({"dataset": Path(path).name, "protocol": protocol, "proposers": rows})
    commit = git("rev-parse", "--short", "HEAD")
    report = {"what": "whole campaigns (tune --backend replay --cold), winners scored by recorded time / grid optimum",
              "command": " ".join(["python", "bench/campaign_replay.py", *(argv or sys.argv[1:])]),
              "date": dt.date.today().isoformat(), "commit": commit, "note": args.note, "budget": args.budget,
              "grids": grids}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
