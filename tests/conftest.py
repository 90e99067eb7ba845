from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes import FakeEmbedder


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A fresh data dir per test."""
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
def fake_embedder() -> FakeEmbedder:
    return FakeEmbedder()


@pytest.fixture(scope="session")
def real_embedder() -> Iterator[object]:
    """The packaged default model (offline), loaded once per test session."""
    from memstrata.storage import default_embedder

    yield default_embedder()
