"""The proposer registry: name -> "module:Class", imported only when asked for.

Listing or validating names costs nothing; Optuna is imported only when the `optuna`
proposer is actually built.
"""

from __future__ import annotations

import importlib

from tilepilot.agents.base import Proposer, Registry
from tilepilot.experiments import InputError

PROPOSERS: Registry = {
    "grid": "tilepilot.agents.grid:GridProposer",
    "llm": "tilepilot.agents.llm:LlmProposer",
    "optuna": "tilepilot.agents.optuna:OptunaProposer",
    "optuna-gp": "tilepilot.agents.optuna_gp:OptunaGpProposer",
    "portfolio": "tilepilot.agents.portfolio:PortfolioProposer",
    "random": "tilepilot.agents.random:RandomProposer",
    "rules": "tilepilot.agents.rules:RulesProposer",
}

DEFAULT_PROPOSER = "portfolio"  # rules, optuna and random (and llm with a key), slots by what each delivers


def proposer_names() -> list[str]:
    """Every registered proposer name, sorted."""
    return sorted(PROPOSERS)


def get_proposer(name: str) -> type[Proposer]:
    """The proposer class registered under `name`.

    Raises InputError for an unknown name, or for a proposer that cannot run here (its
    `unavailable()` reason, e.g. `llm` without ANTHROPIC_API_KEY).
    """
    cls = _load(name)
    reason = cls.unavailable()
    if reason:
        raise InputError(reason)
    return cls


def unavailable(name: str) -> str | None:
    """Why the proposer `name` cannot run here, or None. Raises InputError for an unknown name."""
    return _load(name).unavailable()


def _load(name: str) -> type[Proposer]:
    target = PROPOSERS.get(name)
    if target is None:
        raise InputError(f"unknown proposer {name!r} (known proposers: {', '.join(proposer_names())})")
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, Proposer)) or cls.name != name:
        raise TypeError(f"registry entry {name!r} -> {target} is not a Proposer named {name!r}")
    return cls
