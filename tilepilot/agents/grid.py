"""`grid`: the space in its stable order (`SearchSpace.__iter__`), skipping invalid and seen configs.

A baseline: it ignores results. Configs another proposer already took are skipped, so the
grid stays exhaustive without measuring anything twice.
"""

from __future__ import annotations

from tilepilot.agents.base import Proposer, ProposerContext, SearchState
from tilepilot.experiments import Candidate, Config


class GridProposer(Proposer):
    name = "grid"
    exhaustive = True

    def __init__(self, ctx: ProposerContext) -> None:
        super().__init__(ctx)
        self._valid: list[Config] | None = None  # computed on the first propose

    def propose(self, state: SearchState, n: int) -> list[Candidate]:
        if self._valid is None:
            self._valid = self.ctx.space.valid(self.ctx.problem)
        seen = state.seen
        out: list[Candidate] = []
        for i, config in enumerate(self._valid, start=1):
            if len(out) >= n:
                break
            if config not in seen:
                why = f"grid point {i} of {len(self._valid)} valid configs (space order)"
                out.append(Candidate(self.ctx.problem, config, self.name, why))
        return out
