"""tilepilot: tuning campaigns for Triton kernels, with hypotheses and a live dashboard."""

from __future__ import annotations

__version__ = "0.1.0"
