"""Proposers: they choose the configs to measure and say why (see `base` for the contract).

Implementations are imported through the registry, on demand.
"""

from __future__ import annotations

from tilepilot.agents.base import Proposer, ProposerContext, SearchState
from tilepilot.agents.registry import DEFAULT_PROPOSER, get_proposer, proposer_names

__all__ = [
    "DEFAULT_PROPOSER", "Proposer", "ProposerContext", "SearchState", "get_proposer", "proposer_names",
]
