"""Cached reads of the hypothesis ledger and the knowledge graph, for the Hypotheses and
Knowledge-graph pages (the same sharing and `data.TTL_S` expiry as `data`).

Graph queries return bounded subgraphs (`storage.graph`); nothing here loads the whole graph.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from tilepilot.dashboard import data
from tilepilot.storage import graph, ledger
from tilepilot.storage.graph import Neighbourhood, Support
from tilepilot.storage.ledger import EvidenceRow, HypothesisRow, LearningRow, VerdictRow
from tilepilot.storage.queries import ReadOnlyDB

TTL_S = data.TTL_S


def _db(path: str) -> ReadOnlyDB:
    return data.handle(str(Path(path).resolve()))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def hypotheses(path: str, campaign_id: int | None = None, kernel: str | None = None,
               device: str | None = None) -> list[HypothesisRow]:
    return ledger.hypotheses(_db(path), campaign=campaign_id, kernel=kernel, device=device)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def hypothesis(path: str, hypothesis_id: str) -> HypothesisRow:
    """Raises InputError for an unknown id."""
    return ledger.hypothesis(_db(path), hypothesis_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def evidence(path: str, hypothesis_id: str) -> list[EvidenceRow]:
    return ledger.evidence(_db(path), hypothesis_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def verdicts(path: str, hypothesis_id: str) -> list[VerdictRow]:
    return ledger.verdicts(_db(path), hypothesis_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def learnings(path: str, kernel: str | None = None, device: str | None = None) -> list[LearningRow]:
    return ledger.learnings(_db(path), kernel=kernel, device=device)


def learning_of(path: str, h: HypothesisRow) -> LearningRow | None:
    """The learning a hypothesis produced, if it produced one."""
    found = [x for x in learnings(path, h.hypothesis.kernel, h.hypothesis.device)
             if x.learning.hypothesis_id == h.id]
    return found[0] if found else None


def kernels_devices(path: str) -> list[tuple[str, str]]:
    """Every (kernel, device) of a campaign or a hypothesis, sorted."""
    found = {(c.kernel, c.device) for c in data.campaigns(path)}
    found |= {(h.hypothesis.kernel, h.hypothesis.device) for h in hypotheses(path)}
    return sorted(found)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def support(path: str, hypothesis_id: str) -> Support:
    return graph.support(_db(path), hypothesis_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def neighbourhood(path: str, experiment: str, radius: int, limit: int) -> Neighbourhood:
    return graph.neighbourhood(_db(path), experiment, radius=radius, limit=limit)
