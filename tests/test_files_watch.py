"""The file watcher: debounced background sync, failures kept in status, clean shutdown."""

from __future__ import annotations

import dataclasses
import os
import queue
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memstrata import Config, MemoryFiles
from memstrata.config import FilesConfig
from memstrata.errors import RootMissingError
from memstrata.layers import SyncStats, _watch
from tests.fakes import BreakableEmbedder, FakeEmbedder

WAIT_S = 20.0  # upper bound for a background sync to arrive on a loaded machine


def write(path: Path, text: str, *, age_s: float = 3600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    then = time.time_ns() - int(age_s * 1e9)
    os.utime(path, ns=(then, then))


def make_config(data_dir: Path, **files: Any) -> Config:
    return Config(data_dir=data_dir, files=dataclasses.replace(FilesConfig(), **files))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    write(ws / "MEMORY.md", "# Memory\n\nThe deploy key lives in the vault.\n")
    (ws / "memory").mkdir()
    return ws


@pytest.fixture
def synced() -> queue.Queue[tuple[float, SyncStats]]:
    return queue.Queue()


@pytest.fixture
def index(workspace: Path, data_dir: Path) -> Iterator[MemoryFiles]:
    mf = MemoryFiles.open(
        workspace, embedder=FakeEmbedder(), config=make_config(data_dir, watch_debounce_ms=300)
    )
    mf.sync()
    yield mf
    mf.close()
    assert not any(t.name.startswith("memstrata-watch") and t.is_alive() for t in threading.enumerate())


def watch(mf: MemoryFiles, synced: queue.Queue[tuple[float, SyncStats]], **kwargs: Any) -> None:
    mf.watch(on_synced=lambda stats: synced.put((time.monotonic(), stats)), **kwargs)


def indexed_paths(mf: MemoryFiles) -> set[str]:
    return {r[0] for r in mf.store.db.query("SELECT path FROM chunks")}


def test_watcher_indexes_a_new_file_in_the_background(index: MemoryFiles, workspace: Path, synced):
    watch(index, synced)
    write(workspace / "memory" / "note.md", "The watcher saw this note about otters.\n", age_s=0)
    _, stats = synced.get(timeout=WAIT_S)
    assert stats.files_processed == 1
    assert "memory/note.md" in indexed_paths(index)  # visible through the owner's connection
    status = index.status()["watcher"]
    assert status["running"] and status["healthy"] and status["syncs"] >= 1


def test_a_burst_of_writes_is_debounced_into_one_sync(index: MemoryFiles, workspace: Path, synced):
    watch(index, synced)
    for n in range(5):
        write(workspace / "memory" / f"burst-{n}.md", f"burst note number {n}\n", age_s=0)
    last_write = time.monotonic()
    at, stats = synced.get(timeout=WAIT_S)
    assert stats.files_processed == 5, "one sync for the whole burst"
    assert at - last_write >= 0.3 * 0.9, "the sync waited for the debounce"
    assert synced.empty()
    (workspace / "memory" / "burst-0.md").unlink()
    _, stats = synced.get(timeout=WAIT_S)
    assert stats.files_deleted == 1
    assert "memory/burst-0.md" not in indexed_paths(index)


def test_irrelevant_events_do_not_mark_the_index_dirty(index: MemoryFiles):
    relevant = index._relevant
    assert relevant("memory/x.md", False) and relevant("MEMORY.md", False) and relevant("memory", True)
    assert not relevant("SOUL.md", False) and not relevant("src/app.py", False)
    assert not relevant("memory/.obsidian/x.md", False) and not relevant("memory/.obsidian", True)
    assert not relevant("src", True)


def test_stop_watching_joins_its_threads(index: MemoryFiles, workspace: Path, synced):
    watch(index, synced)
    assert any(t.name.startswith("memstrata-watch") for t in threading.enumerate())
    index.stop_watching()
    assert not any(t.name.startswith("memstrata-watch") and t.is_alive() for t in threading.enumerate())
    assert index.status()["watcher"] == {"running": False}
    index.stop_watching()  # idempotent
    watch(index, synced)  # and it can start again
    write(workspace / "memory" / "again.md", "watching again\n", age_s=0)
    assert synced.get(timeout=WAIT_S)[1].files_processed == 1


def test_a_watcher_that_cannot_start_never_crashes(
    index: MemoryFiles, workspace: Path, monkeypatch: pytest.MonkeyPatch
):
    class BrokenObserver:
        daemon = True

        def schedule(self, *args: object, **kwargs: object) -> None:
            raise OSError(28, "inotify watch limit reached")

    monkeypatch.setattr(_watch, "_observer_class", lambda: BrokenObserver)
    index.watch()
    status = index.status()["watcher"]
    assert not status["healthy"] and "inotify watch limit reached" in status["error"]
    # lazy sync still keeps search current
    write(workspace / "memory" / "late.md", "penguins arrived late\n", age_s=0)
    assert [h.path for h in index.search("penguins")] == ["memory/late.md"]


def test_a_failing_background_sync_is_reported_and_recovers(workspace: Path, data_dir: Path, synced):
    errors: queue.Queue[BaseException] = queue.Queue()

    flaky = BreakableEmbedder()
    with MemoryFiles.open(
        workspace, embedder=flaky, config=make_config(data_dir, watch_debounce_ms=200)
    ) as mf:
        mf.sync()
        flaky.broken = True
        watch(mf, synced, on_error=errors.put)
        write(workspace / "memory" / "a.md", "first note\n", age_s=0)
        error = errors.get(timeout=WAIT_S)
        assert "model crashed" in str(error)
        status = mf.status()["watcher"]
        assert status["running"] and not status["healthy"] and "model crashed" in status["last_error"]
        flaky.broken = False
        write(workspace / "memory" / "b.md", "second note\n", age_s=0)
        _, stats = synced.get(timeout=WAIT_S)
        assert stats.files_processed == 2  # the file the failed sync left dirty, too
        assert mf.status()["watcher"]["healthy"]


def test_a_raising_on_synced_callback_does_not_stop_the_watcher(index: MemoryFiles, workspace: Path):
    calls: queue.Queue[SyncStats] = queue.Queue()

    def callback(stats: SyncStats) -> None:
        calls.put(stats)
        raise ValueError("callback bug")

    index.watch(on_synced=callback)
    write(workspace / "memory" / "one.md", "one\n", age_s=0)
    calls.get(timeout=WAIT_S)
    write(workspace / "memory" / "two.md", "two\n", age_s=0)
    assert calls.get(timeout=WAIT_S).files_processed == 1
    assert "callback bug" in (index.status()["watcher"]["last_error"] or "")


def test_interval_sync_without_events(workspace: Path, data_dir: Path, synced):
    cfg = make_config(data_dir, sync_interval_s=0.2)
    with MemoryFiles.open(workspace, embedder=FakeEmbedder(), config=cfg) as mf:
        watch(mf, synced, events=False)
        first = synced.get(timeout=WAIT_S)[1]
        assert first.files_processed == 1  # MEMORY.md, never synced before
        write(workspace / "memory" / "polled.md", "found by polling\n", age_s=0)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if synced.get(timeout=WAIT_S)[1].files_processed:
                break
        assert "memory/polled.md" in indexed_paths(mf)
        assert mf.status()["watcher"]["events"] is False


def test_a_deleted_root_is_reported_once_and_watching_resumes_when_it_is_back(
    index: MemoryFiles, workspace: Path, synced
):
    errors: queue.Queue[BaseException] = queue.Queue()
    watch(index, synced, on_error=errors.put)
    shutil.rmtree(workspace)
    error = errors.get(timeout=WAIT_S)
    assert isinstance(error, RootMissingError) and str(workspace) in str(error)
    status = index.status()["watcher"]
    assert status["root_missing"] and not status["healthy"] and "missing" in status["last_error"]
    write(workspace / "MEMORY.md", "# Memory\n\nThe deploy key moved to the new vault.\n", age_s=0)
    write(workspace / "memory" / "back.md", "The root came back with herons.\n", age_s=0)
    while "memory/back.md" not in indexed_paths(index):  # the directory back is synced at once
        synced.get(timeout=WAIT_S)
    write(workspace / "memory" / "later.md", "Events flow again: kingfishers.\n", age_s=0)
    while "memory/later.md" not in indexed_paths(index):  # only events can bring this one
        synced.get(timeout=WAIT_S)
    status = index.status()["watcher"]
    assert not status["root_missing"] and status["healthy"] and status["last_error"] is None
    assert status["rearms"] == 1 and errors.empty(), "the disappearance was reported once"


def test_a_background_failure_is_cleared_by_a_later_successful_sync(workspace: Path, data_dir: Path):
    errors: queue.Queue[BaseException] = queue.Queue()
    flaky = BreakableEmbedder(broken=True)
    with MemoryFiles.open(
        workspace, embedder=flaky, config=make_config(data_dir, watch_debounce_ms=50)
    ) as mf:
        mf.watch(on_error=errors.put)
        write(workspace / "memory" / "a.md", "first note\n", age_s=0)
        assert "model crashed" in str(errors.get(timeout=WAIT_S))
        assert "model crashed" in mf.status()["watcher"]["last_error"]
        flaky.broken = False
        assert mf.sync().files_processed >= 1  # the owner's own sync indexes what failed
        status = mf.status()["watcher"]
        assert status["last_error"] is None and status["healthy"]


def debounce_elapsed(watcher: _watch.Watcher) -> None:
    """As if the debounce's time had passed: the worker's pending sync is due now."""
    with watcher._cond:
        watcher._due = time.monotonic()
        watcher._cond.notify_all()


def test_a_change_during_the_owners_sync_is_left_for_the_watcher(workspace: Path, data_dir: Path, synced):
    cfg = make_config(data_dir, watch_debounce_ms=600_000)  # the worker syncs only when the test says
    with MemoryFiles.open(workspace, embedder=FakeEmbedder(), config=cfg) as mf:
        watch(mf, synced, events=False)
        watcher = mf._watcher
        assert watcher is not None
        write(workspace / "memory" / "first.md", "The first note is about otters.\n", age_s=0)
        watcher.mark_dirty()  # its event, seen before the sync: the sync covers it
        late: list[str] = []

        def progress(done: int, total: int, path: str) -> None:
            if not late:  # after the walk: an agent writes a note, its event arrives now
                write(workspace / "memory" / "late.md", "Written during the sync: herons.\n", age_s=0)
                watcher.mark_dirty()
                late.append(path)

        assert mf.sync(progress=progress).files_processed == 2
        assert "memory/late.md" not in indexed_paths(mf)
        assert mf.status()["watcher"]["dirty"], "the change made during the sync is still pending"
        debounce_elapsed(watcher)
        _, stats = synced.get(timeout=WAIT_S)
        assert stats.files_processed == 1 and "memory/late.md" in indexed_paths(mf)
        watcher.mark_dirty()  # seen before the owner's next sync: that sync covers it
        mf.sync()
        assert not mf.status()["watcher"]["dirty"]


def test_a_change_during_the_sync_before_a_search_is_left_for_the_watcher(
    workspace: Path, data_dir: Path, synced
):
    seen: dict[str, Any] = {}

    class EventDuringEmbedding(FakeEmbedder):
        """Writes a note, and delivers its event, while the first watched sync embeds."""

        def embed_documents(self, texts: Any) -> Any:
            watcher = seen.get("watcher")
            if watcher is not None and "late" not in seen:
                seen["late"] = True
                write(workspace / "memory" / "late.md", "Written during the sync: herons.\n", age_s=0)
                watcher.mark_dirty()
            return super().embed_documents(texts)

    cfg = make_config(data_dir, watch_debounce_ms=600_000)
    with MemoryFiles.open(workspace, embedder=EventDuringEmbedding(), config=cfg) as mf:
        mf.sync()
        watch(mf, synced, events=False)
        seen["watcher"] = watcher = mf._watcher
        assert watcher is not None
        write(workspace / "memory" / "fresh.md", "A fresh note about otters.\n", age_s=0)
        watcher.mark_dirty()
        hits = mf.search("otters")
        assert [h.path for h in hits] == ["memory/fresh.md"] and hits.complete
        assert "late" in seen and "memory/late.md" not in indexed_paths(mf)
        assert mf.status()["watcher"]["dirty"], "the change made during the sync is still pending"
        debounce_elapsed(watcher)
        _, stats = synced.get(timeout=WAIT_S)
        assert stats.files_processed == 1 and "memory/late.md" in indexed_paths(mf)
