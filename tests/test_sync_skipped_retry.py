"""A file once skipped (it could not be chunked) is tried again when the chunker signature changes."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import pytest

from memstrata import Codebase, Config
from memstrata.layers import _index_db
from tests.fakes import FakeEmbedder


def write(path: Path, text: str) -> None:
    """Write a file dated an hour ago, past the window in which a sync reads it again anyway."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    then = time.time_ns() - 3600 * 10**9
    os.utime(path, ns=(then, then))


def test_a_file_skipped_by_a_chunker_fault_is_retried_under_a_new_signature(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "src"
    write(root / "good.py", "def good():\n    pass\n")
    write(root / "bad.py", "def bad_but_fine():\n    pass\n")
    working = _index_db.chunk_file

    def faulty(path: str, text: str, **options: Any) -> Any:
        if path == "bad.py":
            raise RecursionError("simulated chunker fault")
        return working(path, text, **options)

    monkeypatch.setattr(_index_db, "chunk_file", faulty)
    config = Config(data_dir=tmp_path / "data")
    with Codebase.open(root, config=config, embedder=FakeEmbedder()) as index:
        assert [path for path, _ in index.sync().skipped] == ["bad.py"]
        again = index.sync()  # the same chunker: the file is not read again
        assert again.files_processed == 0 and [path for path, _ in again.skipped] == ["bad.py"]

    monkeypatch.setattr(_index_db, "chunk_file", working)  # the fixed chunker, with new settings
    chunking = dataclasses.replace(config.chunking, tokens=300, overlap=60)
    with Codebase.open(
        root, config=dataclasses.replace(config, chunking=chunking), embedder=FakeEmbedder()
    ) as index:
        stats = index.sync()
        assert stats.skipped == ()
        assert [hit.path for hit in index.search("bad_but_fine", mode="keyword")] == ["bad.py"]
        assert index.sync().files_processed == 0  # retried once, then unchanged again
