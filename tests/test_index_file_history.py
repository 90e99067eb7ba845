"""A vector index file is tied to the history of the change log it saw, not only to its position:
a database restored from a backup, whose later writes reach the file's position with the same
rowids and ops, does not adopt the newer file; a change log from before the stamps gains them at
open and keeps its file."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from memstrata.storage import Database, VectorIndex, _index_files, open_database

DIM = 8
META = {"cat": "text"}
ROWS = 400


@pytest.fixture(autouse=True)
def small_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Index files for any size (the default skips stores that load fast anyway)."""
    monkeypatch.setattr(_index_files, "MIN_ROWS", 1)


def _vectors(seed: int, n: int) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def _open(path: Path, *, read_only: bool = False) -> tuple[Database, VectorIndex]:
    db = open_database(path, read_only=read_only)
    return db, VectorIndex(db, "items", DIM, metadata=META, approximate_from=None)


def _folder(path: Path) -> Path:
    return path.with_name(path.name + ".index")


def _store(path: Path) -> None:
    """A store of 400 vectors and its index file (which records the database's token)."""
    db, index = _open(path)
    index.upsert_many(list(range(1, ROWS + 1)), _vectors(1, ROWS), [{"cat": "a"}] * ROWS)
    index.search(np.ones(DIM, dtype=np.float32), 3)
    assert index.files_saved == 1
    db.close()


REWRITTEN = [101, 102, 103, 104, 105]  # rows between those the spot check compares


def _rewrite(path: Path, seed: int) -> None:
    """Replace the vectors of some rows (the same rowids and op whatever the seed)."""
    db, index = _open(path)
    index.upsert_many(REWRITTEN, _vectors(seed, 5), [{"cat": "a"}] * 5)
    db.close()


def _answers(index: VectorIndex, queries: npt.NDArray[np.float32]) -> list[list[int]]:
    return [[h.rowid for h in index.search(q, 5, exact=True)] for q in queries]


def _truth(index: VectorIndex, queries: npt.NDArray[np.float32]) -> list[list[int]]:
    """The same answers from SQLite itself (never from a mirror or a file)."""
    return [[h.rowid for h in index.search(q, 5, engine="vec0")] for q in queries]


def test_a_restored_database_does_not_adopt_the_newer_file(tmp_path: Path) -> None:
    path = tmp_path / "v.sqlite"
    backup = tmp_path / "backup.sqlite"
    _store(path)
    shutil.copy(path, backup)  # a backup of the closed database
    _rewrite(path, seed=2)  # later work ...
    shutil.rmtree(_folder(path))
    db, index = _open(path)
    index.search(np.ones(DIM, dtype=np.float32), 3)  # ... that a full load wrote the file for
    assert index.files_saved == 1 and index.reloads == 1
    db.close()
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    shutil.copy(backup, path)  # the database is restored; the index folder stays as it is
    _rewrite(path, seed=3)  # the same rowids and op reach the same change-log positions
    queries = _vectors(3, 5)  # the vectors those rows now hold
    db, index = _open(path)
    try:
        assert _answers(index, queries) == _truth(index, queries)
        assert [a[0] for a in _answers(index, queries)] == REWRITTEN
        assert index.files_loaded == 0 and index.reloads == 1
        assert "another history" in (index.files_note or ""), index.files_note
    finally:
        db.close()
    db, index = _open(path)  # the file written for the restored database is used
    try:
        assert _answers(index, queries) == _truth(index, queries) and index.files_loaded == 1
    finally:
        db.close()


def test_a_change_log_from_before_the_stamps_keeps_its_file(tmp_path: Path) -> None:
    """A database and a file written before the change log had stamps: opened read-only, the
    file is used as it is; opened for writing, the log gains its column (the old entries stay
    without stamps), the file is still used, and new entries are stamped."""
    path = tmp_path / "v.sqlite"
    _store(path)
    found = _index_files.read_index(_folder(path) / "vectors-items")
    assert found is not None
    meta = {**found.meta, "last": found.meta["last"][:2]}  # [item, op], as recorded then
    arrays = dict(found.arrays)
    del found
    assert _index_files.write_index(_folder(path) / "vectors-items", meta, arrays)
    db = open_database(path)
    db.execute("ALTER TABLE items_vec_log DROP COLUMN stamp")  # the log as it was created then
    db.close()
    queries = _vectors(5, 4)
    db, index = _open(path, read_only=True)
    try:
        assert _answers(index, queries) == _truth(index, queries) and index.files_loaded == 1
    finally:
        db.close()
    db, index = _open(path)
    try:
        assert _answers(index, queries) == _truth(index, queries) and index.files_loaded == 1
        index.upsert_many([7, ROWS + 1], _vectors(6, 2), [{"cat": "b"}] * 2)
        stamps = db.query("SELECT stamp FROM items_vec_log ORDER BY seq")
        assert all(s is None for (s,) in stamps[:-2]) and all(s is not None for (s,) in stamps[-2:])
    finally:
        db.close()
    db, index = _open(path)  # caught up from the stamped entries
    try:
        assert _answers(index, queries) == _truth(index, queries) and index.files_loaded == 1
    finally:
        db.close()
