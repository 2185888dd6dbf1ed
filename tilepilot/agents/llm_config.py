"""Configuration of the `llm` proposer: the model, the API key, and what a call costs.

- Model: `TILEPILOT_LLM_MODEL` (default `claude-sonnet-5-5`), a Claude model id. An id without
  a price below is accepted (the API decides whether it exists); its cost is stored as null.
- Key: `ANTHROPIC_API_KEY`, read here and handed to the SDK client only; it is never logged,
  stored or put in an event. Without it the proposer is unavailable.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)

MODEL_ENV = "TILEPILOT_LLM_MODEL"
KEY_ENV = "ANTHROPIC_API_KEY"
DEFAULT_MODEL = "claude-sonnet-5-5"
MODEL_RE = re.compile(r"^claude-[a-z0-9][a-z0-9.-]{0,63}$")
_warned: set[str] = set()  # models without a price, warned about once


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cache_read: float
    cache_write: float  # a 5-minute cache write; the proposer never asks for the 1-hour cache
    max_prompt_tokens: int | None = None  # above this prompt size another tier applies: not priced here


# Checked 2026-11 against platform.claude.com/docs: the model pages (models/<model>/overview) and
# the pricing page (about-claude/pricing). Sonnet 5.5 cache reads were cut from $0.20 to $0.10 per
# million tokens on 2026-10-07. Haiku 5.5 is priced by prompt length (input + cache reads + cache
# writes); only the tier up to 100,000 tokens is listed, a longer prompt's cost is left null.
# Batch, fast mode and US-only inference (x1.1) are never requested, so they are not listed.
PRICES: dict[str, Price] = {
    "claude-opus-5-5": Price(input=4.00, output=20.00, cache_read=0.20, cache_write=5.00),
    "claude-sonnet-5-5": Price(input=2.00, output=10.00, cache_read=0.10, cache_write=2.50),
    "claude-haiku-5-5": Price(input=0.10, output=0.50, cache_read=0.01, cache_write=0.125,
                              max_prompt_tokens=100_000),
}


def model_id() -> str:
    """The model to ask: TILEPILOT_LLM_MODEL, else the default. Raises ValueError for a malformed id."""
    model = os.environ.get(MODEL_ENV, "").strip() or DEFAULT_MODEL
    if not MODEL_RE.match(model):
        raise ValueError(f"{MODEL_ENV}={model[:80]!r} is not a Claude model id "
                         f"(e.g. {', '.join(sorted(PRICES))})")
    return model


def api_key() -> str | None:
    value = os.environ.get(KEY_ENV, "").strip()
    return value or None


def unavailable_reason() -> str | None:
    """Why the `llm` proposer cannot run here (one line), or None."""
    if api_key() is None:
        return (f"proposer 'llm' needs {KEY_ENV} in the environment (it is not set); "
                "the other proposers need no key")
    try:
        model = model_id()
    except ValueError as e:
        return f"proposer 'llm': {e}"
    if model not in PRICES and model not in _warned:
        _warned.add(model)
        log.warning("model %s has no price on file: the cost of its calls will be stored as null", model)
    return None


def cost_usd(model: str, *, input_tokens: int, output_tokens: int, cache_read_tokens: int,
             cache_creation_tokens: int) -> float | None:
    """The cost of one call from its usage; None for a model (or a prompt size) without a known price."""
    price = PRICES.get(model)
    if price is None:
        return None
    prompt = input_tokens + cache_read_tokens + cache_creation_tokens
    if price.max_prompt_tokens is not None and prompt > price.max_prompt_tokens:
        return None
    return (input_tokens * price.input + output_tokens * price.output + cache_read_tokens * price.cache_read
            + cache_creation_tokens * price.cache_write) / 1e6
