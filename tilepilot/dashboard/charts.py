"""Charts: convergence of a problem, and the small time series of a GPU card."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import altair as alt
import pandas as pd

from tilepilot.storage.views import ConvergencePoint, GpuSampleRow


def convergence_frame(points: Sequence[ConvergencePoint]) -> pd.DataFrame:
    """One row per trial of one problem: its time (ok only) and the best time so far."""
    return pd.DataFrame({
        "trial": [p.seq for p in points],
        "median_ms": [p.median_ms for p in points],
        "best_so_far_ms": [p.best_so_far_ms for p in points],
        "status": [p.status.value for p in points],
        "proposer": [p.proposer for p in points],
    })


def convergence_chart(points: Sequence[ConvergencePoint], y_title: str) -> alt.LayerChart:
    """Best-so-far as a step line over trials, each ok trial as a point coloured by proposer.

    The time axis is logarithmic: a search tries configs many times slower than the best, and
    on a linear axis they flatten the best-so-far line against the floor.
    """
    frame = convergence_frame(points)
    base = alt.Chart(frame).encode(
        x=alt.X("trial:Q", title="trial", axis=alt.Axis(tickMinStep=1), scale=alt.Scale(nice=False)))
    best = base.mark_line(interpolate="step-after", color="#d62728", strokeWidth=2).encode(
        y=alt.Y("best_so_far_ms:Q", title=f"{y_title} (log)", scale=alt.Scale(type="log"),
                axis=alt.Axis(format="~g", tickCount=3)),
        tooltip=["trial", "best_so_far_ms"])
    trials = base.transform_filter("datum.median_ms != null").mark_circle(size=28, opacity=0.6).encode(
        y=alt.Y("median_ms:Q", scale=alt.Scale(type="log")),
        color=alt.Color("proposer:N", legend=alt.Legend(orient="top", direction="horizontal",
                                                        titleOrient="left")),
        tooltip=["trial", "median_ms", "proposer", "status"])
    return alt.layer(trials, best).properties(height=260)


def gpu_frame(samples: Sequence[GpuSampleRow]) -> pd.DataFrame:
    return pd.DataFrame({
        "time": [datetime.fromtimestamp(s.ts) for s in samples],  # local time, as the log shows
        "util %": [s.util_pct for s in samples],
        "power W": [s.power_w for s in samples],
        "temp °C": [s.temp_c for s in samples],
    }).set_index("time")
