"""On a GPU: does a campaign's store carry over to a nearby problem the tile model gets wrong?

Three real `tune` campaigns (Ray, the compile pool, the GPU worker) over the recorded 162-config
matmul grid (grouped kernel), with the `rules` constants of the fold that holds out both problems
whose operands load element by element (bench/results/rules-constants-4fold.json, fold 2: fitted
on neither):

1. `cold`: 3000x5000x1000 fp16, the default proposer (portfolio), 8 configs, an empty store;
2. `source`: 1500x1500x1500 fp16, `rules`, 32 configs, in a second store;
3. `warm`: 3000x5000x1000 fp16, portfolio, 8 configs, in that second store: the rules member
   corrects its model by the source problem's results (agents/rules.py), and warm start queues
   the source's winner first only where the corrected model predicts it no slower than its own
   first pick.

Then the two 3000x5000x1000 winners and the recorded grid's optimum there are re-measured
together, interleaved (`Evaluator.remeasure`, 3 times), and each winner's median ratio to the
recorded optimum is reported: the regret each campaign left, measured side by side.

    python bench/history_gpu.py --out $OUT/history-gpu-h100.json --work $OUT
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tilepilot.agents.tile_model import CONSTANTS_ENV, load_constants  # noqa: E402
from tilepilot.experiments import Config, Problem  # noqa: E402
from tilepilot.kernels.registry import get_family  # noqa: E402
from tilepilot.orchestrator.replay import ReplayDataset, load_dataset  # noqa: E402
from tilepilot.storage.queries import best, events, history, open_db  # noqa: E402

if TYPE_CHECKING:
    from tilepilot.kernels.evaluate import Evaluator

GRID = {"BLOCK_SIZE_M": [64, 128, 256], "BLOCK_SIZE_N": [64, 128, 256], "BLOCK_SIZE_K": [32, 64, 128],
        "GROUP_SIZE_M": [8], "num_warps": [4, 8], "num_stages": [3, 4, 5], "VARIANT": ["grouped"],
        "SPLIT_K": [1], "ALIGN_HINT": [False], "EPILOGUE_SUBTILE": [False], "WARP_SPECIALIZE": [False]}
TARGET = {"M": 3000, "N": 5000, "K": 1000, "dtype": "fp16"}
SOURCE = {"M": 1500, "N": 1500, "K": 1500, "dtype": "fp16"}
FOLD = 2  # the fold of rules-constants-4fold.json that holds out both problems


def campaign_text(name: str, proposer: str, budget: int, problem: dict) -> str:
    from bench_env import campaign_toml

    return campaign_toml(name, "matmul", proposer, budget, hypothesis_share=0, space=GRID, problems=[problem])


def run(work: Path, name: str, proposer: str, budget: int, problem: dict, db: Path, env: dict[str, str],
        backend: list[str]) -> None:
    toml = work / f"{name}.toml"
    toml.write_text(campaign_text(name, proposer, budget, problem))
    rc = subprocess.call([sys.executable, "-m", "tilepilot", "tune", str(toml), *backend, "--db", str(db)],
                         cwd=ROOT, env=env)
    if rc != 0:
        raise SystemExit(f"tune exited with {rc} ({name})")


def summary(db: Path, name: str) -> dict:
    with open_db(str(db)) as conn:
        [w] = best(conn, campaign=name)
        rows = sorted(history(conn, campaign=name), key=lambda r: r.seq or 0)
        notes = [e.message for e in events(conn, campaign_id=w.campaign_id, kinds=["proposer", "warm_start"],
                                           limit=100)]
    at = next((i for i, r in enumerate(rows, start=1) if r.config == w.config), None)
    return {"winner": w.config, "winner_ms": w.median_ms, "winner_trial": at, "notes": notes,
            "trials": [{"config": r.config, "median_ms": r.median_ms, "proposer": r.proposer,
                        "predicted_ms": r.predicted_ms, "rationale": r.rationale} for r in rows]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", required=True, help="a folder for the campaign files and stores")
    ap.add_argument("--dataset", default=str(ROOT / "data/replay/matmul-h100.jsonl.gz"))
    ap.add_argument("--replay", action="store_true",
                    help="run the campaigns on the recorded grid instead (a check of the script; no re-measurement)")
    args = ap.parse_args()
    backend = ["--backend", "replay", "--dataset", args.dataset] if args.replay else ["--backend", "gpu"]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    folds = json.loads((ROOT / "bench/results/rules-constants-4fold.json").read_text())["folds"]
    held = folds[FOLD]["held_out"]
    family = get_family("matmul")
    target, source = family.parse_problem(TARGET), family.parse_problem(SOURCE)
    if target.label() not in held or source.label() not in held:
        raise SystemExit(f"fold {FOLD} no longer holds out {target.label()} and {source.label()}")
    constants = work / "fold-constants.json"
    constants.write_text(json.dumps(folds[FOLD]["constants"]))
    load_constants(constants)
    env = {**os.environ, CONSTANTS_ENV: str(constants)}

    t0 = time.monotonic()
    run(work, "cold", "portfolio", 8, TARGET, work / "cold.db", env, backend)
    run(work, "source", "rules", 32, SOURCE, work / "store.db", env, backend)
    run(work, "warm", "portfolio", 8, TARGET, work / "store.db", env, backend)
    wall_s = time.monotonic() - t0
    report = {"cold": summary(work / "cold.db", "cold"), "source": summary(work / "store.db", "source"),
              "warm": summary(work / "store.db", "warm")}
    report["source"].pop("trials")
    dataset = load_dataset(args.dataset, family)
    if args.replay:
        Path(args.out).write_text(json.dumps({"replay": args.dataset, **report}, indent=1, default=str) + "\n")
        return 0

    ev, optimum = remeasure_winners(report, dataset, target)
    result = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "command": " ".join(["python", "bench/history_gpu.py", *sys.argv[1:]]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **ev.environment().as_dict(),
        "rules_constants": f"rules-constants-4fold.json fold {FOLD} (held out: {', '.join(held)})",
        "recorded_optimum": {"config": optimum.as_dict(), "recorded_ms": dataset.optimum_ms(target)},
        "wall_s": round(wall_s, 1), **report,
    }
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


def remeasure_winners(report: dict, dataset: ReplayDataset, target: Problem) -> tuple[Evaluator, Config]:
    """The cold and warm campaigns' winners and the recorded grid's optimum re-measured together on
    this GPU, interleaved, 3 times: each winner's ratios to the optimum, the median's regret and the
    regret the recorded grid gives it, added to its entry of `report`. The evaluator and the optimum."""
    from tilepilot.kernels.evaluate import Evaluator

    space = dataset.space(get_family("matmul"), target)
    optimum = dataset.optimum(target)
    arms = {"cold": space.parse(report["cold"]["winner"]), "warm": space.parse(report["warm"]["winner"])}
    ev = Evaluator("gpu", spread_target=0.01, time_cap_ms=100.0)
    configs = [optimum, *dict.fromkeys(arms.values())]
    ratios: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(3):
        got = dict(zip(configs, ev.remeasure("matmul", target, configs), strict=True))
        base = got[optimum].median_ms
        for k, c in arms.items():
            ms = got[c].median_ms
            if base and ms:
                ratios[k].append(round(ms / base, 5))
    for k in arms:
        report[k]["winner_over_recorded_optimum_remeasured"] = ratios[k]
        report[k]["regret_remeasured"] = round(statistics.median(ratios[k]) - 1, 5) if ratios[k] else None
        recorded = dataset.result(target, arms[k]).median_ms
        report[k]["regret_vs_recorded_grid"] = (round(recorded / (dataset.optimum_ms(target) or math.inf) - 1, 5)
                                                if recorded else None)
        print(f"{k}: winner {report[k]['winner']} regret re-measured {report[k]['regret_remeasured']}, "
              f"by the recorded grid {report[k]['regret_vs_recorded_grid']}", flush=True)
    return ev, optimum


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
