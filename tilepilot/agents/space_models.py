"""The cost models `rules` ranks a non-GEMM space by: one adapter per family shape, each saying
whether it reads a space and a problem, what it predicts for a config, how it explains that, which
problems of the store it errs alike on, and how far two problems stand apart.

- `RowModel`: a row-wise kernel's space (softmax, rmsnorm, layernorm: BLOCK_SIZE,
  ROWS_PER_PROGRAM, num_warps, num_stages over rows × cols; `row_model`). Problems alike: rows
  that fit a block where this problem's do, or need two passes where these do; distance over
  the log2 ratios of rows and cols.
- `AttentionModel`: the flash-attention kernel's space (BLOCK_M, BLOCK_N, num_warps, num_stages
  over B, H, S, D, causal; `attention_model`). Problems alike: causal where this one is, or not
  where it is not; distance over the log2 ratios of the heads (B·H), S and D.

GEMM tiles are the tile model's (`tile_model`), read by `rules` itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from tilepilot.agents.attention_model import (
    ATTENTION_PARAMS,
    attention_space,
    describe_attention,
    estimate_attention,
)
from tilepilot.agents.attention_model import DTYPE_BYTES as ATTENTION_DTYPE_BYTES
from tilepilot.agents.roofline import Device
from tilepilot.agents.row_model import DTYPE_BYTES as ROW_DTYPE_BYTES
from tilepilot.agents.row_model import ROW_PARAMS, describe_rows, estimate_rows, row_space
from tilepilot.experiments import Config, Problem, SearchSpace


class SpaceEstimate(Protocol):
    """What `rules` reads of a space model's estimate (`RowEstimate`, `AttentionEstimate`)."""

    @property
    def launches(self) -> bool: ...

    @property
    def predicted_ms(self) -> float: ...


class SpaceModel(Protocol):
    name: str  # "row model", as rationales and notes name it
    problems: str  # "row-wise problem", as the history's note names a source

    def estimate(self, problem: Problem, config: Config) -> SpaceEstimate: ...

    def key(self, config: Config) -> tuple[object, ...]: ...

    def describe(self, est: Any, config: Config) -> str: ...

    def reads(self, problem: Problem) -> bool: ...

    def alike(self, p: Problem, q: Problem) -> bool: ...

    def dims(self, problem: Problem) -> tuple[float, ...]: ...


@dataclass(frozen=True)
class RowModel:
    kernel: str
    space: SearchSpace
    device: Device
    name: str = "row model"
    problems: str = "row-wise problem"

    def estimate(self, problem: Problem, config: Config) -> SpaceEstimate:
        return estimate_rows(self.kernel, problem, config, self.device)

    def key(self, config: Config) -> tuple[object, ...]:
        return tuple(config.get(name) for name in sorted(ROW_PARAMS))

    def describe(self, est: Any, config: Config) -> str:
        return describe_rows(est, config)

    def reads(self, problem: Problem) -> bool:
        return row_space(set(self.space.names), problem)

    def alike(self, p: Problem, q: Problem) -> bool:
        """Rows that fit a block as `p`'s do, or need two passes as they do."""
        return self.reads(q) and self.two_passes(q) == self.two_passes(p)

    def two_passes(self, q: Problem) -> bool:
        """Whether a row-wise problem's rows are longer than the space's largest block (two passes only)."""
        blocks = [int(c) for c in self.space.param("BLOCK_SIZE").choices]  # type: ignore[call-overload]
        return int(q["cols"]) > max(blocks)

    def dims(self, problem: Problem) -> tuple[float, ...]:
        """rows, cols and the element size."""
        return int(problem["rows"]), int(problem["cols"]), ROW_DTYPE_BYTES[str(problem["dtype"])]


@dataclass(frozen=True)
class AttentionModel:
    space: SearchSpace
    device: Device
    name: str = "attention model"
    problems: str = "attention problem"

    def estimate(self, problem: Problem, config: Config) -> SpaceEstimate:
        return estimate_attention(problem, config, self.device)

    def key(self, config: Config) -> tuple[object, ...]:
        return (*(config.get(name) for name in sorted(ATTENTION_PARAMS)), config.get("VARIANT"))

    def describe(self, est: Any, config: Config) -> str:
        return describe_attention(est, config)

    def reads(self, problem: Problem) -> bool:
        return attention_space(set(self.space.names), problem)

    def alike(self, p: Problem, q: Problem) -> bool:
        """Causal where `p` is, or not where it is not."""
        return self.reads(q) and bool(q["causal"]) == bool(p["causal"])

    def dims(self, problem: Problem) -> tuple[float, ...]:
        """Heads in all (B·H), S, D and the element size."""
        return (int(problem["B"]) * int(problem["H"]), int(problem["S"]), int(problem["D"]),
                ATTENTION_DTYPE_BYTES[str(problem["dtype"])])


def space_model(kernel: str, space: SearchSpace, problem: Problem, device: Device) -> SpaceModel | None:
    """The model that reads this space and problem, None where none does."""
    models: list[SpaceModel] = [RowModel(kernel, space, device), AttentionModel(space, device)]
    return next((m for m in models if m.reads(problem)), None)
