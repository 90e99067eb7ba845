"""What ties an index file to its database, beyond its token and position:

- the matrix carries a checksum of the rows written (its spare rows are a hole): a flipped number
  in a row the spot check does not read is caught at open, and the file is rebuilt with the
  one-line warning any damage gets;
- the file records the random stamp of the change-log entry it reflects: a database restored from
  a backup, whose later writes reach the file's position with the same rowids and ops, does not
  adopt the newer file; a change log from before the stamps gains them at open and keeps its file;
- a keyword (BM25) file records the stamp the database keeps for FTS5's records as the file saw
  them: a restored database written again to the same records, or an index rebuilt to them,
  does not adopt it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from memstrata.layers import KnowledgeStore
from memstrata.storage import Database, VectorIndex, _index_files, _vector_mirror, open_database
from tests.fakes import FakeEmbedder

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


def _file(path: Path) -> Path:
    return path.with_name(path.name + ".index") / "vectors-items"


def _top(index: VectorIndex, query: npt.NDArray[np.float32]) -> list[int]:
    return [h.rowid for h in index.search(query, 5, exact=True)]


@pytest.fixture
def built(tmp_path: Path) -> Iterator[Path]:
    """A store of 400 vectors whose mirror was built and whose index file was written."""
    path = tmp_path / "v.sqlite"
    db, index = _open(path)
    index.upsert_many(list(range(1, ROWS + 1)), _vectors(1, ROWS), [{"cat": "a"}] * ROWS)
    index.search(np.ones(DIM, dtype=np.float32), 3)
    assert index.files_saved == 1 and _file(path).exists()
    db.close()
    yield path


def _matrix_entry(path: Path) -> tuple[dict[str, Any], int, int]:
    """The header entry of the file's matrix, where its data starts, and its row count."""
    found = _index_files.read_index(path)
    assert found is not None
    header = path.read_bytes()[: found.offsets["matrix"]]
    prefix = struct.Struct("<16sQI4x")  # magic, header length, header CRC32
    length = prefix.unpack(header[: prefix.size])[1]
    entries = json.loads(header[prefix.size : prefix.size + length])["arrays"]
    entry = next(e for e in entries if e["name"] == "matrix")
    offset, rows = found.offsets["matrix"], int(found.meta["mirror"]["size"])
    del found
    return entry, offset, rows


def _flip(path: Path, offset: int, row: int, column: int = 0) -> None:
    """Flip the sign of one number of the file's matrix, in place."""
    at = offset + (row * DIM + column) * 4
    with open(path, "r+b") as f:
        f.seek(at)
        value = np.frombuffer(f.read(4), dtype="<f4").copy()
        f.seek(at)
        f.write((-value).tobytes())


def test_a_flipped_number_of_the_matrix_is_caught_and_the_file_rebuilt(
    built: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db, index = _open(built)
    query = _vectors(1, ROWS)[100]
    expected = _top(index, query)  # the database's own answer (the file is still sound)
    db.close()
    entry, offset, rows = _matrix_entry(_file(built))
    assert entry["shape"][0] > rows  # the spare rows the mirror grows into
    _flip(_file(built), offset, 100)  # a row between two spot-checked ones
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="memstrata.storage"):
        db, index = _open(built)
        try:
            assert _top(index, query) == expected
            assert index.files_loaded == 0 and index.files_rejected == 1 and index.reloads == 1
        finally:
            db.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "is damaged (array matrix checksum mismatch)" in warnings[0], warnings
    db, index = _open(built)  # the rebuild wrote a sound file
    try:
        assert _top(index, query) == expected and index.files_loaded == 1
    finally:
        db.close()


def test_rows_appended_into_the_spare_rows_leave_the_file_as_checked(built: Path) -> None:
    """A process that mapped the file appends into its own copy of the spare rows: the file,
    and so its checksum of the rows written, stays as written; damage to its last written row is
    still caught."""
    before = _file(built).read_bytes()
    entry, offset, rows = _matrix_entry(_file(built))
    assert entry["sum_rows"] == rows == ROWS
    db, index = _open(built)
    try:
        _top(index, np.ones(DIM, dtype=np.float32))  # the mirror, mapped from the file
        added = _vectors(2, 20)
        index.upsert_many(list(range(ROWS + 1, ROWS + 21)), added, [{"cat": "b"}] * 20)
        assert index.files_loaded == 1 and _top(index, added[3])[0] == ROWS + 4
        assert _file(built).read_bytes() == before  # appended in memory, not in the file
        assert _index_files.read_index(_file(built)) is not None  # the checksum still holds
    finally:
        db.close()
    entry, offset, rows = _matrix_entry(_file(built))
    _flip(_file(built), offset, rows - 2, column=DIM - 1)
    with pytest.raises(_index_files.DamagedFile, match="matrix checksum mismatch"):
        _index_files.read_index(_file(built))


