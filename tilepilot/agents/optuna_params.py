"""How a `SearchSpace` looks to Optuna: one distribution per parameter, and back.

- powers of two (16, 32, 64, ...) are sampled through their exponent (`log2_<name>`), so
  TPE's kernels see 64 as halfway between 32 and 128;
- other integers in arithmetic progression become an `IntDistribution` with that step;
- other increasing numbers are sampled through their position (`index_<name>`), which
  keeps their order;
- anything else (strings, booleans, unordered choices) is categorical.

Each mapping is exact: every value a distribution can give decodes to one of the choices.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from tilepilot.experiments import Config, Param, SearchSpace, Value


@dataclass(frozen=True)
class Axis:
    """One parameter as Optuna samples it."""

    param: Param
    key: str  # the parameter's name in the study
    dist: BaseDistribution
    kind: str  # exp2 | int | index | categorical

    def encode(self, value: Value) -> Any:
        """The study's value for a choice; KeyError when `value` is not one of the choices."""
        i = _position(self.param.choices, value)
        if self.kind == "exp2":
            return int(value).bit_length() - 1
        if self.kind == "index":
            return i
        return self.param.choices[i]

    def decode(self, raw: Any) -> Value:
        if self.kind == "exp2":
            return 1 << int(raw)
        if self.kind == "index":
            return self.param.choices[int(raw)]
        return self.param.choices[_position(self.param.choices, raw)]


class ParamCodec:
    """Config <-> Optuna params for one search space."""

    def __init__(self, space: SearchSpace) -> None:
        self.axes = tuple(axis_for(p) for p in space.params)
        self.distributions: dict[str, BaseDistribution] = {a.key: a.dist for a in self.axes}

    def to_params(self, config: Config) -> dict[str, Any] | None:
        """The study's params for a config, or None when it does not lie in the space."""
        try:
            return {a.key: a.encode(config[a.param.name]) for a in self.axes}
        except KeyError:
            return None

    def to_config(self, params: dict[str, Any]) -> Config:
        return Config.of({a.param.name: a.decode(params[a.key]) for a in self.axes})


def axis_for(p: Param) -> Axis:
    choices = p.choices
    if len(choices) > 1 and _increasing_ints(choices):
        if p.is_power_of_two:
            exps = [int(c).bit_length() - 1 for c in choices]
            if _step(exps):
                return Axis(p, f"log2_{p.name}", IntDistribution(exps[0], exps[-1], step=_step(exps)), "exp2")
        step = _step([int(c) for c in choices])
        if step:
            return Axis(p, p.name, IntDistribution(int(choices[0]), int(choices[-1]), step=step), "int")
    if len(choices) > 2 and _increasing_numbers(choices):
        return Axis(p, f"index_{p.name}", IntDistribution(0, len(choices) - 1), "index")
    return Axis(p, p.name, CategoricalDistribution(choices), "categorical")


def _position(choices: tuple[Value, ...], value: Value) -> int:
    for i, c in enumerate(choices):
        if type(c) is type(value) and c == value:
            return i
    raise KeyError(value)


def _increasing_ints(choices: tuple[Value, ...]) -> bool:
    return all(type(c) is int for c in choices) and _increasing_numbers(choices)


def _increasing_numbers(choices: tuple[Value, ...]) -> bool:
    if not all(type(c) in (int, float) for c in choices):
        return False
    return all(a < b for a, b in pairwise(choices))  # type: ignore[operator]


def _step(values: list[int]) -> int:
    """The common difference of an arithmetic progression, 0 when it is not one."""
    step = values[1] - values[0]
    ok = step > 0 and all(b - a == step for a, b in pairwise(values))
    return step if ok else 0
