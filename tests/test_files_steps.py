"""A sync embeds and commits in steps of about ``STEP_SECONDS`` of the model's time, whatever the
model's speed: progress is reported, and a stop is seen, that often, and a writer's first batch is
small, to learn the speed. Time is a fake clock the model advances (see test_files_lazy_budget)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from memstrata import MemoryFiles
from memstrata.layers._index_writes import PROBE_BATCH, STEP_SECONDS
from tests.test_files_lazy_budget import PER_TEXT_S, FakeClock, TimedEmbedder, big_note, write


class CallsEmbedder(TimedEmbedder):
    """A :class:`TimedEmbedder` that keeps the number of texts of each document call."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.call_sizes: list[int] = []

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.call_sizes.append(len(texts))
        return super().embed_documents(texts)


Journal = tuple[Path, FakeClock, CallsEmbedder]


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    """A workspace holding one note of 60 sections (a chunk each), and a model on a fake clock."""
    workspace = tmp_path / "ws"
    write(workspace / "memory" / "journal.md", big_note(60))
    clock = FakeClock()
    return workspace, clock, CallsEmbedder(clock)


def _notes(workspace: Path, count: int) -> None:
    """``count`` small notes of one chunk each, every text distinct (nothing cached)."""
    for n in range(count):
        body = " ".join(f"fact{n}x{k}" for k in range(25))
        write(workspace / "memory" / f"n{n:03d}.md", f"Note {n}: {body}.\n")


def test_progress_is_reported_every_step_of_embedding(tmp_path: Path, data_dir: Path) -> None:
    workspace = tmp_path / "ws"
    _notes(workspace, 80)
    clock = FakeClock()
    model = CallsEmbedder(clock)
    reports: list[tuple[int, float]] = []
    with MemoryFiles.open(workspace, embedder=model, clock=clock) as index:
        start = clock.now
        stats = index.sync(progress=lambda done, total, path: reports.append((done, clock.now - start)))
    assert stats.complete and stats.files_processed == 80
    done = [(n, at) for n, at in reports if n]
    assert done[-1][0] == 80
    # the first batch is a probe: its files are reported after a few texts of the model's time
    assert done[0][1] <= PROBE_BATCH * PER_TEXT_S
    # then about a step at a time (a batch ends at the file that fills it), never all at the end
    times = sorted({at for _, at in done})
    gaps = [b - a for a, b in itertools.pairwise([0.0, *times])]
    assert len(times) >= 80 * PER_TEXT_S / (2 * STEP_SECONDS)
    assert max(gaps) <= 1.5 * STEP_SECONDS
    assert model.texts_embedded == 80, "no text embedded twice"


def test_a_large_file_is_embedded_in_calls_of_about_a_step(journal: Journal, data_dir: Path) -> None:
    workspace, clock, model = journal
    with MemoryFiles.open(workspace, embedder=model, clock=clock) as index:
        stats = index.sync()
        chunks = int(index.store.db.scalar("SELECT count(*) FROM chunks"))
    assert stats.complete and chunks >= 60 and sum(model.call_sizes) == chunks
    assert model.call_sizes[0] == PROBE_BATCH  # the speed is unknown until the first call
    assert len(model.call_sizes) >= chunks * PER_TEXT_S / (2 * STEP_SECONDS)
    assert max(model.call_sizes) * PER_TEXT_S <= STEP_SECONDS + PER_TEXT_S


def test_a_large_file_is_reported_between_its_steps(journal: Journal, data_dir: Path) -> None:
    """Its count stays until it is written; the reports between say which file is embedded."""
    workspace, clock, model = journal
    reports: list[tuple[int, str, float]] = []
    with MemoryFiles.open(workspace, embedder=model, clock=clock) as index:
        start = clock.now
        index.sync(progress=lambda done, total, path: reports.append((done, path, clock.now - start)))
    working = [(at, path) for done, path, at in reports if done == 0 and path]
    assert working and {path for _, path in working} == {"memory/journal.md"}
    times = [0.0] + [at for at, _ in working] + [reports[-1][2]]
    assert max(b - a for a, b in itertools.pairwise(times)) <= STEP_SECONDS + PER_TEXT_S
    assert reports[-1][:2] == (1, "memory/journal.md")


def test_a_stop_is_seen_within_a_step_of_a_large_file(journal: Journal, data_dir: Path) -> None:
    workspace, clock, model = journal
    with MemoryFiles.open(workspace, embedder=model, clock=clock) as index:
        start = clock.now
        stats = index.sync(should_stop=lambda: clock.now - start >= 1.0)
        assert not stats.complete
        assert clock.now - start <= 1.0 + STEP_SECONDS + PER_TEXT_S
        # the file stopped half-embedded is not recorded; the next sync finishes it
        assert int(index.store.db.scalar("SELECT count(*) FROM chunks")) == 0
        assert index.sync().complete
        chunks = int(index.store.db.scalar("SELECT count(*) FROM chunks"))
    assert chunks >= 60 and model.texts_embedded == chunks, "the vectors computed before the stop were kept"
