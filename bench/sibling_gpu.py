"""On a GPU: do a sibling device's results correct the model for this one's problem?

`rules` corrects its tile model by the store's nearest problem whose operands load the same way,
measured on the campaign's device or on a sibling (agents/rules.py, `roofline.SIBLINGS`: the H100
SXM and the H200). The H100 grid and the H200 grid each hold one problem whose B operand loads
element by element: 1000x3000x2000 bf16 on the H100 (data/replay/matmul-h100.jsonl.gz) and
512x32001x4096 bf16 on the H200 (data/replay/matmul-h200.jsonl.gz). With no other problem of that
regime in the store, a campaign on one of them can be corrected only by the other device's
results. On the GPU this runs on, with the other device's problem as the source:

1. `cold`: this device's problem, the default proposer (portfolio), 8 configs, an empty store;
2. `source`: the other device's problem, `rules`, 32 configs, replayed from that device's recorded
   grid into a second store (its results carry that device's name, as in a store that holds
   campaigns run there);
3. `warm`: this device's problem, portfolio, 8 configs, in that second store.

Then the two winners and the recorded grid's optimum are re-measured together on this GPU
(`history_gpu.remeasure_winners`). The `rules` constants: on the H200 the shipped ones (fitted on
the H100 grid, on no H200 problem); on the H100 those of the fold of rules-constants-4fold.json that
holds out 1000x3000x2000.

    python bench/sibling_gpu.py --out $OUT/sibling-gpu.json --work $OUT
    python bench/sibling_gpu.py --replay --device "NVIDIA H200" --out /tmp/s.json --work /tmp/s
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from history_gpu import remeasure_winners, run, summary  # noqa: E402

from tilepilot.agents.roofline import sibling_group  # noqa: E402
from tilepilot.agents.tile_model import CONSTANTS_ENV, load_constants  # noqa: E402
from tilepilot.experiments import InputError  # noqa: E402
from tilepilot.kernels.registry import get_family  # noqa: E402
from tilepilot.orchestrator.replay import load_dataset  # noqa: E402

H100 = {"problem": {"M": 1000, "N": 3000, "K": 2000, "dtype": "bf16"},
        "dataset": ROOT / "data/replay/matmul-h100.jsonl.gz"}
H200 = {"problem": {"M": 512, "N": 32001, "K": 4096, "dtype": "bf16"},
        "dataset": ROOT / "data/replay/matmul-h200.jsonl.gz"}


def sides(device: str) -> tuple[dict, dict]:
    """(this device's side, the sibling's) for a device name, as NVML reports it."""
    if sibling_group(device) is None:
        raise InputError(f"--device {device!r} has no sibling recorded here; this runs on an H100 SXM or an H200")
    return (H200, H100) if "H200" in device else (H100, H200)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", required=True, help="a folder for the campaign files and stores")
    ap.add_argument("--device", help="the device this runs on (default: the GPU's name)")
    ap.add_argument("--replay", action="store_true",
                    help="run this device's campaigns on its recorded grid instead (a check of the script; "
                         "no re-measurement; needs --device)")
    args = ap.parse_args()
    if args.device is None:
        if args.replay:
            raise InputError("--replay needs --device (which device's side to play)")
        import torch

        if not torch.cuda.is_available():
            raise InputError("no CUDA GPU here: run on an H100 SXM or an H200, or use --replay --device NAME")
        args.device = torch.cuda.get_device_name()
    mine, theirs = sides(args.device)
    family = get_family("matmul")
    target = family.parse_problem(mine["problem"])
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != CONSTANTS_ENV}
    constants_note = "shipped (tile_model.DEFAULT_CONSTANTS)"
    if mine is H100:
        folds = json.loads((ROOT / "bench/results/rules-constants-4fold.json").read_text())["folds"]
        fold = next(f for f in folds if target.label() in f["held_out"])
        path = work / "fold-constants.json"
        path.write_text(json.dumps(fold["constants"]))
        load_constants(path)
        env[CONSTANTS_ENV] = str(path)
        constants_note = f"rules-constants-4fold.json fold {fold['fold']} (held out: {', '.join(fold['held_out'])})"
    here = ["--backend", "replay", "--dataset", str(mine["dataset"])] if args.replay else ["--backend", "gpu"]
    there = ["--backend", "replay", "--dataset", str(theirs["dataset"])]

    t0 = time.monotonic()
    run(work, "cold", "portfolio", 8, mine["problem"], work / "cold.db", env, here)
    run(work, "source", "rules", 32, theirs["problem"], work / "store.db", env, there)
    run(work, "warm", "portfolio", 8, mine["problem"], work / "store.db", env, here)
    wall_s = time.monotonic() - t0
    report = {"cold": summary(work / "cold.db", "cold"), "source": summary(work / "store.db", "source"),
              "warm": summary(work / "store.db", "warm")}
    report["source"].pop("trials")
    dataset = load_dataset(mine["dataset"], family)
    head = {"what": __doc__.split("\n\n")[0].replace("\n", " "),
            "command": " ".join(["python", "bench/sibling_gpu.py", *sys.argv[1:]]),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "this_device": args.device, "source_device": load_dataset(theirs["dataset"], family).devices,
            "rules_constants": constants_note}
    if args.replay:
        Path(args.out).write_text(json.dumps({**head, "replay": str(mine["dataset"]), **report}, indent=1,
                                             default=str) + "\n")
        return 0
    ev, optimum = remeasure_winners(report, dataset, target)
    result = {**head, **ev.environment().as_dict(),
              "recorded_optimum": {"config": optimum.as_dict(), "recorded_ms": dataset.optimum_ms(target)},
              "wall_s": round(wall_s, 1), **report}
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
