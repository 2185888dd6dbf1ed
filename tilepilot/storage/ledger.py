"""The hypothesis ledger in SQLite: frozen records, row conversions and read-only queries.

The `Store` writes hypotheses, verdicts, evidence and learnings (its ledger methods use the
conversions here); readers call the functions below with a `ReadOnlyDB`. A `device` filter is
a case-insensitive part of the device name ("H100"); a `scope` filter keeps the hypotheses and
learnings whose scope overlaps it; a `problem` keeps those whose scope contains the problem.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tilepilot.experiments import InputError, Value
from tilepilot.experiments.hypothesis import (
    EVIDENCE_RELATIONS,
    Hypothesis,
    HypothesisState,
    Learning,
    Scope,
    Verdict,
)
from tilepilot.storage.queries import ReadOnlyDB, campaign_id_of
from tilepilot.storage.rows import Row, loads

RowsFn = Callable[[str, Sequence[Any]], list[dict[str, Any]]]
STATES = tuple(s.value for s in HypothesisState)


@dataclass(frozen=True)
class HypothesisRow:
    """A hypothesis with its campaign and its latest verdict."""

    hypothesis: Hypothesis
    campaign_id: int
    campaign: str
    state: HypothesisState
    pairs: int
    wins: int
    losses: int
    effect: float | None  # geometric mean of median_ms(b) / median_ms(a)
    ci_low: float | None
    ci_high: float | None
    noise: float | None
    reason: str
    created_at: float
    updated_at: float
    decided_at: float | None

    @property
    def id(self) -> str:
        return self.hypothesis.id

    def as_dict(self) -> dict[str, Any]:
        h = self.hypothesis
        return {"id": h.id, "text": h.text, "state": str(self.state), "kernel": h.kernel, "device": h.device,
                "param": h.param, "a": h.a, "b": h.b, "scope": h.scope.as_list(), "scope_text": h.scope.text(),
                "campaign": self.campaign, "pairs": self.pairs, "wins": self.wins, "losses": self.losses,
                "effect": self.effect, "ci_low": self.ci_low, "ci_high": self.ci_high, "noise": self.noise,
                "reason": self.reason, "rationale": h.rationale, "source": h.source,
                "created_at": self.created_at, "decided_at": self.decided_at}


@dataclass(frozen=True)
class EvidenceRow:
    """One pair behind a hypothesis, with both experiments' configs and times."""

    hypothesis_id: str
    relation: str  # supports | refutes
    ratio: float  # median_ms(b) / median_ms(a)
    problem: dict[str, Any]
    problem_key: str
    experiment_a: str
    experiment_b: str
    config_a: dict[str, Any]
    config_b: dict[str, Any]
    median_a_ms: float | None
    median_b_ms: float | None
    device: str


@dataclass(frozen=True)
class VerdictRow:
    id: int
    hypothesis_id: str
    state: HypothesisState
    pairs: int
    wins: int
    losses: int
    effect: float | None
    ci_low: float | None
    ci_high: float | None
    noise: float
    reason: str
    decided_at: float


@dataclass(frozen=True)
class LearningRow:
    learning: Learning
    hypothesis_text: str
    campaign: str
    created_at: float

    @property
    def id(self) -> str:
        return self.learning.id

    def as_dict(self) -> dict[str, Any]:
        lrn = self.learning
        claim = self.hypothesis_text.partition(" when ")[0].removesuffix(" on every problem")
        return {"id": lrn.id, "text": lrn.text, "claim": claim, "hypothesis": lrn.hypothesis_id, "kernel": lrn.kernel,
                "device": lrn.device, "torch": lrn.torch, "triton": lrn.triton, "scope": lrn.scope.as_list(),
                "scope_text": lrn.scope.text(), "effect": lrn.effect, "pairs": lrn.pairs,
                "evidence": list(lrn.evidence), "campaign": self.campaign, "created_at": self.created_at}


# ---- conversions ----------------------------------------------------------------------------

def value_json(v: Value) -> str:
    return json.dumps(v)


def hypothesis_columns(h: Hypothesis) -> dict[str, Any]:
    return {"id": h.id, "statement_key": h.statement_key, "kernel": h.kernel, "device": h.device,
            "param": h.param, "value_a": value_json(h.a), "value_b": value_json(h.b),
            "scope": json.dumps(h.scope.as_list()), "text": h.text, "rationale": h.rationale, "source": h.source}


