"""The dashboard's only way to the database: one shared read-only handle and cached queries.

Every browser session polls on its own, so each query is cached for `TTL_S` seconds across
sessions: however many tabs are open, the database sees about one query of each kind per
`TTL_S`. The queries are the dashboard's own (`reads`, fast at 100k experiments) and, for the
event log, the GPU samples and the ledger, `storage.queries` and `storage.ledger`; results are
frozen records. A campaign's trials come from one shared `TrialLog` that reads only new trials,
and what the Overview computes from them (`digest`) is cached by the campaign's `updated_at`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import streamlit as st

from tilepilot.dashboard import digest as digest_of
from tilepilot.dashboard import reads, trial_stats
from tilepilot.dashboard.digest import CampaignDigest
from tilepilot.dashboard.trial_log import TrialLog
from tilepilot.experiments import DeviceCeilings, InputError
from tilepilot.storage import queries
from tilepilot.storage.views import EventRow, GpuSampleRow

TTL_S = 2.0  # the live refresh's pace: every query is at most this old
DIGEST_TTL_S = 20.0  # winners, ceilings and model spend show within this (new trials at once)
EFFECTS_TTL_S = 15.0
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
def handle(path: str) -> reads.DashboardDB:
    """One read-only handle per database file, shared by every session (queries are serialised)."""
    return reads.open_db(path)


def _db(path: str) -> reads.DashboardDB:
    return handle(str(Path(path).resolve()))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def campaigns(path: str) -> list[reads.CampaignInfo]:
    """Every campaign, newest first, with its queue counts (cheap: no trial is read)."""
    return reads.campaigns(_db(path))


def campaign(path: str, campaign_id: int) -> reads.CampaignInfo | None:
    return next((c for c in campaigns(path) if c.id == campaign_id), None)


def any_running(path: str) -> bool:
    return any(c.state == "running" for c in campaigns(path))


# ---- one campaign's trials and what the Overview computes from them ----------------------------------

@st.cache_resource(show_spinner=False)
def trial_log(path: str) -> TrialLog:
    """Every campaign's trials, read incrementally (see `trial_log`); one per database, shared."""
    return TrialLog()


def trials(path: str, campaign_id: int) -> tuple[reads.TrialPoint, ...]:
    return trial_log(path).read(_db(path)).get(campaign_id, ())


@st.cache_data(ttl=TTL_S, show_spinner=False)
def ceilings(path: str) -> list[DeviceCeilings]:
    return queries.ceilings(_db(path))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def llm_spend(path: str) -> dict[int, reads.LlmSpend]:
    return reads.llm_spend(_db(path))


@st.cache_data(ttl=DIGEST_TTL_S, show_spinner=False, max_entries=256)
def digest(path: str, campaign_id: int, updated_at: float) -> CampaignDigest | None:
    """The campaign's figures (see `digest`). Keyed by the campaign's `updated_at`, which every new
    trial and change of state moves: a new trial shows at the next refresh, winners, ceilings and
    model calls within `DIGEST_TTL_S`. Its `campaign` is the row as of then: take the queue counts,
    which change without `updated_at`, from `campaigns`."""
    c = campaign(path, campaign_id)
    if c is None:
        return None
    db = _db(path)
    points = trials(path, campaign_id)
    won = reads.winners(db, campaign_id)
    briefs = reads.experiments(db, digest_of.keys_to_read(c, points, won))
    return digest_of.digest(c, points, won, briefs, ceilings(path), llm_spend(path).get(campaign_id), time.time())


