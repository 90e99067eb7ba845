"""The row index of a vector mirror mapped from its index file: checked whole at its first use,
except that a few ids it finds, each confirmed at the row it names, need no whole check."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from memstrata.storage import Database, VectorIndex, _index_files, _vector_mirror, open_database

DIM = 8
META = {"cat": "text"}
ROWS = 400


@pytest.fixture(autouse=True)
def small_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Index files for any size (the default skips stores that load fast anyway)."""
    monkeypatch.setattr(_index_files, "MIN_ROWS", 1)


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the whole checks of a mapped row index."""
    done: list[int] = []
    whole = _vector_mirror._check_index

    def counted(mirror: Any, keys: npt.NDArray[np.int64], values: npt.NDArray[np.int64]) -> None:
        done.append(len(keys))
        whole(mirror, keys, values)

    monkeypatch.setattr(_vector_mirror, "_check_index", counted)
    return done


def _vectors(n: int) -> npt.NDArray[np.float32]:
    return np.random.default_rng(3).standard_normal((n, DIM)).astype(np.float32)


def _open(path: Path) -> tuple[Database, VectorIndex]:
    db = open_database(path)
    return db, VectorIndex(db, "items", DIM, metadata=META, approximate_from=None)


@pytest.fixture
def built(tmp_path: Path) -> Iterator[Path]:
    """A store of 400 vectors (rowids 1..400) whose index file was written."""
    path = tmp_path / "v.sqlite"
    db, index = _open(path)
    index.upsert_many(range(1, ROWS + 1), _vectors(ROWS), [{"cat": "a"}] * ROWS)
    db.close()
    db, index = _open(path)
    index.search(np.ones(DIM, dtype=np.float32), 3)
    assert index.files_saved == 1
    db.close()
    yield path


def _garble(path: Path) -> None:
    """The file's row index, every position moved to another row (no checksum catches it)."""
    file = path.with_name(path.name + ".index") / "vectors-items"
    found = _index_files.read_index(file)
    assert found is not None
    arrays = dict(found.arrays)
    arrays["index_values"] = arrays["index_values"][::-1].copy()
    assert _index_files.write_index(file, found.meta, arrays, unchecked=_index_files.MIRROR_UNCHECKED)


def _expected(query: npt.NDArray[np.float32], ids: list[int]) -> list[int]:
    """The ids ranked by cosine similarity to ``query``, computed here."""
    rows = _vectors(ROWS)[np.asarray(ids) - 1]
    sims = rows @ query / np.linalg.norm(rows, axis=1) / np.linalg.norm(query)
    return [ids[i] for i in np.argsort(-sims, kind="stable")]


def _ranked(index: VectorIndex, query: npt.NDArray[np.float32], ids: list[int]) -> list[int]:
    return [h.rowid for h in index.search(query, len(ids), candidates=ids)]


QUERY = np.linspace(-1, 1, DIM).astype(np.float32)


def test_a_few_ids_found_need_no_whole_check(built: Path, checks: list[int]) -> None:
    db, index = _open(built)
    try:
        ids = [5, 77, 123, 399]
        assert _ranked(index, QUERY, ids) == _expected(QUERY, ids)
        assert checks == [] and index.files_loaded == 1
    finally:
        db.close()


def test_an_id_not_found_is_answered_after_the_whole_check(built: Path, checks: list[int]) -> None:
    db, index = _open(built)
    try:
        assert _ranked(index, QUERY, [5, 77, ROWS + 50]) == _expected(QUERY, [5, 77])
        assert checks == [ROWS]
    finally:
        db.close()


def test_a_garbled_row_index_is_checked_whole_and_answers_right(built: Path, checks: list[int]) -> None:
    _garble(built)
    db, index = _open(built)
    try:
        ids = [5, 77, 123, 399]
        assert _ranked(index, QUERY, ids) == _expected(QUERY, ids)
        assert checks == [ROWS]
        assert _ranked(index, QUERY, [1, 2, 3]) == _expected(QUERY, [1, 2, 3])
    finally:
        db.close()
