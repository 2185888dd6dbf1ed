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
    "optuna": "tilepilot.agents.optuna:OptunaProposer",
    "portfolio": "tilepilot.agents.portfolio:PortfolioProposer",
    "random": "tilepilot.agents.random:RandomProposer",
    "rules": "tilepilot.agents.rules:RulesProposer",
}

DEFAULT_PROPOSER = "optuna"


def proposer_names() -> list[str]:
    """Every registered proposer name, sorted."""
    return sorted(PROPOSERS)


def get_proposer(name: str) -> type[Proposer]:
    """The proposer class registered under `name`. Raises InputError for an unknown name."""
    target = PROPOSERS.get(name)
    if target is None:
        raise InputError(f"unknown proposer {name!r} (known proposers: {', '.join(proposer_names())})")
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, Proposer)) or cls.name != name:
        raise TypeError(f"registry entry {name!r} -> {target} is not a Proposer named {name!r}")
    return cls
