"""`SearchSpace`: the parameters of a kernel family's configs and the rules that make one invalid."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from tilepilot.experiments.errors import InputError
from tilepilot.experiments.values import Config, Problem, Value

# A constraint returns None when the config is fine for the problem, else the reason it is not.
Constraint = Callable[[Config, Problem], str | None]


def reads(*names: str) -> Callable[[Constraint], Constraint]:
    """Mark a constraint with the only parameters it reads (a decorator). `SearchSpace.valid` then
    decides it as soon as those are chosen and skips every config that shares a refused choice of
    them, instead of building each: a space of conditional parameters is mostly refused
    combinations (matmul's: 9.4 million points, under 230,000 valid on any problem). A constraint
    without the mark is decided on whole configs. The mark must be true: one that reads a parameter
    it does not name would be decided on a config that lacks it."""
    def mark(fn: Constraint) -> Constraint:
        fn.reads = frozenset(names)  # type: ignore[attr-defined]
        return fn

    return mark


@dataclass(frozen=True)
class Param:
    """One tunable parameter with its allowed values, in increasing order where ordered.

    `default`, when given, is the value `SearchSpace.parse` fills in for a config that lacks the
    parameter (a config recorded before the parameter existed)."""

    name: str
    choices: tuple[Value, ...]
    default: Value | None = None

    @property
    def is_power_of_two(self) -> bool:
        return all(isinstance(c, int) and c > 0 and c & (c - 1) == 0 for c in self.choices)


@dataclass(frozen=True)
class SearchSpace:
    params: tuple[Param, ...]
    constraints: tuple[Constraint, ...] = field(default=())

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def size(self) -> int:
        n = 1
        for p in self.params:
            n *= len(p.choices)
        return n

    def __iter__(self) -> Iterator[Config]:
        """Every point of the cartesian product, valid or not, in a stable order."""
        for values in itertools.product(*(p.choices for p in self.params)):
            yield Config.of(dict(zip(self.names, values, strict=True)))

    def parse(self, data: Mapping[str, object]) -> Config:
        """Check a config from outside (a file, an LLM, a user) and return it.

        A missing parameter that has a default takes it. Raises InputError naming every unknown
        key, missing key (without a default) and out-of-range value.
        """
        if not isinstance(data, Mapping):
            raise InputError(f"bad config: {data!r:.80} is not a table of parameter = value")
        problems: list[str] = []
        data = {**{p.name: p.default for p in self.params if p.default is not None and p.name not in data}, **data}
        unknown = sorted(set(data) - set(self.names))
        if unknown:
            problems.append(f"unknown parameter(s) {', '.join(unknown)} (allowed: {', '.join(self.names)})")
        for p in self.params:
            if p.name not in data:
                problems.append(f"missing {p.name}")
            elif not _allowed(data[p.name], p.choices):
                allowed = ", ".join(str(c) for c in p.choices)
                problems.append(f"{p.name}={data[p.name]!r} is not one of {{{allowed}}}")
        if problems:
            raise InputError("bad config: " + "; ".join(problems))
        return Config.of({p.name: data[p.name] for p in self.params})  # type: ignore[misc]

    def check(self, config: Config, problem: Problem) -> str | None:
        """The first reason this config cannot run on this problem, or None."""
        for c in self.constraints:
            reason = c(config, problem)
            if reason:
                return reason
        return None

    def valid(self, problem: Problem) -> list[Config]:
        """The configs `check` passes, in the order of iteration. Each constraint marked with the
        parameters it reads (`reads`) is decided on the first of them chosen, over a partial config,
        so a refused choice prunes all that follows it; the rest are decided on whole configs."""
        names = self.names
        depth = {name: i for i, name in enumerate(names)}
        last = len(names) - 1
        at: list[list[Constraint]] = [[] for _ in names]
        for c in self.constraints:
            marked = getattr(c, "reads", None)
            known = marked is not None and marked <= depth.keys()
            at[max((depth[n] for n in marked), default=0) if known else last].append(c)  # type: ignore[union-attr]
        out: list[Config] = []
        chosen: dict[str, Value] = {}

        def walk(d: int) -> None:
            for value in self.params[d].choices:
                chosen[names[d]] = value
                if at[d] or d == last:
                    config = Config.of(dict(chosen))
                    if any(c(config, problem) for c in at[d]):
                        continue
                    if d == last:
                        out.append(config)
                        continue
                walk(d + 1)
            chosen.pop(names[d], None)  # (a parameter may have no choices left: nothing is valid)

        if not names:  # the one empty config
            return [c for c in self if self.check(c, problem) is None]
        walk(0)
        return out

    def narrowed(self, choices: Mapping[str, Sequence[object]]) -> SearchSpace:
        """The space with some parameters limited to the given choices (a campaign's [space]).

        Raises InputError naming an unknown parameter or a choice the family does not allow.
        """
        for name, values in choices.items():
            if name not in self.names:
                raise InputError(f"space.{name}: unknown parameter (allowed: {', '.join(self.names)})")
            bad = [v for v in values if not _allowed(v, self.param(name).choices)]
            if bad:
                allowed = ", ".join(str(c) for c in self.param(name).choices)
                raise InputError(f"space.{name}: {bad[0]!r} is not one of {{{allowed}}}")
        params = tuple(
            dataclasses.replace(p, choices=tuple(c for c in p.choices if p.name not in choices
                                                 or any(_allowed(c, (v,)) for v in choices[p.name])))
            for p in self.params
        )
        return SearchSpace(params, self.constraints)

    def restricted(self, configs: Sequence[Config]) -> SearchSpace:
        """The smallest sub-space (per-parameter choices) holding these configs, limited to them.

        Used by replay: the searchable space is exactly the recorded configs.
        """
        allowed = frozenset(c.key() for c in configs)
        params = tuple(
            dataclasses.replace(p, choices=tuple(v for v in p.choices if any(c[p.name] == v for c in configs)))
            for p in self.params
        )

        def recorded(config: Config, problem: Problem) -> str | None:
            return None if config.key() in allowed else "not in the recorded dataset"

        return SearchSpace(params, (*self.constraints, recorded))


def at_default(name: str, value: object, defaults: Mapping[str, Value]) -> bool:
    """True when `name` has a default (see `Param.default`) and `value` is it (True is not 1)."""
    return name in defaults and _allowed(value, (defaults[name],))


def _allowed(value: object, choices: tuple[Value, ...]) -> bool:
    """`value in choices`, but True is not 1 and 1.0 is not 1."""
    return any(type(value) is type(c) and value == c for c in choices)
