"""`portfolio`: each round's slots split among member proposers by the improvement each delivered.

Members (a campaign's `members = [...]` in its [campaign] table, else the defaults: rules,
optuna, random, and llm when it can run here, i.e. with an API key;
without one the portfolio runs without it and says so once in the event log) are full proposers
of the same problem. The llm member calls the model in the background, so a round never waits
for it: until its reply is in, it has nothing to offer and the other members take its slots. So does
`optuna-gp` (not a default member; name it in `members`): its GP asks ahead in a background thread,
and a round takes only what is ready. Should every member come up empty while such a member is still
computing, the round waits for one config of it rather than end the campaign. Every result
goes to every member's `observe`, whoever proposed it, so Optuna learns from the rules'
configs and the rules' model from Optuna's.

Credit: a member's candidate whose result beats the best time so far by more than `IMPROVEMENT`
(relative) is an improvement for that member, and so is the problem's first timing (the first config
that runs at all: without it the member that goes first, by its head start, would start its first
round with nothing to show for it, and lose its lead before the data had said anything). Slots are
given one at a time to the member with the highest upper confidence bound, `(improvements + prior) /
(measured + 2) + explore * sqrt(ln(1 + given) / (1 + member_given))`, where `prior` is a member's
head start: `MODEL_PRIOR` for a member that predicts the problem's configs before anything is
measured (`rules` where the space has a GEMM's tile parameters, its tile model, or is a row-wise
kernel's, its row model) and for `llm`, else its entry in `priors`, so a model leads until the data
says otherwise (with both, they share the first rounds). A floor keeps every member alive, in whole
slots: a member is owed the next slot when `floor` × (slots handed out + 1), rounded down, is more
than it has had. Below that, a small budget is not split among members that cannot learn from a slot
or two (TPE samples at random for its first trials): with a floor of 0.1, the first nine slots
follow the bound alone, so an 8-config campaign is the model's where there is one. A member that has
nothing to offer is skipped and its slots go to the others; the portfolio is exhausted when all are.

Candidates keep their member's prediction and hypothesis; the rationale says who proposed
it, how the round was split and why, then the member's own reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tilepilot.agents.base import Proposer, ProposerContext, ProposerRecords, SearchState
from tilepilot.agents.registry import get_proposer, unavailable
from tilepilot.experiments import Candidate, Config, InputError, Result, Status

DEFAULT_MEMBERS = ("rules", "optuna", "random")
MODEL_PRIOR = 4.0  # head start of a member that predicts the problem's configs before any result
# head start in improvements; others get DEFAULT_PRIOR. rules without a model of the space
# gets 1; llm, which reads the kernel, the space and the results as an engineer would, the model's.
PRIOR_IMPROVEMENTS = {"rules": 1.0, "llm": MODEL_PRIOR}
DEFAULT_PRIOR = 0.5
IMPROVEMENT = 0.005  # a result must beat the best so far by 0.5% (about the timing noise)


@dataclass
class Member:
    name: str
    proposer: Proposer
    prior: float
    given: int = 0  # candidates handed out
    measured: int = 0  # of those, results that count against the budget
    improvements: int = 0

    def mean(self) -> float:
        return (self.improvements + self.prior) / (self.measured + 2.0)

    def summary(self) -> str:
        return f"{self.improvements} improvement{'s' if self.improvements != 1 else ''} in {self.measured}"


@dataclass
class PortfolioSettings:
    members: tuple[str, ...] | None = None  # None: DEFAULT_MEMBERS, and llm when it can run here
    floor: float = 0.1  # least share of all slots each member receives
    explore: float = 0.3  # weight of the UCB exploration term
    priors: dict[str, float] = field(default_factory=lambda: dict(PRIOR_IMPROVEMENTS))
    # How to build a member other than through the registry (e.g. a rules proposer with other
    # constants); the built proposer must carry the member's name.
    builders: dict[str, Callable[[ProposerContext], Proposer]] = field(default_factory=dict)


class PortfolioProposer(Proposer):
    name = "portfolio"

    def __init__(self, ctx: ProposerContext, settings: PortfolioSettings | None = None) -> None:
        super().__init__(ctx)
        self.settings = settings or PortfolioSettings()
        self._builders = dict(self.settings.builders)
        self._notes: list[str] = []
        names = (self.settings.members if self.settings.members is not None
                 else ctx.members or self._default_members())
        if not names or len(set(names)) != len(names) or self.name in names:
            raise InputError(f"portfolio members {names!r} must be distinct proposers other than 'portfolio'")
        self.members = [self._member(n, ctx) for n in names]
        self._owner: dict[Config, Member] = {}
        self._seen_results: dict[Config, Result] = {}
        self._best_ms: float | None = None

    def _default_members(self) -> tuple[str, ...]:
        reason = unavailable("llm")
        if reason:
            self._notes.append(f"portfolio runs without llm: {reason}")
            return DEFAULT_MEMBERS
        self._builders.setdefault("llm", _llm_in_background)
        return (*DEFAULT_MEMBERS, "llm")

    def _member(self, name: str, ctx: ProposerContext) -> Member:
        """A member with its head start: MODEL_PRIOR where it predicts the space's first config
        with nothing measured (a model of the problem), else its entry in `priors`."""
        proposer = self._build(name, ctx)
        first = next(iter(ctx.space), None)
        models = first is not None and proposer.score([first])[0][0] is not None
        return Member(name, proposer, MODEL_PRIOR if models else self.settings.priors.get(name, DEFAULT_PRIOR))

    def _build(self, name: str, ctx: ProposerContext) -> Proposer:
        builder = self._builders.get(name) or IN_BACKGROUND.get(name)
        proposer = builder(ctx) if builder else get_proposer(name)(ctx)
        if proposer.name != name:
            raise TypeError(f"the builder of member {name!r} made a proposer named {proposer.name!r}")
        return proposer

    # ---- the contract --------------------------------------------------------------
    def propose(self, state: SearchState, n: int) -> list[Candidate]:
        self._absorb(state)
        taken: list[tuple[Member, Candidate]] = []
        idle: set[str] = set()  # members with nothing to offer in this round
        while len(taken) < n and len(idle) < len(self.members):
            member = self._next_member(idle)
            pending = state.pending | {c.config for _, c in taken}
            sub = SearchState(results=state.results, pending=pending, dropped=state.dropped)
            got = [c for c in member.proposer.propose(sub, 1) if c.config not in state.seen | pending]
            if not got:
                idle.add(member.name)
                continue
            member.given += 1
            self._owner[got[0].config] = member
            taken.append((member, got[0]))
        if not taken and n > 0:
            taken = self._wait_for_background(state)
        split = self._split(taken)
        return [self._relabel(m, c, split) for m, c in taken]

    def observe(self, results: Sequence[Result]) -> None:
        fresh = []
        for r in results:
            self._check_problem(r)
            if self._seen_results.get(r.config) == r:
                continue
            self._seen_results[r.config] = r
            self._credit(r)
            fresh.append(r)
        if fresh:
            for m in self.members:
                m.proposer.observe(fresh)

    def close(self) -> None:
        for m in self.members:
            m.proposer.close()

    def score(self, configs: Sequence[Config]) -> list[tuple[float | None, str]]:
        """Each config's prediction by the first member (in member order) that makes one."""
        out: list[tuple[float | None, str]] = [(None, "")] * len(configs)
        for m in self.members:
            todo = [i for i, (ms, _) in enumerate(out) if ms is None]
            if not todo:
                break
            for i, got in zip(todo, m.proposer.score([configs[i] for i in todo]), strict=True):
                if got[0] is not None:
                    out[i] = got
        return out

    def best_prediction(self) -> float | None:
        """The first member's (in member order) that makes one: the member `score` asks first."""
        for m in self.members:
            best = m.proposer.best_prediction()
            if best is not None:
                return best
        return None

    def drain_records(self) -> ProposerRecords:
        out = ProposerRecords(notes=tuple(self._notes))
        self._notes = []
        for m in self.members:
            out += m.proposer.drain_records()
        return out

    def _wait_for_background(self, state: SearchState) -> list[tuple[Member, Candidate]]:
        """Every member came up empty: one config from the first that is still computing, if any."""
        for member in self.members:
            waiting = getattr(member.proposer, "propose_waiting", None)
            got = [c for c in waiting(state, 1) if c.config not in state.seen] if waiting else []
            if got:
                member.given += 1
                self._owner[got[0].config] = member
                return [(member, got[0])]
        return []

    # ---- allocation ----------------------------------------------------------------
    def _next_member(self, idle: set[str]) -> Member:
        live = [m for m in self.members if m.name not in idle]
        given = sum(m.given for m in self.members)
        starved = [m for m in live if m.given < math.floor(self.settings.floor * (given + 1))]
        if starved:
            return min(starved, key=lambda m: m.given)  # first in member order on ties
        return max(live, key=lambda m: self._ucb(m, given))  # first in member order on ties

    def _ucb(self, m: Member, given: int) -> float:
        return m.mean() + self.settings.explore * math.sqrt(math.log(1.0 + given) / (1.0 + m.given))

    def _credit(self, r: Result) -> None:
        owner = self._owner.get(r.config)
        if owner is not None and r.status.counts_against_budget:
            owner.measured += 1
        if r.status is not Status.OK or r.median_ms is None:
            return
        if (self._best_ms is None or r.median_ms < self._best_ms * (1.0 - IMPROVEMENT)) and owner:
            owner.improvements += 1
        self._best_ms = r.median_ms if self._best_ms is None else min(self._best_ms, r.median_ms)

    # ---- explaining ----------------------------------------------------------------
    def _split(self, taken: list[tuple[Member, Candidate]]) -> str:
        counts = {m.name: 0 for m in self.members}
        for m, _ in taken:
            counts[m.name] += 1
        parts = [f"{counts[m.name]} to {m.name} ({m.summary()})" for m in self.members]
        return f"{len(taken)} slot{'s' if len(taken) != 1 else ''}: " + ", ".join(parts)

    def _relabel(self, member: Member, cand: Candidate, split: str) -> Candidate:
        why = f"portfolio via {member.name}, {split}; {member.name}: {cand.rationale}"
        return Candidate(cand.problem, cand.config, self.name, why, predicted_ms=cand.predicted_ms,
                         hypothesis_id=cand.hypothesis_id)

    def _absorb(self, state: SearchState) -> None:
        fresh = [r for c, r in state.results.items() if self._seen_results.get(c) != r]
        if fresh:
            self.observe(fresh)


def _gp_in_background(ctx: ProposerContext) -> Proposer:
    from tilepilot.agents.optuna_gp import GpSettings, OptunaGpProposer

    return OptunaGpProposer(ctx, GpSettings(wait_when_empty=False))


IN_BACKGROUND: dict[str, Callable[[ProposerContext], Proposer]] = {"optuna-gp": _gp_in_background}


def _llm_in_background(ctx: ProposerContext) -> Proposer:
    from tilepilot.agents.llm import LlmProposer, LlmSettings

    return LlmProposer(ctx, LlmSettings(wait=False))
