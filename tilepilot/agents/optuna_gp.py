"""`optuna-gp`: the `optuna` proposer with Optuna's GP sampler, asking ahead in a background thread.

What differs from TPE (`optuna.OptunaProposer`, whose telling and asking this reuses):
- The sampler is `GPSampler` (Matern-5/2 GP with ARD; log constrained EI, and its q-batch form
  over the RUNNING trials, so configs asked and not yet measured count as pending points).
  Constraints go through `trial.set_constraint` (its `constraints_func` is deprecated in
  Optuna 5). It fits a GP per ask (seconds on a CPU), so:
- The GP reads only COMPLETE trials, FAIL ones not at all (as TPE), but unlike TPE it fits its
  objective model to the values of infeasible trials too. An infeasible trial carries the worst
  feasible value so far; until there is one, infeasible tells are held (their trials stay
  RUNNING, so the GP stays in its random startup) and told when the first timing arrives.
- A suggestion that needs no run (invalid or seen) is told at once as with TPE, but instead of
  asking again (another fit) the unseen valid config nearest to it (in the study's normalised
  coordinates; categorical: equal or not) is enqueued and asked: one fit per candidate.
  Categorical parameters are categorical to the GP (Optuna's GP gives them their own kernel).

Asking ahead (the default; `GpSettings(synchronous=True)` asks inline, deterministic, for tests
and benchmarks): a background thread keeps up to `ahead` asked configs ready (their trials
RUNNING: pending to the GP, constant-liar style). `propose` hands out what is ready and returns
at once, fewer than `n` or none when nothing is; `observe` queues results, which the thread
tells before its next ask, so results that arrive during a fit are not lost. One lock serialises
every use of the study (Optuna's in-memory study is not safe across threads for ask/tell);
`propose` and `observe` never take it, they meet the thread through a short hand-off lock.
With `wait_when_empty` (the default when the proposer runs alone: an empty list would end its
campaign) `propose` waits for one config when nothing is ready and the space is not exhausted;
the portfolio runs it without, so a round never waits and its slots go to the other members.
`close` stops the thread (after the fit in progress) and fails the trials still running.

Optuna's GP imports torch and scipy (CPU only; it sets torch's intra-op threads to 1); the
proposer is unavailable where scipy is missing.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import math
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import Trial, TrialState

from tilepilot.agents.base import ProposerContext, SearchState
from tilepilot.agents.optuna import OptunaProposer
from tilepilot.experiments import Candidate, Config, Result

log = logging.getLogger(__name__)
EXIT_WAIT_S = 30.0  # at interpreter exit, how long a fit in progress may take to finish
_LIVE: weakref.WeakSet[OptunaGpProposer] = weakref.WeakSet()  # with a thread, not yet closed


@dataclass(frozen=True)
class GpSettings:
    synchronous: bool = False  # True: ask inside `propose` (deterministic; blocks for each fit)
    ahead: int = 4  # configs the background thread keeps ready (at least the last `n` asked for)
    wait_when_empty: bool = True  # nothing ready: wait for one config rather than return none
    free_asks: int = 1  # suggestions told at once (invalid or seen) before the nearest unseen config


class OptunaGpProposer(OptunaProposer):
    name = "optuna-gp"
    sampler_label = "GP"

    def __init__(self, ctx: ProposerContext, settings: GpSettings | None = None) -> None:
        self.settings = settings or GpSettings()
        super().__init__(ctx)
        self._held: list[Trial] = []  # infeasible, told once a feasible value exists
        self._held_added: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self._lock = threading.RLock()  # the study and the state of the base class
        self._cond = threading.Condition()  # the hand-off below, between callers and the thread
        self._inbox: list[Result] = []
        self._delivered: dict[Config, Result] = {}
        self._dropped: set[Config] = set()  # handed to the thread to fail
        self._drop_box: set[Config] = set()
        self._ready: list[Candidate] = []
        self._snapshot = SearchState()
        self._want = self.settings.ahead
        self._dry = False  # the thread found no unseen valid config
        self._stop = False
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._error_raised = False

    @classmethod
    def unavailable(cls) -> str | None:
        if importlib.util.find_spec("scipy") is None:
            return "proposer 'optuna-gp' needs scipy (Optuna's GPSampler fits with it): pip install scipy"
        return None

    def _sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.GPSampler(seed=self.ctx.seed, n_startup_trials=self.n_startup,
                                         warn_independent_sampling=False)

    # ---- the contract --------------------------------------------------------------
    def propose(self, state: SearchState, n: int) -> list[Candidate]:
        if self.settings.synchronous:
            with self._lock:
                return super().propose(state, n)
        return self._propose_ready(state, n, wait=self.settings.wait_when_empty)

    def propose_waiting(self, state: SearchState, n: int) -> list[Candidate]:
        """`propose`, but when nothing is ready and the space is not exhausted, wait for one config
        (for a caller to whom an empty list would mean the end)."""
        if self.settings.synchronous:
            return self.propose(state, n)
        return self._propose_ready(state, n, wait=True)

    def observe(self, results: Sequence[Result]) -> None:
        if self.settings.synchronous:
            with self._lock:
                super().observe(results)
            return
        for r in results:
            self._check_problem(r)
        with self._cond:
            self._deliver(results)
            self._cond.notify_all()
        self._raise_error()

    def close(self) -> None:
        self._halt(None)
        _LIVE.discard(self)
        with self._lock:
            if self._error is None:  # the thread's last results, then what is left
                self._settle(self._inbox, self._drop_box)
                self._inbox, self._drop_box = [], set()
            self._release_held()
            super().close()
        if not self._error_raised:
            self._raise_error()

    # ---- asking ahead --------------------------------------------------------------
    def _propose_ready(self, state: SearchState, n: int, *, wait: bool) -> list[Candidate]:
        self._raise_error()
        if n <= 0:
            return []
        exhausted = all(c in state.seen for c in self._valid_configs())
        with self._cond:
            self._deliver(state.results.values())
            self._drop_box |= state.dropped - self._dropped
            self._dropped |= state.dropped
            self._snapshot = SearchState(pending=set(state.pending), dropped=set(state.dropped))
            self._want = max(self.settings.ahead, n)
            out = [] if exhausted else self._take(state, n)
            self._start()
            self._cond.notify_all()
            while wait and not out and not exhausted and not (self._dry or self._stop or self._error):
                self._cond.wait()
                out = self._take(state, n)
        self._raise_error()
        return out

    def _take(self, state: SearchState, n: int) -> list[Candidate]:
        """Up to n ready candidates still unseen; the stale ones leave the buffer (holding the hand-off lock)."""
        out: list[Candidate] = []
        keep: list[Candidate] = []
        for cand in self._ready:
            if cand.config in state.seen or cand.config in self._delivered:
                continue  # someone else proposed it meanwhile: its result goes to its trial
            (out if len(out) < n else keep).append(cand)
        self._ready = keep
        return out

    def _deliver(self, results: Sequence[Result] | Any) -> None:
        """Queue the results not yet handed to the thread (holding the hand-off lock)."""
        for r in results:
            if self._delivered.get(r.config) != r:
                self._delivered[r.config] = r
                self._inbox.append(r)

    def _start(self) -> None:
        if self._thread is None and not self._stop:
            self._thread = threading.Thread(target=self._work, daemon=True,
                                            name=f"tilepilot-gp {self.ctx.problem.label()}")
            _LIVE.add(self)
            self._thread.start()

    def _halt(self, timeout: float | None) -> None:
        """Stop the thread after the fit in progress (waiting at most `timeout` seconds)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def _work(self) -> None:
        """The background thread: tell what arrived, then ask one config, until stopped."""
        try:
            while True:
                with self._cond:
                    while not (self._stop or self._inbox or self._drop_box or self._wants_more()):
                        self._cond.wait()
                    if self._stop:
                        return
                    inbox, drops, self._inbox, self._drop_box = self._inbox, self._drop_box, [], set()
                    want = self._wants_more()
                    snap = self._snapshot  # what was in flight at the last propose
                    state = SearchState(dict(self._delivered), set(snap.pending), set(snap.dropped))
                with self._lock:
                    self._settle(inbox, drops)
                    cand = self._ask(state, state.seen | set(self._running)) if want else None
                with self._cond:
                    if cand is not None:
                        self._ready.append(cand)
                    elif want:
                        self._dry = True
                    self._cond.notify_all()
        except BaseException as e:  # handed to the caller: propose, observe or close raise it
            log.exception("the GP's background thread failed for %s", self.ctx.problem.label())
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def _wants_more(self) -> bool:
        return not self._dry and len(self._ready) < self._want

    def _settle(self, results: list[Result], drops: set[Config]) -> None:
        """Tell results and fail dropped configs' trials (holding the study lock)."""
        if results:
            OptunaProposer.observe(self, results)
        if drops:
            self._drop(drops)

    def _raise_error(self) -> None:
        if self._error is not None:
            self._error_raised = True
            raise RuntimeError(f"the GP's background thread failed: {self._error!r}") from self._error

    # ---- hooks of the TPE proposer -------------------------------------------------
    def _max_free_asks(self) -> int:
        return self.settings.free_asks

    def _fallback_config(self, unseen: list[Config], last: Config | None) -> tuple[Config, str]:
        if last is None:
            return super()._fallback_config(unseen, last)
        here = self._coordinates(last)
        dist = [sum((a - b) ** 2 for a, b in zip(here, self._coordinates(c), strict=True)) for c in unseen]
        nearest = [c for c, d in zip(unseen, dist, strict=True) if d == min(dist)]
        return self._rng.choice(nearest), f"unseen valid config nearest to its suggestion {last.label()}"

    def _coordinates(self, config: Config) -> list[float]:
        """A config in the study's normalised coordinates (categorical: one 0/1 axis per choice)."""
        params = self._codec.to_params(config) or {}
        out: list[float] = []
        for key, dist in self._codec.distributions.items():
            if isinstance(dist, IntDistribution):
                span = dist.high - dist.low
                out.append((params[key] - dist.low) / span if span else 0.0)
            elif isinstance(dist, CategoricalDistribution):
                out += [float(params[key] == c) / math.sqrt(2) for c in dist.choices]
        return out

    def _tell_infeasible(self, trial: Trial) -> None:
        if self._worst is None:
            self._held.append(trial)  # RUNNING until a feasible value gives it one
        else:
            super()._tell_infeasible(trial)

    def _add_infeasible(self, params: dict[str, Any], attrs: dict[str, Any]) -> None:
        if self._worst is None:
            self._held_added.append((params, attrs))
        else:
            super()._add_infeasible(params, attrs)

    def _on_feasible(self) -> None:
        self._release_held()

    def _release_held(self) -> None:
        held, added = self._held, self._held_added
        self._held, self._held_added = [], []
        for trial in held:
            super()._tell_infeasible(trial)
        for params, attrs in added:
            super()._add_infeasible(params, attrs)

    def _n_done(self) -> int:
        """Finished trials as the GP counts them for its startup phase (COMPLETE only)."""
        return len(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


@atexit.register
def _halt_all() -> None:
    """A proposer never closed must not leave its thread inside a fit while the interpreter exits."""
    for p in list(_LIVE):
        p._halt(EXIT_WAIT_S)
