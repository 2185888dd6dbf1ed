"""The report as one self-contained HTML page: inline CSS and SVG, no script, nothing fetched.

Every text from the store (names, rationales, hypothesis statements, model output, messages)
goes through `html.escape`; the SVG charts escape their own labels (`svg`).
"""

from __future__ import annotations

import time
from html import escape

from tilepilot.report.data import Report
from tilepilot.report.sections import Section, Table, sections, title

_CSS = """
body { font-family: system-ui, -apple-system, sans-serif; margin: 2em auto; max-width: 1100px; color: #222;
       padding: 0 1em; line-height: 1.4; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 1.8em; }
table { border-collapse: collapse; margin: .6em 0 1em; font-size: .88em; }
th, td { border: 1px solid #ddd; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } caption { text-align: left; color: #666; padding: .2em 0; }
td { white-space: pre-wrap; overflow-wrap: break-word; max-width: 28em; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; } figure { margin: 0; }
nav a { margin-right: .8em; } .muted { color: #666; }
"""


def render_html(r: Report) -> str:
    parts = sections(r)
    nav = " ".join(f'<a href="#{escape(s.anchor)}">{escape(s.title)}</a>' for s in parts)
    body = "".join(_section(s) for s in parts)
    made = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            "img-src data:\">"
            f"<title>{escape(title(r))}</title><style>{_CSS}</style></head><body>"
            f"<h1>{escape(title(r))}</h1><p class=\"muted\">generated {escape(made)} by tilepilot report</p>"
            f"<nav>{nav}</nav>{body}</body></html>\n")


def _section(s: Section) -> str:
    out = [f'<section id="{escape(s.anchor)}"><h2>{escape(s.title)}</h2>']
    out += [f"<p>{escape(p)}</p>" for p in s.paragraphs]
    if s.items:
        out.append("<ul>" + "".join(f"<li>{escape(i)}</li>" for i in s.items) + "</ul>")
    out += [_table(t) for t in s.tables]
    if s.charts:
        out.append('<div class="charts">' + "".join(
            f'<figure data-chart="{escape(c.name)}">{c.svg}</figure>' for c in s.charts) + "</div>")
    out.append("</section>")
    return "".join(out)


def _table(t: Table) -> str:
    cap = f"<caption>{escape(t.caption)}</caption>" if t.caption else ""
    head = "".join(f"<th>{escape(h)}</th>" for h in t.headers)
    rows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in t.rows)
    if not t.rows:
        rows = f'<tr><td colspan="{len(t.headers)}">none</td></tr>'
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
