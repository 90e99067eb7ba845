"""Persisted index files: a new connection maps the vector mirror and the BM25 lengths/postings
saved beside the database instead of rebuilding them, catches up from the change log, and
rebuilds (warning when the file contradicts the database) whatever it cannot trust."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from click.testing import CliRunner

from memstrata.bridges._app import CliState
from memstrata.bridges.cli import cli
from memstrata.config import Config
from memstrata.layers import EpisodicMemory, KnowledgeStore
from memstrata.storage import Database, VectorIndex, _index_files, _vector_sync, open_database
from memstrata.storage import _bm25_file as bm25_file_module
from tests._support import late_model_loading
from tests.fakes import FakeEmbedder

DIM = 8
META = {"cat": "text", "n": "integer"}
CATS = ("alpha", "beta", "gamma")


@pytest.fixture(autouse=True)
def small_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Index files for any size (the default skips stores that load fast anyway); BM25 files of
    the words read, also after a bulk load (every posting: ``test_storage_bm25_complete.py``)."""
    monkeypatch.setattr(_index_files, "MIN_ROWS", 1)
    monkeypatch.setattr(bm25_file_module, "_BULK_SHARE", 2.0)


def _rows(
    seed: int, n: int, start: int = 1
) -> tuple[list[int], npt.NDArray[np.float32], list[dict[str, Any]]]:
    rng = np.random.default_rng(seed)
    ids = list(range(start, start + n))
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    metas = [{"cat": CATS[int(rng.integers(3))], "n": int(rng.integers(4))} for _ in range(n)]
    return ids, vectors, metas


def _open(
    path: Path, *, approximate_from: int | None = None, read_only: bool = False
) -> tuple[Database, VectorIndex]:
    db = open_database(path, read_only=read_only)
    return db, VectorIndex(db, "items", DIM, metadata=META, approximate_from=approximate_from)


def _answers(index: VectorIndex, seed: int = 7) -> list[list[int]]:
    """Exact top-10 rowids for a few queries, with and without a filter."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(4):
        q = rng.standard_normal(DIM).astype(np.float32)
        out.append([h.rowid for h in index.search(q, 10, exact=True)])
        out.append([h.rowid for h in index.search(q, 10, where={"cat": "beta"}, exact=True)])
    return out


def _truth(index: VectorIndex, seed: int = 7) -> list[list[int]]:
    """The same answers from SQLite's own KNN (never from a mirror or a file)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(4):
        q = rng.standard_normal(DIM).astype(np.float32)
        out.append([h.rowid for h in index.search(q, 10, engine="vec0")])
        out.append([h.rowid for h in index.search(q, 10, where={"cat": "beta"}, engine="vec0")])
    return out


def _file(db_path: Path, name: str = "vectors-items") -> Path:
    return db_path.with_name(db_path.name + ".index") / name


@pytest.fixture
def built(tmp_path: Path) -> Iterator[Path]:
    """A store of 400 vectors whose mirror was built (and its index file written) once."""
    path = tmp_path / "v.sqlite"
    db, index = _open(path)
    ids, vectors, metas = _rows(1, 400)
    index.upsert_many(ids, vectors, metas)
    db.close()
    db, index = _open(path)
    index.search(np.ones(DIM, dtype=np.float32), 3)
    assert index.reloads == 1 and index.files_saved == 1 and _file(path).exists()
    db.close()
    yield path


# -- vectors ---------------------------------------------------------------------------------------


def test_vector_file_is_written_once_and_reused(built: Path) -> None:
    db, index = _open(built)
    try:
        answers = _answers(index)
        assert index.files_loaded == 1 and index.reloads == 0, index.files_status()
        assert index.status()["index_file"]["loaded"] == 1
        assert answers == _truth(index)
    finally:
        db.close()
    stamp = _file(built).stat().st_mtime_ns
    db, index = _open(built)  # nothing changed: the file is used again and not rewritten
    try:
        _answers(index)
        assert index.files_loaded == 1 and index.reloads == 0 and index.files_saved == 0
    finally:
        db.close()
    assert _file(built).stat().st_mtime_ns == stamp


