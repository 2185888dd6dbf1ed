"""Winner declaration: finalists are re-measured interleaved and judged on both measurements."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tests.replay_fixture import write_campaign, write_dataset
from tilepilot.experiments import Config, Problem, Result
from tilepilot.kernels.registry import get_family
from tilepilot.orchestrator.driver import TOP_K_REMEASURE, Driver
from tilepilot.orchestrator.replay import load_dataset
from tilepilot.orchestrator.replay_executor import ReplayExecutor
from tilepilot.orchestrator.tune import TuneOptions, open_campaign, plan
from tilepilot.storage.store import Store


class NoisyRemeasure(ReplayExecutor):
    """Replays the recording, but the re-measurement of each config is scaled by a factor."""

    def __init__(self, *args, factors: dict[Config, float], **kw) -> None:
        super().__init__(*args, **kw)
        self.factors = factors
        self.asked: list[list[Config]] = []

    def remeasure(self, problem: Problem, configs: Sequence[Config]) -> list[Result]:
        self.asked.append(list(configs))
        out = []
        for r in super().remeasure(problem, configs):
            f = self.factors.get(r.config, 1.0)
            t = r.timing
            out.append(dataclasses.replace(r, timing=dataclasses.replace(
                t, median_ms=t.median_ms * f, p20_ms=t.p20_ms * f, p80_ms=t.p80_ms * f)))
        return out


def _run(tmp_path, factors_for):
    data = write_dataset(tmp_path / "d.jsonl")
    opts = TuneOptions(campaign=write_campaign(tmp_path / "c.toml", proposer="grid", budget=32),
                       backend="replay", dataset=data, db=tmp_path / "t.db")
    p = plan(opts)
    dataset = load_dataset(data, get_family("matmul"))
    problem = p.campaign.problems[0]
    p = dataclasses.replace(p, campaign=p.campaign.with_problems([problem]),
                            spaces={problem: p.spaces[problem]})
    ranked = sorted((r for r in dataset.records(problem).values() if r.median_ms), key=lambda r: r.median_ms)
    executor = NoisyRemeasure(dataset, factors=factors_for(ranked))
    store = Store(opts.db)
    cid = open_campaign(store, p, opts, executor.environment.device)
    [winner] = Driver(p.campaign, p.family, store, executor, spaces=p.spaces, campaign_id=cid).run()
    store.close()
    return winner, ranked, executor


def test_top_finalists_are_remeasured(tmp_path):
    winner, ranked, executor = _run(tmp_path, lambda ranked: {})
    assert [set(a) for a in executor.asked] == [{r.config for r in ranked[:TOP_K_REMEASURE]}]
    assert winner.median_ms == ranked[0].median_ms


def test_one_noisy_remeasure_does_not_flip_a_clear_first_measurement(tmp_path):
    # The fastest config reads slow on its re-measure by more than its lead, so the
    # re-measure alone would crown the runner-up; judged on both measurements it keeps the win.
    # (Every other finalist reads 2x slow on its re-measure, to leave the two alone.)
    picked = {}

    def factors(ranked):
        first = ranked[0]
        second = next(r for r in ranked if r.median_ms > first.median_ms * 1.01)
        q = second.median_ms / first.median_ms
        f1 = (q + q * q) / 2  # between q (flips alone) and q**2 (flips on both)
        picked.update(first=first, second=second, f1=f1)
        out = {r.config: 2.0 for r in ranked[:TOP_K_REMEASURE]}
        out.update({first.config: f1, second.config: 1.0})
        return out

    winner, _, executor = _run(tmp_path, factors)
    first, second, f1 = picked["first"], picked["second"], picked["f1"]
    assert second.config in executor.asked[0]  # the runner-up is a finalist in this data
    assert second.median_ms < first.median_ms * f1  # the re-measure alone would flip it
    assert abs(winner.median_ms - first.median_ms * f1) < 1e-12  # the first keeps it, re-measured time shown
    assert winner.runner_up_ms is not None and abs(winner.runner_up_ms - second.median_ms) < 1e-12


def test_a_consistent_remeasure_does_change_the_winner(tmp_path):
    # the second config is faster on the re-measure by far more than the first-measurement gap
    def factors(ranked):
        return {ranked[1].config: 0.5}

    winner, ranked, _ = _run(tmp_path, factors)
    assert abs(winner.median_ms - ranked[1].median_ms * 0.5) < 1e-12
