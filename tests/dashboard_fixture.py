"""A store for the dashboard tests, written through the `Store` API as a campaign driver would.

SYNTHETIC: every timing, NVML reading and message below is made up to exercise the screens
(distinctive numbers, so a test can find them on the page); nothing here was measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from tilepilot.experiments import (
    Campaign,
    Candidate,
    Config,
    Environment,
    GpuSample,
    Problem,
    Result,
    Status,
    Timing,
    experiment_key,
)
from tilepilot.storage import Store, WinnerRow

KERNEL, VERSION = "matmul", "1+synthetic"
DEVICE = "Synthetic GPU 80GB"
GPU_ENV = Environment("gpu", DEVICE, "2.11.0", "3.6.0", "570.00")
REPLAY_ENV = Environment("replay", DEVICE, "2.11.0", "3.6.0", "570.00")
P1 = Problem.of({"M": 4096, "N": 4096, "K": 512, "dtype": "fp16"})
P2 = Problem.of({"M": 64, "N": 8192, "K": 2048, "dtype": "bf16"})
BUDGET = 8
# Text a proposer or a user could have written: it must reach the page as text, never as markup.
HOSTILE = "<b id='injected'>bold</b> **not bold** [link](javascript:alert(1))"


def cfg(bm: int, bn: int, warps: int = 4, stages: int = 3) -> Config:
    return Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "num_warps": warps, "num_stages": stages})


def ok(problem: Problem, config: Config, median_ms: float, env: Environment = GPU_ENV) -> Result:
    return Result(problem, config, Status.OK, env,
                  Timing(median_ms, median_ms * 0.98, median_ms * 1.02, median_ms * 0.97, 100, True),
                  compile_ms=812.5)


def failed(problem: Problem, config: Config, status: Status, message: str) -> Result:
    return Result(problem, config, status, GPU_ENV, message=message)


@dataclass
class Live:
    """The live campaign, and the writer that advances it."""

    store: Store
    campaign_id: int
    queue_ids: dict[str, int] = field(default_factory=dict)

    def trial(self, result: Result, *, proposer: str = "optuna", rationale: str = "TPE sample",
              predicted_ms: float | None = None) -> str:
        key = experiment_key(KERNEL, VERSION, result.problem, result.config, result.env)
        with self.store.transaction():
            self.store.record_result(result, key=key, kernel=KERNEL, kernel_version=VERSION, worker="gpu-0")
            self.store.add_trial(self.campaign_id, key,
                                 Candidate(result.problem, result.config, proposer, rationale, predicted_ms),
                                 reused=False)
            self.store.log_event("result", f"{result.problem.label()}: {result.status.value}",
                                 campaign_id=self.campaign_id, data={"key": key})
        return key


def build(path: Path, *, gpus: bool = True) -> Live:
    """Two campaigns (a running one on `gpu`, a finished one on `replay`), queue, events, samples."""
    store = Store(path)
    live = _live_campaign(store)
    _replay_campaign(store)
    if gpus:
        add_gpu_samples(store)
    return live


def _live_campaign(store: Store) -> Live:
    c = Campaign("mm-live", KERNEL, "optuna", BUDGET, 1, (P1, P2), f"Synthetic campaign. {HOSTILE}")
    cid = store.create_campaign(c, backend="gpu", dataset="", device=DEVICE)
    live = Live(store, cid)
    store.log_event("campaign_started", "mm-live started on 1 GPU", campaign_id=cid)
    live.trial(ok(P1, cfg(128, 128), 0.5123), predicted_ms=0.61)
    live.trial(ok(P1, cfg(128, 256, 8), 0.4321), rationale=HOSTILE, predicted_ms=0.45)
    live.trial(failed(P1, cfg(256, 256, 8, 5), Status.OUT_OF_RESOURCES, "shared memory 262144 > 232448"),
               proposer="rules", rationale="largest tile that fits")
    live.trial(ok(P2, cfg(64, 128), 1.2345), proposer="rules", rationale="skinny M: small BLOCK_SIZE_M")
    queued = [Candidate(P1, cfg(64, 256, 4, 4), "optuna", "TPE sample near the best", 0.418),
              Candidate(P2, cfg(64, 256, 4, 4), "rules", "wider N tile for a skinny problem", 1.05),
              Candidate(P2, cfg(32, 128, 2, 3), "optuna", "TPE exploration", None)]
    ids = store.enqueue(cid, queued, priorities=[2.5, 1.75, 0.5],
                        reasons=["predicted 3% faster than the best", "rule: N tiles", "exploration"])
    live.queue_ids = {"p1-next": ids[0], "p2-next": ids[1], "p2-explore": ids[2]}
    store.set_queue_state(ids[0], "running", worker="gpu-0")
    return live


def _replay_campaign(store: Store) -> None:
    c = Campaign("mm-replay", KERNEL, "grid", 4, 0, (P1,), "replayed from a recorded grid")
    cid = store.create_campaign(c, backend="replay", dataset="data/replay/synthetic.jsonl", device=DEVICE)
    for median_ms, config in ((0.7777, cfg(64, 64)), (0.6543, cfg(128, 64))):
        r = ok(P1, config, median_ms, REPLAY_ENV)
        key = experiment_key(KERNEL, VERSION, P1, config, REPLAY_ENV)
        store.record_result(r, key=key, kernel=KERNEL, kernel_version=VERSION)
        store.add_trial(cid, key, Candidate(P1, config, "grid", "next grid point"), reused=False)
    store.set_winner(WinnerRow(cid, P1.key(), key, 0.6543, 0.01, None, None, None))
    store.log_event("campaign_finished", "mm-replay finished: 1 winner", campaign_id=cid)
    store.set_campaign_state(cid, "finished")


def add_gpu_samples(store: Store, *, now: float | None = None) -> None:
    now = time.time() if now is None else now
    samples = []
    for i in range(5):
        ts = now - 8 + 2 * i
        samples.append(GpuSample(ts, "node-a", "GPU-synthetic-0", 0, DEVICE, 87.0 + i, 40960.0, 81559.0,
                                 1755.0, 612.0, 71.0, "", "gpu-0", "mm-live M=4096 N=4096 K=512 fp16"))
        samples.append(GpuSample(ts, "node-a", "GPU-synthetic-1", 1, DEVICE, 3.0, 1024.0, 81559.0,
                                 345.0, 93.0, 38.0, "sw_power_cap", "gpu-1", ""))
    store.add_gpu_samples(samples)
