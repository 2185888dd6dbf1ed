"""The tilepilot dashboard: `streamlit run app.py -- --db PATH` (see `launch.serve`).

Read-only. The sidebar names the database and holds the live-refresh toggle; each page
lives in `screens/` (not `pages/`: Streamlit would treat that folder as the legacy
multipage layout).
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from tilepilot.dashboard import data, live

HERE = Path(__file__).parent
PAGES = (
    ("screens/overview.py", "Overview", ":material/monitoring:"),
    ("screens/gpus.py", "GPUs", ":material/memory:"),
    ("screens/queue.py", "Queue", ":material/queue:"),
    ("screens/experiments.py", "Experiments", ":material/science:"),
    ("screens/hypotheses.py", "Hypotheses", ":material/lightbulb:"),
    ("screens/graph.py", "Knowledge graph", ":material/hub:"),
    ("screens/log.py", "Log", ":material/receipt_long:"),
)


def main() -> None:
    st.set_page_config(page_title="tilepilot", page_icon=":material/tune:", layout="wide")
    path = data.db_path()
    problem = data.open_problem(path)
    if problem is not None:
        st.title("tilepilot")
        st.error("The dashboard cannot open its database.")
        st.text(problem)
        st.stop()
    st.session_state[live.DB_KEY] = str(Path(str(path)).resolve())
    pages = [st.Page(str(HERE / file), title=title, icon=icon, default=i == 0)
             for i, (file, title, icon) in enumerate(PAGES)]
    page = st.navigation(pages)
    with st.sidebar:
        st.caption("Database (read-only)")
        st.text(st.session_state[live.DB_KEY])
        st.toggle("Live refresh", value=True, key=live.LIVE_KEY,
                  help=f"every {live.REFRESH} while a campaign runs, every {live.IDLE_REFRESH} otherwise")
    page.run()


main()
