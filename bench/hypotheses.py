"""Verdict accuracy of the hypothesis ledger on a recorded grid (replay).

    python bench/hypotheses.py [--dataset data/replay/matmul-h100.jsonl.gz]
        [--proposers random,optuna] [--seeds 5] [--budgets 8,16,32] [--variants shipped,...]
        [--out bench/results/hypotheses-h100.json]

For every judge variant (`VARIANTS`: the shipped settings first), proposer, budget (distinct
configs per problem) and seed, one campaign runs on the replay backend over every problem of
the dataset, in a fresh store, with the hypothesis miner and judge as the driver runs them.
Every hypothesis' final verdict is then checked against the full recorded grid: the geometric
mean of median_ms(b) / median_ms(a) over every recorded pair in its scope (configs identical
but for the parameter, both ok).

- validated agrees when that grid effect exceeds 1 + the verdict's noise threshold;
  `same_direction` (weaker) when it exceeds 1;
- ruled out agrees when the grid effect does not exceed 1 + noise;
- inconclusive verdicts are counted, not scored.

The numbers are computed from the dataset named in the output; nothing is estimated.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tilepilot.agents.hypotheses as hyp
from tilepilot.agents.hypotheses import GridCheck, check_verdict
from tilepilot.agents.pairs import Observation
from tilepilot.experiments import HypothesisState, Verdict
from tilepilot.kernels import get_family
from tilepilot.orchestrator.replay import ReplayDataset, load_dataset
from tilepilot.orchestrator.tune import TuneOptions, tune
from tilepilot.storage import HypothesisRow, Store

log = logging.getLogger("bench.hypotheses")
ROOT = Path(__file__).resolve().parents[1]


def grid_observations(dataset: ReplayDataset) -> list[Observation]:
    out = []
    for problem in dataset.problems:
        for config in dataset.records(problem):
            o = Observation.of("", dataset.result(problem, config))
            if o is not None:
                out.append(o)
    return out


def run_campaign(dataset_path: Path, kernel: str, proposer: str, budget: int, seed: int,
                 workdir: Path) -> tuple[list[HypothesisRow], dict[str, int]]:
    name = f"hyp-{proposer}-{budget}-{seed}"
    campaign = workdir / f"{name}.toml"
    campaign.write_text(f'[campaign]\nname = "{name}"\nkernel = "{kernel}"\nproposer = "{proposer}"\n'
                        f"budget = {budget}\nseed = {seed}\n")
    db = workdir / f"{name}.db"
    out = tune(TuneOptions(campaign=campaign, backend="replay", dataset=dataset_path, db=db))
    with Store.open_readonly(db) as store:
        rows = store.hypotheses(campaign_id=out.campaign_id)
        spent: dict[str, int] = {}
        for t, _ in store.campaign_results(out.campaign_id):
            spent[t.proposer] = spent.get(t.proposer, 0) + 1
    return rows, spent


def verdict_of(row: HypothesisRow) -> Verdict:
    return Verdict(row.id, row.state, row.pairs, row.wins, row.losses, row.effect, row.ci_low, row.ci_high,
                   row.noise if row.noise is not None else 0.0, row.reason)


def summarise(checks: list[tuple[HypothesisRow, GridCheck]]) -> dict[str, Any]:
    decided = [c for _, c in checks if c.agrees is not None]
    by_state = {s.value: sum(r.state is s for r, _ in checks) for s in HypothesisState}
    validated = [c for c in decided if c.state is HypothesisState.VALIDATED]
    ruled = [c for c in decided if c.state is HypothesisState.RULED_OUT]
    return {
        "hypotheses": len(checks), "by_state": by_state, "scored": len(decided),
        "agreement": _frac(sum(bool(c.agrees) for c in decided), len(decided)),
        "validated_agreement": _frac(sum(bool(c.agrees) for c in validated), len(validated)),
        "validated_same_direction": _frac(sum(bool(c.same_direction) for c in validated), len(validated)),
        "ruled_out_agreement": _frac(sum(bool(c.agrees) for c in ruled), len(ruled)),
        "inconclusive_share": _frac(by_state["inconclusive"], len(checks)),
    }


def _frac(k: int, n: int) -> float | None:
    return round(k / n, 4) if n else None


def _detail(row: HypothesisRow, c: GridCheck) -> dict[str, Any]:
    return {"id": row.id, "text": row.hypothesis.text, "state": str(row.state), "pairs": row.pairs,
            "effect": _r(row.effect), "ci": [_r(row.ci_low), _r(row.ci_high)], "noise": _r(row.noise),
            "grid_pairs": c.grid_pairs, "grid_effect": _r(c.grid_effect), "agrees": c.agrees,
            "same_direction": c.same_direction}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


# Judge settings compared in one run (module constants of tilepilot.agents.hypotheses). The
# first is the shipped one; the others show what each safeguard buys.
VARIANTS: dict[str, dict[str, Any]] = {
    "shipped": {},
    "fixed_spread_floor": {"ADAPTIVE_SPREAD": False},
    "no_spread_floor_3_pairs": {"ADAPTIVE_SPREAD": False, "SPREAD_FLOOR": 0.0, "MIN_PAIRS": 3,
                                "MIN_PAIRS_NULL": 3},
}


def run_variant(settings: dict[str, Any], args: argparse.Namespace, grid: list[Observation],
                proposers: list[str], budgets: list[int]) -> dict[str, Any]:
    saved = {k: getattr(hyp, k) for k in settings}
    for k, v in settings.items():
        setattr(hyp, k, v)
    started = time.time()
    runs: list[dict[str, Any]] = []
    every: list[tuple[HypothesisRow, GridCheck]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for proposer in proposers:
                for budget in budgets:
                    for seed in range(args.seeds):
                        rows, spent = run_campaign(args.dataset, args.kernel, proposer, budget, seed, Path(tmp))
                        checks = [(r, check_verdict(r.hypothesis, verdict_of(r), grid)) for r in rows]
                        every.extend(checks)
                        runs.append({"proposer": proposer, "budget": budget, "seed": seed,
                                     "trials_by_proposer": spent, "summary": summarise(checks),
                                     "verdicts": [_detail(r, c) for r, c in checks]})
                        log.info("%s budget %d seed %d: %s", proposer, budget, seed, runs[-1]["summary"])
    finally:
        for k, v in saved.items():
            setattr(hyp, k, v)
    tagged = _tagged(every, runs)
    return {
        "settings": {k: getattr(hyp, k) for k in JUDGE_SETTINGS} | settings,
        "overall": summarise(every),
        "by_budget": {str(b): summarise([x for x, run in tagged if run["budget"] == b]) for b in budgets},
        "by_proposer": {p: summarise([x for x, run in tagged if run["proposer"] == p]) for p in proposers},
        "hypothesis_trials_share": _frac(sum(r["trials_by_proposer"].get("hypotheses", 0) for r in runs),
                                         sum(sum(r["trials_by_proposer"].values()) for r in runs)),
        "median_hypotheses_per_campaign": statistics.median(r["summary"]["hypotheses"] for r in runs),
        "wall_s": round(time.time() - started, 1),
        "runs": runs,
    }


JUDGE_SETTINGS = ("MIN_PAIRS", "MAX_PAIRS", "NOISE_FLOOR", "SIGN_P", "SPREAD_FLOOR", "ADAPTIVE_SPREAD",
                  "MIN_PAIRS_NULL")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", type=Path, default=ROOT / "data/replay/matmul-h100.jsonl.gz")
    ap.add_argument("--kernel", default="matmul")
    ap.add_argument("--proposers", default="random,optuna")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budgets", default="8,16,32")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"judge settings to run ({', '.join(VARIANTS)})")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/hypotheses-h100.json")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    dataset = load_dataset(args.dataset, get_family(args.kernel))
    grid = grid_observations(dataset)
    proposers = [p for p in args.proposers.split(",") if p]
    budgets = [int(b) for b in args.budgets.split(",") if b]
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant {unknown[0]!r} (known: {', '.join(VARIANTS)})")
    variants = {}
    for name in names:
        variants[name] = run_variant(VARIANTS[name], args, grid, proposers, budgets)
        log.warning("%s: %s", name, json.dumps(variants[name]["overall"]))
    for name in names[1:]:
        del variants[name]["runs"]  # the verdict-by-verdict detail is kept for the first variant only
    report = {
        "dataset": str(args.dataset.relative_to(ROOT) if args.dataset.is_relative_to(ROOT) else args.dataset),
        "dataset_identity": dataset.identity, "device": dataset.devices, "problems": len(dataset.problems),
        "grid_ok_results": len(grid), "proposers": proposers, "budgets": budgets, "seeds": args.seeds,
        "method": __doc__.split("\n\n", 2)[2].strip(),
        "variants": variants,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({name: {k: v[k] for k in ("settings", "overall", "by_budget", "hypothesis_trials_share")}
                      for name, v in variants.items()}, indent=1))
    return 0


def _tagged(every: list[tuple[HypothesisRow, GridCheck]],
            runs: list[dict[str, Any]]) -> list[tuple[tuple[HypothesisRow, GridCheck], dict[str, Any]]]:
    """Each check with the run it came from (runs list their verdicts in the same order)."""
    out = []
    i = 0
    for run in runs:
        n = len(run["verdicts"])
        out.extend((every[i + k], run) for k in range(n))
        i += n
    return out


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
