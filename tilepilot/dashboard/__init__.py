"""dashboard: the live, read-only Streamlit view of a tilepilot database.

`launch.serve(db, host, port)` runs `streamlit run app.py` bound to 127.0.0.1 by default.
`app.py` navigates between the pages in `screens/`; they read through `data` (a shared
read-only handle and cached `storage.queries`) and refresh their live part in a fragment
(`live.live`). Nothing here writes to the database.
"""
