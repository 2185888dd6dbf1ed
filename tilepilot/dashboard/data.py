"""The dashboard's only way to the database: one shared read-only handle and cached queries.

Every browser session polls on its own, so each query is cached for `TTL_S` seconds across
sessions: however many tabs are open, the database sees about one query of each kind per
`TTL_S`. Results are frozen records from `storage.views`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import streamlit as st

from tilepilot.experiments import InputError
from tilepilot.storage import queries
from tilepilot.storage.views import (
    BestRow,
    CampaignSummary,
    ConvergencePoint,
    EventRow,
    GpuSampleRow,
    HistoryRow,
    QueueView,
)

TTL_S = 2.0
GPU_WINDOW_S = 300.0


def db_path(argv: Sequence[str] | None = None) -> str | None:
    """The `--db PATH` given after `--` on the `streamlit run` command line, or None."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--db")
    args, _ = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    return args.db


def open_problem(path: str | None) -> str | None:
    """Why the database at `path` cannot be read, in one line, or None when it can."""
    if not path:
        return "no database given: start the dashboard with `tilepilot dashboard --db PATH`"
    try:
        handle(str(Path(path).resolve()))
    except InputError as e:
        return str(e)
    return None


@st.cache_resource(show_spinner=False)
def handle(path: str) -> queries.ReadOnlyDB:
    """One read-only handle per database file, shared by every session (queries are serialised)."""
    return queries.open_db(path)


def _db(path: str) -> queries.ReadOnlyDB:
    return handle(str(Path(path).resolve()))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def campaigns(path: str) -> list[CampaignSummary]:
    return queries.campaigns(_db(path))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def best(path: str, campaign_id: int | None = None) -> list[BestRow]:
    return queries.best(_db(path), campaign=campaign_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def convergence(path: str, campaign_id: int) -> list[ConvergencePoint]:
    return queries.convergence(_db(path), campaign_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def queue_view(path: str, campaign_id: int | None, next_limit: int = 20,
               done_limit: int = 20) -> QueueView:
    return queries.queue_view(_db(path), campaign_id, next_limit=next_limit, done_limit=done_limit)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def history(path: str, campaign_id: int | None = None, status: tuple[str, ...] | None = None,
            proposer: str | None = None, limit: int | None = 500) -> list[HistoryRow]:
    return queries.history(_db(path), campaign=campaign_id, status=status, proposer=proposer,
                           limit=limit)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def events(path: str, campaign_id: int | None = None, kinds: tuple[str, ...] | None = None,
           limit: int = 200) -> list[EventRow]:
    return queries.events(_db(path), campaign_id=campaign_id, kinds=kinds, limit=limit)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def gpu_samples(path: str, window_s: float = GPU_WINDOW_S) -> dict[str, list[GpuSampleRow]]:
    return queries.latest_gpu_samples(_db(path), window_s=window_s)


# Choices for filters: the distinct values are read from recent rows, cached longer.

@st.cache_data(ttl=30, show_spinner=False)
def proposers(path: str, campaign_id: int | None = None) -> list[str]:
    rows = queries.history(_db(path), campaign=campaign_id, limit=5000)
    return sorted({r.proposer for r in rows if r.proposer})


@st.cache_data(ttl=30, show_spinner=False)
def event_kinds(path: str) -> list[str]:
    return sorted({e.kind for e in queries.events(_db(path), limit=5000)})
