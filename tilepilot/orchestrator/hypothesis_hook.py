"""The campaign driver's hypothesis ledger: after results are stored, judge and mine, store
what the lab decided, and queue the experiments that settle the open hypotheses.

A share of each problem's budget (the campaign's `hypothesis_share`, 10% unless the file says
otherwise; 0 turns the experiments off) is held back from the proposer for those experiments;
it goes back to the proposers once the lab has nothing more to ask, so the budget is always
spent in full. Events: `hypothesis` for each new hypothesis, `verdict`
for each one validated, ruled out or found inconclusive.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tilepilot.agents.hypotheses import HypothesisLab, LedgerEntry, Observation, Step
from tilepilot.experiments import Candidate, Config, Hypothesis, Problem

if TYPE_CHECKING:
    from tilepilot.orchestrator.driver import Driver

log = logging.getLogger(__name__)



def reserve(budget: int, share: float) -> int:
    """Experiments of each problem's budget held back for testing hypotheses."""
    return int(budget * share)


class HypothesisHook:
    """Created by the driver after it restored a resumed campaign; the driver calls
    `after_results()` once per loop turn and `finish()` when the budget is spent."""

    def __init__(self, driver: Driver) -> None:
        self.d = driver
        env = driver.executor.environment
        rows = [r for r in driver.store.hypotheses(kernel=driver.campaign.kernel, device=env.device)
                if r.hypothesis.device == env.device]
        self.lab = HypothesisLab(
            kernel=driver.campaign.kernel, origin=driver.campaign.name, env=env,
            spaces={p: run.space for p, run in driver.runs.items()}, seed=driver.campaign.seed,
            ledger=[LedgerEntry(r.hypothesis, r.state) for r in rows if r.campaign_id != driver.campaign_id],
            resumed=[LedgerEntry(r.hypothesis, r.state) for r in rows if r.campaign_id == driver.campaign_id])
        # which hypothesis each experiment was queued to test: only those pairs are its evidence
        self._tests: dict[tuple[Problem, Config], str] = {
            (r.problem, r.config): t.hypothesis_id
            for t, r in driver.store.campaign_results(driver.campaign_id) if t.hypothesis_id}
        self._tests.update(((c.problem, c.config), c.hypothesis_id) for c in driver.candidates.values()
                           if c.hypothesis_id)
        used = Counter(p.key() for p, _ in self._tests)
        for p, run in driver.runs.items():
            run.reserved = max(0, reserve(driver.campaign.budget, driver.campaign.hypothesis_share) - used[p.key()])
        self._obs: dict[Problem, list[Observation]] = {p: [] for p in driver.runs}  # ok results, in result order
        self._read: dict[Problem, int] = dict.fromkeys(driver.runs, 0)  # results of each problem turned into _obs
        self._results = -1
        self._asked: set[Problem] = set()
        self.writes = 0  # changes written to the campaign's hypotheses so far (the driver re-reads them after one)

    def after_results(self) -> None:
        n = sum(len(run.state.results) for run in self.d.runs.values())
        if n != self._results:
            self._results = n
            if self._idle():
                self._asked = set()  # what an empty step leaves (it asks for nothing)
            else:
                self._step(final=False)
        self._release()

    def finish(self) -> None:
        if not self._idle():
            self._step(final=True)

    def adopt(self, hypotheses: Sequence[Hypothesis]) -> None:
        """Hypotheses a proposer stated (the `llm`): those the lab takes are stored and tested like its
        own (event `hypothesis`); the others are logged with the reason (event `hypothesis_declined`)."""
        store, cid = self.d.store, self.d.campaign_id
        with store.transaction():
            for h, why in self.lab.adopt(hypotheses, room=self._room()):
                if why:
                    store.log_event("hypothesis_declined", f"{h.text} (from {h.source}): {why}", campaign_id=cid,
                                    data={"text": h.text, "source": h.source, "reason": why})
                    continue
                store.add_hypothesis(cid, h)
                self.writes += 1
                store.log_event("hypothesis", f"{h.id}: {h.text} ({h.rationale})", campaign_id=cid,
                                data={"hypothesis": h.id, "text": h.text, "rationale": h.rationale,
                                      "source": h.source})

    # ---- internals ----------------------------------------------------------------------------
    def _room(self) -> dict[Problem, int]:
        d = self.d
        return {p: 0 if run.exhausted else max(0, min(run.reserved, d.campaign.budget - run.counted
                                                      - len(run.state.pending)))
                for p, run in d.runs.items()}

    def _step(self, *, final: bool) -> None:
        d = self.d
        room = self._room()
        pending = Counter(c.hypothesis_id for c in d.candidates.values() if c.hypothesis_id)
        step = self.lab.step(self._observations(), seen={p: run.state.seen for p, run in d.runs.items()},
                             room=room, pending=pending, final=final)
        by_problem: dict[Problem, list[Candidate]] = {}
        for c in step.candidates:
            by_problem.setdefault(c.problem, []).append(c)
            if c.hypothesis_id:
                self._tests[(c.problem, c.config)] = c.hypothesis_id
        self._asked = set(by_problem)
        with d.store.transaction():  # the ledger's changes and the experiments queued, in one commit
            self._store(step)
            for problem, cands in by_problem.items():
                run = d.runs[problem]
                run.reserved -= len(cands)
                d._admit(run, cands)

    def _idle(self) -> bool:
        """True when a step can do nothing: no hypothesis under test (none to judge or test) and no
        room to test a new one in any problem (the miner proposes none without room for a pair, and
        `adopt` takes none): with `hypothesis_share = 0`, or once the reserves are released. The
        step is skipped then, and the results are not even read."""
        return not self.lab.active and not any(self._room().values())

    def _observations(self) -> list[Observation]:
        """The ok results of every problem, each problem's in the order they came: only the results
        that arrived since the last call are read (a result never changes once learned, nor the
        hypothesis it was queued to test)."""
        for p, run in self.d.runs.items():
            results = run.state.results
            start = self._read[p]
            if start == len(results):
                continue
            obs = self._obs[p]
            for config, result in itertools.islice(results.items(), start, None):
                o = Observation.of(self.d._key(p, config), result, self._tests.get((p, config)))
                if o is not None:
                    obs.append(o)
            self._read[p] = len(results)
        return [o for obs in self._obs.values() for o in obs]

    def _store(self, step: Step) -> None:
        store, cid = self.d.store, self.d.campaign_id
        learned = {lrn.hypothesis_id: lrn for lrn in step.learnings}
        if step.proposed or step.judgements:
            self.writes += 1
        with store.transaction():
            for h in step.proposed:
                store.add_hypothesis(cid, h)
                store.log_event("hypothesis", f"{h.id}: {h.text} ({h.rationale})", campaign_id=cid,
                                data={"hypothesis": h.id, "text": h.text, "rationale": h.rationale})
            for j in step.judgements:
                changed = store.record_verdict(j.verdict, j.evidence)
                v = j.verdict
                if changed and v.state.terminal:
                    store.log_event("verdict", f"{v.hypothesis_id} {v.state}: {j.hypothesis.text} ({v.reason})",
                                    campaign_id=cid, data={
                                        "hypothesis": v.hypothesis_id, "state": str(v.state), "pairs": v.pairs,
                                        "effect": v.effect, "learning": learned[v.hypothesis_id].text
                                        if v.hypothesis_id in learned else None})
            for lrn in step.learnings:
                store.add_learning(lrn)

    def _release(self) -> None:
        """Give every reserve back to the proposers once the lab asks for nothing more: no
        hypothesis experiment in flight, none asked for in the last step, and every problem's
        proposer share measured (so no result that could start a new hypothesis is on its way)."""
        runs = self.d.runs.values()
        if self._asked or not any(run.reserved for run in runs):
            return
        budget = self.d.campaign.budget
        if all(run.exhausted or (not run.state.pending and run.counted + run.reserved >= budget) for run in runs):
            log.debug("hypothesis reserves released: %d experiment(s)", sum(run.reserved for run in runs))
            for run in runs:
                run.reserved = 0
