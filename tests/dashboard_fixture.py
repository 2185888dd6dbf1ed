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
    DeviceCeilings,
    Environment,
    GpuSample,
    Problem,
    Result,
    Status,
    Telemetry,
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
from tilepilot.experiments.llm_call import LlmCall
from tilepilot.storage import Store, WinnerRow
from tilepilot.storage.cost import record_actual

KERNEL, VERSION = "matmul", "1+synthetic"
DEVICE = "Synthetic GPU 80GB"
GPU_ENV = Environment("gpu", DEVICE, "2.11.0", "3.6.0", "570.00")
REPLAY_ENV = Environment("replay", DEVICE, "2.11.0", "3.6.0", "570.00")
P1 = Problem.of({"M": 4096, "N": 4096, "K": 512, "dtype": "fp16"})
P2 = Problem.of({"M": 64, "N": 8192, "K": 2048, "dtype": "bf16"})
BUDGET = 8
CEILINGS = DeviceCeilings(DEVICE, "570.00", copy_gbps=2000.0, matmul_tflops=500.0, measured_at=1_700_000_000.0)
BASELINE = "cuBLAS (torch.matmul)"
# Text a proposer or a user could have written: it must reach the page as text, never as markup.
HOSTILE = "<b id='injected'>bold</b> **not bold** [link](javascript:alert(1))"


def cfg(bm: int, bn: int, warps: int = 4, stages: int = 3) -> Config:
    return Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "num_warps": warps, "num_stages": stages})


def ok(problem: Problem, config: Config, median_ms: float, env: Environment = GPU_ENV, *,
       adaptive: bool = False) -> Result:
    """An ok result; `adaptive`: timed until its spread reached 1 % (52.5 ms of GPU time), with the
    NVML readings and the register counts a GPU worker stores."""
    timing = Timing(median_ms, median_ms * 0.98, median_ms * 1.02, median_ms * 0.97, 100, True)
    if adaptive:
        timing = Timing(median_ms, median_ms * 0.995, median_ms * 1.004, median_ms * 0.99, 120, True, "cuda-graph",
                        spread_target=0.01, time_cap_ms=200.0, stop_reason="spread", timed_ms=52.5)
    return Result(problem, config, Status.OK, env, timing, compile_ms=812.5, max_rel_err=3.25e-4,
                  telemetry=Telemetry(1710.0, 598.0, 69.0) if adaptive else Telemetry(),
                  extra={"n_regs": 168, "n_spills": 4} if adaptive else {})


def failed(problem: Problem, config: Config, status: Status, message: str) -> Result:
    return Result(problem, config, status, GPU_ENV, message=message)


@dataclass
class Live:
    """The live campaign, and the writer that advances it."""

    store: Store
    campaign_id: int
    queue_ids: dict[str, int] = field(default_factory=dict)

    def trial(self, result: Result, *, proposer: str = "optuna", rationale: str = "TPE sample",
              predicted_ms: float | None = None, hypothesis_id: str | None = None) -> str:
        key = experiment_key(KERNEL, VERSION, result.problem, result.config, result.env)
        with self.store.transaction():
            self.store.record_result(result, key=key, kernel=KERNEL, kernel_version=VERSION, worker="gpu-0")
            self.store.add_trial(self.campaign_id, key,
                                 Candidate(result.problem, result.config, proposer, rationale, predicted_ms,
                                           hypothesis_id),
                                 reused=False)
            self.store.log_event("result", f"{result.problem.label()}: {result.status.value}",
                                 campaign_id=self.campaign_id, data={"key": key})
        return key


def build(path: Path, *, gpus: bool = True) -> Live:
    """Two campaigns (a running one on `gpu`, a finished one on `replay`), queue, events, samples,
    the device's ceilings."""
    store = Store(path)
    store.set_ceilings(CEILINGS)
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
    live.trial(ok(P1, cfg(128, 256, 8), 0.4321, adaptive=True), rationale=HOSTILE, predicted_ms=0.45,
               hypothesis_id="H-0000beef")
    live.trial(failed(P1, cfg(256, 256, 8, 5), Status.OUT_OF_RESOURCES, "shared memory 262144 > 232448"),
               proposer="rules", rationale="largest tile that fits")
    live.trial(ok(P2, cfg(64, 128), 1.2345), proposer="rules", rationale="skinny M: small BLOCK_SIZE_M")
    _queue(live)
    _model_calls(live)
    return live


