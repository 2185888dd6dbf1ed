"""`random`: uniform samples of the configs that are valid for the problem and not yet seen.

A baseline: it ignores results. (Inside this module `import random` is the standard library:
imports are absolute.)
"""

from __future__ import annotations

import random

from tilepilot.agents.base import Proposer, ProposerContext, SearchState
from tilepilot.experiments import Candidate, Config


class RandomProposer(Proposer):
    name = "random"

    def __init__(self, ctx: ProposerContext) -> None:
        super().__init__(ctx)
        self._rng = random.Random(ctx.seed)
        self._valid: list[Config] | None = None  # computed on the first propose
        self._count = 0

    def propose(self, state: SearchState, n: int) -> list[Candidate]:
        if self._valid is None:
            self._valid = self.ctx.space.valid(self.ctx.problem)
        seen = state.seen
        unseen = [c for c in self._valid if c not in seen]
        picks = self._rng.sample(unseen, min(max(n, 0), len(unseen)))
        out = []
        for config in picks:
            self._count += 1
            why = (f"random sample {self._count} of the valid space "
                   f"({len(self._valid)} configs, seed {self.ctx.seed})")
            out.append(Candidate(self.ctx.problem, config, self.name, why))
        return out
