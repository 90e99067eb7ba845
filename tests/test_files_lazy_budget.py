"""The sync before a search keeps to ``files.lazy_sync_wait_s``: the budget is checked between
embedding batches too, a budget of 0 runs no sync at all, and what does not fit is finished by
later syncs, nothing lost and nothing half-recorded. Time is a fake clock the model advances."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from memstrata import Config, MemoryFiles
from memstrata.config import FilesConfig
from tests.fakes import FakeEmbedder

PER_TEXT_S = 0.125  # fake seconds the model takes per document text
BUDGET_S = 1.0


class FakeClock:
    """A ``time.monotonic`` stand-in that only moves when the model works."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TimedEmbedder(FakeEmbedder):
    """Each document text costs :data:`PER_TEXT_S` of the fake clock; queries cost nothing."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.clock.now += PER_TEXT_S * len(texts)
        return super().embed_documents(texts)


def write(path: Path, text: str, *, age_s: float = 3600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    then = time.time_ns() - int(age_s * 1e9)
    os.utime(path, ns=(then, then))


def config(data_dir: Path, wait_s: float) -> Config:
    return Config(data_dir=data_dir, files=dataclasses.replace(FilesConfig(), lazy_sync_wait_s=wait_s))


def big_note(sections: int) -> str:
    """A note of ``sections`` headed sections, each its own chunk (distinct text, nothing cached)."""
    body = " ".join(f"word{n}" for n in range(150))
    return "\n\n".join(f"# Section {i}\n\nEntry {i} of the journal: {body} end{i}." for i in range(sections))


def chunks_of(index: MemoryFiles, rel: str) -> int:
    return int(index.store.db.scalar("SELECT count(*) FROM chunks WHERE path = ?", (rel,)))


def file_rows(index: MemoryFiles, rel: str) -> int:
    return int(index.store.db.scalar("SELECT count(*) FROM files WHERE path = ?", (rel,)))


def test_a_note_bigger_than_the_budget_is_indexed_over_several_searches(tmp_path: Path, data_dir: Path):
    workspace = tmp_path / "ws"
    write(workspace / "MEMORY.md", "# Memory\n\nThe deploy key lives in the vault.\n")
    clock = FakeClock()
    model = TimedEmbedder(clock)
    with MemoryFiles.open(workspace, embedder=model, config=config(data_dir, BUDGET_S), clock=clock) as index:
        index.sync()
        embedded_before = model.texts_embedded
        write(workspace / "memory" / "journal.md", big_note(40), age_s=0)
        searches = 0
        complete = False
        while not complete:
            started = clock.now
            hits = index.search("deploy key vault")
            searches += 1
            assert clock.now - started <= BUDGET_S + PER_TEXT_S, "at most one text past the budget"
            assert [h.path for h in hits][:1] == ["MEMORY.md"]
            complete = hits.complete
            if not complete:  # a file half-embedded is not recorded as indexed
                assert chunks_of(index, "memory/journal.md") == 0
                assert file_rows(index, "memory/journal.md") == 0
            assert searches < 40, "each search makes progress"
        chunks = chunks_of(index, "memory/journal.md")
        assert chunks >= 40 and searches >= chunks * PER_TEXT_S / (BUDGET_S + PER_TEXT_S)
        assert model.texts_embedded - embedded_before == chunks, "no text embedded twice"
        assert index.store.vectors is not None and index.store.vectors.count() == chunks_of(
            index, "memory/journal.md"
        ) + chunks_of(index, "MEMORY.md")
        assert index.sync().files_processed == 0


def test_a_budget_of_zero_runs_no_sync_before_a_search(tmp_path: Path, data_dir: Path):
    workspace = tmp_path / "ws"
    write(workspace / "MEMORY.md", "# Memory\n\nThe deploy key lives in the vault.\n")
    model = FakeEmbedder()
    with MemoryFiles.open(workspace, embedder=model, config=config(data_dir, 0.0)) as index:
        index.sync()
        embedded_before = model.texts_embedded
        write(workspace / "memory" / "fresh.md", "The kubernetes cluster was upgraded.\n", age_s=0)
        hits = index.search("kubernetes cluster")
        assert hits == [] and model.texts_embedded == embedded_before
        assert file_rows(index, "memory/fresh.md") == 0
        assert hits.complete is False, "the search saw the change it did not index"
        assert index.sync().files_processed == 1
        hits = index.search("kubernetes cluster")
        assert [h.path for h in hits] == ["memory/fresh.md"] and hits.complete
        index.watch(events=False)
        assert index._watcher is not None
        index._watcher.mark_dirty()  # the watcher saw a change it has not synced yet
        assert index.search("kubernetes cluster").complete is False


def test_a_deadline_past_before_the_first_file_processes_nothing(tmp_path: Path, data_dir: Path):
    workspace = tmp_path / "ws"
    write(workspace / "MEMORY.md", "# Memory\n\nThe deploy key lives in the vault.\n")
    model = FakeEmbedder()
    with MemoryFiles.open(workspace, embedder=model, config=config(data_dir, BUDGET_S)) as index:
        result = index.store.sync(deadline=time.monotonic() - 1.0)
        assert result.files_processed == 0 and result.complete is False
        assert model.texts_embedded == 0 and file_rows(index, "MEMORY.md") == 0
        assert index.store.sync().files_processed == 1
