"""The hypothesis ledger's offline agents: the judge, the miner, and the lab that runs both.

- `judge` decides from results only. Its pairs are configs identical except the hypothesis'
  parameter, both `ok`, on a problem in scope, and drawn at random to test it (a side queued
  for it: `Observation.tests`); the effect is the geometric mean of median_ms(b) /
  median_ms(a). The noise is the measured spread of the timings (their rel_spread, at least
  `NOISE_FLOOR`); the interval uses the spread of the paired ratios, at least the campaign's
  typical one (paired ratios are heavy-tailed: a few that agree do not show their spread).
  Validated: at least `MIN_PAIRS` pairs, the effect beyond 1 + noise, its 95% t-interval above
  1, a sign test (a faster in enough pairs), and no problem in scope whose pairs (two or more)
  favour b beyond the noise. Ruled out: at least `MIN_PAIRS` pairs and the interval below 1
  (confidently the other way), or `MIN_PAIRS_NULL` pairs and the interval below 1 + noise
  (confidently within the noise). Otherwise testing, and inconclusive when no more pairs can
  be had (no budget left in scope, `MAX_PAIRS` reached, or the campaign ends).
- `HypothesisMiner` (in `miner.py`) proposes hypotheses from the results so far and names
  the experiments that would settle each (random pairs in scope).
- `HypothesisLab` holds a campaign's active hypotheses and turns new results into a `Step`:
  hypotheses to store, verdicts with their evidence, learnings and the candidates to queue.
  It never writes: the campaign driver stores what it returns.
- `check_verdict` compares a verdict with the effect over a full recorded grid (replay).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tilepilot.agents.miner import MAX_ACTIVE, HypothesisMiner, LedgerEntry, _blocked, room_in_scope
from tilepilot.agents.pairs import Observation, Pair, PairIndex, find_pairs
from tilepilot.experiments import Candidate, Config, Environment, Problem, SearchSpace, same_value
from tilepilot.experiments.hypothesis import (
    Evidence,
    Hypothesis,
    HypothesisState,
    Learning,
    Verdict,
    geometric_mean,
)

__all__ = [
    "GridCheck", "HypothesisLab", "HypothesisMiner", "Judgement", "LedgerEntry", "Observation", "Pair",
    "Step", "check_verdict", "find_pairs", "judge",
]

MIN_PAIRS = 5  # fewer pairs never decide
MAX_PAIRS = 12  # an effect not settled by this many pairs is inconclusive
NOISE_FLOOR = 0.01  # relative; a spread below it is not believed
SIGN_P = 0.15  # one-sided sign-test p-value a validation needs
# Paired log-ratios are heavy-tailed (on the recorded H100 grid their standard deviation over a
# scope is 0.11 to 0.87): a few pairs that happen to agree do not show a small spread.
SPREAD_FLOOR = 0.1  # least standard deviation of the paired log-ratios believed
ADAPTIVE_SPREAD = True
MIN_PAIRS_NULL = 8  # pairs needed to rule an effect out as within the noise
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)  # Student t, 97.5% quantile, df = 1..30


# ---- pairs and the judge -----------------------------------------------------------------------

def _t975(df: int) -> float:
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.5 / df


def _against(pairs: Sequence[Pair], tau: float) -> list[str]:
    """The problems whose pairs (two or more) clearly favour b on average: the claim fails there."""
    by_problem: dict[Problem, list[float]] = {}
    for p in pairs:
        by_problem.setdefault(p.a.problem, []).append(math.log(p.ratio))
    return [p.label() for p, x in by_problem.items() if len(x) >= 2 and statistics.fmean(x) < -tau]


def _sign_p(wins: int, n: int) -> float:
    """P(at least `wins` of `n` fair coin flips come up heads)."""
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n


@dataclass(frozen=True)
class Judgement:
    hypothesis: Hypothesis
    verdict: Verdict
    evidence: tuple[Evidence, ...]
    previous: HypothesisState  # the state before this judgement


def judge(h: Hypothesis, observations: Iterable[Observation], *, final: bool = False,
          spread: float = SPREAD_FLOOR, pairs: Sequence[Pair] | None = None) -> tuple[Verdict, list[Evidence]]:
    """The verdict the results give `h`, and the pairs it rests on (see the module docstring).

    `final`: no more results will come (the campaign ends), so an undecided hypothesis is
    inconclusive rather than testing. `spread`: the least standard deviation of the paired
    log-ratios to believe (the lab passes the campaign's typical spread). `pairs`: the drawn pairs
    of `h` among the observations, where the caller has them already (the lab's `PairIndex`).
    """
    if pairs is None:
        pairs = find_pairs(h, observations, drawn=True)
    noise = max(NOISE_FLOOR, statistics.median(p.spread for p in pairs)) if pairs else NOISE_FLOOR
    evidence = [Evidence(h.id, p.a.key, p.b.key, p.a.problem.key(), p.ratio,
                         "supports" if p.ratio > 1 + noise else "refutes") for p in pairs]
    undecided = HypothesisState.INCONCLUSIVE if final else HypothesisState.TESTING
    n = len(pairs)
    if n == 0:
        return Verdict(h.id, undecided, 0, 0, 0, None, None, None, noise, "no paired configs in scope yet"), evidence
    x = [math.log(p.ratio) for p in pairs]
    wins, losses = sum(v > 0 for v in x), sum(v < 0 for v in x)
    mean = statistics.fmean(x)
    sd = max(statistics.stdev(x) if n > 1 else 0.0, noise, spread)
    half = _t975(n - 1) * sd / math.sqrt(n) if n > 1 else math.inf
    lo, hi = mean - half, mean + half
    tau = math.log1p(noise)
    effect, ci = math.exp(mean), (math.exp(lo), math.exp(hi) if math.isfinite(hi) else None)
    summary = (f"{n} pair(s), {h.param}={h.a} faster in {wins}; effect {effect:.3f}x"
               + (f" (95% CI {ci[0]:.3f}-{ci[1]:.3f}x)" if ci[1] is not None else "")
               + f", noise {noise:.1%}")
    against = _against(pairs, tau)
    if n >= MIN_PAIRS and lo > 0 and mean > tau and _sign_p(wins, n) <= SIGN_P and not against:
        state, why = HypothesisState.VALIDATED, "validated: effect beyond the noise"
    elif (n >= MIN_PAIRS and hi < 0) or (n >= MIN_PAIRS_NULL and hi < tau):
        why = "ruled out: confidently the other way" if hi < 0 else "ruled out: confidently within the noise"
        state = HypothesisState.RULED_OUT
    else:
        state = HypothesisState.INCONCLUSIVE if n >= MAX_PAIRS else undecided
        why = f"{state}: " + ("too few pairs" if n < MIN_PAIRS else f"{h.param}={h.b} is faster on {against[0]}"
                              if against else "the interval spans the threshold")
        if n >= MAX_PAIRS:
            why += f" after {n} pairs"
    verdict = Verdict(h.id, state, n, wins, losses, effect, ci[0] if ci[1] is not None else None, ci[1], noise,
                      f"{why}; {summary}")
    return verdict, evidence


# ---- checking a verdict against a full grid ----------------------------------------------------

@dataclass(frozen=True)
class GridCheck:
    hypothesis_id: str
    state: HypothesisState
    effect: float | None  # the verdict's effect
    grid_pairs: int  # pairs in scope over the whole grid
    grid_effect: float | None  # the geometric mean over them
    threshold: float  # 1 + the verdict's noise
    agrees: bool | None  # None: undecided verdict, or no pair in the grid
    same_direction: bool | None  # a weaker check: validated and the grid effect above 1


def check_verdict(h: Hypothesis, v: Verdict, grid: Iterable[Observation]) -> GridCheck:
    """Compare a verdict with the true paired effect over every recorded pair in scope.

    Validated agrees when the grid effect exceeds 1 + noise; ruled out agrees when it does
    not. Undecided verdicts are not scored.
    """
    pairs = find_pairs(h, grid)
    g = geometric_mean([p.ratio for p in pairs]) if pairs else None
    threshold = 1.0 + v.noise
    agrees = same = None
    if g is not None and v.state is HypothesisState.VALIDATED:
        agrees, same = g > threshold, g > 1.0
    elif g is not None and v.state is HypothesisState.RULED_OUT:
        agrees = same = g <= threshold
    return GridCheck(h.id, v.state, v.effect, len(pairs), g, threshold, agrees, same)


# ---- the lab -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    proposed: tuple[Hypothesis, ...] = ()
    judgements: tuple[Judgement, ...] = ()
    learnings: tuple[Learning, ...] = ()
    candidates: tuple[Candidate, ...] = ()


class HypothesisLab:
    """A campaign's hypotheses: mines, judges and asks for experiments; stores nothing itself.

    `ledger`: hypotheses of earlier campaigns on this kernel and device (not re-proposed when
    decided); `resumed`: this campaign's own, when it resumes. Deterministic for a seed.
    """

    def __init__(self, *, kernel: str, origin: str, env: Environment, spaces: Mapping[Problem, SearchSpace],
                 seed: int = 0, ledger: Sequence[LedgerEntry] = (), resumed: Sequence[LedgerEntry] = ()) -> None:
        self.env = env
        self.spaces = dict(spaces)
        self.miner = HypothesisMiner(kernel=kernel, device=env.device, origin=origin, spaces=spaces, seed=seed)
        self.known: list[LedgerEntry] = list(ledger)
        self.states: dict[str, HypothesisState] = {}
        self.hypotheses: dict[str, Hypothesis] = {}
        self._pairs: dict[str, int] = {}
        self._step_spread: float | None = None
        # the drawn pairs of every hypothesis, indexed as observations arrive (see `_feed`)
        self._index = PairIndex()
        self._blocks: dict[Problem, _Block] | None = {}
        self._sds: dict[str, tuple[Hypothesis, int, float]] = {}  # stdev of log-ratios by pair count
        for e in resumed:
            self.hypotheses[e.hypothesis.id] = e.hypothesis
            self.states[e.hypothesis.id] = e.state

    @property
    def active(self) -> list[Hypothesis]:
        return [h for hid, h in self.hypotheses.items() if not self.states[hid].terminal]

    def step(self, observations: Sequence[Observation], *, seen: Mapping[Problem, set[Config]],
             room: Mapping[Problem, int], pending: Mapping[str, int], final: bool = False) -> Step:
        """Judge the active hypotheses, mine new ones, and name the experiments to queue.

        `seen`: configs tried or queued per problem; `room`: experiments the lab may still
        queue per problem; `pending`: queued experiments per hypothesis id.
        """
        room = dict(room)
        self._feed(observations)
        self._step_spread = None  # computed once per step, on the first judgement
        judgements, learnings = self._judge_all(observations, room, pending, final)
        proposed: list[Hypothesis] = []
        if not final:
            entries = self.known + [LedgerEntry(h, self.states[h.id], here=True) for h in self.hypotheses.values()]
            for h in self.miner.mine(observations, known=entries, room=room, max_new=MAX_ACTIVE - len(self.active)):
                self.hypotheses[h.id], self.states[h.id] = h, HypothesisState.PROPOSED
                proposed.append(h)
                j, learned = self._judge_one(h, observations, room, pending, final=False)
                judgements.extend(j)
                learnings.extend(learned)
        candidates = [] if final else self._experiments(seen, room, pending, judgements)
        return Step(tuple(proposed), tuple(judgements), tuple(learnings), tuple(candidates))

    def adopt(self, hypotheses: Sequence[Hypothesis], *, room: Mapping[Problem, int]) -> list[tuple[Hypothesis, str]]:
        """Take hypotheses stated outside the lab (by a proposer: the `llm`) under the rules its own
        follow: a parameter and values this campaign searches, not a question the ledger asks already
        of overlapping problems, fewer than MAX_ACTIVE under test, room in scope for a pair. Each is
        restated with this campaign's origin (so the same claim gets the same id whoever states it).
        Returns each with "" when taken (then judged and tested like a mined one), else the reason."""
        out: list[tuple[Hypothesis, str]] = []
        for given in hypotheses:
            m = self.miner
            h = Hypothesis.new(origin=m.origin, kernel=m.kernel, device=m.device, param=given.param, a=given.a,
                               b=given.b, scope=given.scope, rationale=given.rationale, source=given.source)
            entries = self.known + [LedgerEntry(g, self.states[g.id], here=True) for g in self.hypotheses.values()]
            values = m.choices.get(h.param, ())
            if not all(any(same_value(x, v) for v in values) for x in (h.a, h.b)):
                why = f"{h.param}={h.a} or {h.param}={h.b} is not searched in this campaign"
            elif _blocked(h, entries):
                why = "the ledger asks this question of overlapping problems already"
            elif len(self.active) >= MAX_ACTIVE:
                why = f"{MAX_ACTIVE} hypotheses are under test already"
            elif room_in_scope(h, room) < 2:
                why = "no budget left in its scope for a pair"
            else:
                self.hypotheses[h.id], self.states[h.id] = h, HypothesisState.PROPOSED
                why = ""
            out.append((h, why))
        return out

    def _judge_all(self, observations: Sequence[Observation], room: Mapping[Problem, int],
                   pending: Mapping[str, int], final: bool) -> tuple[list[Judgement], list[Learning]]:
        judgements: list[Judgement] = []
        learnings: list[Learning] = []
        for h in self.active:
            j, learned = self._judge_one(h, observations, room, pending, final=final)
            judgements.extend(j)
            learnings.extend(learned)
        return judgements, learnings

    def _judge_one(self, h: Hypothesis, observations: Sequence[Observation], room: Mapping[Problem, int],
                   pending: Mapping[str, int], *, final: bool) -> tuple[list[Judgement], list[Learning]]:
        if self._step_spread is None:
            self._step_spread = self._spread(observations)
        verdict, evidence = judge(h, observations, final=final, spread=self._step_spread,
                                  pairs=self._index.drawn(h))
        previous = self.states[h.id]
        if verdict.state is HypothesisState.TESTING:
            if not pending.get(h.id) and room_in_scope(h, room) == 0 and previous is HypothesisState.TESTING:
                verdict = _restate(verdict, HypothesisState.INCONCLUSIVE, "no budget left in scope for more pairs")
            elif previous is HypothesisState.PROPOSED:
                verdict = _restate(verdict, HypothesisState.PROPOSED)
        if verdict.state is previous and self._pairs.get(h.id) == verdict.pairs:
            return [], []
        self.states[h.id], self._pairs[h.id] = verdict.state, verdict.pairs
        learned: list[Learning] = []
        if verdict.state is HypothesisState.VALIDATED:
            keys = [k for e in evidence if e.relation == "supports" for k in (e.experiment_a, e.experiment_b)]
            learned.append(Learning.from_verdict(h, verdict, torch=self.env.torch, triton=self.env.triton,
                                                 evidence=keys))
        return [Judgement(h, verdict, tuple(evidence), previous)], learned

    def _spread(self, observations: Sequence[Observation]) -> float:
        """The typical spread of paired log-ratios in this campaign: the median, over its
        hypotheses with MIN_PAIRS drawn pairs or more, of their standard deviation; SPREAD_FLOOR
        until there is one. A few pairs of one hypothesis that happen to agree say little about
        the tails of its effect; the other hypotheses' pairs show how wide effects spread here."""
        if not ADAPTIVE_SPREAD:
            return SPREAD_FLOOR
        sds = []
        for h in self.hypotheses.values():
            pairs = self._index.drawn(h)  # grows only: the same count is the same pairs
            if len(pairs) < MIN_PAIRS:
                continue
            known = self._sds.get(h.id)
            if known is None or known[0] is not h or known[1] != len(pairs):
                known = self._sds[h.id] = (h, len(pairs), statistics.stdev([math.log(p.ratio) for p in pairs]))
            sds.append(known[2])
        return statistics.median(sds) if sds else SPREAD_FLOOR

    def _feed(self, observations: Sequence[Observation]) -> None:
        """Index what arrived since the last step. The driver hands each step every observation so
        far, each problem's in one run, in the order they came, a run extending the last step's:
        only each run's new tail is read (a run is recognised by its length, first and last
        observation). Anything else (a list in another order, one that lost observations) is indexed
        again from scratch."""
        found = _extension(observations, self._blocks) if self._blocks is not None else None
        if found is None:
            self._index, self._sds = PairIndex(), {}
            found = _extension(observations, {})
            self._blocks = found[1] if found is not None else None
            self._index.add(observations)
            return
        new, self._blocks = found
        self._index.add(new)

    def _experiments(self, seen: Mapping[Problem, set[Config]], room: dict[Problem, int],
                     pending: Mapping[str, int], judgements: list[Judgement]) -> list[Candidate]:
        taken: dict[Problem, set[Config]] | None = None  # copied when a hypothesis first asks
        out: list[Candidate] = []
        for h in self.active:
            if pending.get(h.id):
                continue
            if taken is None:
                taken = {p: set(configs) for p, configs in seen.items()}
            pairs = self._pairs.get(h.id, 0)
            want = min(max(MIN_PAIRS - pairs, 2), MAX_PAIRS - pairs)
            cands = self.miner.experiments(h, seen=taken, room=room, pairs=want)
            for c in cands:
                taken.setdefault(c.problem, set()).add(c.config)
                room[c.problem] -= 1
            out.extend(cands)
            if cands and self.states[h.id] is HypothesisState.PROPOSED:
                self.states[h.id] = HypothesisState.TESTING
                last = next((j.verdict for j in judgements if j.hypothesis.id == h.id), None)
                verdict = _restate(last or judge(h, [])[0], HypothesisState.TESTING, "experiments queued")
                judgements.append(Judgement(h, verdict, (), HypothesisState.PROPOSED))
        return out


_Block = tuple[int, Observation, Observation]  # a problem's run of observations: length, first, last


def _extension(observations: Sequence[Observation],
               blocks: Mapping[Problem, _Block]) -> tuple[list[Observation], dict[Problem, _Block]] | None:
    """The observations not in `blocks` and the runs now, when `observations` holds one run per
    problem, each extending its run in `blocks` (every problem of `blocks` present); None otherwise."""
    new: list[Observation] = []
    runs: dict[Problem, _Block] = {}
    i, n = 0, len(observations)
    while i < n:
        p = observations[i].problem
        if p in runs:
            return None  # a problem in two runs
        count, first, last = blocks.get(p, (0, None, None))
        if count and (i + count > n or observations[i] is not first or observations[i + count - 1] is not last):
            return None
        j = i + count
        while j < n and (observations[j].problem is p or observations[j].problem == p):
            j += 1
        new.extend(observations[i + count:j])
        runs[p] = (j - i, observations[i], observations[j - 1])
        i = j
    if any(p not in runs for p in blocks):
        return None
    return new, runs


def _restate(v: Verdict, state: HypothesisState, why: str | None = None) -> Verdict:
    """The same figures under another state; the reason keeps its summary after "; "."""
    summary = v.reason.partition("; ")[2]
    head = f"{state}: {why}" if why else str(state)
    return Verdict(v.hypothesis_id, state, v.pairs, v.wins, v.losses, v.effect, v.ci_low, v.ci_high, v.noise,
                   f"{head}; {summary}" if summary else head)
