"""The reply the `llm` proposer asks for, and how a reply is checked: untrusted data in, facts out.

The JSON schema goes to the API as a structured-output format (`output_config.format`): each
config parameter is an enum of its choices, so the model can only name values of the space.
The schema is a request, not a guarantee: `read_reply` checks everything again. Every config goes
through `SearchSpace.parse` (unknown, missing or out-of-range keys) and the space's constraints
for the problem; configs already tried, repeated, or beyond the number asked for are rejected;
each rejection keeps its reason (one line, length-capped). Text fields are reduced to one line
of printable characters and capped. Nothing in a reply is ever executed or interpreted: text
stays text.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from tilepilot.experiments import Config, InputError, Problem, SearchSpace, Value
from tilepilot.experiments.hypothesis import Bound, Hypothesis, Scope

MAX_REPLY_CHARS = 100_000
MAX_TEXT = 300  # characters kept of a rationale, hypothesis, experiment or learning
MAX_REASON = 300  # characters kept of a rejection reason
MAX_HYPOTHESES = 3  # per reply
MAX_LEARNINGS = 5  # per reply
MAX_PREDICTED_MS = 1e6
OPS = ("<=", ">=", "<", ">", "=", "!=")
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class Proposal:
    config: Config
    rationale: str
    tests: str  # the expectation this experiment tests, in the model's words
    predicted_ms: float | None


@dataclass
class Reply:
    proposals: list[Proposal] = field(default_factory=list)
    hypotheses: list[Hypothesis] = field(default_factory=list)
    learnings: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # one line per rejected or ignored item
    proposals_rejected: int = 0


# ---- the schema ----------------------------------------------------------------------------------

def reply_schema(space: SearchSpace, problem: Problem) -> dict[str, Any]:
    """The JSON schema of a reply for this space and problem (before the SDK's `transform_schema`)."""
    values = _distinct(v for p in space.params for v in p.choices)
    config = _object({p.name: {"enum": list(p.choices)} for p in space.params})
    proposal = _object({
        "config": config,
        "rationale": _text("why this config, now: one sentence"),
        "hypothesis": _text("the falsifiable expectation this measurement tests"),
        "predicted_ms": {"anyOf": [{"type": "number"}, {"type": "null"}],
                         "description": "the median time you expect, in milliseconds, or null"},
    })
    bound = _object({
        "param": {"enum": list(problem)},
        "op": {"enum": list(OPS)},
        "value": {"anyOf": [{"type": "number"}, {"type": "string"}, {"type": "boolean"}]},
    })
    hypothesis = _object({
        "param": {"enum": list(space.names)},
        "faster": {"enum": values, "description": "the value of param claimed faster"},
        "slower": {"enum": values, "description": "the value it is compared with"},
        "scope": {"type": "array", "items": bound,
                  "description": "conditions on the problem where the claim holds; [] for every problem"},
        "rationale": _text("what in the results suggests it"),
        "experiment": _text("the measurements that would settle it"),
    })
    return _object({
        "proposals": {"type": "array", "items": proposal},
        "hypotheses": {"type": "array", "items": hypothesis},
        "learnings": {"type": "array", "items": _text("a conclusion the results so far support")},
    })


def _object(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _text(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def _distinct(values: Any) -> list[Value]:
    out: list[Value] = []
    for v in values:
        if not any(type(v) is type(w) and v == w for w in out):
            out.append(v)
    return out


# ---- reading a reply ------------------------------------------------------------------------------

def read_reply(text: str, *, space: SearchSpace, problem: Problem, seen: Collection[Config], want: int,
               kernel: str, device: str) -> Reply:
    """Check a reply (JSON text) against the space, the problem and the configs already seen.

    Never raises on the reply's content: whatever cannot be used is left out with its reason.
    """
    reply = Reply()
    if len(text) > MAX_REPLY_CHARS:
        reply.rejected.append(f"reply of {len(text)} characters is over the {MAX_REPLY_CHARS} limit: not read")
        return reply
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        reply.rejected.append(clean_text(f"reply is not JSON: {e}", MAX_REASON))
        return reply
    if not isinstance(data, dict):
        reply.rejected.append(f"reply is a JSON {type(data).__name__}, not an object")
        return reply
    for key in sorted(set(data) - {"proposals", "hypotheses", "learnings"}, key=str):
        reply.rejected.append(clean_text(f"unknown field {key!r} ignored", MAX_REASON))
    _read_proposals(_list(data, "proposals", reply), reply, space, problem, seen, want)
    _read_hypotheses(_list(data, "hypotheses", reply), reply, space, problem, kernel, device)
    for i, item in enumerate(_list(data, "learnings", reply), start=1):
        if i > MAX_LEARNINGS:
            reply.rejected.append(f"learnings beyond the first {MAX_LEARNINGS} ignored")
            break
        learning = clean_text(item)
        if learning:
            reply.learnings.append(learning)
    return reply


def _list(data: Mapping[str, Any], key: str, reply: Reply) -> list[Any]:
    value = data.get(key, [])
    if isinstance(value, list):
        return value
    reply.rejected.append(f"{key} is a {type(value).__name__}, not a list: ignored")
    return []


def _read_proposals(items: list[Any], reply: Reply, space: SearchSpace, problem: Problem,
                    seen: Collection[Config], want: int) -> None:
    taken: set[Config] = set()
    for i, item in enumerate(items, start=1):
        reason, proposal = _proposal(item, space, problem)
        if proposal is not None and (proposal.config in seen or proposal.config in taken):
            reason = f"{proposal.config.label()} was tried, is queued or repeats an earlier proposal"
        elif proposal is not None and len(taken) >= want:
            reason = f"beyond the {want} config(s) asked for"
        if reason or proposal is None:
            reply.proposals_rejected += 1
            reply.rejected.append(clean_text(f"proposal {i}: {reason}", MAX_REASON))
            continue
        taken.add(proposal.config)
        reply.proposals.append(proposal)
        if proposal.predicted_ms is None and isinstance(item, dict) and item.get("predicted_ms") is not None:
            reply.rejected.append(clean_text(f"proposal {i}: predicted_ms={item['predicted_ms']!r:.40} ignored "
                                             "(not a positive number of milliseconds)", MAX_REASON))


def _proposal(item: Any, space: SearchSpace, problem: Problem) -> tuple[str, Proposal | None]:
    if not isinstance(item, dict):
        return f"a {type(item).__name__}, not an object", None
    raw = item.get("config")
    if not isinstance(raw, dict):
        return "no config object", None
    try:
        config = space.parse(raw)
    except InputError as e:
        return str(e), None
    why_not = space.check(config, problem)
    if why_not:
        return f"{config.label()} is invalid for {problem.label()}: {why_not}", None
    rationale = clean_text(item.get("rationale")) or "no reason given"
    return "", Proposal(config, rationale, clean_text(item.get("hypothesis")), _predicted(item.get("predicted_ms")))


def _predicted(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    x = float(value)
    return x if math.isfinite(x) and 0.0 < x < MAX_PREDICTED_MS else None


def _read_hypotheses(items: list[Any], reply: Reply, space: SearchSpace, problem: Problem, kernel: str,
                     device: str) -> None:
    for i, item in enumerate(items, start=1):
        if i > MAX_HYPOTHESES:
            reply.rejected.append(f"hypotheses beyond the first {MAX_HYPOTHESES} ignored")
            return
        try:
            reply.hypotheses.append(_hypothesis(item, space, problem, kernel, device))
        except ValueError as e:
            reply.rejected.append(clean_text(f"hypothesis {i}: {e}", MAX_REASON))


def _hypothesis(item: Any, space: SearchSpace, problem: Problem, kernel: str, device: str) -> Hypothesis:
    if not isinstance(item, dict):
        raise ValueError(f"a {type(item).__name__}, not an object")
    param = item.get("param")
    if not isinstance(param, str) or param not in space.names:
        raise ValueError(f"param {param!r} is not one of {', '.join(space.names)}")
    choices = space.param(param).choices
    a, b = item.get("faster"), item.get("slower")
    for side in (a, b):
        if not any(type(side) is type(c) and side == c for c in choices):
            raise ValueError(f"{param}={side!r} is not one of {{{', '.join(str(c) for c in choices)}}}")
    scope = _scope(item.get("scope", []), problem)
    rationale = clean_text(item.get("rationale")) or "no reason given"
    experiment = clean_text(item.get("experiment"))
    why = f"stated by the llm: {rationale}" + (f"; experiment: {experiment}" if experiment else "")
    return Hypothesis.new(origin="llm", kernel=kernel, device=device, param=param, a=a, b=b, scope=scope,
                          rationale=clip(why, 2 * MAX_TEXT), source="llm")


def _scope(raw: Any, problem: Problem) -> Scope:
    if not isinstance(raw, list):
        raise ValueError("scope is not a list of conditions")
    bounds = []
    for cond in raw:
        if not isinstance(cond, dict):
            raise ValueError("a scope condition is not an object")
        name, op, value = cond.get("param"), cond.get("op"), cond.get("value")
        if not isinstance(name, str) or name not in problem:
            raise ValueError(f"scope parameter {name!r} is not one of the problem's ({', '.join(problem)})")
        if op not in OPS:
            raise ValueError(f"scope operator {op!r} is not one of {', '.join(OPS)}")
        if not isinstance(value, int | float | str | bool) or (isinstance(value, str) and len(value) > 100):
            raise ValueError(f"scope value {value!r:.100} is not a number, a short text or a boolean")
        bounds.append(Bound(name, op, value))  # ValueError: an ordering bound on text
    return Scope.of(bounds)


# ---- text ------------------------------------------------------------------------------------------

def clean_text(value: Any, limit: int = MAX_TEXT) -> str:
    """One line of printable text, at most `limit` characters; "" for anything that is not text."""
    if not isinstance(value, str):
        return ""
    value = value[: limit * 4]
    printable = "".join(ch if unicodedata.category(ch)[0] != "C" else " " for ch in value)
    return clip(_SPACES.sub(" ", printable).strip(), limit)


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