def verdict_columns(v: Verdict) -> dict[str, Any]:
    return {"state": v.state.value, "pairs": v.pairs, "wins": v.wins, "losses": v.losses, "effect": v.effect,
            "ci_low": v.ci_low, "ci_high": v.ci_high, "noise": v.noise, "reason": v.reason}


def hypothesis_from_row(r: Row) -> Hypothesis:
    return Hypothesis(r["id"], r["kernel"], r["device"], r["param"], json.loads(r["value_a"]),
                      json.loads(r["value_b"]), Scope.from_list(json.loads(r["scope"])), r["text"],
                      r["rationale"], r["source"])


def _hypothesis_row(r: Row) -> HypothesisRow:
    return HypothesisRow(
        hypothesis_from_row(r), r["campaign_id"], r["campaign"] or "", HypothesisState(r["state"]), r["pairs"],
        r["wins"], r["losses"], r["effect"], r["ci_low"], r["ci_high"], r["noise"], r["reason"], r["created_at"],
        r["updated_at"], r["decided_at"])


def _learning_row(r: Row, evidence: Sequence[str]) -> LearningRow:
    learning = Learning(r["id"], r["hypothesis_id"], r["kernel"], r["device"], r["torch"], r["triton"],
                        Scope.from_list(json.loads(r["scope"])), r["text"], r["effect"], r["pairs"], tuple(evidence))
    return LearningRow(learning, r["hypothesis_text"], r["campaign"] or "", r["created_at"])


# ---- queries (on any `rows(sql, params)` function) -------------------------------------------

_HYPOTHESES = """SELECT h.*, c.name AS campaign FROM hypotheses h LEFT JOIN campaigns c ON c.id = h.campaign_id"""


def select_hypotheses(rows: RowsFn, *, kernel: str | None = None, device: str | None = None,
                      campaign_id: int | None = None, states: Sequence[str] | None = None,
                      ids: Sequence[str] | None = None) -> list[HypothesisRow]:
    where, params = kernel_device_filter("h", kernel, device)
    if campaign_id is not None:
        where.append("h.campaign_id = ?")
        params.append(campaign_id)
    if states is not None:
        where.append(f"h.state IN ({', '.join('?' * len(states))})")
        params.extend(states)
    if ids is not None:
        where.append(f"h.id IN ({', '.join('?' * len(ids))})")
        params.extend(ids)
    cond = " WHERE " + " AND ".join(where) if where else ""
    return [_hypothesis_row(r) for r in rows(_HYPOTHESES + cond + " ORDER BY h.created_at, h.id", params)]


def select_learnings(rows: RowsFn, *, kernel: str | None = None, device: str | None = None,
                     ids: Sequence[str] | None = None) -> list[LearningRow]:
    where, params = kernel_device_filter("l", kernel, device)
    if ids is not None:
        where.append(f"l.id IN ({', '.join('?' * len(ids))})")
        params.extend(ids)
    cond = " WHERE " + " AND ".join(where) if where else ""
    found = rows("SELECT l.*, h.text AS hypothesis_text, c.name AS campaign FROM learnings l "
                 "JOIN hypotheses h ON h.id = l.hypothesis_id LEFT JOIN campaigns c ON c.id = h.campaign_id"
                 + cond + " ORDER BY l.created_at, l.id", params)
    support: dict[str, list[str]] = {}
    if found:
        marks = ", ".join("?" * len(found))
        for e in rows(f"SELECT hypothesis_id, experiment_a, experiment_b FROM evidence WHERE relation = 'supports' "
                      f"AND hypothesis_id IN ({marks}) ORDER BY problem_key, experiment_a",
                      [r["hypothesis_id"] for r in found]):
            support.setdefault(e["hypothesis_id"], []).extend([e["experiment_a"], e["experiment_b"]])
    return [_learning_row(r, support.get(r["hypothesis_id"], [])) for r in found]


def select_evidence(rows: RowsFn, hypothesis_id: str, *, relation: str | None = None) -> list[EvidenceRow]:
    params: list[Any] = [hypothesis_id]
    cond = ""
    if relation is not None:
        if relation not in EVIDENCE_RELATIONS:
            raise InputError(f"unknown relation {relation!r} (allowed: {', '.join(EVIDENCE_RELATIONS)})")
        cond, params = " AND v.relation = ?", [hypothesis_id, relation]
    found = rows(
        "SELECT v.*, ea.problem, ea.config AS config_a, eb.config AS config_b, ea.device, "
        "ra.median_ms AS median_a_ms, rb.median_ms AS median_b_ms FROM evidence v "
        "JOIN experiments ea ON ea.key = v.experiment_a JOIN experiments eb ON eb.key = v.experiment_b "
        "LEFT JOIN results ra ON ra.experiment_key = v.experiment_a "
        "LEFT JOIN results rb ON rb.experiment_key = v.experiment_b "
        f"WHERE v.hypothesis_id = ?{cond} ORDER BY v.relation DESC, v.ratio DESC", params)
    return [EvidenceRow(r["hypothesis_id"], r["relation"], r["ratio"], loads(r["problem"]), r["problem_key"],
                        r["experiment_a"], r["experiment_b"], loads(r["config_a"]), loads(r["config_b"]),
                        r["median_a_ms"], r["median_b_ms"], r["device"]) for r in found]


