"""Device ceilings in the store (the `devices` table), the adaptive-timing fields of a result, and
the roofline percentage the read-only `best` query derives from both."""

from __future__ import annotations

from pathlib import Path

import pytest

from tilepilot.experiments import (
    Campaign,
    Candidate,
    Config,
    DeviceCeilings,
    Environment,
    Problem,
    Result,
    Status,
    Timing,
    experiment_key,
)
from tilepilot.storage import Store, WinnerRow, open_db, queries

ENV = Environment("gpu", "NVIDIA H100 80GB HBM3", "2.11.0", "3.6.0", "580.1")
KERNEL, VERSION = "matmul", "1+abc123"
P = Problem.of({"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"})
FLOPS, BYTES = 2.0 * 4096**3, 3.0 * 4096 * 4096 * 2
CEILINGS = DeviceCeilings(ENV.device, ENV.driver, copy_gbps=3000.0, matmul_tflops=750.0, details={
    "copy": {"bytes": 2**30, "rel_spread": 0.004}, "matmul": {"n": 8192, "rel_spread": 0.01}}, measured_at=1.0e9)


def cfg(bm: int) -> Config:
    return Config.of({"BLOCK_M": bm, "num_warps": 4})


def result(config: Config, ms: float, *, work: bool = True, env: Environment = ENV) -> Result:
    timing = Timing(ms, ms * 0.99, ms * 1.01, ms * 0.98, 40, True, "cuda-events", 0.02, 15.0, "spread", 4.5)
    extra = {"work_flops": FLOPS, "work_bytes": BYTES} if work else {}
    return Result(P, config, Status.OK, env, timing, extra=extra)


@pytest.fixture()
def store(tmp_path: Path):
    s = Store(tmp_path / "t.db")
    yield s
    s.close()


def put(store: Store, cid: int, r: Result) -> str:
    key = experiment_key(KERNEL, VERSION, r.problem, r.config, r.env)
    with store.transaction():
        store.record_result(r, key=key, kernel=KERNEL, kernel_version=VERSION)
        store.add_trial(cid, key, Candidate(r.problem, r.config, "random", ""), reused=False)
    return key


def campaign(store: Store, name: str = "c") -> int:
    return store.create_campaign(Campaign(name, KERNEL, "random", 4, 0, (P,)), backend="gpu", dataset="",
                                 device=ENV.device)


def test_ceilings_round_trip_per_device_and_driver(store: Store) -> None:
    assert store.ceilings(ENV.device, ENV.driver) is None
    store.set_ceilings(CEILINGS)
    assert store.ceilings(ENV.device, ENV.driver) == CEILINGS
    assert store.ceilings(ENV.device, "another driver") is None
    again = DeviceCeilings(ENV.device, ENV.driver, 3100.0, 760.0, measured_at=0.0)
    store.set_ceilings(again)  # upsert; a missing time is now
    got = store.ceilings(ENV.device, ENV.driver)
    assert got is not None and (got.copy_gbps, got.matmul_tflops, got.details) == (3100.0, 760.0, {})
    assert got.measured_at > 1.0e9
    assert store.all_ceilings() == [got]


def test_adaptive_timing_fields_round_trip(store: Store) -> None:
    r = result(cfg(64), 0.25)
    key = put(store, campaign(store), r)
    got = store.lookup_result(key)
    assert got == r
    assert got is not None and got.timing is not None
    assert (got.timing.spread_target, got.timing.time_cap_ms, got.timing.stop_reason, got.timing.timed_ms) == (
        0.02, 15.0, "spread", 4.5)


def test_best_reports_the_roofline_percentage_of_the_winner(store: Store, tmp_path: Path) -> None:
    cid = campaign(store)
    put(store, cid, result(cfg(64), 0.4))
    put(store, cid, result(cfg(128), 0.25))
    with open_db(tmp_path / "t.db") as db:
        assert [b.roofline_pct for b in queries.best(db)] == [None]  # no ceilings measured yet
    store.set_ceilings(CEILINGS)
    bound_ms = CEILINGS.bound_ms(FLOPS, BYTES)
    with open_db(tmp_path / "t.db") as db:
        [b] = queries.best(db)
    assert b.median_ms == 0.25 and b.roofline_pct == pytest.approx(100 * bound_ms / 0.25)
    win = experiment_key(KERNEL, VERSION, P, cfg(64), ENV)
    store.set_winner(WinnerRow(cid, P.key(), win, 0.5))  # a declared winner: its remeasured median counts
    with open_db(tmp_path / "t.db") as db:
        [b] = queries.best(db)
    assert b.roofline_pct == pytest.approx(100 * bound_ms / 0.5)


def test_roofline_uses_another_drivers_ceilings_of_the_same_device(store: Store, tmp_path: Path) -> None:
    store.set_ceilings(DeviceCeilings(ENV.device, "older driver", 3000.0, 750.0, measured_at=1.0))
    put(store, campaign(store), result(cfg(64), 0.4))
    with open_db(tmp_path / "t.db") as db:
        [b] = queries.best(db)
    assert b.roofline_pct == pytest.approx(100 * CEILINGS.bound_ms(FLOPS, BYTES) / 0.4)


def test_no_roofline_without_the_work_model_or_for_another_device(store: Store, tmp_path: Path) -> None:
    store.set_ceilings(CEILINGS)
    put(store, campaign(store, "a"), result(cfg(64), 0.4, work=False))
    h200 = Environment("gpu", "NVIDIA H200", "2.11.0", "3.6.0", "580.1")
    put(store, campaign(store, "b"), result(cfg(64), 0.4, env=h200))
    with open_db(tmp_path / "t.db") as db:
        assert [b.roofline_pct for b in queries.best(db)] == [None, None]
