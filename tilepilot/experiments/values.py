"""`Problem` and `Config`: frozen, hashable, canonically serialised parameter sets."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

Value = int | float | str | bool


def same_value(x: object, y: object) -> bool:
    """Equal as parameter values: of one type and equal (True is not 1, 4 is not 4.0)."""
    return type(x) is type(y) and x == y


def canonical_json(data: Mapping[str, Any]) -> str:
    """The one serialisation used for keys and hashes: sorted keys, no spaces."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, eq=False)
class _Params(Mapping[str, Value]):
    """Parameters in the order given (for display); equal and hashed by their canonical key."""

    items_: tuple[tuple[str, Value], ...]

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.key() == other.key()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.key()))

    def __getitem__(self, key: str) -> Value:
        for k, v in self.items_:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self.items_)

    def __len__(self) -> int:
        return len(self.items_)

    def as_dict(self) -> dict[str, Value]:
        return dict(self.items_)

    def key(self) -> str:
        cached = self.__dict__.get("_key")  # computed once: hashing and equality go through it
        if cached is None:
            cached = canonical_json(self.as_dict())
            object.__setattr__(self, "_key", cached)
        return cached

    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.items_)

    def __str__(self) -> str:
        return self.label()


@dataclass(frozen=True, eq=False)
class Problem(_Params):
    """One problem instance of a kernel family, e.g. {M, N, K, dtype} for matmul."""

    @classmethod
    def of(cls, data: Mapping[str, Value]) -> Problem:
        return cls(tuple(data.items()))

    def label(self) -> str:
        dims = " ".join(f"{k}={v}" for k, v in self.items_ if k != "dtype")
        return f"{dims} {self['dtype']}" if "dtype" in self else dims


@dataclass(frozen=True, eq=False)
class Config(_Params):
    """One point of a kernel's config space: tile sizes, num_warps, num_stages, ..."""

    @classmethod
    def of(cls, data: Mapping[str, Value]) -> Config:
        return cls(tuple(data.items()))
