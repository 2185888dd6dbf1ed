"""The campaign driver: proposers → queue → executor → store, until every budget is spent.

One driver per campaign, single-threaded, the store's only writer. A campaign killed at any
point resumes with `resume=True`: finished trials are read back and told to the proposers,
work that was running goes back to the queue, and no experiment is measured twice (an
experiment whose key is already in the store is reused, not re-measured).

The budget counts the configs a campaign measures: a result reused from the store (an earlier
campaign measured the same experiment) is a result of the campaign's own, told to its proposer and
a candidate winner, but free. A campaign on a problem the store holds therefore measures as many
new configs as one on a problem it does not; counting reused results, a second `rules` campaign of
8 configs started cold after a first re-proposed the first's 8 and measured nothing new
(bench/retune.py).

The queue: entries are queued in proposal order (each problem's turns interleave in that
order); after each collected batch the queued entries of the problems that got results are
re-scored (`queue_scoring`: predictions, hypotheses, failure regions), each reordering logged
as a `reordered` event. A new campaign starts with the winners of nearby problems and what the
learnings imply (`warm_start`), unless told not to.

Writes are grouped: each collected batch is one transaction (its experiments, results, trials,
queue rows and events, one statement per table: a kill -9 leaves all of a batch or none of it),
as are each admission of a problem's proposals, each dispatch round and each re-scoring turn.

A person stays in charge: at each step the driver reads the campaign's control ("pause":
dispatch nothing new, what runs finishes; "stop": let what runs finish, mark the campaign
interrupted and return; "": go on) and answers the requests on its queue (promote, drop, pin),
each logged as a `control` event.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from tilepilot.agents.base import Proposer, ProposerContext, SearchState
from tilepilot.agents.registry import get_proposer
from tilepilot.experiments import (
    Campaign,
    Candidate,
    Config,
    Problem,
    Result,
    SearchSpace,
    Status,
    experiment_key,
)
from tilepilot.kernels.base import KernelFamily
from tilepilot.orchestrator.executor import Batch, Executor, record_ceilings
from tilepilot.orchestrator.hypothesis_hook import HypothesisHook
from tilepilot.orchestrator.queue_scoring import (
    KEEP,
    PINNED,
    PROMOTED,
    Entry,
    FailureRegions,
    HypothesisStatus,
    rescore,
    tier_of,
)
from tilepilot.orchestrator.warm_start import Rule, by_prediction, warm_candidates
from tilepilot.storage import cost
from tilepilot.storage.ledger import HypothesisRow, LearningRow
from tilepilot.storage.rows import TrialWrite
from tilepilot.storage.store import QUEUE_REQUESTS, ControlRequest, Store, WinnerRow

log = logging.getLogger(__name__)

INVALID_STREAK_LIMIT = 200  # proposals in a row that break the space's constraints
SAMPLE_EVERY_S = 5.0
TOP_K_REMEASURE = 5  # finalists re-measured interleaved before a winner is declared
IDLE_S = 0.2  # wait per step while paused or stopping with nothing running
HEADS = 64  # queued rows read at once to pick batches from (see `_dispatch`)


@dataclass
class ProblemRun:
    problem: Problem
    space: SearchSpace
    proposer: Proposer
    state: SearchState = field(default_factory=SearchState)
    counted: int = 0  # distinct configs measured against the budget (a result reused from the store is free)
    exhausted: bool = False
    invalid_streak: int = 0
    reserved: int = 0  # budget held back from the proposer for hypothesis experiments
    best_ms: float | None = None  # the fastest median_ms among the results: state.best()'s, kept as they come


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    best_ms: dict[Problem, float]


ProgressFn = Callable[[Progress], None]


class Driver:
    def __init__(
        self,
        campaign: Campaign,
        family: KernelFamily,
        store: Store,
        executor: Executor,
        *,
        spaces: dict[Problem, SearchSpace],
        campaign_id: int,
        batch_size: int = 4,
        first: tuple[Config, ...] = (),
        on_progress: ProgressFn | None = None,
        warm_start: bool = False,
        history: bool | None = None,
    ) -> None:
        self.campaign = campaign
        self.family = family
        self.store = store
        self.executor = executor
        self.campaign_id = campaign_id
        self.batch_size = batch_size
        self.on_progress = on_progress
        self.first = first
        proposer_cls = get_proposer(campaign.proposer)
        self.runs: dict[Problem, ProblemRun] = {}
        ledger = LedgerView(store)
        listed: dict[SearchSpace, ListedSpace] = {}  # problems that share a space share its listings
        for problem in campaign.problems:
            space = listed.setdefault(spaces[problem], ListedSpace.of(spaces[problem]))
            ctx = ProposerContext(kernel=campaign.kernel, problem=problem, space=space,
                                  seed=campaign.seed, budget=campaign.budget,
                                  device=executor.environment.device, ledger=ledger, members=campaign.members,
                                  history=ledger if (warm_start if history is None else history) else None,
                                  kernel_version=executor.kernel_version)
            self.runs[problem] = ProblemRun(problem, space, proposer_cls(ctx))
        self.candidates: dict[int, Candidate] = {}  # queue id -> candidate, for queued/running rows
        self._next_batch = 0
        self._last_sample = 0.0
        self._notes: set[str] = set()  # proposer notes logged already (each once per campaign)
        self.warm_start = warm_start  # queue the winners of nearby problems first (a new campaign only)
        self.stopped = False  # a person stopped the campaign: it is interrupted, not finished
        self._seq = 0  # entries queued so far: each new one goes behind all others (priority -seq)
        self._pinned: set[int] = set()  # queue ids a person pinned (first, whatever the scores)
        self._promoted: set[int] = set()  # queue ids a person moved to the head (left there by re-scoring)
        self._running: set[int] = set()  # queue ids dispatched and not collected yet
        self._admitted: Counter[Problem] = Counter()  # entries queued so far, per problem
        # per problem, what its queue was last re-scored against: (hypotheses, entries admitted, failure regions)
        self._scored: dict[Problem, tuple[tuple[HypothesisStatus, ...], int, int]] = {}
        self._touched: set[Problem] = set()  # problems with results since the queue was last re-scored
        self._failures = FailureRegions(family)
        self._hypothesis_states: dict[str, str] = {}  # this campaign's hypotheses as last re-scored
        self._statuses: tuple[int, list[HypothesisStatus]] = (-1, [])  # (the hook's writes, statuses) last read
        self._paused = False
        self._stopping = False
        self._answered = 0  # the last request answered
        self._keys: dict[tuple[Problem, Config], str] = {}  # experiment keys computed so far (see `_key`)

    # ---- the loop -----------------------------------------------------------------------
    def run(self) -> list[WinnerRow]:
        restored = self._restore()
        record_ceilings(self.executor, self.store, self.campaign_id)  # gpu: once per (device, driver)
        env = self.executor.environment  # the estimate from the history, once (storage/cost.py)
        cost.record_start(self.store, self.campaign_id, kernel=self.campaign.kernel, proposer=self.campaign.proposer,
                          budget=self.campaign.budget, device=env.device, backend=env.backend,
                          kernel_version=self.executor.kernel_version,
                          valid={p: len(run.space.valid(p)) for p, run in self.runs.items()})
        self.hypotheses = HypothesisHook(self)
        self._enqueue_first()
        if self.warm_start and not restored:
            self._enqueue_warm()
        self.store.log_event("campaign_started", f"campaign {self.campaign.name} started on "
                             f"{self.executor.backend} ({self.executor.environment.device})",
                             campaign_id=self.campaign_id,
                             data={"problems": len(self.runs), "budget": self.campaign.budget})
        self._answered = self.store.last_answered_request(self.campaign_id)
        if restored and self.store.clear_control(self.campaign_id, "stop"):
            self.store.log_event("control", "a stop left from the last run is cleared: the campaign resumes",
                                 campaign_id=self.campaign_id, data={"action": "stop", "honoured": False})
        while True:
            self._controls()
            if self._stopping and not self.executor.in_flight():
                return self._stop()
            held = self._paused or self._stopping
            if not held:
                self._fill()
                self._dispatch()
            try:
                self._collect(timeout_s=0.2)
            finally:  # a quarantine that ends the campaign is logged before it raises
                self._log_executor_events()
            self.hypotheses.after_results()
            self._rescore()
            self._sample()
            if self._finished():
                break
            if held and not self.executor.in_flight():
                time.sleep(IDLE_S)
        self.hypotheses.finish()
        winners = [w for w in (self._declare(run) for run in self.runs.values()) if w]
        self._log_executor_events()
        for run in self.runs.values():
            run.proposer.close()
            self._drain(run, adopt=False)
        cost.record_actual(self.store, self.campaign_id)  # GPU-seconds, model cost, beside the estimate
        self.store.set_campaign_state(self.campaign_id, "finished")
        self.store.log_event("campaign_finished", f"campaign {self.campaign.name} finished: "
                             f"{self._done()} trials", campaign_id=self.campaign_id)
        return winners

    def _finished(self) -> bool:
        if self.executor.in_flight() or self.candidates:
            return False
        return all(run.exhausted or run.counted >= self.campaign.budget for run in self.runs.values())

    def _done(self) -> int:
        return sum(run.counted for run in self.runs.values())

    # ---- resume -------------------------------------------------------------------------
    def _restore(self) -> bool:
        """Read back what the campaign did before; True when it had done anything."""
        by_key = {p.key(): run for p, run in self.runs.items()}
        trials = self.store.campaign_results(self.campaign_id)
        for trial, result in trials:
            run = by_key.get(trial.problem_key)
            if run is None or result.config in run.state.results:
                continue
            self._learn(run, result, reused=trial.reused)
        requeued = self.store.requeue_unfinished(self.campaign_id)
        if requeued:
            self.store.log_event("resumed", f"{requeued} unfinished experiment(s) back in the queue",
                                 campaign_id=self.campaign_id)
        for row in self.store.queued(self.campaign_id, states=("dropped",)):
            run = by_key.get(row.problem_key)
            if run is not None and row.config not in run.state.results:
                run.state.dropped.add(row.config)
        queued = self.store.queued(self.campaign_id)
        self._pinned = self.store.pinned_ids(self.campaign_id)
        for row in queued:
            self._seq = max(self._seq, math.ceil(-row.priority))
            run = by_key.get(row.problem_key)
            if run is None:
                continue
            cand = row.candidate
            if cand.config in run.state.results:
                self.store.set_queue_state(row.id, "dropped")
                continue
            self.candidates[row.id] = cand
            run.state.pending.add(cand.config)
            if row.reason == PROMOTED:
                self._promoted.add(row.id)
        self._touched = set(self.runs) if self._failures else set()  # drop what earlier failures rule out
        return bool(trials or queued or requeued)

    # ---- proposals ----------------------------------------------------------------------
    def _enqueue_first(self) -> None:
        """The campaign file's [[configs]] go first, for every problem (once, even on resume)."""
        for run in self.runs.values():
            fresh = [Candidate(run.problem, c, "campaign", "listed in the campaign file's [[configs]]")
                     for c in self.first if c not in run.state.seen]
            self._admit(run, fresh)

    def _enqueue_warm(self) -> None:
        """Winners of nearby problems and what the learnings imply, queued first (see `warm_start`)."""
        env = self.executor.environment
        kernel = self.campaign.kernel
        winners = self.store.winners_of(kernel, env.device)
        statements = {r.id: r.hypothesis for r in self.store.hypotheses(kernel=kernel, device=env.device)}
        rules = [Rule(row.learning, statements[row.learning.hypothesis_id])
                 for row in self.store.learnings(kernel=kernel, device=env.device)
                 if row.learning.hypothesis_id in statements]
        queued = fitting = 0
        for run in self.runs.values():
            room = self.campaign.budget - run.counted - len(run.state.pending)
            cands = warm_candidates(run.problem, run.space, winners, rules, budget=self.campaign.budget,
                                    torch=env.torch, triton=env.triton, skip=run.state.seen)
            fitting += len(cands)
            cands = by_prediction(cands, run.proposer.score, run.proposer.best_prediction())[:max(0, room)]
            if not cands:
                continue
            queued += len(cands)
            self._admit(run, cands)
            self.store.log_event("warm_start", f"{run.problem.label()}: {len(cands)} config(s) first, "
                                 + "; ".join(c.rationale.removeprefix("warm start: ") for c in cands[:3]),
                                 campaign_id=self.campaign_id, data={
                                     "problem": run.problem.key(),
                                     "configs": [{"config": c.config.as_dict(), "source": c.rationale} for c in cands]})
        if not queued:
            why = (f"no winner of {kernel} on {env.device} in the store" if not winners
                   else "no winner of a nearby problem fits this campaign's spaces" if not fitting
                   else "the proposer predicts none of the nearby winners as fast as its own first pick")
            self.store.log_event("warm_start", f"starting cold: {why}", campaign_id=self.campaign_id,
                                 data={"configs": []})

    def _fill(self) -> None:
        active = sum(1 for run in self.runs.values() if not run.exhausted and run.counted < self.campaign.budget)
        limit = pending_limit(self.executor, self.batch_size, problems=active)
        for run in self.runs.values():
            while not run.exhausted:  # again while what it proposed needed no GPU (reused, invalid)
                want = min(self.campaign.budget - run.counted - len(run.state.pending) - run.reserved,
                           limit - len(run.state.pending))
                if want <= 0:
                    break
                proposals = run.proposer.propose(run.state, want)
                self._drain(run)
                if not proposals:
                    run.exhausted = True
                    self.store.log_event("exhausted", f"{run.proposer.name} has nothing more to propose "
                                         f"for {run.problem.label()}", campaign_id=self.campaign_id)
                    break
                # a config dropped off the queue is in `seen`, but a proposer may not have been told (llm)
                proposals = [c for c in proposals if c.config not in run.state.dropped]
                for cand in proposals:
                    if cand.config in run.state.seen:
                        raise RuntimeError(f"{run.proposer.name} proposed a config it had seen: {cand.config}")
                before = (run.counted, len(run.state.pending))
                self._admit(run, proposals)
                if (run.counted, len(run.state.pending)) != before or not proposals:
                    break

    def _drain(self, run: ProblemRun, *, adopt: bool = True) -> None:
        """Store what the proposer recorded: its calls to a model (table `llm_calls`, event `llm_call`),
        its notes (event `proposer`, each once) and, while the campaign runs, the hypotheses it stated
        (the lab takes those its rules allow)."""
        records = run.proposer.drain_records()
        if not records:
            return
        cid = self.campaign_id
        with self.store.transaction():
            for call in records.llm_calls:
                self.store.add_llm_call(cid, call)
                self.store.log_event("llm_call", f"{call.model} for {run.problem.label()}: {call.summary()}",
                                     campaign_id=cid, data={
                                         "model": call.model, "input_tokens": call.input_tokens,
                                         "output_tokens": call.output_tokens, "cost_usd": call.cost_usd,
                                         "error": call.error, "accepted": call.proposals_accepted,
                                         "rejected": call.proposals_rejected})
            for note in records.notes:
                if note not in self._notes:
                    self._notes.add(note)
                    log.info("%s", note)
                    self.store.log_event("proposer", note, campaign_id=cid)
        if adopt and records.hypotheses:
            self.hypotheses.adopt(records.hypotheses)

    def _admit(self, run: ProblemRun, proposals: list[Candidate]) -> None:
        """Settle what needs no GPU; queue the rest in proposal order. One transaction: the settled
        trials, the queue rows and their events commit together."""
        with self.store.transaction():
            fresh = self._settle_without_measuring(run, proposals)
            for cand in fresh:
                run.state.pending.add(cand.config)
            if not fresh:
                return
            priorities = [-float(self._seq + i) for i in range(1, len(fresh) + 1)]  # behind everything queued
            self._seq += len(fresh)
            ids = self.store.enqueue(self.campaign_id, fresh, priorities=priorities,
                                     reasons=[f"in proposal order ({c.proposer})" for c in fresh])
            for qid, cand in zip(ids, fresh, strict=True):
                self.candidates[qid] = cand
            self._admitted[run.problem] += len(ids)
            self.store.log_event("queued", f"{len(fresh)} config(s) queued for {run.problem.label()} "
                                 f"by {fresh[0].proposer}", campaign_id=self.campaign_id)
            if self._failures and not run.proposer.exhaustive:
                self._drop(run, [(qid, why) for qid, cand in zip(ids, fresh, strict=True)
                                 if (why := self._failures.match(run.problem, cand.config))])

    def _drop(self, run: ProblemRun, drops: list[tuple[int, str]], *, by_person: bool = False) -> None:
        """Take queued entries off the queue unmeasured; they are never proposed again."""
        if not drops:
            return
        with self.store.transaction():
            self.store.drop_queued(drops)
            configs = []
            for qid, _ in drops:
                cand = self.candidates.pop(qid)
                run.state.pending.discard(cand.config)
                run.state.dropped.add(cand.config)
                self._promoted.discard(qid)
                self._pinned.discard(qid)
                configs.append(cand.config)
            if not by_person:
                self.store.log_event(
                    "dropped", f"{len(drops)} queued config(s) of {run.problem.label()} dropped: "
                    f"{configs[0].label()}: {drops[0][1].removeprefix('dropped: ')}"
                    + (f"; {len(drops) - 1} more" if len(drops) > 1 else ""),
                    campaign_id=self.campaign_id, data={"problem": run.problem.key(), "dropped": [
                        {"queue_id": qid, "config": c.as_dict(), "reason": why}
                        for (qid, why), c in zip(drops, configs, strict=True)]})

    def _settle_without_measuring(self, run: ProblemRun, proposals: list[Candidate]) -> list[Candidate]:
        """Invalid configs and experiments already in the store need no GPU: their trials are
        recorded (in proposal order, in one write); returns the proposals that need measuring."""
        reasons = [run.space.check(cand.config, run.problem) for cand in proposals]
        found = self.store.lookup_results([self._key(run.problem, cand.config)
                                           for cand, reason in zip(proposals, reasons, strict=True) if not reason])
        settled: list[TrialWrite] = []
        fresh: list[Candidate] = []
        for cand, reason in zip(proposals, reasons, strict=True):
            key = self._key(run.problem, cand.config)
            if reason:
                run.invalid_streak += 1
                if run.invalid_streak >= INVALID_STREAK_LIMIT:
                    run.exhausted = True
                result = Result(problem=run.problem, config=cand.config, status=Status.INVALID,
                                env=self.executor.environment, message=reason)
                settled.append(TrialWrite(key, cand, result))
                continue
            run.invalid_streak = 0
            existing = found.get(key)
            if existing is None:
                fresh.append(cand)
            else:
                settled.append(TrialWrite(key, cand, existing, reused=True))
        self._record(settled)
        return fresh

    # ---- dispatch and collection --------------------------------------------------------
    def _dispatch(self) -> None:
        """Hand batches to the executor while it has room: each the first queued entries of the
        problem at the head of the queue. One transaction for all: their rows 'running', an event
        `started` each."""
        if self.executor.free_slots() <= 0:
            return
        with self.store.transaction():
            started = self._dispatch_batches()
            self.store.log_events(started, campaign_id=self.campaign_id)

    def _dispatch_batches(self) -> list[tuple[str, str, None]]:
        """Submit the batches; returns their events."""
        started: list[tuple[str, str, None]] = []
        heads: list[tuple[int, str]] = []
        complete = False  # `heads` holds every queued row, not only the first HEADS
        while self.executor.free_slots() > 0:
            picked = _pick(heads, self.batch_size)
            if len(picked) < self.batch_size and not complete:
                # the rows read last time, less those dispatched since, are the head of the queue as
                # it is now; a batch they cannot fill is picked again from a fresh read
                heads = self.store.queue_heads(self.campaign_id, limit=HEADS)
                complete = len(heads) < HEADS
                picked = _pick(heads, self.batch_size)
            if not picked:
                break
            taken = set(picked)
            heads = [h for h in heads if h[0] not in taken]
            problem = self.candidates[picked[0]].problem
            batch = Batch(self._next_batch, problem, tuple(self.candidates[qid].config for qid in picked),
                          tuple(picked))
            self._next_batch += 1
            self.store.set_queue_states(picked, "running")
            started.append(("started", f"{len(picked)} config(s) of {problem.label()} started", None))
            self._running.update(picked)
            self.executor.submit(batch)
        return started

    def _collect(self, timeout_s: float) -> None:
        for batch, results in self.executor.poll(timeout_s):
            self._touched.add(batch.problem)
            writes: list[TrialWrite] = []
            for qid, result in zip(batch.queue_ids, results, strict=True):
                cand = self.candidates.pop(qid)
                self._running.discard(qid)
                self._pinned.discard(qid)
                self._promoted.discard(qid)
                writes.append(TrialWrite(self._key(cand.problem, cand.config), cand, result, queue_id=qid,
                                         worker=str(result.extra.get("worker", ""))))
            self._record(writes)  # one commit a batch: its results are stored together
            if self.on_progress:
                best_ms = {p: r.best_ms for p, r in self.runs.items() if r.best_ms is not None}
                self.on_progress(Progress(self._done(), self.campaign.budget * len(self.runs), best_ms))

    def _record(self, writes: list[TrialWrite]) -> None:
        """Store trials (their experiments and results unless reused, the queue rows they ran from,
        an event `finished` or `failed` each) in one transaction, then learn from their results."""
        if not writes:
            return
        with self.store.transaction():
            self.store.record_trials(self.campaign_id, writes, kernel=self.campaign.kernel,
                                     kernel_version=self.executor.kernel_version)
            self.store.log_events([
                ("finished" if w.result.status is Status.OK else "failed", _describe(w.candidate, w.result, w.reused),
                 {"experiment": w.key, "status": str(w.result.status), "median_ms": w.result.median_ms})
                for w in writes], campaign_id=self.campaign_id)
            for w in writes:
                self._learn(self.runs[w.candidate.problem], w.result, reused=w.reused)

    def _learn(self, run: ProblemRun, result: Result, *, reused: bool = False) -> None:
        run.state.pending.discard(result.config)
        replaced = result.config in run.state.results
        run.state.results[result.config] = result
        if replaced:  # never while the driver runs (no config is measured twice): read them all again
            best = run.state.best()
            run.best_ms = best.median_ms if best is not None else None
        elif result.median_ms is not None and (run.best_ms is None or result.median_ms < run.best_ms):
            run.best_ms = result.median_ms
        if result.status.counts_against_budget and not reused:  # a result from the store is free
            run.counted += 1
        run.proposer.observe([result])
        if self._failures.learn(result):
            self._touched.update(self.runs)  # a new failure region: every problem's queue is checked

    # ---- re-scoring the queue ------------------------------------------------------------
    def _rescore(self) -> None:
        """Re-score the queued entries of the problems that got results (see `queue_scoring`)."""
        statuses = self._hypothesis_statuses()
        touched, self._touched = self._touched, set()
        if not touched:
            return
        queued: dict[Problem, list[tuple[int, Candidate]]] = {}  # the entries re-scoring may move, by problem
        for qid, cand in self.candidates.items():
            if qid not in self._running and qid not in self._pinned and qid not in self._promoted:
                queued.setdefault(cand.problem, []).append((qid, cand))
        with self.store.transaction():  # what every problem's re-scoring writes, in one commit
            for run in self.runs.values():
                if run.problem in touched:
                    self._rescore_problem(run, statuses, queued.get(run.problem, []))

    def _rescore_problem(self, run: ProblemRun, statuses: list[HypothesisStatus],
                         queued: list[tuple[int, Candidate]]) -> None:
        if self._rescore_changes_nothing(run, statuses, queued):
            return
        self._scored[run.problem] = (tuple(statuses), self._admitted[run.problem], len(self._failures))
        # the queue rows hold the candidates of `self.candidates`: only their places and reasons are read
        slots = [(qid, priority, reason) for qid, priority, reason in self.store.queue_slots(
                 self.campaign_id, run.problem.key())
                 if qid in self.candidates and qid not in self._pinned and qid not in self._promoted]
        if not slots:
            return
        if self._failures and not run.proposer.exhaustive:
            drops = [(qid, why) for qid, _, _ in slots
                     if (why := self._failures.match(run.problem, self.candidates[qid].config))]
            self._drop(run, drops)
            gone = {qid for qid, _ in drops}
            slots = [s for s in slots if s[0] not in gone]
        entries = [Entry(qid, self.candidates[qid].config, self.candidates[qid].hypothesis_id, priority, reason)
                   for qid, priority, reason in slots]
        out = rescore(run.problem, entries, predict=run.proposer.score, hypotheses=statuses)
        if not out.updates:
            return
        with self.store.transaction():
            self.store.reprioritise(out.updates)
            if out.moves:
                self.store.log_event("reordered", out.message(run.problem), campaign_id=self.campaign_id,
                                     data=out.data(run.problem))

    def _rescore_changes_nothing(self, run: ProblemRun, statuses: list[HypothesisStatus],
                                 queued: list[tuple[int, Candidate]]) -> bool:
        """True when re-scoring the problem's queue can neither drop, move nor re-word an entry, so
        the queue is not read: its proposer predicts nothing (`Proposer.score` not overridden), no
        queued entry is in a failure region and every one stays in its tier (no hypothesis moves
        it); or, with such a proposer, the queue was re-scored against the same hypotheses and
        failure regions and no entry joined it since (entries only left: the rest stay in their
        tiers' order). Then `rescore` keeps each entry's place and reason, and the reading is all
        it costs (the whole queue of the problem, after every batch). `queued`: the problem's entries
        that are neither running, pinned nor promoted."""
        proposer = run.proposer
        if type(proposer).score is not Proposer.score or "score" in vars(proposer):
            return False
        if self._scored.get(run.problem) == (tuple(statuses), self._admitted[run.problem], len(self._failures)):
            return True  # re-scored against the same hypotheses and regions, and only left since: in order
        failures = bool(self._failures) and not proposer.exhaustive
        if not failures and not statuses:
            return True
        for _, cand in queued:
            if failures and self._failures.match(run.problem, cand.config):
                return False
            if statuses and tier_of(run.problem, cand.config, cand.hypothesis_id, statuses)[0] != KEEP:
                return False
        return True

    def _hypothesis_statuses(self) -> list[HypothesisStatus]:
        """This campaign's hypotheses with their latest figures; problems whose entries a verdict
        just changed (in scope, or testing it) are marked for re-scoring."""
        lab = self.hypotheses.lab
        if not lab.hypotheses:
            return []
        states = {hid: str(state) for hid, state in lab.states.items()}
        changed = {hid for hid, state in states.items() if self._hypothesis_states.get(hid) != state}
        self._hypothesis_states = states
        if changed:
            for run in self.runs.values():
                if any(lab.hypotheses[h].scope.contains(run.problem) for h in changed):
                    self._touched.add(run.problem)
            self._touched.update(c.problem for c in self.candidates.values() if c.hypothesis_id in changed)
        if not self._touched:
            return []
        writes = self.hypotheses.writes  # only the hook writes the campaign's hypotheses: read again after it did
        if self._statuses[0] != writes:
            self._statuses = (writes, [HypothesisStatus(r.hypothesis, r.state, r.pairs, r.effect, r.noise)
                                       for r in self.store.hypotheses(campaign_id=self.campaign_id)])
        return list(self._statuses[1])

    # ---- a person's controls --------------------------------------------------------------
    def _controls(self) -> None:
        """Honour the campaign's control and answer the requests on its queue, in order."""
        requests = self.store.requests(self.campaign_id, after=self._answered)
        control = self.store.control(self.campaign_id)
        asked = [r for r in requests if r.action not in QUEUE_REQUESTS]
        last = asked[-1].id if asked else None
        running = self.executor.in_flight()
        if control == "stop" and not self._stopping:
            self._stopping = True
            back, running = self._withdraw(), self.executor.in_flight()
            self._answer(last, "stop", f"stopping: a person asked; {running} batch(es) running finish first, "
                         f"nothing new starts{back}")
        elif control == "pause" and not self._paused:
            self._paused = True
            back, running = self._withdraw(), self.executor.in_flight()
            self._answer(last, "pause", f"paused by a person: nothing new starts; {running} batch(es) running "
                         f"finish{back}")
        elif control != "pause" and self._paused:
            self._paused = False
            self._answer(last, "resume", "resumed by a person")
        for r in requests:
            if r.action in QUEUE_REQUESTS:
                self._honour(r)
        if requests:
            self._answered = requests[-1].id

    def _withdraw(self) -> str:
        """Take back from the executor what no worker holds yet: those configs are queued again (they
        start after a resume, or on `--resume` after a stop). Returns what to add to the message."""
        batches = self.executor.withdraw()
        ids = [qid for batch in batches for qid in batch.queue_ids]
        self.store.set_queue_states(ids, "queued")
        self._running.difference_update(ids)
        configs = sum(len(b.queue_ids) for b in batches)
        return f"; {configs} config(s) not yet on a worker queued again" if configs else ""

    def _answer(self, request: int | None, action: str, message: str, *, queue_id: int | None = None,
                honoured: bool = True) -> None:
        self.store.log_event("control", message, campaign_id=self.campaign_id, data={
            "request": request, "action": action, "queue_id": queue_id, "honoured": honoured})

    def _honour(self, r: ControlRequest) -> None:
        qid = r.queue_id
        row = self.store.queue_row(qid) if qid is not None else None
        if row is None or row.campaign_id != self.campaign_id or row.state != "queued" or qid not in self.candidates:
            state = "unknown" if row is None or row.campaign_id != self.campaign_id else row.state
            self._answer(r.id, r.action, f"{r.action} of queue entry {qid} not done: it is {state}, not queued",
                         queue_id=qid, honoured=False)
            return
        assert qid is not None
        run = self.runs[row.problem]
        what = f"queue entry {qid} ({run.problem.label()} {row.config.label()})"
        with self.store.transaction():
            if r.action == "drop":
                self._drop(run, [(qid, "dropped by a person")], by_person=True)
                self._answer(r.id, "drop", f"{what} dropped by a person", queue_id=qid)
            elif r.action == "promote":
                self._promoted.add(qid)
                self.store.reprioritise([(qid, self._head(pinned=False) + 1.0, PROMOTED)])
                self._keep_pins_first()
                self._answer(r.id, "promote", f"{what} promoted to the head of the queue by a person", queue_id=qid)
            else:
                self._pinned.add(qid)
                self.store.pin_queued(qid, priority=self._head(pinned=True) + 1.0, reason=PINNED)
                self._answer(r.id, "pin", f"{what} pinned at the head of the queue by a person", queue_id=qid)

    def _head(self, *, pinned: bool) -> float:
        """The highest priority among the queued entries (pinned ones too, or not)."""
        rows = self.store.queued(self.campaign_id, limit=len(self._pinned) + 1)
        top = [r.priority for r in rows if pinned or r.id not in self._pinned]
        return max(top, default=0.0)

    def _keep_pins_first(self) -> None:
        """Pinned entries keep priorities above all others (so every view of the queue agrees)."""
        floor = self._head(pinned=False)
        pins = [r for r in self.store.queued(self.campaign_id, limit=len(self._pinned)) if r.id in self._pinned]
        if pins and min(r.priority for r in pins) <= floor:
            self.store.reprioritise([(r.id, floor + len(pins) - i, r.reason) for i, r in enumerate(pins)])

    def _stop(self) -> list[WinnerRow]:
        """Stop as a person asked: nothing runs now; the campaign is interrupted and can be resumed."""
        for run in self.runs.values():
            run.proposer.close()
            self._drain(run, adopt=False)
        cost.record_actual(self.store, self.campaign_id)  # what it spent so far
        self.store.clear_control(self.campaign_id, "stop")
        self.store.set_campaign_state(self.campaign_id, "interrupted")
        left = len(self.candidates)
        self.store.log_event("campaign_stopped", f"campaign {self.campaign.name} stopped by a person after "
                             f"{self._done()} trials ({left} config(s) left in the queue); resume with "
                             "tilepilot tune --resume", campaign_id=self.campaign_id,
                             data={"trials": self._done(), "queued": left})
        self.stopped = True
        return []

    def _key(self, problem: Problem, config: Config) -> str:
        """The experiment key of (problem, config) here, computed once per campaign: the proposal's
        look-up, its trial, its event and the hypothesis lab's observation all need it."""
        key = self._keys.get((problem, config))
        if key is None:
            key = self._keys[(problem, config)] = experiment_key(
                self.campaign.kernel, self.executor.kernel_version, problem, config, self.executor.environment)
        return key

    def _log_executor_events(self) -> None:
        """What happened to the executor's workers (lost, re-queued, quarantined, ...), as events."""
        for e in self.executor.events():
            self.store.log_event(e.kind, e.message, campaign_id=self.campaign_id, data=e.data)

    def _sample(self) -> None:
        now = time.monotonic()
        if now - self._last_sample < SAMPLE_EVERY_S:
            return
        self._last_sample = now
        samples = self.executor.samples()
        if samples:
            self.store.add_gpu_samples(samples)

    # ---- winners ------------------------------------------------------------------------
    def _declare(self, run: ProblemRun) -> WinnerRow | None:
        ok = sorted((r for r in run.state.results.values() if r.timing is not None),
                    key=lambda r: r.median_ms or 0.0)
        if not ok:
            self.store.log_event("no_winner", f"no config of {run.problem.label()} ran correctly",
                                 campaign_id=self.campaign_id)
            return None
        top = [r.config for r in ok[:TOP_K_REMEASURE]]
        again = [r for r in self.executor.remeasure(run.problem, top) if r.timing] or ok[:1]
        # Each finalist is judged on both of its measurements (geometric mean of the first
        # median and the interleaved one): one noisy reading cannot flip the winner alone.
        score = {r.config: math.sqrt((r.median_ms or 0.0) * (run.state.results[r.config].median_ms or 0.0))
                 for r in again}
        ranked = sorted(again, key=lambda r: score[r.config])
        winner = ranked[0]
        runner = ranked[1] if len(ranked) > 1 else None
        assert winner.timing is not None
        margin = score[runner.config] / score[winner.config] - 1.0 if runner else None
        noise = max(winner.timing.rel_spread, runner.timing.rel_spread if runner and runner.timing else 0.0)
        verdict = self.executor.recheck(run.problem, winner.config)
        base = self.executor.baseline(run.problem)
        row = WinnerRow(
            campaign_id=self.campaign_id,
            problem_key=run.problem.key(),
            experiment_key=self._key(run.problem, winner.config),
            median_ms=winner.timing.median_ms,
            rel_spread=winner.timing.rel_spread,
            runner_up_key=self._key(run.problem, runner.config) if runner else None,
            runner_up_ms=runner.median_ms if runner else None,
            margin=margin,
            tie=bool(margin is not None and margin <= noise),
            recheck_passed=None if verdict is None else verdict.passed,
            recheck_err=None if verdict is None else verdict.max_rel_err,
            median_config_ms=statistics.median(r.median_ms or 0.0 for r in ok),
            baseline_ms=base[1].median_ms if base else None,
            baseline_name=base[0] if base else "",
            decided_at=None,
        )
        self.store.set_winner(row)
        tie = " (a tie within noise with the runner-up)" if row.tie else ""
        self.store.log_event("winner", f"{run.problem.label()}: {winner.config.label()} at "
                             f"{winner.timing.median_ms:.4f} ms{tie}", campaign_id=self.campaign_id,
                             data={"experiment": row.experiment_key})
        return row


