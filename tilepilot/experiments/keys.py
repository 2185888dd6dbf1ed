"""The experiment key: what makes two measurements the same experiment."""

from __future__ import annotations

import hashlib

from tilepilot.experiments.result import Environment
from tilepilot.experiments.values import Config, Problem, canonical_json


def experiment_key(kernel: str, kernel_version: str, problem: Problem, config: Config,
                   env: Environment) -> str:
    """sha256 over kernel version, problem, config, device model and toolchain versions.

    `kernel_version` is the family's declared version plus a hash of its source (for
    replay: the dataset's identity), so an edited kernel is a new experiment.
    """
    payload = canonical_json({
        "kernel": kernel, "kernel_version": kernel_version,
        "problem": problem.as_dict(), "config": config.as_dict(),
        "backend": env.backend, "device": env.device, "torch": env.torch, "triton": env.triton,
    })
    return hashlib.sha256(payload.encode()).hexdigest()[:32]
