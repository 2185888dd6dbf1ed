"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _no_model_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reaches the Anthropic API by accident: a key in the developer's environment is hidden
    (tests of the `llm` proposer pass their own key and a mock transport)."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("TILEPILOT_LLM_MODEL", raising=False)


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


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    """A folder for the test families' marker files (tests/worker_families.py), with those families
    registered in the test process too, so that it resolves them as the workers do."""
    from tests.worker_families import register_all

    register_all()
    path = tmp_path / "markers"
    path.mkdir()
    return path