class LedgerView:
    """The store's ledger and result reads and nothing else: what proposers may consult (agents
    never write)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def hypotheses(self, *, kernel: str | None = None, device: str | None = None,
                   campaign_id: int | None = None) -> list[HypothesisRow]:
        return self._store.hypotheses(kernel=kernel, device=device, campaign_id=campaign_id)

    def learnings(self, *, kernel: str | None = None, device: str | None = None) -> list[LearningRow]:
        return self._store.learnings(kernel=kernel, device=device)

    def devices(self, kernel: str) -> list[str]:
        return self._store.devices(kernel)

    def measured_problems(self, kernel: str, device: str) -> list[Problem]:
        return self._store.measured_problems(kernel, device)

    def measured(self, kernel: str, device: str, problem: Problem) -> list[tuple[Config, float]]:
        return self._store.measured(kernel, device, problem)

    def kernel_versions(self, kernel: str, device: str, problem: Problem) -> frozenset[str]:
        return self._store.kernel_versions(kernel, device, problem)


def _pick(heads: list[tuple[int, str]], batch_size: int) -> list[int]:
    """The next batch from the head of the queue, (id, problem key) in dispatch order: up to
    `batch_size` rows of the first row's problem."""
    if not heads:
        return []
    first = heads[0][1]
    return [qid for qid, problem_key in heads if problem_key == first][:batch_size]


