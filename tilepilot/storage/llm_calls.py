"""The `llm_calls` table: one row per request the `llm` proposer made, and read-only queries on it.

The `Store` writes rows (`Store.add_llm_call`, with `llm_call_columns`); readers call `llm_calls`
and `llm_usage` with a `ReadOnlyDB`. Texts (rejection reasons, the model's learnings) are data to
show as text, never markup or commands.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tilepilot.experiments import InputError
from tilepilot.experiments.llm_call import LlmCall
from tilepilot.storage.queries import ReadOnlyDB, campaign_id_of
from tilepilot.storage.rows import Row

RowsFn = Callable[[str, Sequence[Any]], list[dict[str, Any]]]


@dataclass(frozen=True)
class LlmCallRow:
    id: int
    campaign_id: int
    campaign: str
    call: LlmCall


@dataclass(frozen=True)
class LlmUsage:
    """Totals over calls: what the model was asked, what it cost, what came of it."""

    calls: int
    failed: int  # calls with an error
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_creation_tokens: int
    cost_usd: float  # over the calls with a known cost
    unpriced: int  # answered calls whose cost is unknown (a model without a price on file)
    proposals_accepted: int
    proposals_rejected: int


def llm_call_columns(campaign_id: int, c: LlmCall) -> dict[str, Any]:
    return {"ts": c.ts, "campaign_id": campaign_id, "problem_key": c.problem_key, "model": c.model,
            "input_tokens": c.input_tokens, "output_tokens": c.output_tokens,
            "cache_read_tokens": c.cache_read_tokens, "cache_creation_tokens": c.cache_creation_tokens,
            "cost_usd": c.cost_usd, "stop_reason": c.stop_reason, "request_id": c.request_id, "error": c.error,
            "duration_ms": c.duration_ms, "proposals_accepted": c.proposals_accepted,
            "proposals_rejected": c.proposals_rejected, "hypotheses_stated": c.hypotheses_stated,
            "rejected_reasons": json.dumps(list(c.rejected_reasons)), "learnings": json.dumps(list(c.learnings))}


def _row(r: Row) -> LlmCallRow:
    call = LlmCall(
        ts=r["ts"], problem_key=r["problem_key"], model=r["model"], input_tokens=r["input_tokens"],
        output_tokens=r["output_tokens"], cache_read_tokens=r["cache_read_tokens"],
        cache_creation_tokens=r["cache_creation_tokens"], cost_usd=r["cost_usd"], stop_reason=r["stop_reason"],
        request_id=r["request_id"], error=r["error"], duration_ms=r["duration_ms"],
        proposals_accepted=r["proposals_accepted"], proposals_rejected=r["proposals_rejected"],
        hypotheses_stated=r["hypotheses_stated"], rejected_reasons=tuple(json.loads(r["rejected_reasons"])),
        learnings=tuple(json.loads(r["learnings"])))
    return LlmCallRow(r["id"], r["campaign_id"], r["campaign"] or "", call)


def select_llm_calls(rows: RowsFn, *, campaign_id: int | None = None, limit: int = -1) -> list[LlmCallRow]:
    cond, params = (" WHERE l.campaign_id = ?", [campaign_id]) if campaign_id is not None else ("", [])
    found = rows("SELECT l.*, c.name AS campaign FROM llm_calls l LEFT JOIN campaigns c ON c.id = l.campaign_id"
                 + cond + " ORDER BY l.id DESC LIMIT ?", [*params, limit])
    return [_row(r) for r in found]


def usage_of(calls: Sequence[LlmCall]) -> LlmUsage:
    answered = [c for c in calls if not c.error]
    return LlmUsage(
        calls=len(calls), failed=len(calls) - len(answered),
        input_tokens=sum(c.input_tokens or 0 for c in calls), output_tokens=sum(c.output_tokens or 0 for c in calls),
        cache_read_tokens=sum(c.cache_read_tokens or 0 for c in calls),
        cache_creation_tokens=sum(c.cache_creation_tokens or 0 for c in calls),
        cost_usd=sum(c.cost_usd or 0.0 for c in calls),
        unpriced=sum(c.cost_usd is None and c.input_tokens is not None for c in calls),
        proposals_accepted=sum(c.proposals_accepted for c in calls),
        proposals_rejected=sum(c.proposals_rejected for c in calls))


# ---- the read-only API ------------------------------------------------------------------------

def llm_calls(db: ReadOnlyDB, *, campaign: str | int | None = None, limit: int | None = None) -> list[LlmCallRow]:
    """Calls to the model, newest first. Raises InputError for an unknown campaign."""
    cid = campaign_id_of(db, campaign) if campaign is not None else None
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InputError(f"limit={limit!r} is not a positive integer")
    return select_llm_calls(db.rows, campaign_id=cid, limit=-1 if limit is None else limit)


def llm_usage(db: ReadOnlyDB, *, campaign: str | int | None = None) -> LlmUsage:
    """Token and cost totals of the calls (of one campaign, or all)."""
    return usage_of([r.call for r in llm_calls(db, campaign=campaign)])
