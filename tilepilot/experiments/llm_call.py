"""`LlmCall`: what one request to a language model cost and what came of it.

The `llm` proposer makes them; the campaign driver stores them (table `llm_calls`). A record
never holds the API key, the prompt or the model's raw reply: only the model's name, the
token counts and cost the API reported, why it stopped, and what was accepted or rejected.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LlmCall:
    ts: float  # epoch seconds when the request was sent
    problem_key: str  # Problem.key() of the problem the proposals were for
    model: str  # the model id asked for
    input_tokens: int | None  # None: no response (the call failed)
    output_tokens: int | None
    cache_read_tokens: int | None
    cache_creation_tokens: int | None
    cost_usd: float | None  # None: failed call, or a model without a known price
    stop_reason: str | None
    request_id: str | None  # the API's request-id header
    error: str  # "" when a reply arrived and was read
    duration_ms: float
    proposals_accepted: int = 0
    proposals_rejected: int = 0
    hypotheses_stated: int = 0  # hypotheses that passed validation (the lab may still decline them)
    rejected_reasons: tuple[str, ...] = ()  # one line per rejected or ignored item of the reply
    learnings: tuple[str, ...] = ()  # the model's own conclusions: unverified text, length-capped

    @property
    def ok(self) -> bool:
        return not self.error

    def summary(self) -> str:
        """One line for the event log."""
        if self.error:
            return f"failed: {self.error}"
        cost = f"${self.cost_usd:.4f}" if self.cost_usd is not None else "cost unknown"
        return (f"{self.proposals_accepted} config(s) accepted, {self.proposals_rejected} rejected, "
                f"{self.hypotheses_stated} hypothesis(es); {self.input_tokens} in / {self.output_tokens} out "
                f"tokens, {cost}")
