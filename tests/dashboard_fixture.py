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
from tilepilot.experiments.hypothesis import (
    Evidence,
    Hypothesis,
    HypothesisState,
    Learning,
    Scope,
    Verdict,
    geometric_mean,
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


# -- the hypothesis ledger -------------------------------------------------------------------------
# A third campaign whose experiments test hypotheses: one validated (with its learning), one ruled
# out, one being tested, one just proposed (by a model, with hostile text) and one inconclusive.
# SYNTHETIC like the rest: the medians are chosen so each pair's ratio is easy to recognise.

P3 = Problem.of({"M": 2048, "N": 2048, "K": 8192, "dtype": "fp16"})
TOOLCHAIN = {"torch": "2.11.0", "triton": "3.6.0"}


@dataclass
class Ledger:
    """The ledger campaign and the ids a test looks for."""

    live: Live
    hypotheses: dict[str, Hypothesis]  # validated, ruled_out, testing, proposed, inconclusive
    learning: Learning
    pairs: dict[str, list[tuple[str, str, float]]]  # hypothesis name -> (key a, key b, ratio b/a)


def _pair(live: Live, h: Hypothesis, base: Config, problem: Problem, ms_a: float,
          ms_b: float) -> tuple[str, str, float]:
    """Two experiments that differ only in the hypothesis' parameter, queued to test it."""
    keys = []
    for value, median in ((h.a, ms_a), (h.b, ms_b)):
        config = Config.of({**base.as_dict(), h.param: value})
        result = ok(problem, config, median)
        key = experiment_key(KERNEL, VERSION, problem, config, GPU_ENV)
        live.store.record_result(result, key=key, kernel=KERNEL, kernel_version=VERSION, worker="gpu-0")
        live.store.add_trial(live.campaign_id, key, Candidate(problem, config, "miner", f"tests {h.id}", None,
                                                              h.id), reused=False)
        keys.append(key)
    return keys[0], keys[1], ms_b / ms_a


def _judge(store: Store, h: Hypothesis, state: HypothesisState, pairs: list[tuple[str, str, float]],
           problem: Problem, ci: tuple[float, float] | None, noise: float, reason: str) -> Verdict:
    ratios = [r for _, _, r in pairs]
    effect = geometric_mean(ratios) if ratios else None
    wins = sum(r > 1 + noise for r in ratios)
    losses = sum(r < 1 - noise for r in ratios)
    verdict = Verdict(h.id, state, len(pairs), wins, losses, effect, ci and ci[0], ci and ci[1], noise, reason)
    evidence = [Evidence(h.id, a, b, problem.key(), r, "supports" if r > 1 + noise else "refutes")
                for a, b, r in pairs]
    store.record_verdict(verdict, evidence)
    return verdict


def build_ledger(path: Path) -> Ledger:
    """`build(path)`, plus the ledger campaign (running on `gpu`) with five hypotheses."""
    store = build(path).store
    c = Campaign("mm-hyp", KERNEL, "portfolio", BUDGET, 3, (P1, P3), "Synthetic campaign with hypotheses.")
    live = Live(store, store.create_campaign(c, backend="gpu", dataset="", device=DEVICE))
    scope_k = Scope.parse("K>=4096")
    hyps = {
        "validated": Hypothesis.new(origin="mm-hyp", kernel=KERNEL, device=DEVICE, param="num_stages", a=4, b=3,
                                    scope=scope_k, rationale="stages 4 led on every long-K problem so far"),
        "ruled_out": Hypothesis.new(origin="mm-hyp", kernel=KERNEL, device=DEVICE, param="BLOCK_SIZE_M", a=256,
                                    b=128, scope=Scope(), rationale="bigger tiles reuse more", source="rules"),
        "testing": Hypothesis.new(origin="mm-hyp", kernel=KERNEL, device=DEVICE, param="num_warps", a=8, b=4,
                                  scope=Scope.parse("M>=1024"), rationale="large M feeds 8 warps"),
        "proposed": Hypothesis("H-11111111", KERNEL, DEVICE, "GROUP_SIZE_M", 16, 8, Scope.parse("M>=2048"),
                               f"GROUP_SIZE_M=16 beats GROUP_SIZE_M=8 {HOSTILE}", f"model says {HOSTILE}", "llm"),
        "inconclusive": Hypothesis.new(origin="mm-hyp", kernel=KERNEL, device=DEVICE, param="BLOCK_SIZE_N", a=64,
                                       b=128, scope=Scope.parse("M<=64"), rationale="skinny problems"),
    }
    for h in hyps.values():
        store.add_hypothesis(live.campaign_id, h)
    pairs = {
        "validated": [_pair(live, hyps["validated"], cfg(128, 128, 4, 3), P3, 2.0, 2.618),
                      _pair(live, hyps["validated"], cfg(64, 128, 4, 3), P3, 2.5, 3.175),
                      _pair(live, hyps["validated"], cfg(128, 64, 8, 3), P3, 3.0, 4.05)],
        "ruled_out": [_pair(live, hyps["ruled_out"], cfg(64, 64, 4, 3), P1, 0.9, 0.639),
                      _pair(live, hyps["ruled_out"], cfg(64, 128, 4, 3), P1, 0.8, 0.552)],
        "testing": [_pair(live, hyps["testing"], cfg(64, 64, 4, 3), P3, 4.4, 4.84)],
        "inconclusive": [_pair(live, hyps["inconclusive"], cfg(64, 64, 4, 3), P1, 0.95, 0.9785)],
    }
    _judge(store, hyps["testing"], HypothesisState.TESTING, [], P3, None, 0.02, "testing: 0 of 5 pairs measured")
    _judge(store, hyps["testing"], HypothesisState.TESTING, pairs["testing"], P3, None, 0.02,
           "testing: 1 of 5 pairs measured")
    _judge(store, hyps["validated"], HypothesisState.TESTING, [], P3, None, 0.021, "testing: 0 of 3 pairs measured")
    validated = _judge(store, hyps["validated"], HypothesisState.VALIDATED, pairs["validated"], P3, (1.2345, 1.3876),
                       0.021, "validated: effect beyond the noise; 3 pair(s), num_stages=4 faster in 3")
    _judge(store, hyps["ruled_out"], HypothesisState.TESTING, [], P1, None, 0.025, "testing: 0 of 2 pairs measured")
    _judge(store, hyps["ruled_out"], HypothesisState.RULED_OUT, pairs["ruled_out"], P1, (0.6543, 0.7456), 0.025,
           "ruled out: BLOCK_SIZE_M=128 is faster in every pair")
    _judge(store, hyps["inconclusive"], HypothesisState.INCONCLUSIVE, pairs["inconclusive"], P1, (0.9712, 1.0801),
           0.03, "inconclusive: no budget left in scope for more pairs")
    learning = Learning.from_verdict(hyps["validated"], validated, **TOOLCHAIN,
                                     evidence=[k for a, b, _ in pairs["validated"] for k in (a, b)])
    store.add_learning(learning)
    store.log_event("verdict", f"{hyps['validated'].id} validated", campaign_id=live.campaign_id)
    return Ledger(live, hyps, learning, pairs)
