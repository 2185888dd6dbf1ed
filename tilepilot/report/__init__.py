"""`tilepilot report`: a campaign's report, built from the store (`data`), laid out once
(`sections`) and rendered as self-contained HTML (`html`) or Markdown (`markdown`)."""

from __future__ import annotations

from tilepilot.report.data import Report, build_report
from tilepilot.report.html import render_html
from tilepilot.report.markdown import render_markdown

__all__ = ["Report", "build_report", "render_html", "render_markdown"]
