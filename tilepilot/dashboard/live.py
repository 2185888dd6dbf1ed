"""What every screen shares: the database it reads and how its live part refreshes.

A screen draws its filters once per full run and its data inside `live(...)`: a fragment
that Streamlit reruns on its own every `REFRESH` while the toggle in the sidebar is on, so
the page updates in place without a full rerun. Queries are cached for `data.TTL_S`, so
the database sees the same load however many browsers are open.
"""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

REFRESH = "2s"
LIVE_KEY = "live"
DB_KEY = "tilepilot_db"


def db() -> str:
    """The resolved path of the database the app was started on (set by app.py)."""
    return str(st.session_state[DB_KEY])


def is_live() -> bool:
    return bool(st.session_state.get(LIVE_KEY, True))


def live(body: Callable[[], None]) -> None:
    """Draw `body` in a fragment that reruns every REFRESH while live refresh is on."""
    st.fragment(run_every=REFRESH if is_live() else None)(body)()
