"""Charts: a problem's convergence, the results on the roofline, and the effect of each parameter.

Every chart gets its data already thinned (`digest`): a browser draws a few thousand marks per
chart at most, whatever the store holds.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import altair as alt
import pandas as pd

from tilepilot.dashboard import roofline
from tilepilot.experiments import DeviceCeilings

LEGEND = alt.Legend(orient="top", direction="horizontal", titleOrient="left")


def convergence_frame(points: pd.DataFrame, panels: Mapping[str, str]) -> pd.DataFrame:
    """One row per trial drawn (rows of `digest.ConvergencePoint` with their `problem_key`), for the
    problems in `panels` (problem key -> the panel's title), in that order: its time (ok only) and
    the best time so far."""
    rows = points[points["problem_key"].isin(list(panels))]
    order = {k: i for i, k in enumerate(panels)}
    return pd.DataFrame({"panel": rows["problem_key"].map(panels), "order": rows["problem_key"].map(order),
                         "trial": rows["seq"], "median_ms": rows["median_ms"],
                         "best_so_far_ms": rows["best_so_far_ms"], "status": rows["status"],
                         "proposer": rows["proposer"]}).reset_index(drop=True)


def convergence_chart(y_title: str, columns: int = 2, width: int = 380) -> alt.FacetChart:
    """A panel per problem: best-so-far as a step line over trials, each ok trial as a point
    coloured by proposer. The data (a `convergence_frame`) is given when drawn. One chart with a
    panel per problem, not a chart per problem: a browser builds each chart's view on its own.

    The time axis is logarithmic: a search tries configs many times slower than the best, and
    on a linear axis they flatten the best-so-far line against the floor.
    """
    base = alt.Chart().encode(
        x=alt.X("trial:Q", title="trial", axis=alt.Axis(tickMinStep=1), scale=alt.Scale(nice=False)))
    best = base.mark_line(interpolate="step-after", color="#d62728", strokeWidth=2).encode(
        y=alt.Y("best_so_far_ms:Q", title=f"{y_title} (log)", scale=alt.Scale(type="log"),
                axis=alt.Axis(format="~g", tickCount=3)),
        tooltip=["trial:Q", "best_so_far_ms:Q"])
    trials = base.transform_filter("datum.median_ms != null").mark_circle(size=28, opacity=0.6).encode(
        y=alt.Y("median_ms:Q", scale=alt.Scale(type="log")),
        color=alt.Color("proposer:N", legend=LEGEND),
        tooltip=["trial:Q", "median_ms:Q", "proposer:N", "status:N"])
    facet = alt.Facet("panel:N", title=None, sort=alt.EncodingSortField("order", order="ascending"),
                      header=alt.Header(labelLimit=600, labelFontSize=12, labelAnchor="start"))
    placeholder = pd.DataFrame(columns=["panel", "order", "trial", "median_ms", "best_so_far_ms", "status", "proposer"])
    return (alt.layer(trials, best, data=placeholder).properties(width=width, height=220)
            .facet(facet=facet, columns=columns).resolve_scale(x="independent", y="independent"))


@functools.lru_cache(maxsize=8)
def _convergence_json(y_title: str) -> str:
    spec = convergence_chart(y_title).to_dict()
    spec.pop("data", None)  # the placeholder: the frame comes with the drawing
    spec.pop("datasets", None)
    return json.dumps(spec)


def convergence_spec(y_title: str) -> dict[str, Any]:
    """`convergence_chart` as a Vega-Lite spec, built once (through Altair it costs more than the
    rest of the page)."""
    return json.loads(_convergence_json(y_title))


# ---- the roofline ------------------------------------------------------------------------------------

def roofline_frame(points: pd.DataFrame, labels: Mapping[str, str]) -> pd.DataFrame:
    """The results to draw (rows of `digest.RooflinePoint`), with their problems' labels."""
    return pd.DataFrame({
        "problem": [labels.get(k, k) for k in points["problem_key"]],
        "FLOP per byte": points["intensity"].to_numpy(),
        "TFLOP/s": points["tflops"].to_numpy(),
        "median_ms": points["median_ms"].to_numpy(),
        "% of roofline": points["pct"].to_numpy(dtype=float, na_value=float("nan")),
        "result": ["best" if b else "other" for b in points["best"]],
    })


def ceiling_frame(c: DeviceCeilings, lo: float, hi: float, steps: int = 64) -> pd.DataFrame:
    """The roofline min(matmul rate, intensity × copy bandwidth) over [lo, hi] FLOP/byte (log steps,
    and the ridge point where the two meet)."""
    xs = sorted({lo * (hi / lo) ** (i / (steps - 1)) for i in range(steps)} | {roofline.ridge(c)} if lo < hi else {lo})
    xs = [x for x in xs if lo <= x <= hi]
    return pd.DataFrame({"FLOP per byte": xs,
                         "TFLOP/s": [min(c.matmul_tflops, x * c.copy_gbps / 1000) for x in xs]})


def roofline_chart(points: pd.DataFrame, labels: Mapping[str, str],
                   ceiling: DeviceCeilings | None) -> alt.LayerChart:
    """Arithmetic intensity against achieved TFLOP/s (log-log), each result a point (a problem's
    results share its intensity), each problem's best filled; with ceilings, the roofline drawn."""
    frame = roofline_frame(points, labels)
    lo, hi = float(frame["FLOP per byte"].min()), float(frame["FLOP per byte"].max())
    if ceiling is not None:
        lo, hi = min(lo, roofline.ridge(ceiling)), max(hi, roofline.ridge(ceiling))
    lo, hi = lo / 2, hi * 2
    x = alt.X("FLOP per byte:Q", title="arithmetic intensity (FLOP/byte, log)",
              scale=alt.Scale(type="log", domain=[lo, hi], nice=False), axis=alt.Axis(format="~g"))
    y = alt.Y("TFLOP/s:Q", title="achieved TFLOP/s (log)", scale=alt.Scale(type="log"), axis=alt.Axis(format="~g"))
    dots = alt.Chart(frame).mark_point(filled=True, opacity=0.55).encode(
        x=x, y=y, color=alt.Color("problem:N", legend=alt.Legend(orient="right", title="problem", labelLimit=260)),
        shape=alt.Shape("result:N", scale=alt.Scale(domain=["best", "other"], range=["diamond", "circle"]),
                        legend=LEGEND),
        size=alt.Size("result:N", scale=alt.Scale(domain=["best", "other"], range=[120, 22]), legend=None),
        tooltip=["problem", alt.Tooltip("median_ms:Q", format=".4g"), alt.Tooltip("TFLOP/s:Q", format=".4g"),
                 alt.Tooltip("FLOP per byte:Q", format=".4g"), alt.Tooltip("% of roofline:Q", format=".1f")])
    layers: list[alt.Chart] = [dots]
    if ceiling is not None:
        roof = alt.Chart(ceiling_frame(ceiling, lo, hi)).mark_line(color="#444444", strokeWidth=2).encode(
            x=x, y=y, tooltip=[alt.Tooltip("FLOP per byte:Q", format=".4g"), alt.Tooltip("TFLOP/s:Q", format=".4g")])
        notes = [
            (lo * 1.15, lo * 1.15 * ceiling.copy_gbps / 1000, f"copy {ceiling.copy_gbps:.0f} GB/s", "left"),
            (hi / 1.15, ceiling.matmul_tflops, f"{ceiling.matmul_dtype} matmul {ceiling.matmul_tflops:.0f} TFLOP/s",
             "right")]
        text = [alt.Chart(pd.DataFrame({"FLOP per byte": [nx], "TFLOP/s": [ny], "note": [note]}))
                .mark_text(dy=-9, fontSize=11, color="#444444", align=align).encode(x=x, y=y, text="note:N")
                for nx, ny, note, align in notes]
        layers = [roof, *text, dots]
    return alt.layer(*layers).properties(height=340)


# ---- the effect of each parameter --------------------------------------------------------------------

def effects_chart(effects: pd.DataFrame, columns: int = 3) -> alt.FacetChart:
    """Per parameter (a panel each), per value: time over the problem's best, as a box from the
    25th to the 75th percentile with whiskers at the 10th and 90th and a tick at the median."""
    frame = effects.copy()
    frame["label"] = frame["value"]
    y_top = max(2.0, float(frame["q90"].max()) * 1.05) if len(frame) else 2.0
    x = alt.X("label:N", title=None, sort=alt.EncodingSortField("order", order="ascending"),
              axis=alt.Axis(labelAngle=0))
    scale = alt.Scale(type="log", domain=[1, y_top], nice=False)
    tip = ["param", "value", "n", alt.Tooltip("q10:Q", format=".3f"), alt.Tooltip("q25:Q", format=".3f"),
           alt.Tooltip("q50:Q", format=".3f"), alt.Tooltip("q75:Q", format=".3f"), alt.Tooltip("q90:Q", format=".3f")]
    base = alt.Chart().encode(x=x, tooltip=tip)
    whisker = base.mark_rule(color="#7f7f7f").encode(
        y=alt.Y("q10:Q", title="time / problem's best (log)", scale=scale, axis=alt.Axis(format="~g")), y2="q90:Q")
    box = base.mark_bar(size=14, color="#9ecae1", opacity=0.9).encode(y=alt.Y("q25:Q", scale=scale), y2="q75:Q")
    mid = base.mark_tick(color="#08519c", thickness=2, size=16).encode(y=alt.Y("q50:Q", scale=scale))
    return (alt.layer(whisker, box, mid, data=frame).properties(width=190, height=170)
            .facet(facet=alt.Facet("param:N", title=None), columns=columns)
            .resolve_scale(x="independent"))
