"""On a GPU: re-tuning problems the store already holds, through real `tune` campaigns.

Three campaigns (Ray, the compile pool, the GPU worker) over the recorded 162-config matmul grid on
two problems of the H200 grid, in one store, each of 8 configs a problem:

1. `earlier`: Optuna's TPE (seed 0);
2. `again`: `rules`, as a campaign starts by default (warm start: the earlier winner first where the
   model predicts it no slower than its own first pick); the store's results it proposes are reused;
3. `twice`: `rules` with `--cold`: it proposes `again`'s picks first, all reused, then measures.

Reported per campaign and problem: the configs it measured and those it reused (a reused result is
free of the budget, so each campaign measures 8), its best time and winner, and the recorded grid's
optimum for scale. `--replay` runs the same on the recorded grid (a check of the script on a CPU).

    python bench/retune_gpu.py --out $OUT/retune-gpu-h200.json --work $OUT
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_env import campaign_toml, run_main  # noqa: E402
from history_gpu import GRID  # noqa: E402

from tilepilot.experiments import InputError, Status  # noqa: E402
from tilepilot.kernels.registry import get_family  # noqa: E402
from tilepilot.orchestrator.replay import load_dataset  # noqa: E402
from tilepilot.storage.queries import history, open_db  # noqa: E402

PROBLEMS = [{"M": 8192, "N": 4096, "K": 14336, "dtype": "bf16"}, {"M": 2048, "N": 3584, "K": 3584, "dtype": "fp16"}]
DATASET = ROOT / "data/replay/matmul-h200.jsonl.gz"
BUDGET = 8
CAMPAIGNS = (("earlier", "optuna", []), ("again", "rules", []), ("twice", "rules", ["--cold"]))


def per_problem(db: Path, name: str) -> dict[str, dict]:
    """For each problem of the campaign: configs measured and reused, the best time and its config."""
    with open_db(str(db)) as conn:
        rows = sorted(history(conn, campaign=name), key=lambda r: r.trial_id or 0)
    out: dict[str, dict] = {}
    for r in rows:
        label = get_family("matmul").parse_problem(r.problem).label()
        entry = out.setdefault(label, {"measured": 0, "reused": 0, "invalid": 0, "best_ms": None, "winner": None})
        if r.status is Status.INVALID:
            entry["invalid"] += 1
        else:
            entry["reused" if r.reused else "measured"] += 1
        if r.median_ms is not None and (entry["best_ms"] is None or r.median_ms < entry["best_ms"]):
            entry["best_ms"], entry["winner"] = r.median_ms, r.config
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", required=True, help="a folder for the campaign files and the store")
    ap.add_argument("--replay", action="store_true", help="run the campaigns on the recorded grid instead")
    args = ap.parse_args()
    work = Path(args.work)
    if not work.is_dir():
        raise InputError(f"--work {args.work}: no such folder")
    if not Path(args.out).parent.is_dir():
        raise InputError(f"--out {args.out}: its folder does not exist")
    backend = ["--backend", "replay", "--dataset", str(DATASET)] if args.replay else ["--backend", "gpu"]
    db = work / "retune.db"
    db.unlink(missing_ok=True)
    t0 = time.monotonic()
    for name, proposer, flags in CAMPAIGNS:
        toml = work / f"{name}.toml"
        toml.write_text(campaign_toml(name, "matmul", proposer, BUDGET, hypothesis_share=0, space=GRID,
                                      problems=PROBLEMS))
        rc = subprocess.call([sys.executable, "-m", "tilepilot", "tune", str(toml), *backend, "--db", str(db),
                              *flags], cwd=ROOT, env=dict(os.environ))
        if rc != 0:
            raise SystemExit(f"tune exited with {rc} ({name})")
    wall_s = time.monotonic() - t0
    with open_db(str(db)) as conn:
        env = conn.rows("SELECT device, driver, torch, triton, backend FROM experiments LIMIT 1")[0]
    dataset = load_dataset(DATASET, get_family("matmul"))
    optimum = {q.label(): dataset.optimum_ms(q) for q in dataset.problems}
    result = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "method": __doc__.split("\n\n")[1].replace("\n", " ") + " " + __doc__.split("\n\n")[2].replace("\n", " "),
        "command": " ".join(["python", "bench/retune_gpu.py", *sys.argv[1:]]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), **dict(env),
        "budget": BUDGET, "wall_s": round(wall_s, 1),
        "recorded_optimum_ms": {label: optimum[label] for label in per_problem(db, "earlier")},
        "campaigns": {name: per_problem(db, name) for name, _, _ in CAMPAIGNS},
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for name, problems in result["campaigns"].items():
        for label, e in problems.items():
            print(f"{name:8s} {label:28s} measured {e['measured']} reused {e['reused']} best {e['best_ms']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