def select_verdicts(rows: RowsFn, hypothesis_id: str) -> list[VerdictRow]:
    return [VerdictRow(r["id"], r["hypothesis_id"], HypothesisState(r["state"]), r["pairs"], r["wins"], r["losses"],
                       r["effect"], r["ci_low"], r["ci_high"], r["noise"], r["reason"], r["decided_at"])
            for r in rows("SELECT * FROM verdicts WHERE hypothesis_id = ? ORDER BY id", [hypothesis_id])]


def kernel_device_filter(alias: str, kernel: str | None, device: str | None) -> tuple[list[str], list[Any]]:
    """WHERE terms (and their parameters) for a kernel and a case-insensitive part of a device name."""
    where: list[str] = []
    params: list[Any] = []
    if kernel is not None:
        where.append(f"{alias}.kernel = ?")
        params.append(kernel)
    if device is not None:
        where.append(f"instr(lower({alias}.device), lower(?)) > 0")
        params.append(device)
    return where, params


# ---- the read-only API ------------------------------------------------------------------------

def hypotheses(db: ReadOnlyDB, *, kernel: str | None = None, device: str | None = None,
               campaign: str | int | None = None, state: str | Sequence[str] | None = None,
               scope: Scope | str | None = None) -> list[HypothesisRow]:
    """Hypotheses, oldest first. `db` is a `ReadOnlyDB`; `state` one state or several.

    Raises InputError for an unknown campaign, state or a bad scope filter.
    """
    states = None
    if state is not None:
        states = [state] if isinstance(state, str) else list(state)
        bad = [s for s in states if s not in STATES]
        if bad:
            raise InputError(f"unknown hypothesis state {bad[0]!r} (allowed: {', '.join(STATES)})")
    cid = campaign_id_of(db, campaign) if campaign is not None else None
    found = select_hypotheses(db.rows, kernel=kernel, device=device, campaign_id=cid, states=states)
    if scope is not None:
        s = Scope.parse(scope) if isinstance(scope, str) else scope
        found = [h for h in found if h.hypothesis.scope.overlaps(s)]
    return found


def hypothesis(db: ReadOnlyDB, hypothesis_id: str) -> HypothesisRow:
    """One hypothesis; raises InputError naming a few known ids when there is none."""
    found = select_hypotheses(db.rows, ids=[hypothesis_id])
    if found:
        return found[0]
    known = [r["id"] for r in db.rows("SELECT id FROM hypotheses ORDER BY created_at DESC LIMIT 5", [])]
    raise InputError(f"no hypothesis {hypothesis_id!r} (latest: {', '.join(known) or 'none'})")


def evidence(db: ReadOnlyDB, hypothesis_id: str, *, relation: str | None = None) -> list[EvidenceRow]:
    """The pairs behind a hypothesis, supporting first. Raises InputError for an unknown id."""
    hypothesis(db, hypothesis_id)
    return select_evidence(db.rows, hypothesis_id, relation=relation)


def verdicts(db: ReadOnlyDB, hypothesis_id: str) -> list[VerdictRow]:
    """Every change of state of a hypothesis, oldest first."""
    hypothesis(db, hypothesis_id)
    return select_verdicts(db.rows, hypothesis_id)


def learnings(db: ReadOnlyDB, *, kernel: str | None = None, device: str | None = None,
              problem: Mapping[str, Value] | None = None, scope: Scope | str | None = None) -> list[LearningRow]:
    """Learnings, oldest first: those whose scope contains `problem` (the learnings that apply
    to it) and overlaps `scope`, when given."""
    found = select_learnings(db.rows, kernel=kernel, device=device)
    if problem is not None:
        found = [r for r in found if r.learning.scope.contains(problem)]
    if scope is not None:
        s = Scope.parse(scope) if isinstance(scope, str) else scope
        found = [r for r in found if r.learning.scope.overlaps(s)]
    return found
