"""dashboard: the live, read-only Streamlit view of a tilepilot database.

`launch.serve(db, host, port)` runs `streamlit run app.py` bound to 127.0.0.1 by default.
`app.py` navigates between the pages in `screens/`; they read through `data` (a shared
read-only handle, cached queries: the dashboard's own in `reads`, and `storage`'s), compute
what they show in `digest`, `roofline` and `queue_history`, draw with `charts` and refresh their
live part in a fragment (`live.live`). Nothing here writes to the database.
`bench/dashboard_render.py` times every page on a 100k-experiment store.
"""
