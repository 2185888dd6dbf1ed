"""A toy search space, a SYNTHETIC objective and a driver loop, for proposer tests.

Nothing here is measured: `synthetic_ms` is an invented function of the config with one
known optimum, used only to check that a proposer learns from results.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable

from tilepilot.agents.base import Proposer, ProposerContext, SearchState
from tilepilot.experiments import Config, Environment, Param, Problem, Result, SearchSpace, Status, Timing

ENV = Environment(backend="replay", device="synthetic objective (tests)", torch="", triton="")
PROBLEM = Problem.of({"M": 128, "N": 512, "K": 1024, "dtype": "fp16"})
SHARED_LIMIT = 160 * 1024


def _fits_shared(config: Config, problem: Problem) -> str | None:
    need = (int(config["BLOCK_M"]) + int(config["BLOCK_N"])) * int(config["BLOCK_K"]) * 2
    need *= int(config["num_stages"])
    return f"needs {need} bytes of shared memory" if need > SHARED_LIMIT else None


def _tile_fits_problem(config: Config, problem: Problem) -> str | None:
    return "BLOCK_M exceeds M" if int(config["BLOCK_M"]) > int(problem["M"]) else None


TOY_SPACE = SearchSpace(
    params=(
        Param("BLOCK_M", (16, 32, 64, 128, 256)),
        Param("BLOCK_N", (16, 32, 64, 128, 256)),
        Param("BLOCK_K", (16, 32, 64, 128)),
        Param("num_warps", (2, 4, 8)),
        Param("num_stages", (2, 3, 4, 5)),
    ),
    constraints=(_fits_shared, _tile_fits_problem),
)

# Three valid configs out of four: (a=2, b="y") is invalid.
TINY_SPACE = SearchSpace(
    params=(Param("a", (1, 2)), Param("b", ("x", "y"))),
    constraints=(lambda c, p: "a=2 with b=y" if (c["a"], c["b"]) == (2, "y") else None,),
)


def synthetic_ms(config: Config) -> float:
    """SYNTHETIC: a bowl in log2 space (optimum BLOCK_M=128, BLOCK_N=128, BLOCK_K=64,
    num_warps=4, num_stages=3) with an interaction and a small deterministic ripple.
    Configs of TINY_SPACE get the ripple alone."""
    ripple = int(hashlib.sha256(config.key().encode()).hexdigest()[:4], 16) / 0xFFFF
    if "BLOCK_M" not in config:
        return 1.0 + ripple
    lg = {k: math.log2(int(config[k])) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps")}
    d = ((lg["BLOCK_M"] - 7) ** 2 + (lg["BLOCK_N"] - 7) ** 2 + 0.7 * (lg["BLOCK_K"] - 6) ** 2
         + 0.5 * (lg["num_warps"] - 2) ** 2 + 0.4 * (int(config["num_stages"]) - 3) ** 2
         + 0.3 * (lg["BLOCK_M"] + lg["BLOCK_N"] - 2 * lg["num_warps"] - 10) ** 2)
    return 0.05 * math.exp(0.35 * d) * (1.0 + 0.05 * ripple)


def ok_result(config: Config, problem: Problem = PROBLEM, ms: float | None = None) -> Result:
    ms = synthetic_ms(config) if ms is None else ms
    timing = Timing(median_ms=ms, p20_ms=ms, p80_ms=ms, min_ms=ms, reps=1, l2_flushed=False,
                    method="replay")
    return Result(problem, config, Status.OK, ENV, timing=timing)


def failed_result(config: Config, status: Status, problem: Problem = PROBLEM) -> Result:
    return Result(problem, config, status, ENV, message=f"synthetic {status}")


def evaluate(space: SearchSpace, config: Config, problem: Problem = PROBLEM) -> Result:
    reason = space.check(config, problem)
    return failed_result(config, Status.INVALID, problem) if reason else ok_result(config, problem)


def context(space: SearchSpace = TOY_SPACE, seed: int = 0, budget: int = 40) -> ProposerContext:
    return ProposerContext(kernel="toy", problem=PROBLEM, space=space, seed=seed, budget=budget)


def drive(proposer: Proposer, budget: int, batch: int = 4,
          answer: Callable[[Config], Result] | None = None) -> SearchState:
    """The driver's loop in miniature: propose, mark pending, answer, observe."""
    answer = answer or (lambda c: evaluate(proposer.ctx.space, c))
    state = SearchState()
    measured = 0
    while measured < budget:
        candidates = proposer.propose(state, min(batch, budget - measured))
        if not candidates:
            break
        state.pending.update(c.config for c in candidates)
        results = [answer(c.config) for c in candidates]
        for r in results:
            state.pending.discard(r.config)
            state.results[r.config] = r
        proposer.observe(results)
        measured += sum(r.status.counts_against_budget for r in results)
    return state


def best_ms(state: SearchState) -> float:
    best = state.best()
    return best.median_ms if best and best.median_ms is not None else math.inf


def optimum_ms(space: SearchSpace = TOY_SPACE) -> float:
    return min(synthetic_ms(c) for c in space.valid(PROBLEM))
