"""Hypotheses, verdicts, evidence and learnings: the ledger's vocabulary.

A `Hypothesis` is a falsifiable statement about one parameter of a kernel on a device, within
a `Scope` of problems: "num_stages=4 beats num_stages=3 when K ≥ 4096". Its metric is fixed:
over configs that differ only in that parameter (pairs), the ratio median_ms(b) / median_ms(a);
the effect is the geometric mean of those ratios (> 1: `a` is faster). A `Verdict` is the
judgement of the results on it, `Evidence` the pairs it rests on, and a `Learning` a validated
hypothesis with its scope (kernel, problems, device, toolchain).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tilepilot.experiments.errors import InputError
from tilepilot.experiments.values import Value, canonical_json


class HypothesisState(StrEnum):
    PROPOSED = "proposed"
    TESTING = "testing"
    VALIDATED = "validated"
    RULED_OUT = "ruled_out"
    INCONCLUSIVE = "inconclusive"

    @property
    def decided(self) -> bool:
        """Validated or ruled out: the results settled it."""
        return self in (HypothesisState.VALIDATED, HypothesisState.RULED_OUT)

    @property
    def terminal(self) -> bool:
        return self.decided or self is HypothesisState.INCONCLUSIVE


# ---- scopes --------------------------------------------------------------------------------

_OPS = {"<=": "<=", "≤": "<=", ">=": ">=", "≥": ">=", "<": "<", ">": ">", "=": "=", "==": "=", "!=": "!="}
_SHOWN = {"<=": "≤", ">=": "≥", "<": "<", ">": ">", "=": "=", "!=": "≠"}
_BOUND_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|==|!=|≤|≥|<|>|=)\s*(\S+)\s*$")
_INT_RE = re.compile(r"^[+-]?\d+$")
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")


@dataclass(frozen=True)
class Bound:
    """One condition on a problem parameter: `K >= 4096`, `dtype = bf16`."""

    param: str
    op: str  # one of <=, >=, <, >, =, !=
    value: Value

    def __post_init__(self) -> None:
        if self.op not in _SHOWN:
            raise ValueError(f"unknown operator {self.op!r} (allowed: {', '.join(_SHOWN)})")
        if self.op not in ("=", "!=") and not _is_number(self.value):
            raise ValueError(f"{self.param}{self.op}{self.value!r}: an ordering bound needs a number")

    def holds(self, problem: Mapping[str, Value]) -> bool:
        if self.param not in problem:
            return False
        x = problem[self.param]
        if self.op == "=":
            return x == self.value
        if self.op == "!=":
            return x != self.value
        if not _is_number(x):
            return False
        v = self.value
        if self.op == "<=":
            return x <= v  # type: ignore[operator]
        if self.op == ">=":
            return x >= v  # type: ignore[operator]
        return x < v if self.op == "<" else x > v  # type: ignore[operator]

    def text(self) -> str:
        return f"{self.param} {_SHOWN[self.op]} {self.value}"

    def as_list(self) -> list[Any]:
        return [self.param, self.op, self.value]


@dataclass(frozen=True)
class Scope:
    """A conjunction of bounds on the problem; no bounds: every problem of the kernel."""

    bounds: tuple[Bound, ...] = ()

    @classmethod
    def of(cls, bounds: Sequence[Bound]) -> Scope:
        """Canonical order (by parameter, operator, value), duplicates removed."""
        unique = {(b.param, b.op, canonical_json({"v": b.value})): b for b in bounds}
        return cls(tuple(unique[k] for k in sorted(unique)))

    @classmethod
    def parse(cls, text: str) -> Scope:
        """Parse "M<=64, K>=4096" (also "M ≤ 64 and K ≥ 4096"; "" or "all": every problem).

        Raises InputError naming the bad part and what is allowed.
        """
        if text.strip().lower() in ("", "all", "*"):
            return cls()
        bounds = []
        for part in re.split(r",|\band\b", text):
            if not part.strip():
                continue
            m = _BOUND_RE.match(part)
            if not m:
                raise InputError(f"bad problem filter {part.strip()!r}: expected NAME OP VALUE with OP one of "
                                 "<=, >=, <, >, =, != (e.g. M<=64 or dtype=bf16)")
            name, op, raw = m.group(1), _OPS[m.group(2)], m.group(3)
            if raw[0] in "<>=!≤≥":
                raise InputError(f"bad problem filter {part.strip()!r}: unknown operator "
                                 "(allowed: <=, >=, <, >, =, !=)")
            value = parse_value(raw)
            if op not in ("=", "!=") and not _is_number(value):
                raise InputError(f"bad problem filter {part.strip()!r}: {raw!r} is not a number "
                                 f"(only = and != take text)")
            bounds.append(Bound(name, op, value))
        return cls.of(bounds)

    @classmethod
    def from_list(cls, data: Sequence[Sequence[Any]]) -> Scope:
        return cls.of([Bound(str(p), str(op), v) for p, op, v in data])

    def as_list(self) -> list[list[Any]]:
        return [b.as_list() for b in self.bounds]

    def key(self) -> str:
        return canonical_json({"scope": self.as_list()})

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(sorted({b.param for b in self.bounds}))

    def contains(self, problem: Mapping[str, Value]) -> bool:
        return all(b.holds(problem) for b in self.bounds)

    def text(self) -> str:
        return " and ".join(b.text() for b in self.bounds) if self.bounds else "every problem"

    def __str__(self) -> str:
        return self.text()

    def overlaps(self, other: Scope) -> bool:
        """Some problem could lie in both (numeric bounds as intervals; = and != exactly)."""
        return _Region.of(self.bounds + other.bounds).feasible()

    def covers(self, other: Scope) -> bool:
        """Every problem in `other` lies in this scope."""
        region = _Region.of(other.bounds)
        return not region.feasible() or all(region.implies(b) for b in self.bounds)


def parse_value(raw: str) -> Value:
    """A filter value: an int, a float, true/false, else the text itself."""
    if _INT_RE.match(raw):
        return int(raw)
    if _FLOAT_RE.match(raw):
        return float(raw)
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    return raw


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


@dataclass
class _Side:
    value: float
    inclusive: bool


@dataclass
class _Interval:
    lo: _Side | None = None
    hi: _Side | None = None
    eq: set[Any] | None = None  # allowed values (from "="); None: any
    ne: set[Any] | None = None

    def add(self, b: Bound) -> None:
        if b.op == "=":
            self.eq = {b.value} if self.eq is None else self.eq & {b.value}
        elif b.op == "!=":
            self.ne = (self.ne or set()) | {b.value}
        elif b.op in ("<=", "<"):
            side = _Side(float(b.value), b.op == "<=")  # type: ignore[arg-type]
            if self.hi is None or (side.value, side.inclusive) < (self.hi.value, self.hi.inclusive):
                self.hi = side
        else:
            side = _Side(float(b.value), b.op == ">=")  # type: ignore[arg-type]
            if self.lo is None or (side.value, not side.inclusive) > (self.lo.value, not self.lo.inclusive):
                self.lo = side

    def _inside(self, x: Any) -> bool:
        if self.ne and x in self.ne:
            return False
        if not _is_number(x):
            return self.lo is None and self.hi is None
        if self.lo and (x < self.lo.value or (x == self.lo.value and not self.lo.inclusive)):
            return False
        return not (self.hi and (x > self.hi.value or (x == self.hi.value and not self.hi.inclusive)))

    def feasible(self) -> bool:
        if self.eq is not None:
            return any(self._inside(x) for x in self.eq)
        if self.lo and self.hi:
            if self.lo.value > self.hi.value:
                return False
            if self.lo.value == self.hi.value:
                return self.lo.inclusive and self.hi.inclusive and not (self.ne and self.lo.value in self.ne)
        return True

    def implies(self, b: Bound) -> bool:
        if self.eq is not None:
            return all(b.holds({b.param: x}) for x in self.eq if self._inside(x))
        v = b.value
        if b.op in ("<=", "<"):
            return self.hi is not None and (self.hi.value < v or (  # type: ignore[operator]
                self.hi.value == v and (b.op == "<=" or not self.hi.inclusive)))
        if b.op in (">=", ">"):
            return self.lo is not None and (self.lo.value > v or (  # type: ignore[operator]
                self.lo.value == v and (b.op == ">=" or not self.lo.inclusive)))
        if b.op == "!=":
            return bool(self.ne and v in self.ne) or (_is_number(v) and not self._inside(v))
        return False  # "=": only an equality implies an equality


@dataclass
class _Region:
    by_param: dict[str, _Interval]

    @classmethod
    def of(cls, bounds: Sequence[Bound]) -> _Region:
        region = cls({})
        for b in bounds:
            region.by_param.setdefault(b.param, _Interval()).add(b)
        return region

    def feasible(self) -> bool:
        return all(i.feasible() for i in self.by_param.values())

    def implies(self, b: Bound) -> bool:
        interval = self.by_param.get(b.param)
        return interval is not None and interval.implies(b)


# ---- hypotheses, verdicts, evidence, learnings -----------------------------------------------

def _digest(data: Mapping[str, Any], n: int = 10) -> str:
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()[:n]


@dataclass(frozen=True)
class Hypothesis:
    """`param = a` beats `param = b` for `kernel` on `device`, for problems in `scope`."""

    id: str
    kernel: str
    device: str
    param: str
    a: Value  # the value claimed faster
    b: Value  # the value it is compared with
    scope: Scope
    text: str
    rationale: str = ""  # why it was proposed (the signal in the results so far)
    source: str = "miner"  # who proposed it: miner | rules | llm

    @classmethod
    def new(cls, *, origin: str, kernel: str, device: str, param: str, a: Value, b: Value,
            scope: Scope, rationale: str = "", source: str = "miner") -> Hypothesis:
        """A hypothesis with its id ("H-" + a hash of `origin`, e.g. the campaign, and the statement)."""
        if a == b:
            raise ValueError(f"a hypothesis compares two different values of {param}, not {a!r} with itself")
        key = statement_key(kernel, device, param, a, b, scope)
        hid = "H-" + _digest({"origin": origin, "statement": key}, 8)
        where = f"when {scope.text()}" if scope.bounds else "on every problem"
        text = f"{param}={a} beats {param}={b} {where}"
        return cls(hid, kernel, device, param, a, b, scope, text, rationale, source)

    @property
    def statement_key(self) -> str:
        """The same for the same claim, whichever campaign states it."""
        return statement_key(self.kernel, self.device, self.param, self.a, self.b, self.scope)

    def same_question(self, other: Hypothesis) -> bool:
        """Same kernel, device and parameter, and the same two values (in either direction)."""
        return (self.kernel, self.device, self.param) == (other.kernel, other.device, other.param) \
            and {canonical_json({"v": self.a}), canonical_json({"v": self.b})} \
            == {canonical_json({"v": other.a}), canonical_json({"v": other.b})}


def statement_key(kernel: str, device: str, param: str, a: Value, b: Value, scope: Scope) -> str:
    return _digest({"kernel": kernel, "device": device, "param": param, "a": a, "b": b,
                    "scope": scope.as_list()}, 16)


@dataclass(frozen=True)
class Verdict:
    """The results' judgement of a hypothesis at one moment."""

    hypothesis_id: str
    state: HypothesisState
    pairs: int  # paired configs in scope, both ok
    wins: int  # pairs where a was faster
    losses: int  # pairs where b was faster
    effect: float | None  # geometric mean of median_ms(b) / median_ms(a); > 1: a faster
    ci_low: float | None  # 95% interval of the effect
    ci_high: float | None
    noise: float  # relative: an effect must exceed 1 + noise to count
    reason: str  # one line


