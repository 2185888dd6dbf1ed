"""What every screen shares: the database it reads and how its live part refreshes.

A screen draws its filters once per full run and its data inside `live(...)`: a fragment
that Streamlit reruns on its own, so the page updates in place without a full rerun. It
reruns every `REFRESH` while a campaign runs and every `IDLE_REFRESH` otherwise (to notice
a new campaign); when that changes, the fragment asks for one full rerun to switch pace.
The sidebar toggle turns refreshing off. Queries are cached for `data.TTL_S`, so the
database sees the same load however many browsers are open.
"""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from tilepilot.dashboard import data

REFRESH = "2s"
IDLE_REFRESH = "10s"
LIVE_KEY = "live"
DB_KEY = "tilepilot_db"


def db() -> str:
    """The resolved path of the database the app was started on (set by app.py)."""
    return str(st.session_state[DB_KEY])


def is_live() -> bool:
    return bool(st.session_state.get(LIVE_KEY, True))


def campaign_running() -> bool:
    return any(c.state == "running" for c in data.campaigns(db()))


def interval(*, live: bool, running: bool) -> str | None:
    """How often the live part reruns: None when refreshing is off."""
    if not live:
        return None
    return REFRESH if running else IDLE_REFRESH


def live(body: Callable[[], None]) -> None:
    """Draw `body` in a fragment that reruns on its own (see the module docstring)."""
    running = campaign_running()

    def refresh() -> None:
        if is_live() and campaign_running() != running:
            st.rerun()  # a campaign started or ended: one full run to change the pace
        body()

    st.fragment(run_every=interval(live=is_live(), running=running))(refresh)()
