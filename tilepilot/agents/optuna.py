"""`optuna`: multivariate TPE with constant liar, driven through ask/tell.

(Inside this module `import optuna` is the Optuna package: imports are absolute.)

How results are told (objective: log of median_ms, minimised):
- ok: COMPLETE with the value, constraint `runs` = 0 (feasible);
- a status that never runs (`Status.never_runs`: invalid, compile_error, out_of_resources,
  wrong_result, crashed, poison): COMPLETE with `runs` = 1 (infeasible). TPE splits
  infeasible trials by their violation alone and never reads their value, and
  `best_trial` skips them; the value carried is the worst feasible one so far (0 before any);
- timeout, oom: FAIL (TPE ignores it; the config may pass on another try).

Every asked trial is told: a proposed config keeps its trial until its result arrives,
and `close` fails what is still running. Configs this proposer did not ask for (other
proposers, the store, warm start) are added as finished trials where they lie in the space.

Within `propose`, suggestions that cost nothing are told at once and asked again: configs
the space's constraints reject (infeasible) and configs already seen (their known outcome,
or FAIL while still in flight). After `MAX_FREE_ASKS` such suggestions in a row, an unseen
valid config chosen at random is enqueued and asked instead. A config taken off the queue
unmeasured (`state.dropped`) has its trial told as FAIL.

`optuna_gp.OptunaGpProposer` is this proposer with Optuna's GP sampler; the hooks it
overrides are marked "(hook)".
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import Trial, TrialState, create_trial

from tilepilot.agents.base import Proposer, ProposerContext, SearchState
from tilepilot.agents.optuna_params import ParamCodec
from tilepilot.experiments import Candidate, Config, Result, Status

log = logging.getLogger(__name__)

CONSTRAINT = "runs"  # > 0: the config can never give a timing for this problem
FEASIBLE, INFEASIBLE = 0.0, 1.0
MAX_FREE_ASKS = 24  # told-at-once suggestions per candidate before the random fallback
RETRYABLE = (Status.TIMEOUT, Status.OOM)


class OptunaProposer(Proposer):
    name = "optuna"
    sampler_label = "TPE"  # how rationales name the model

    def __init__(self, ctx: ProposerContext) -> None:
        super().__init__(ctx)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.n_startup = max(1, min(8, ctx.budget // 4))
        self.study = optuna.create_study(
            direction="minimize", sampler=self._sampler(), study_name=f"{ctx.kernel} {ctx.problem.label()}")
        self._codec = ParamCodec(ctx.space)
        self._rng = random.Random(ctx.seed)
        self._running: dict[Config, Trial] = {}  # proposed, result not yet told
        self._told: dict[Config, Result] = {}  # the last result told per config
        self._valid: list[Config] | None = None
        self._worst: float | None = None  # worst feasible objective value so far

    def _sampler(self) -> optuna.samplers.BaseSampler:
        """(hook) The study's sampler."""
        return optuna.samplers.TPESampler(
            seed=self.ctx.seed, n_startup_trials=self.n_startup, multivariate=True, constant_liar=True)

    # ---- the contract --------------------------------------------------------------
    def propose(self, state: SearchState, n: int) -> list[Candidate]:
        self._absorb(state)
        self._drop(state.dropped)
        seen = state.seen | set(self._running)
        out: list[Candidate] = []
        for _ in range(max(n, 0)):
            candidate = self._ask(state, seen)
            if candidate is None:
                break
            seen.add(candidate.config)
            out.append(candidate)
        return out

    def observe(self, results: Sequence[Result]) -> None:
        for r in results:
            self._check_problem(r)
            if self._told.get(r.config) == r:
                continue  # already told (through state or an earlier observe)
            trial = self._running.pop(r.config, None)
            if trial is not None:
                self._tell(trial, r, trial.user_attrs.get("origin", "proposed"))
            else:
                self._add(r)
            self._told[r.config] = r

    def close(self) -> None:
        for trial in self._running.values():
            trial.set_user_attr("origin", "abandoned")
            self.study.tell(trial, state=TrialState.FAIL)
        self._running.clear()

    # ---- asking --------------------------------------------------------------------
    def _ask(self, state: SearchState, seen: set[Config]) -> Candidate | None:
        """One new candidate, or None when every valid config is seen."""
        unseen = [c for c in self._valid_configs() if c not in seen]
        return self._next(state, seen, unseen) if unseen else None

    def _max_free_asks(self) -> int:
        """(hook) Suggestions told at once per candidate before the fallback."""
        return MAX_FREE_ASKS

    def _next(self, state: SearchState, seen: set[Config], unseen: list[Config]) -> Candidate:
        free = 0
        last: Config | None = None  # the model's last suggestion (told at once)
        while free < self._max_free_asks():
            done = self._n_done()
            trial = self.study.ask(self._codec.distributions)
            try:
                config = self._codec.to_config(trial.params)
                if self._told_at_once(trial, config, state, seen):
                    free, last = free + 1, config
                    continue
            except BaseException:
                self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
                raise
            trial.set_user_attr("origin", "proposed")
            self._running[config] = trial
            why = self._why(trial.number, config, done, state, free)
            return Candidate(self.ctx.problem, config, self.name, why)
        return self._fallback(unseen, free, last)

    def _told_at_once(self, trial: Trial, config: Config, state: SearchState, seen: set[Config]) -> bool:
        """Tell a suggestion that needs no run (invalid or already seen); False if it needs one."""
        reason = self.ctx.space.check(config, self.ctx.problem)
        if reason is not None:
            trial.set_user_attr("message", reason)
            self._tell_status(trial, Status.INVALID, None, "invalid")
            return True
        if config not in seen:
            return False
        known = self._told.get(config) or state.results.get(config)
        if known is None:  # in flight: nothing to tell yet
            trial.set_user_attr("origin", "duplicate")
            self.study.tell(trial, state=TrialState.FAIL)
        else:
            self._tell(trial, known, "duplicate")
        return True

    def _fallback(self, unseen: list[Config], free: int, last: Config | None) -> Candidate:
        config, how = self._fallback_config(unseen, last)
        self.study.enqueue_trial(self._codec.to_params(config) or {}, user_attrs={"origin": "fallback"})
        trial = self.study.ask(self._codec.distributions)  # every param fixed: no model fit
        if self._codec.to_config(trial.params) != config:
            self.study.tell(trial, state=TrialState.FAIL)
            raise RuntimeError(f"enqueued config {config} came back as {trial.params}")
        self._running[config] = trial
        plural = "suggestion was" if free == 1 else f"{free} suggestions were"
        why = f"{self.sampler_label} trial {trial.number}: {how}, the model's last {plural} invalid or already seen"
        return Candidate(self.ctx.problem, config, self.name, why)

    def _fallback_config(self, unseen: list[Config], last: Config | None) -> tuple[Config, str]:
        """(hook) The unseen valid config asked instead, and how it was chosen."""
        return self._rng.choice(unseen), "random unseen valid config"

    # ---- telling -------------------------------------------------------------------
    def _tell(self, trial: Trial, result: Result, origin: str) -> None:
        if result.message:
            trial.set_user_attr("message", result.message[:500])
        self._tell_status(trial, result.status, result.median_ms, origin)

    def _tell_status(self, trial: Trial, status: Status, median_ms: float | None, origin: str) -> None:
        trial.set_user_attr("origin", origin)
        trial.set_user_attr("status", str(status))
        if status in RETRYABLE:
            self.study.tell(trial, state=TrialState.FAIL)
        elif status is Status.OK:
            trial.set_constraint(CONSTRAINT, FEASIBLE)
            self.study.tell(trial, self._value(median_ms))
            self._on_feasible()
        else:
            self._tell_infeasible(trial)

    def _tell_infeasible(self, trial: Trial) -> None:
        """(hook) Finish a trial whose config never runs: COMPLETE with the constraint violated."""
        trial.set_constraint(CONSTRAINT, INFEASIBLE)
        self.study.tell(trial, self._infeasible_value())

    def _on_feasible(self) -> None:
        """(hook) Called after each feasible value is told or added."""

    def _add(self, result: Result) -> None:
        """A result of a config this proposer did not ask for: a finished trial, if it fits."""
        params = self._codec.to_params(result.config)
        if params is None:
            log.debug("config %s lies outside the optuna space; not added", result.config)
            return
        attrs = {"origin": "observed", "status": str(result.status)}
        if result.status in RETRYABLE:
            self.study.add_trial(create_trial(state=TrialState.FAIL, params=params,
                                              distributions=self._codec.distributions, user_attrs=attrs))
        elif result.status is Status.OK:
            self.study.add_trial(create_trial(
                value=self._value(result.median_ms), params=params, distributions=self._codec.distributions,
                user_attrs=attrs, constraints={CONSTRAINT: FEASIBLE}))
            self._on_feasible()
        else:
            self._add_infeasible(params, attrs)

    def _add_infeasible(self, params: dict[str, Any], attrs: dict[str, Any]) -> None:
        """(hook) Add a finished trial for an observed config that never runs."""
        self.study.add_trial(create_trial(
            value=self._infeasible_value(), params=params, distributions=self._codec.distributions,
            user_attrs=attrs, constraints={CONSTRAINT: INFEASIBLE}))

    def _drop(self, dropped: set[Config]) -> None:
        """Fail the trials of configs taken off the queue unmeasured: no result will come."""
        for config in dropped & set(self._running):
            trial = self._running.pop(config)
            trial.set_user_attr("origin", "dropped")
            self.study.tell(trial, state=TrialState.FAIL)

    def _absorb(self, state: SearchState) -> None:
        """Tell results in the state that `observe` has not delivered yet."""
        fresh = [r for c, r in state.results.items() if self._told.get(c) != r]
        if fresh:
            self.observe(fresh)

    def _value(self, median_ms: float | None) -> float:
        if median_ms is None:
            raise ValueError("an ok result without a timing")
        value = math.log(max(median_ms, 1e-9))
        self._worst = value if self._worst is None else max(self._worst, value)
        return value

    def _infeasible_value(self) -> float:
        return 0.0 if self._worst is None else self._worst

    # ---- explaining ----------------------------------------------------------------
    def _n_done(self) -> int:
        """Finished trials as TPE counts them (COMPLETE and PRUNED) for its startup phase."""
        states = (TrialState.COMPLETE, TrialState.PRUNED)
        return len(self.study.get_trials(deepcopy=False, states=states))

    def _why(self, number: int, config: Config, done: int, state: SearchState, free: int) -> str:
        label = self.sampler_label
        if done < self.n_startup:
            body = f"startup random sample, {done} of {self.n_startup} trials told before {label} takes over"
        else:
            body = f"{label} model of {done} finished trials; {_relation(config, state.best())}"
        if free:
            body += f"; {free} invalid or seen suggestions told without running"
        return f"{label} trial {number}: {body}"

    def _valid_configs(self) -> list[Config]:
        if self._valid is None:
            self._valid = self.ctx.space.valid(self.ctx.problem)
        return self._valid


def _relation(config: Config, best: Result | None) -> str:
    """Where a config lies from the best result: near it (exploit) or far (explore)."""
    if best is None:
        return "explore, no timing yet"
    diffs = [f"{k} {best.config.get(k)}->{v}" for k, v in config.items() if best.config.get(k) != v]
    if len(diffs) <= max(1, len(config) // 2):
        return f"exploit near best ({best.median_ms:.4g} ms): {', '.join(diffs)}"
    return f"explore, {len(diffs)} of {len(config)} params differ from best ({best.median_ms:.4g} ms)"