def test_partitioned_mirror_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    db, index = _open(path, approximate_from=300)
    ids, vectors, metas = _rows(2, 600)
    index.upsert_many(ids, vectors, metas)
    index.search(np.ones(DIM, dtype=np.float32), 3)
    built = index.status()["approximate"]
    assert built is not None and index.files_saved >= 1
    approximate = [h.rowid for h in index.search(np.arange(DIM, dtype=np.float32), 10)]
    db.close()
    db, index = _open(path, approximate_from=300)
    try:
        assert [h.rowid for h in index.search(np.arange(DIM, dtype=np.float32), 10)] == approximate
        restored = index.status()["approximate"]
        assert index.files_loaded == 1 and index.reloads == 0
        assert restored["lists"] == built["lists"] and restored["builds"] == 0
        assert _answers(index) == _truth(index)
    finally:
        db.close()


def test_writes_from_another_connection_are_caught_up(built: Path) -> None:
    other, writer = _open(built)
    ids, vectors, metas = _rows(3, 50, start=1000)
    writer.upsert_many(ids, vectors, metas)  # new rows
    changed_ids, changed, changed_metas = _rows(4, 30, start=10)
    writer.upsert_many(changed_ids, changed, changed_metas)  # replaced rows
    writer.delete_many(range(100, 140))
    other.close()
    db, index = _open(built)
    try:
        answers = _answers(index)
        assert index.files_loaded == 1 and index.reloads == 0
        assert answers == _truth(index)
        assert index.count() == index._mirror_now().live == 400 + 50 - 40
    finally:
        db.close()


def test_a_file_the_log_cannot_explain_is_rebuilt(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_vector_sync, "LOG_KEEP", 5)
    monkeypatch.setattr(_vector_sync, "_LOG_SLACK", 1)
    other, writer = _open(built)
    for start in range(2000, 2100, 10):  # the log is pruned past the file's position
        writer.upsert_many(*_rows(start, 10, start=start))
    other.close()
    db, index = _open(built)
    try:
        answers = _answers(index)
        assert index.files_loaded == 0 and index.reloads == 1
        assert "older than the change log" in (index.files_note or "")
        assert answers == _truth(index)
        assert index.files_saved == 1  # replaced by a current one
    finally:
        db.close()


def test_a_reset_to_another_dimension_is_not_taken_from_the_file(built: Path) -> None:
    db, index = _open(built)
    index.reset(DIM * 2)
    index.upsert_many([1, 2], np.ones((2, DIM * 2), dtype=np.float32), [{"cat": "alpha", "n": 0}] * 2)
    db.close()
    db = open_database(built)
    try:
        index = VectorIndex(db, "items", DIM * 2, metadata=META)
        hits = index.search(np.ones(DIM * 2, dtype=np.float32), 5)
        assert [h.rowid for h in hits] == [1, 2] and index.files_loaded == 0
    finally:
        db.close()


