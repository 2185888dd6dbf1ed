"""Small SVG charts drawn from numbers: no plotting library, no network, every text escaped.

Each function returns one `<svg>` element (a string) that stands alone: it can be inlined in HTML
or written as a `.svg` file. Points carry a `<title>` with their values, which a browser shows
on hover.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
FONT = 'font-family="system-ui, sans-serif" font-size="11"'
_PAD = (52, 14, 26, 40)  # left, right, top, bottom


@dataclass(frozen=True)
class Series:
    name: str
    points: tuple[tuple[float, float, str], ...]  # (x, y, tooltip)
    kind: str = "points"  # points | step | line
    color: str = PALETTE[0]


def num(v: float) -> str:
    """Four significant digits: the way every number of a report is written."""
    return f"{v:.4g}"


def _open(width: int, height: int, title: str) -> list[str]:
    t = escape(title)
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{t}">',
            f"<title>{t}</title>",
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
            f'<text x="{width / 2:.1f}" y="15" text-anchor="middle" {FONT} font-weight="bold">{t}</text>']


class _Axis:
    """A linear or log10 mapping of [lo, hi] onto [a, b] pixels."""

    def __init__(self, lo: float, hi: float, a: float, b: float, log: bool) -> None:
        if log:
            lo, hi = math.log10(lo), math.log10(hi)
        if hi - lo < 1e-12:
            lo, hi = lo - 0.5, hi + 0.5
        margin = 0.06 * (hi - lo)  # no point on the frame
        lo, hi = lo - margin, hi + margin
        self.lo, self.hi, self.a, self.b, self.log = lo, hi, a, b, log

    def __call__(self, v: float) -> float:
        x = math.log10(v) if self.log else v
        return self.a + (x - self.lo) / (self.hi - self.lo) * (self.b - self.a)

    def ticks(self, n: int = 5) -> list[float]:
        if self.log:
            lo, hi = math.floor(self.lo), math.ceil(self.hi)
            step = max(1, (hi - lo) // n or 1)
            return [10.0 ** e for e in range(lo, hi + 1, step) if self.lo - 1e-9 <= e <= self.hi + 1e-9]
        raw = (self.hi - self.lo) / n
        mag = 10 ** math.floor(math.log10(raw))
        step = min((m * mag for m in (1, 2, 5, 10) if m * mag >= raw), default=raw)
        first = math.ceil(self.lo / step) * step
        return [first + i * step for i in range(int((self.hi - first) / step + 1e-9) + 1)]


def xy_chart(series: Sequence[Series], *, title: str, x_label: str, y_label: str, log_x: bool = False,
             log_y: bool = False, width: int = 520, height: int = 260,
             extra: Sequence[Series] = ()) -> str:
    """Points, steps or lines over shared axes; `extra` series are drawn first (e.g. a roofline)."""
    every = [p for s in (*series, *extra) for p in s.points]
    out = _open(width, height, title)
    if not every:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" {FONT}>no data</text></svg>')
        return "".join(out)
    xs = [p[0] for p in every if not log_x or p[0] > 0]
    ys = [p[1] for p in every if not log_y or p[1] > 0]
    left, right, top, bottom = _PAD
    ax = _Axis(min(xs), max(xs), left, width - right, log_x)
    ay = _Axis(min(ys), max(ys), height - bottom, top + 8, log_y)
    out += _frame(ax, ay, width, height, x_label, y_label)
    for s in (*extra, *series):
        out += _series(s, ax, ay, log_x, log_y)
    out += _legend([s for s in series if s.name], width)
    out.append("</svg>")
    return "".join(out)


def _frame(ax: _Axis, ay: _Axis, width: int, height: int, x_label: str, y_label: str) -> list[str]:
    left, right, top, bottom = _PAD
    out = [f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#444"/>',
           f'<line x1="{left}" y1="{top + 4}" x2="{left}" y2="{height - bottom}" stroke="#444"/>']
    for t in ax.ticks():
        x = ax(t)
        out.append(f'<line x1="{x:.1f}" y1="{height - bottom}" x2="{x:.1f}" y2="{height - bottom + 4}" stroke="#444"/>'
                   f'<text x="{x:.1f}" y="{height - bottom + 15}" text-anchor="middle" {FONT}>{escape(num(t))}</text>')
    for t in ay.ticks():
        y = ay(t)
        out.append(f'<line x1="{left - 4}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#e5e5e5"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" {FONT}>{escape(num(t))}</text>')
    out.append(f'<text x="{(left + width - right) / 2:.1f}" y="{height - 6}" text-anchor="middle" {FONT}>'
               f"{escape(x_label)}</text>")
    out.append(f'<text x="12" y="{(top + height - bottom) / 2:.1f}" text-anchor="middle" {FONT} '
               f'transform="rotate(-90 12 {(top + height - bottom) / 2:.1f})">{escape(y_label)}</text>')
    return out


def _series(s: Series, ax: _Axis, ay: _Axis, log_x: bool, log_y: bool) -> list[str]:
    pts = [(ax(x), ay(y), tip) for x, y, tip in s.points if (not log_x or x > 0) and (not log_y or y > 0)]
    if not pts:
        return []
    color = escape(s.color)
    if s.kind in ("step", "line"):
        path = f"M{pts[0][0]:.1f},{pts[0][1]:.1f}"
        for (_, y0, _), (x1, y1, _) in itertools.pairwise(pts):
            path += f" L{x1:.1f},{y0:.1f} L{x1:.1f},{y1:.1f}" if s.kind == "step" else f" L{x1:.1f},{y1:.1f}"
        dash = ' stroke-dasharray="5 3"' if s.kind == "line" else ""
        out = [f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>']
        return out + [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2" fill="{color}"><title>{escape(t)}</title></circle>'
                      for x, y, t in pts if t]
    return [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}" fill-opacity="0.75">'
            f"<title>{escape(t)}</title></circle>" for x, y, t in pts]


def _legend(series: Sequence[Series], width: int) -> list[str]:
    out = []
    for i, s in enumerate(series):
        y = 30 + 14 * i
        out.append(f'<rect x="{width - 150}" y="{y - 8}" width="10" height="10" fill="{escape(s.color)}"/>'
                   f'<text x="{width - 136}" y="{y + 1}" {FONT}>{escape(s.name[:28])}</text>')
    return out


def bar_chart(bars: Sequence[tuple[str, float, str]], *, title: str, x_label: str, reference: float | None = None,
              width: int = 460) -> str:
    """Horizontal bars (label, value, tooltip) from 0; `reference` draws a dashed line at that value."""
    row = 18
    height = 36 + row * max(1, len(bars)) + 30
    out = _open(width, height, title)
    if not bars:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" {FONT}>no data</text></svg>')
        return "".join(out)
    left, right = 170, 60
    hi = max(max(v for _, v, _ in bars), reference or 0.0) or 1.0
    scale = (width - left - right) / hi
    for i, (label, value, tip) in enumerate(bars):
        y = 28 + row * i
        out.append(f'<text x="{left - 6}" y="{y + 12}" text-anchor="end" {FONT}>{escape(label[:26])}</text>'
                   f'<rect x="{left}" y="{y + 2}" width="{max(value * scale, 1):.1f}" height="{row - 5}" '
                   f'fill="{PALETTE[0]}"><title>{escape(tip)}</title></rect>'
                   f'<text x="{left + value * scale + 4:.1f}" y="{y + 12}" {FONT}>{escape(num(value))}</text>')
    bottom = 28 + row * len(bars)
    if reference is not None:
        x = left + reference * scale
        out.append(f'<line x1="{x:.1f}" y1="24" x2="{x:.1f}" y2="{bottom + 2}" stroke="#888" stroke-dasharray="4 3"/>')
    out.append(f'<text x="{(left + width - right) / 2:.1f}" y="{bottom + 22}" text-anchor="middle" {FONT}>'
               f"{escape(x_label)}</text></svg>")
    return "".join(out)
