"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray for the whole test session (3 s to start: LIBRARIES.md), 2 CPUs.

    No GPUs on a CPU machine; on a GPU machine Ray finds the GPUs itself, for the gpu tests.
    """
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()