def _damage_and_reopen(path: Path, caplog: pytest.LogCaptureFixture, expect: str) -> None:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="memstrata.storage"):
        db, index = _open(path)
        try:
            answers = _answers(index)
            assert index.files_loaded == 0 and index.reloads == 1 and index.files_rejected == 1
            assert answers == _truth(index)
        finally:
            db.close()
    assert any(expect in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_truncated_file_is_rebuilt_with_a_warning(built: Path, caplog: pytest.LogCaptureFixture) -> None:
    file = _file(built)
    with open(file, "r+b") as f:
        f.truncate(file.stat().st_size // 2)
    _damage_and_reopen(built, caplog, "damaged")
    db, index = _open(built)  # the rebuild wrote a good file again
    try:
        _answers(index)
        assert index.files_loaded == 1
    finally:
        db.close()


def test_garbage_file_is_rebuilt_with_a_warning(built: Path, caplog: pytest.LogCaptureFixture) -> None:
    _file(built).write_bytes(os.urandom(5000))
    _damage_and_reopen(built, caplog, "damaged")


def test_garbled_matrix_is_caught_by_the_spot_check(built: Path, caplog: pytest.LogCaptureFixture) -> None:
    found = _index_files.read_index(_file(built))
    assert found is not None
    arrays = dict(found.arrays)
    arrays["matrix"] = np.random.default_rng(0).standard_normal(arrays["matrix"].shape).astype(np.float32)
    assert _index_files.write_index(_file(built), found.meta, arrays)
    _damage_and_reopen(built, caplog, "disagrees with the database")


def test_the_spot_check_reads_rows_from_the_first_slot_of_spread_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A row deep in a vec0 chunk is read by walking the chunk's pages up to it; the spot check
    takes the first row of chunks spread over the table instead, and still catches one bad row."""
    path = tmp_path / "v.sqlite"
    db, index = _open(path)
    index.upsert_many(*_rows(3, 12 * 1024))  # twelve chunks of 1,024 slots
    index.search(np.ones(DIM, dtype=np.float32), 3)  # the mirror and its file
    first_slots = {int(r[0]) for r in db.query("SELECT rowid FROM items_vec_rowids WHERE chunk_offset = 0")}
    db.close()
    asked: list[int] = []
    read = VectorIndex._read

    def recording(self: VectorIndex, items: list[int] | None, room: float = 0.0) -> Any:
        asked.extend(items or [])
        return read(self, items, room)

    with monkeypatch.context() as patch:
        patch.setattr(VectorIndex, "_read", recording)
        db, index = _open(path)
        answers = _answers(index)
        assert index.files_loaded == 1 and answers == _truth(index)
        db.close()
    assert len(set(asked)) >= 8 and set(asked) <= first_slots, (asked, sorted(first_slots))
    found = _index_files.read_index(_file(path))
    assert found is not None
    arrays = dict(found.arrays)
    matrix = np.array(arrays["matrix"])
    row = int(np.flatnonzero(np.asarray(arrays["rowids"]) == max(asked))[0])
    matrix[row] = -matrix[row]  # one row of the file no longer matches the database
    arrays["matrix"] = matrix
    assert _index_files.write_index(_file(path), found.meta, arrays)
    _damage_and_reopen(path, caplog, "disagrees with the database")


def test_a_garbled_row_index_is_rebuilt_from_the_rowids(built: Path) -> None:
    """The row index has no checksum (see ``MIRROR_UNCHECKED``): it is checked whole instead."""
    found = _index_files.read_index(_file(built))
    assert found is not None
    arrays = dict(found.arrays)
    arrays["index_values"] = arrays["index_values"][::-1].copy()
    assert _index_files.write_index(_file(built), found.meta, arrays, unchecked=_index_files.MIRROR_UNCHECKED)
    db, index = _open(built)
    try:
        assert _answers(index) == _truth(index) and index.files_loaded == 1
    finally:
        db.close()


def test_file_of_another_dimension_is_rebuilt_with_a_warning(
    built: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    found = _index_files.read_index(_file(built))
    assert found is not None
    other_db = open_database(tmp_path / "other.sqlite")
    other = VectorIndex(other_db, "items", DIM * 2, metadata=META, approximate_from=None)
    ids, _, metas = _rows(5, 400)
    other.upsert_many(ids, np.ones((400, DIM * 2), np.float32), metas)
    state, arrays = _index_files.mirror_arrays(other._mirror_now())
    other_db.close()
    meta = {**found.meta, "mirror": state}  # the right database and position, the wrong vectors
    assert _index_files.write_index(_file(built), meta, arrays)
    _damage_and_reopen(built, caplog, "16-dimensional")


def test_file_of_another_database_is_not_used(built: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy" / "v.sqlite"
    copy.parent.mkdir()
    db, index = _open(copy)
    index.upsert_many(*_rows(1, 400))  # the same rows, but another database (no token yet)
    db.close()
    shutil.copytree(built.with_name(built.name + ".index"), copy.with_name(copy.name + ".index"))
    db, index = _open(copy)
    try:
        assert _answers(index) == _truth(index)
        assert index.files_loaded == 0 and "another database" in (index.files_note or "")
    finally:
        db.close()


def test_read_only_database_uses_the_file_and_writes_nothing(built: Path, tmp_path: Path) -> None:
    db, index = _open(built, read_only=True)
    try:
        assert _answers(index) == _truth(index) and index.files_loaded == 1
    finally:
        db.close()
    shutil.rmtree(built.with_name(built.name + ".index"))
    db, index = _open(built, read_only=True)
    try:  # no file: built from SQLite, and no file is written for a read-only database
        assert _answers(index) == _truth(index) and index.reloads == 1 and index.files_saved == 0
    finally:
        db.close()
    after = sorted(p.name for p in built.parent.rglob("*"))
    assert [n for n in after if n.endswith(".index") or n.startswith(("vectors-", "bm25-"))] == []


def test_closing_refreshes_a_lagging_file(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db, index = _open(built)
    index.search(np.ones(DIM, dtype=np.float32), 3)
    assert index.files_loaded == 1
    index.upsert_many(*_rows(9, 1200, start=5000))  # more than a next process should re-read
    db.close()  # the close refreshes the file
    assert index.files_saved == 1
    db, index = _open(built)
    try:
        assert _answers(index) == _truth(index)
        assert index.files_loaded == 1 and index.files_status()["lag"] == 0
    finally:
        db.close()


# -- BM25 ------------------------------------------------------------------------------------------


WORDS = [
    "queue",
    "retry",
    "backoff",
    "payment",
    "invoice",
    "cache",
    "timeout",
    "database",
    "index",
    "migration",
    "lock",
    "deploy",
]


def _knowledge(path: Path, n: int = 300, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        store.add_many({"content": " ".join(rng.choice(WORDS, 6)), "category": "pattern"} for _ in range(n))


def _rankings(store: KnowledgeStore) -> list[list[int]]:
    return [store._bm25.search(terms, 20) for terms in (["queue"], ["retry", "cache"], ["deploy", "lock"])]


def test_bm25_file_is_written_at_close_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite"
    _knowledge(path)
    store = KnowledgeStore.open(path, FakeEmbedder())
    first = _rankings(store)
    assert store._bm25.files_loaded == 0
    store.close()
    bm25_file = _file(path, "bm25-knowledge_fts")
    assert bm25_file.exists()
    store = KnowledgeStore.open(path, FakeEmbedder())
    try:
        assert _rankings(store) == first
        assert store._bm25.files_loaded == 1 and store._bm25.files_status()["rejected"] == 0
    finally:
        store.close()


def test_bm25_file_keeps_the_postings_cache_in_its_order_of_use(tmp_path: Path) -> None:
    """The cache drops its least recently used words first; a new process that maps the file
    continues with the same order, so the words the last one used most recently stay longest."""
    path = tmp_path / "k.sqlite"
    _knowledge(path)
    store = KnowledgeStore.open(path, FakeEmbedder())
    _rankings(store)
    store._bm25.search(["retry"], 5)  # used again: now the most recent
    used = list(store._bm25._postings)
    assert used[-1] == store._bm25.stems(["retry"])[0] and len(used) == 5
    store.close()
    store = KnowledgeStore.open(path, FakeEmbedder())
    try:
        store._bm25.search(["retry"], 5)  # maps the file; "retry" is already the last
        assert store._bm25.files_loaded == 1
        assert list(store._bm25._postings) == used
    finally:
        store.close()


def test_bm25_file_is_rewritten_for_many_new_postings_not_for_a_few(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that read a few words from FTS5 leaves a current file alone at close (reading
    them again costs less than the write); one that read many adds them."""
    path = tmp_path / "k.sqlite"
    _knowledge(path)
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        store._bm25.search(["queue"], 5)
    bm25_file = _file(path, "bm25-knowledge_fts")
    written = bm25_file.stat().st_ino
    for worth, rewritten in ((bm25_file_module._WORTH_WRITING, False), (1, True)):
        monkeypatch.setattr(bm25_file_module, "_WORTH_WRITING", worth)
        store = KnowledgeStore.open(path, FakeEmbedder())
        store._bm25.search(["deploy" if rewritten else "lock"], 5)  # a word the file lacks
        assert store._bm25.files_loaded == 1
        store.close()
        assert (bm25_file.stat().st_ino != written) is rewritten and store._bm25.files_saved == int(rewritten)
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        store._bm25.search(["queue"], 5)  # reads the file: its words' postings
        held = store._bm25._postings
        assert store._bm25.stems(["deploy"])[0] in held and store._bm25.stems(["lock"])[0] not in held


def test_bm25_file_is_dropped_after_writes_and_rankings_stay_exact(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite"
    _knowledge(path)
    store = KnowledgeStore.open(path, FakeEmbedder())
    _rankings(store)
    store.close()
    with KnowledgeStore.open(path, FakeEmbedder()) as writer:  # another connection writes
        writer.add_many({"content": "queue queue queue retry", "category": "pattern"} for _ in range(5))
    store = KnowledgeStore.open(path, FakeEmbedder())
    try:
        got = _rankings(store)
        assert store._bm25.files_loaded == 0
        store._bm25.reset()  # a fresh read of the database, no file
        store._bm25._load_file = lambda: False  # type: ignore[method-assign]
        assert got == _rankings(store)
    finally:
        store.close()


def _garble_scores(bm25_file: Path) -> None:
    data = bytearray(bm25_file.read_bytes())
    data[-8:] = b"\xff" * 8  # the last postings' scores
    bm25_file.write_bytes(bytes(data))


def _swap_postings(bm25_file: Path) -> None:
    """One word's first two documents swapped, the file otherwise intact: the top-k search
    bisects a word's postings, so a file out of document order is refused, not trusted."""
    found = _index_files.read_index(bm25_file)
    assert found is not None
    arrays = {name: np.array(array) for name, array in found.arrays.items()}
    first = arrays["positions"][: int(arrays["offsets"][1])]
    assert len(first) >= 2
    first[[0, 1]] = first[[1, 0]]
    assert _index_files.write_index(bm25_file, found.meta, arrays)


@pytest.mark.parametrize("damage", [_garble_scores, _swap_postings])
def test_damaged_bm25_file_is_rebuilt_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], None]
) -> None:
    path = tmp_path / "k.sqlite"
    _knowledge(path)
    store = KnowledgeStore.open(path, FakeEmbedder())
    expected = _rankings(store)
    store.close()
    damage(_file(path, "bm25-knowledge_fts"))
    with caplog.at_level(logging.WARNING, logger="memstrata.storage"):
        store = KnowledgeStore.open(path, FakeEmbedder())
        try:
            assert _rankings(store) == expected
            assert store._bm25.files_loaded == 0 and store._bm25.files_rejected == 1
        finally:
            store.close()
    assert any("damaged" in r.getMessage() for r in caplog.records)