def _queue(live: Live) -> None:
    """Two rows running (on gpu-0 of node-a and gpu-2 of node-b), two queued (one pinned by a person,
    one moved up by a re-scoring), one dropped; with the events a driver logs for each change."""
    store, cid = live.store, live.campaign_id
    queued = [Candidate(P1, cfg(64, 256, 4, 4), "optuna", "TPE sample near the best", 0.418),
              Candidate(P2, cfg(64, 256, 4, 4), "rules", "wider N tile for a skinny problem", 1.05),
              Candidate(P2, cfg(32, 128, 2, 3), "optuna", "TPE exploration", None),
              Candidate(P1, cfg(128, 64, 4, 5), "llm", f"deeper pipeline for a short K {HOSTILE}", 0.4711,
                        "H-0000beef"),
              Candidate(P2, cfg(256, 128, 8, 5), "optuna", "TPE sample", None)]
    ids = store.enqueue(cid, queued, priorities=[2.5, 1.75, 0.5, 1.25, 0.25],
                        reasons=["predicted 3% faster than the best", "rule: N tiles", "exploration",
                                 "in proposal order (llm)", "in proposal order (optuna)"])
    live.queue_ids = {"p1-next": ids[0], "p2-next": ids[1], "p2-explore": ids[2], "p1-llm": ids[3],
                      "p2-oor": ids[4]}
    store.set_queue_state(ids[0], "running", worker="gpu-0")
    store.set_queue_state(ids[1], "running", worker="gpu-2")
    store.log_event("reordered", f"queue of {P1.label()} re-scored, 1 moved", campaign_id=cid, data={
        "problem": P1.key(), "moves": [{"queue_id": ids[3], "config": queued[3].config.as_dict(), "from": 3, "to": 1,
                                        "reason": f"moved up: tests H-0000beef, which the last 4 results made likely "
                                                  f"(1.21x over 2 pairs) {HOSTILE}"}]})
    store.drop_queued([(ids[4], "dropped: needs the same shared memory (160 KiB) as a config that ran out")])
    store.log_event("dropped", f"1 queued config(s) of {P2.label()} dropped", campaign_id=cid, data={
        "problem": P2.key(), "dropped": [{"queue_id": ids[4], "config": queued[4].config.as_dict(),
                                          "reason": "dropped: needs the same shared memory (160 KiB) as a config "
                                                    "that ran out"}]})
    request = store.add_request(cid, "pin", queue_id=ids[2])
    store.pin_queued(ids[2], priority=3.0, reason="pinned by a person")
    store.log_event("control", f"queue entry {ids[2]} pinned at the head of the queue by a person", campaign_id=cid,
                    data={"request": request, "action": "pin", "queue_id": ids[2], "honoured": True})


def _model_calls(live: Live) -> None:
    """Two calls of the llm proposer: one priced (5000 in, 800 out, $0.0270), one of a model without a price."""
    for tokens_in, tokens_out, cost in ((5000, 800, 0.027), (3000, 500, None)):
        live.store.add_llm_call(live.campaign_id, LlmCall(
            time.time(), P1.key(), "claude-sonnet-5-5", tokens_in, tokens_out, 0, 0, cost, "end_turn", "req_synthetic",
            "", 1500.0, 2, 1, 1, (f"BLOCK_SIZE_M=512 is not one of the choices {HOSTILE}",)))


def _replay_campaign(store: Store) -> None:
    c = Campaign("mm-replay", KERNEL, "grid", 4, 0, (P1,), "replayed from a recorded grid")
    cid = store.create_campaign(c, backend="replay", dataset="data/replay/synthetic.jsonl", device=DEVICE)
    for median_ms, config in ((0.7777, cfg(64, 64)), (0.6543, cfg(128, 64))):
        r = ok(P1, config, median_ms, REPLAY_ENV)
        key = experiment_key(KERNEL, VERSION, P1, config, REPLAY_ENV)
        store.record_result(r, key=key, kernel=KERNEL, kernel_version=VERSION)
        store.add_trial(cid, key, Candidate(P1, config, "grid", "next grid point"), reused=False)
    store.set_winner(WinnerRow(cid, P1.key(), key, 0.6543, 0.01, None, None, None, baseline_ms=0.5888,
                               baseline_name=BASELINE))
    store.log_event("campaign_finished", "mm-replay finished: 1 winner", campaign_id=cid)
    store.set_campaign_state(cid, "finished")
    record_actual(store, cid)  # its GPU time: 100 repetitions × (0.7777 + 0.6543) ms


def add_gpu_samples(store: Store, *, now: float | None = None) -> None:
    """Two nodes with two GPUs each, five samples of each over the last 8 s. gpu-0 (node-a) and
    gpu-2 (node-b) run the two running queue rows; only gpu-0's samples say what runs."""
    now = time.time() if now is None else now
    samples = []
    for i in range(5):
        ts = now - 8 + 2 * i
        samples.append(GpuSample(ts, "node-a", "GPU-synthetic-0", 0, DEVICE, 87.0 + i, 40960.0, 81559.0,
                                 1755.0, 612.0, 71.0, "", "gpu-0", "mm-live M=4096 N=4096 K=512 fp16"))
        samples.append(GpuSample(ts, "node-a", "GPU-synthetic-1", 1, DEVICE, 3.0, 1024.0, 81559.0,
                                 345.0, 93.0, 38.0, "sw_power_cap", "gpu-1", ""))
        samples.append(GpuSample(ts, "node-b", "GPU-synthetic-2", 0, DEVICE, 64.0 + i, 30720.0, 81559.0,
                                 1620.0 + 10 * i, 455.0, 66.0, "", "gpu-2", ""))
        samples.append(GpuSample(ts, "node-b", "GPU-synthetic-3", 1, DEVICE, 0.0, 512.0, 81559.0,
                                 210.0, 71.0, 35.0, "hw_slowdown" if i in (1, 2) else "", "gpu-3", ""))
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