def _describe(cand: Candidate, result: Result, reused: bool) -> str:
    what = f"{cand.problem.label()} {cand.config.label()}"
    origin = " (from the store)" if reused else ""
    if result.timing is not None:
        return f"{what}: {result.timing.median_ms:.4f} ms{origin}"
    return f"{what}: {result.status}{origin}: {result.message[:200]}"



class ListedSpace(SearchSpace):
    """A search space that lists each problem's valid configs once and hands out copies: the
    driver's start (the campaign's estimate), the proposer and the hypothesis miner all list
    them, and over matmul's full space one listing takes seconds."""

    @classmethod
    def of(cls, space: SearchSpace) -> ListedSpace:
        return space if isinstance(space, ListedSpace) else cls(space.params, space.constraints)

    def valid(self, problem: Problem) -> list[Config]:
        listings: dict[Problem, list[Config]] = self.__dict__.setdefault("_listings", {})
        if problem not in listings:
            listings[problem] = super().valid(problem)
        return list(listings[problem])


def pending_limit(executor: Executor, batch_size: int, *, problems: int = 1) -> int:
    """Configs of one problem queued or in flight at most: the `problems` still searching share
    what keeps the executor busy, and none runs further ahead of its results than its share, or
    one batch where the share is less. What keeps it busy: two batches (one running, one waiting);
    on an executor that compiles ahead (RayExecutor with a compile pool), what the pipeline holds
    at once (the pool's compiles, the compiled batches waiting for a GPU and those the workers
    hold) and a batch more, if that is more. A problem alone gets it all. Where other problems
    keep the GPUs busy, a proposer one batch ahead picks its second batch after its first
    batch's results, not before: at 8 configs a problem, 4 picked after 4 results rather than
    all 8 blind."""
    pool = getattr(executor, "pool", None)
    need = 2 * batch_size
    if pool is not None:
        from tilepilot.orchestrator.ray_executor import READY_PER_GPU

        gpus = sum(1 for slot in getattr(executor, "slots", ()) if not slot.quarantined)
        per_gpu = READY_PER_GPU + int(getattr(executor, "per_worker", 1))
        need = max(need, int(pool.capacity) + per_gpu * gpus * batch_size + batch_size)
    return max(batch_size, -(-need // max(1, problems)))
