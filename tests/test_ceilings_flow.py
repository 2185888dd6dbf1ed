"""When a campaign starts, the driver asks the executor for the device ceilings once per (device,
driver) and stores them; replay (and interpret) campaigns measure none."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tests.replay_fixture import write_campaign, write_dataset
from tilepilot.experiments import Config, DeviceCeilings, Problem, Result
from tilepilot.kernels.registry import get_family
from tilepilot.orchestrator.driver import Driver
from tilepilot.orchestrator.executor import Batch, record_ceilings
from tilepilot.orchestrator.replay import load_dataset
from tilepilot.orchestrator.replay_executor import ReplayExecutor
from tilepilot.orchestrator.tune import TuneOptions, open_campaign, plan
from tilepilot.storage.store import Store


class GpuLabelled(ReplayExecutor):
    """A recording relabelled as the gpu backend, whose `ceilings` hands back given values (as a
    GPU worker's measurement would) and counts the calls; for the driver's bookkeeping only."""

    def __init__(self, *args, given: DeviceCeilings | None, **kw) -> None:
        super().__init__(*args, **kw)
        self.environment = dataclasses.replace(self.environment, backend="gpu")
        self.given = given
        self.asked = 0

    def ceilings(self) -> dict[str, DeviceCeilings]:
        self.asked += 1
        return {} if self.given is None else {"gpu-0": self.given}

    def poll(self, timeout_s: float) -> list[tuple[Batch, list[Result]]]:
        return [(b, self._relabel(rs)) for b, rs in super().poll(timeout_s)]

    def remeasure(self, problem: Problem, configs: Sequence[Config]) -> list[Result]:
        return self._relabel(super().remeasure(problem, configs))

    def _relabel(self, results: list[Result]) -> list[Result]:
        return [dataclasses.replace(r, env=self.environment) for r in results]


def _setup(tmp_path, name="t"):
    data = write_dataset(tmp_path / "d.jsonl")
    opts = TuneOptions(campaign=write_campaign(tmp_path / f"{name}.toml", name=name, budget=2), backend="replay",
                       dataset=data, db=tmp_path / "t.db")
    return opts, plan(opts), load_dataset(data, get_family("matmul"))


def test_replay_campaign_measures_no_ceilings(tmp_path):
    opts, p, dataset = _setup(tmp_path)
    executor = ReplayExecutor(dataset)
    assert executor.ceilings() == {}
    with Store(opts.db) as store:
        cid = open_campaign(store, p, opts, executor.environment.device)
        Driver(p.campaign, p.family, store, executor, spaces=p.spaces, campaign_id=cid).run()
        assert store.all_ceilings() == []


def test_gpu_campaign_stores_ceilings_once_per_device_and_driver(tmp_path):
    opts, p, dataset = _setup(tmp_path)
    env = ReplayExecutor(dataset).environment
    given = DeviceCeilings(env.device, env.driver, 3000.0, 750.0, details={"copy": {}}, measured_at=5.0)
    executor = GpuLabelled(dataset, given=given)
    with Store(opts.db) as store:
        cid = open_campaign(store, p, opts, executor.environment.device)
        Driver(p.campaign, p.family, store, executor, spaces=p.spaces, campaign_id=cid).run()
        assert executor.asked == 1
        assert store.ceilings(env.device, env.driver) == given
        assert [e for e in store.db.query("SELECT kind FROM events WHERE kind = 'ceilings'")]
        assert record_ceilings(executor, store, cid) == []  # stored already: not measured again
        assert executor.asked == 1


def test_a_failed_measurement_stores_nothing_and_the_campaign_goes_on(tmp_path):
    opts, p, dataset = _setup(tmp_path)
    executor = GpuLabelled(dataset, given=None)
    with Store(opts.db) as store:
        cid = open_campaign(store, p, opts, executor.environment.device)
        winners = Driver(p.campaign, p.family, store, executor, spaces=p.spaces, campaign_id=cid).run()
        assert executor.asked == 1 and store.all_ceilings() == [] and winners