def test_the_checksum_read_from_the_file_equals_the_checksum_of_the_array() -> None:
    """The matrix's checksum is read from the file in blocks, each weighted by where it starts."""
    rng = np.random.default_rng(3)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "f"
        for size in (0, 5, 8, 1023 * 8 + 3, (1 << 20) + 13, 2 * (1 << 20) + 8):
            data = rng.integers(0, 256, size, dtype=np.uint8)
            path.write_bytes(b"x" * 17 + data.tobytes())
            fd = os.open(path, os.O_RDONLY)
            try:
                assert _index_files._file_checksum(fd, 17, size) == _index_files.checksum(data), size
            finally:
                os.close(fd)


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


# -- the keyword (BM25) file -------------------------------------------------------------------------

WORDS = ["queue", "retry", "backoff", "payment", "invoice", "cache", "timeout", "deploy"]


def _entries(path: Path) -> None:
    """A knowledge store of 300 entries of six words and its BM25 file (every posting: written at
    the close of the bulk load)."""
    rng = np.random.default_rng(0)
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        store.add_many({"content": " ".join(rng.choice(WORDS, 6)), "category": "pattern"} for _ in range(300))
    assert store._bm25.files_saved == 1


def _keyword_hits(path: Path, word: str) -> list[tuple[int, str]]:
    """The keyword hits for ``word`` in a fresh process's store, which writes its file at close."""
    store = KnowledgeStore.open(path, FakeEmbedder())
    hits = [(h.entry.id, h.entry.content) for h in store.search(word, mode="keyword", top_k=5)]
    assert store._bm25.files_loaded == 0  # the index changed since the file was written
    store.close()
    assert store._bm25.files_saved == 1
    return hits


def _rewrite_entry(path: Path, word: str) -> None:
    """Entry 7 holds ``word`` six times: the same shape whatever the word."""
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        store.update(7, content=" ".join([word] * 6))


def test_a_restored_database_does_not_adopt_the_newer_keyword_file(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite"
    backup = tmp_path / "backup.sqlite"
    _entries(path)
    shutil.copy(path, backup)  # a backup of the closed database
    _rewrite_entry(path, "zebra")  # later work ...
    assert _keyword_hits(path, "zebra") == [(7, " ".join(["zebra"] * 6))]  # ... and its file
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    shutil.copy(backup, path)  # the database is restored; the index folder stays as it is
    _rewrite_entry(path, "yak")  # FTS5's records now equal those the file saw
    store = KnowledgeStore.open(path, FakeEmbedder())
    try:
        assert store.search("zebra", mode="keyword") == []
        assert [h.entry.id for h in store.search("yak", mode="keyword")] == [7]
        assert store._bm25.files_loaded == 0 and store._bm25.files_rejected == 1
        assert "another history" in (store._bm25.files_note or ""), store._bm25.files_note
    finally:
        store.close()
    store = KnowledgeStore.open(path, FakeEmbedder())  # the file written for the restored database
    try:
        assert [h.entry.id for h in store.search("yak", mode="keyword")] == [7]
        assert store._bm25.files_loaded == 1
    finally:
        store.close()


def _drop_a_document_length(path: Path) -> None:
    """A hand edit the open's consistency check repairs by rebuilding the index from the entries."""
    db = open_database(path)
    db.execute("DELETE FROM knowledge_fts_docsize WHERE id = 2")
    db.close()


def test_an_index_rebuilt_to_the_records_of_its_file_does_not_adopt_it(tmp_path: Path) -> None:
    """A rebuild starts FTS5's records afresh: rebuilt from entries of the same shape, an index
    reaches the records its bulk load had, and the file written then no longer holds it."""
    path = tmp_path / "k.sqlite"
    _entries(path)
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        word = store.get(7).content.split()[0]  # a word entry 7 is about to lose
    _rewrite_entry(path, "zebra")
    _drop_a_document_length(path)
    store = KnowledgeStore.open(path, FakeEmbedder())  # rebuilt at open: the bulk load's records
    try:
        assert store.status()["consistency"]["fts_rebuilt"]
        assert 7 not in store._bm25.search([word], 300)
        assert [h.entry.id for h in store.search("zebra", mode="keyword")] == [7]
        assert store._bm25.files_loaded == 0
    finally:
        store.close()


# -- the row index mapped from the file: checked whole at its first use, except that a few ids
# it finds, each confirmed at the row it names, need no whole check --------------------------------


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


def _garble(path: Path) -> None:
    """The file's row index, every position moved to another row (no checksum catches it)."""
    file = _file(path)
    found = _index_files.read_index(file)
    assert found is not None
    arrays = dict(found.arrays)
    arrays["index_values"] = arrays["index_values"][::-1].copy()
    assert _index_files.write_index(file, found.meta, arrays, unchecked=_index_files.MIRROR_UNCHECKED)


def _expected(query: npt.NDArray[np.float32], ids: list[int]) -> list[int]:
    """The ids ranked by cosine similarity to ``query``, computed here."""
    rows = _vectors(1, ROWS)[np.asarray(ids) - 1]
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
