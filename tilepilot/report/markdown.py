"""The report as Markdown: the same sections and numbers as the HTML, plots as SVG files.

Text from the store is escaped for Markdown tables and inline text: HTML's special characters
become entities (so a renderer that allows inline HTML shows them as text), and Markdown's
own (| * _ ` [ ] ~ and the backslash; # - + = at the start) are backslash-escaped; line breaks
become spaces.
"""

from __future__ import annotations

import re
from html import escape

from tilepilot.report.data import Report
from tilepilot.report.sections import Section, Table, sections, title

_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def md(text: str, *, cell: bool = False) -> str:
    """Text escaped for Markdown; a table `cell` needs no escape at its start (it starts no block)."""
    flat = _MD_SPECIAL.sub(r"\\\1", escape(" ".join(str(text).split()), quote=False))
    return "\\" + flat if not cell and flat[:1] in ("#", "-", "+", "=") else flat


def render_markdown(r: Report, *, image_folder: str | None) -> tuple[str, dict[str, str]]:
    """The Markdown text and the plots to write beside it (file name -> SVG). Without an
    `image_folder` the plots are left out (the HTML report has them)."""
    out = [f"# {md(title(r))}", ""]
    images: dict[str, str] = {}
    for s in sections(r):
        out += _section(s, image_folder, images)
    return "\n".join(out) + "\n", images


def _section(s: Section, folder: str | None, images: dict[str, str]) -> list[str]:
    out = [f"## {md(s.title)}", ""]
    for p in s.paragraphs:
        out += [md(p), ""]
    if s.items:
        out += [f"- {md(i)}" for i in s.items] + [""]
    for t in s.tables:
        out += [*_table(t), ""]
    for c in s.charts:
        if folder is None:
            continue
        name = f"{c.name}.svg"
        images[name] = c.svg
        out += [f"![{md(c.alt)}]({folder}/{name})", ""]
    if s.charts and folder is None:
        out += ["_(plots: see the HTML report, `tilepilot report --out FILE.html`)_", ""]
    return out


def _table(t: Table) -> list[str]:
    out = [f"_{md(t.caption)}_", ""] if t.caption else []
    out.append("| " + " | ".join(md(h, cell=True) for h in t.headers) + " |")
    out.append("|" + "|".join(" --- " for _ in t.headers) + "|")
    rows = t.rows or (("none",) + ("",) * (len(t.headers) - 1),)
    out += ["| " + " | ".join(md(c, cell=True) for c in row) + " |" for row in rows]
    return out
