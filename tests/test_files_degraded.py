"""A file search whose query embedding fails ranks by keywords and says so (``degraded``), once in
the log; a keyword-only index or a keyword search is no failure and says nothing."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

import pytest

from memstrata import Codebase, Config, MemoryFiles
from memstrata.config import FilesConfig
from memstrata.errors import EmbedderUnavailableError
from memstrata.layers import _files
from tests.fakes import BreakableEmbedder, FakeEmbedder


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    then = time.time_ns() - 3600 * 10**9
    os.utime(path, ns=(then, then))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    write(ws / "MEMORY.md", "# Memory\n\nThe deploy key lives in the vault.\n")
    return ws


def config(data_dir: Path) -> Config:
    return Config(data_dir=data_dir, files=dataclasses.replace(FilesConfig()))


def test_a_failed_query_embedding_is_reported_as_degraded(
    workspace: Path, data_dir: Path, caplog: pytest.LogCaptureFixture
):
    model = BreakableEmbedder(queries=True)
    with MemoryFiles.open(workspace, embedder=model, config=config(data_dir)) as index:
        index.sync()
        healthy = index.search("deploy vault")
        assert healthy.degraded is None and healthy[0].match_type == "hybrid"
        model.broken = True
        with caplog.at_level(logging.WARNING, logger="memstrata"):
            hits = index.search("deploy vault")
        assert [h.path for h in hits] == ["MEMORY.md"] and hits[0].match_type == "keyword"
        assert hits.degraded is not None and "\n" not in hits.degraded
        assert "query embedding failed" in hits.degraded and "model crashed" in hits.degraded
        assert "keywords only" in hits.degraded
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "model crashed" in warnings[0].getMessage()
        assert index.search("deploy vault", mode="keyword").degraded is None
        model.broken = False
        assert index.search("deploy vault").degraded is None


def test_a_codebase_search_reports_it_too(tmp_path: Path, data_dir: Path):
    tree = tmp_path / "src"
    write(tree / "app.py", "def deploy_key():\n    return 'vault'\n")
    model = BreakableEmbedder(queries=True)
    with Codebase.open(tree, embedder=model, config=config(data_dir)) as index:
        index.sync()
        model.broken = True
        hits = index.search("deploy key")
        assert [h.path for h in hits] == ["app.py"]
        assert hits.degraded is not None and "model crashed" in hits.degraded


def test_keyword_only_by_configuration_is_not_degraded(
    workspace: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    def unavailable(*args: object, **kwargs: object) -> None:
        raise EmbedderUnavailableError("no model here")

    monkeypatch.setattr(_files, "load_embedder", unavailable)
    with MemoryFiles.open(workspace, config=config(data_dir)) as index:
        index.sync()
        hits = index.search("deploy vault")
        assert [h.path for h in hits] == ["MEMORY.md"] and hits.degraded is None


def test_an_empty_query_is_not_degraded(workspace: Path, data_dir: Path):
    with MemoryFiles.open(workspace, embedder=FakeEmbedder(), config=config(data_dir)) as index:
        assert index.search("  ").degraded is None
