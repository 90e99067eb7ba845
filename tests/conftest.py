from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

import memstrata.storage._connection as connection_module
from memstrata import Config, MemorySystem
from memstrata._workspaces import Workspaces
from memstrata.storage import disable_vec_for_tests
from tests.fakes import FakeEmbedder

# Property tests draw the same examples on every run (a suite that passes passes again);
# HYPOTHESIS_PROFILE=explore draws new ones, to look for what the fixed ones miss.
settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A fresh data dir per test."""
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
def fake_embedder() -> FakeEmbedder:
    return FakeEmbedder()


@pytest.fixture
def system_and_files(data_dir: Path) -> Iterator[tuple[MemorySystem, Workspaces]]:
    """A running system and a file registry on one data dir, both with the fake embedder: what
    the tools and the bridges work on."""
    embedder = FakeEmbedder()
    with (
        MemorySystem.start(Config(data_dir=data_dir), embedder=embedder) as system,
        Workspaces(data_dir, config=system.config, embedder=embedder) as registry,
    ):
        yield system, registry


@pytest.fixture(scope="session")
def real_embedder() -> Iterator[object]:
    """The packaged default model (offline), loaded once per test session."""
    from memstrata.storage import default_embedder

    yield default_embedder()


@pytest.fixture
def backoff_signal(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set when a writer starts backing off from a locked database (the storage module's clock,
    spied on)."""
    waiting = threading.Event()
    real_sleep = time.sleep

    class _Time:
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(seconds: float) -> None:
            waiting.set()
            real_sleep(seconds)

    monkeypatch.setattr(connection_module, "time", _Time)
    return waiting


@pytest.fixture
def no_vec() -> Iterator[None]:
    """Stores opened inside this fixture cannot load sqlite-vec."""
    disable_vec_for_tests(True)
    try:
        yield
    finally:
        disable_vec_for_tests(False)
