"""Kernel families (one module each), the registry, and the steps a worker runs: compile
(CPU, no CUDA context) and evaluate (verify, then time, in the process that owns the GPU).

Importing this package imports neither torch nor triton.
"""

from __future__ import annotations

from tilepilot.kernels.base import KernelFamily, Target, Work
from tilepilot.kernels.registry import family_names, get_family, problem_parsers, register

__all__ = ["KernelFamily", "Target", "Work", "family_names", "get_family", "problem_parsers", "register"]
