"""`random`: uniform samples of the configs that are valid for the problem and not yet seen.

A baseline: it ignores results. (Inside this module `import random` is the standard library:
imports are absolute.)

Each call draws with `random.Random.sample` from the valid configs not seen, in the space's
order. That list is not built: `_Unseen` is a sequence over the listing that skips the seen
positions, so a call costs what was seen, not the size of the space, and draws exactly what
sampling the built list would.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from typing import overload

from tilepilot.agents.base import Proposer, ProposerContext, SearchState
from tilepilot.experiments import Candidate, Config


class RandomProposer(Proposer):
    name = "random"

    def __init__(self, ctx: ProposerContext) -> None:
        super().__init__(ctx)
        self._rng = random.Random(ctx.seed)
        self._valid: list[Config] | None = None  # computed on the first propose
        self._where: dict[Config, int] | None = None  # position of each valid config in _valid
        self._count = 0

    def propose(self, state: SearchState, n: int) -> list[Candidate]:
        valid = self._listing()
        unseen = self._unseen(state)
        picks = self._rng.sample(unseen, min(max(n, 0), len(unseen)))
        out = []
        for config in picks:
            self._count += 1
            why = (f"random sample {self._count} of the valid space "
                   f"({len(valid)} configs, seed {self.ctx.seed})")
            out.append(Candidate(self.ctx.problem, config, self.name, why))
        return out

    def _listing(self) -> list[Config]:
        if self._valid is None:
            self._valid = self.ctx.space.valid(self.ctx.problem)
            where = {c: i for i, c in enumerate(self._valid)}
            self._where = where if len(where) == len(self._valid) else None  # a config listed twice: scan
        return self._valid

    def _unseen(self, state: SearchState) -> Sequence[Config]:
        valid = self._listing()
        if self._where is None:
            seen = state.seen
            return [c for c in valid if c not in seen]
        where = self._where
        positions = {where[c] for part in (state.results, state.pending, state.dropped) for c in part if c in where}
        return _Unseen(valid, sorted(positions))


class _Unseen(Sequence[Config]):
    """`valid` without the configs at the sorted `skipped` positions, in order, as a sequence."""

    def __init__(self, valid: list[Config], skipped: list[int]) -> None:
        self._valid, self._skipped = valid, skipped

    def __len__(self) -> int:
        return len(self._valid) - len(self._skipped)

    @overload
    def __getitem__(self, i: int) -> Config: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[Config]: ...

    def __getitem__(self, i: int | slice) -> Config | Sequence[Config]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        # the i-th unseen sits at i + (skipped positions at or before it): iterate to the fixed point
        before = bisect.bisect_right(self._skipped, i)
        while True:
            more = bisect.bisect_right(self._skipped, i + before)
            if more == before:
                return self._valid[i + before]
            before = more