@dataclass(frozen=True)
class Evidence:
    """One pair of experiments that differ only in the hypothesis' parameter."""

    hypothesis_id: str
    experiment_a: str  # the experiment with param = a
    experiment_b: str  # with param = b
    problem_key: str
    ratio: float  # median_ms(b) / median_ms(a)
    relation: str  # supports (a faster beyond noise) | refutes


EVIDENCE_RELATIONS = ("supports", "refutes")


@dataclass(frozen=True)
class Learning:
    """A validated hypothesis as a statement with its scope and toolchain."""

    id: str
    hypothesis_id: str
    kernel: str
    device: str
    torch: str
    triton: str
    scope: Scope
    text: str
    effect: float  # geometric mean speed-up of a over b
    pairs: int
    evidence: tuple[str, ...] = ()  # keys of the experiments that support it

    @classmethod
    def from_verdict(cls, h: Hypothesis, v: Verdict, *, torch: str, triton: str,
                     evidence: Sequence[str] = ()) -> Learning:
        if v.state is not HypothesisState.VALIDATED or v.effect is None:
            raise ValueError(f"only a validated hypothesis becomes a learning ({h.id} is {v.state})")
        ci = f", 95% CI {v.ci_low:.2f}-{v.ci_high:.2f}x" if v.ci_low and v.ci_high else ""
        text = (f"{h.kernel} on {h.device}, {h.scope.text()}: {h.param}={h.a} is {v.effect:.2f}x as fast as "
                f"{h.param}={h.b} (geometric mean over {v.pairs} paired configs{ci}; "
                f"torch {torch}, triton {triton})")
        return cls("L-" + h.id.removeprefix("H-"), h.id, h.kernel, h.device, torch, triton, h.scope, text,
                   v.effect, v.pairs, tuple(evidence))

    def applies_to(self, kernel: str, device: str, problem: Mapping[str, Value]) -> bool:
        """Same kernel, `device` names this device (a case-insensitive part of it), problem in scope."""
        return kernel == self.kernel and device.lower() in self.device.lower() and self.scope.contains(problem)


def geometric_mean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))