def test_a_refused_bm25_file_is_shown_in_status_as_the_vector_file_is(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite"
    _knowledge(path)
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        _rankings(store)
    _garble_scores(_file(path, "bm25-knowledge_fts"))
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        _rankings(store)
        status = store.status()
    keyword, vector = status["keyword_index_file"], status["vectors"]["index_file"]
    assert keyword["path"] == str(_file(path, "bm25-knowledge_fts"))
    assert keyword["rejected"] == 1 and keyword["loaded"] == 0 and "damaged" in keyword["note"]
    assert {"path", "loaded", "saved", "rejected", "note"} <= set(keyword) & set(vector)


def test_the_episodic_store_shows_its_keyword_file_in_status_too(tmp_path: Path) -> None:
    path = tmp_path / "e.sqlite"
    rng = np.random.default_rng(0)
    query = f"{WORDS[0]} {WORDS[1]}"
    with EpisodicMemory.open(path, FakeEmbedder()) as memory:
        memory.record_many({"content": " ".join(rng.choice(WORDS, 6))} for _ in range(300))
        expected = [h.episode.id for h in memory.search(query, top_k=20, mode="keyword")]
        saved = memory.status()["keyword_index_file"]
    _garble_scores(_file(path, "bm25-episodes_fts"))
    with EpisodicMemory.open(path, FakeEmbedder()) as memory:
        assert [h.episode.id for h in memory.search(query, top_k=20, mode="keyword")] == expected
        keyword = memory.status()["keyword_index_file"]
    assert saved["path"] == keyword["path"] == str(_file(path, "bm25-episodes_fts"))
    assert keyword["rejected"] == 1 and keyword["loaded"] == 0 and "damaged" in keyword["note"]


# -- status ----------------------------------------------------------------------------------------


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def test_status_creates_nothing_and_loads_no_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    _knowledge(KnowledgeStore.path_for(data, "a1"), n=25)
    config = Config.load(None, data_dir=data)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("status must not load a model or start a system")

    import memstrata._system as system_module
    import memstrata.storage._fastembed as fastembed_module

    monkeypatch.setattr(fastembed_module, "load_embedder", refuse)
    monkeypatch.setattr(fastembed_module, "default_embedder", refuse)
    monkeypatch.setattr(system_module.MemorySystem, "start", classmethod(refuse))
    before = _tree(data)
    result = CliRunner().invoke(cli, ["status", "--json"], obj=CliState(data_dir=data, _config=config))
    assert result.exit_code == 0, result.output
    import orjson

    report = orjson.loads(result.stdout)
    assert report["stores"]["knowledge"]["a1"] == {"count": 25, "mode": "hybrid", "reason": None}
    assert report["system"]["embedding"]["loaded"] is False and report["system"]["running"] is False
    assert _tree(data) == before  # not even a -wal or -shm file


# -- `memstrata query` without a system ------------------------------------------------------------


def _query(data: Path, embedder: FakeEmbedder, *args: str) -> list[dict[str, Any]]:
    import orjson

    result = CliRunner().invoke(
        cli, ["--data-dir", str(data), "query", *args, "--json"], obj=CliState(embedder=embedder)
    )
    assert result.exit_code == 0, result.output
    hits: list[dict[str, Any]] = orjson.loads(result.stdout)
    return hits


@pytest.mark.parametrize(
    "args",
    [
        ("queue retry",),
        ("cache deploy", "--category", "pitfall"),
        ("lock", "--top-k", "3", "--mode", "keyword"),
        ("payment invoice", "--tag", "team=core", "--mode", "vector"),
    ],
)
def test_query_in_process_answers_as_the_system_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    from memstrata.bridges import _cli_query

    data = tmp_path / "data"
    embedder = FakeEmbedder()
    rng = np.random.default_rng(3)
    for owner in ("a1", "shared"):
        with KnowledgeStore.open(KnowledgeStore.path_for(data, owner), embedder) as store:
            store.add_many(
                {
                    "content": " ".join(rng.choice(WORDS, 5)),
                    "category": ("pattern", "pitfall")[i % 2],
                    "tags": {"team": ("core", "edge")[i % 3 == 0]},
                }
                for i in range(60)
            )
            store.add("queue retry cache deploy lock", category="pattern")  # in both: kept once
    calls = []
    real = _cli_query.query_knowledge

    def counted(*a: Any, **k: Any) -> Any:
        found = real(*a, **k)
        calls.append(found is not None)
        return found

    monkeypatch.setattr(_cli_query, "query_knowledge", counted)
    direct = _query(data, embedder, *args, "-a", "a1")
    monkeypatch.setattr(_cli_query, "query_knowledge", lambda *a, **k: None)
    system = _query(data, embedder, *args, "-a", "a1")
    assert calls == [True] and direct
    if args == ("queue retry",):  # the shared store's hits are merged in, the common entry once
        assert {h["store"] for h in direct} == {"a1", "shared"}
        assert sum(h["content"] == "queue retry cache deploy lock" for h in direct) == 1
    assert [(h["store"], h["id"]) for h in direct] == [(h["store"], h["id"]) for h in system]
    for mine, theirs in zip(direct, system, strict=True):
        assert mine["score"] == pytest.approx(theirs["score"])
        assert {k: v for k, v in mine.items() if k not in ("score", "similarity")} == {
            k: v for k, v in theirs.items() if k not in ("score", "similarity")
        }


def test_in_process_query_bounds_a_late_model_as_the_system_does() -> None:
    from memstrata.bridges._cli_query import _Loading
    from memstrata.core.errors import ModelFaultError

    with (
        late_model_loading() as loading,
        pytest.raises(ModelFaultError, match=r"no query vector within 0\.05 s"),
    ):
        loading.embed_query("late")
    assert loading.embed_query("on time").shape == (64,) and not loading.failed
    broken = _Loading("fake-bow", 64, lambda: (_ for _ in ()).throw(OSError("no model")), limit=1.0)
    assert broken.failed and "no model" in str(broken.error)


def test_arrays_written_in_pieces_read_back_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Arrays are written a piece at a time (small pages in the page cache, see ``_WRITE_BYTES``):
    sizes that are no multiple of the piece, and a spare hole after the last, read back exactly."""
    monkeypatch.setattr(_index_files, "_WRITE_BYTES", 1000)
    rng = np.random.default_rng(3)
    arrays = {
        "ids": rng.integers(0, 1 << 40, 777, dtype=np.int64),
        "flags": rng.random(3) < 0.5,
        "matrix": rng.standard_normal((301, 7)).astype(np.float32),
    }
    path = tmp_path / "pieces"
    assert _index_files.write_index(path, {"kind": "test"}, arrays, spare={"matrix": 5})
    found = _index_files.read_index(path)
    assert found is not None and found.meta == {"kind": "test"}
    np.testing.assert_array_equal(found.arrays["ids"], arrays["ids"])
    np.testing.assert_array_equal(found.arrays["flags"], arrays["flags"])
    assert found.arrays["matrix"].shape == (306, 7)
    np.testing.assert_array_equal(found.arrays["matrix"][:301], arrays["matrix"])
    assert not found.arrays["matrix"][301:].any()


def test_query_in_process_opens_its_stores_with_the_configured_storage_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the actors open theirs: ``[storage] lock_timeout_s`` and ``synchronous`` apply."""
    from memstrata.bridges import _cli_query
    from memstrata.config import StorageConfig

    data = tmp_path / "data"
    embedder = FakeEmbedder()
    with KnowledgeStore.open(KnowledgeStore.path_for(data, "a1"), embedder) as store:
        store.add("queue retry cache deploy lock", category="pattern")
    seen: list[tuple[float, str]] = []
    real_open = KnowledgeStore.open

    def recorded(*args: Any, **kwargs: Any) -> KnowledgeStore:
        opened = real_open(*args, **kwargs)
        db = opened._db
        seen.append((db.lock_bound_s, str(db.scalar("PRAGMA synchronous"))))
        return opened

    monkeypatch.setattr(KnowledgeStore, "open", recorded)
    config = Config(data_dir=data, storage=StorageConfig(lock_timeout_s=0.5, synchronous="full"))
    hits = _cli_query.query_knowledge(config, embedder, "a1", "queue retry", {})
    assert hits and seen == [(0.5, "2")]  # PRAGMA synchronous: 2 is FULL