@st.cache_data(ttl=DIGEST_TTL_S, show_spinner=False, max_entries=32)
def chart_points(path: str, campaign_id: int, updated_at: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The trials to draw, thinned (see `digest.convergence` and `digest.roofline_points`), as
    frames: the convergence of every problem (columns `problem_key` and those of
    `digest.ConvergencePoint`) and the results on the roofline (those of `digest.RooflinePoint`).
    Frames, because a cached value is copied out to every reader, and a frame copies fast."""
    d = digest(path, campaign_id, updated_at)
    points = trials(path, campaign_id)
    if d is None:
        return pd.DataFrame(), pd.DataFrame()
    conv = [(key, *p) for key, pts in digest_of.convergence(points).items() for p in pts]
    roof = digest_of.roofline_points(d.campaign.kernel, d.problems, points, d.ceilings)
    return (pd.DataFrame(conv, columns=["problem_key", *digest_of.ConvergencePoint._fields]),
            pd.DataFrame(roof, columns=list(digest_of.RooflinePoint._fields)))


@st.cache_data(ttl=EFFECTS_TTL_S, show_spinner=False, max_entries=32)
def parameter_effects(path: str, campaign_id: int) -> pd.DataFrame:
    """Per parameter value, time over the problem's best (see `digest.parameter_effects`); the
    distributions move slowly, so they are recomputed every `EFFECTS_TTL_S` at most."""
    return digest_of.parameter_effects(trials(path, campaign_id))


# ---- queue, experiments, events, GPUs -------------------------------------------------------------

@st.cache_data(ttl=TTL_S, show_spinner=False)
def running(path: str, campaign_id: int | None = None) -> list[reads.QueueEntry]:
    return reads.running(_db(path), campaign_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def queued(path: str, campaign_id: int | None = None, limit: int = 25) -> list[reads.QueueEntry]:
    return reads.queued(_db(path), campaign_id, limit)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def recently_done(path: str, campaign_id: int | None = None, limit: int = 25) -> list[reads.QueueEntry]:
    return reads.recently_done(_db(path), campaign_id, limit)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def queue_totals(path: str, campaign_id: int | None = None) -> dict[str, int]:
    return reads.queue_totals(_db(path), campaign_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def queue_events(path: str, campaign_id: int | None = None, limit: int = 50) -> list[reads.QueueEvent]:
    return reads.queue_events(_db(path), campaign_id, limit)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def trial_list(path: str, campaign_id: int | None = None, statuses: tuple[str, ...] = (),
               proposer: str | None = None, limit: int = 500, kernel: str | None = None,
               problem_key: str | None = None) -> list[reads.TrialListRow]:
    return reads.trial_list(_db(path), campaign_id=campaign_id, statuses=statuses, proposer=proposer, limit=limit,
                            kernel=kernel, problem_key=problem_key)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def trial_summary(path: str, campaign_ids: tuple[int, ...], problem_key: str | None, statuses: tuple[str, ...],
                  proposer: str | None) -> trial_stats.Summary:
    """Counts and times over every trial of `campaign_ids` that the filters keep (see `trial_stats`),
    from the shared trial log: no query beyond its new trials."""
    points = [p for cid in campaign_ids for p in trials(path, cid)]
    return trial_stats.summary(points, problem_key, statuses, proposer)


def problem_keys(path: str, campaign_ids: tuple[int, ...]) -> list[str]:
    """The problems the campaigns' trials ran, in the order first tried."""
    return list(dict.fromkeys(p.problem_key for cid in campaign_ids for p in trials(path, cid)))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def experiment(path: str, key: str) -> tuple[reads.ExperimentDetail | None, list[reads.TrialOf],
                                            list[reads.HypothesisLink]]:
    db = _db(path)
    return reads.experiment_detail(db, key), reads.trials_of(db, key), reads.tested_hypotheses(db, key)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def events(path: str, campaign_id: int | None = None, kinds: tuple[str, ...] | None = None,
           limit: int = 200) -> list[EventRow]:
    return queries.events(_db(path), campaign_id=campaign_id, kinds=kinds, limit=limit)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def gpu_samples(path: str, window_s: float = GPU_WINDOW_S) -> dict[str, list[GpuSampleRow]]:
    return queries.latest_gpu_samples(_db(path), window_s=window_s)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def last_gpu_samples(path: str, window_s: float = GPU_WINDOW_S) -> dict[str, list[GpuSampleRow]]:
    """The `window_s` seconds of samples up to the store's newest one ({} when it holds none): what
    the GPUs did when the store last saw them, for a store whose campaigns have ended."""
    db = _db(path)
    last = queries.last_gpu_sample_ts(db)
    return {} if last is None else queries.latest_gpu_samples(db, window_s=window_s, now=last)


# Choices for filters: cached longer.

@st.cache_data(ttl=30, show_spinner=False)
def proposers(path: str, campaign_id: int | None = None) -> list[str]:
    return reads.proposers(_db(path), campaign_id)


@st.cache_data(ttl=30, show_spinner=False)
def event_kinds(path: str) -> list[str]:
    return reads.event_kinds(_db(path))
