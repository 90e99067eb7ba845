"""Bulk ingest: ``add_many(items, vectors=...)`` with precomputed vectors, the full-text rows
written in bulk in the writing transaction, and the named migration that made it so."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from memstrata.errors import InvalidInputError, StorageError
from memstrata.layers import KnowledgeStore
from memstrata.layers._knowledge_schema import MIGRATIONS
from memstrata.storage import Database, apply_migrations, bulk_cache, open_database, text_hash
from memstrata.storage._migrations import NamedMigration, get_meta
from memstrata.storage._vector_checks import check_vectors
from tests._support import check_knowledge, without_default_model
from tests.fakes import FakeEmbedder

DIM = 64


class CountingEmbedder(FakeEmbedder):
    """Counts the documents it is asked to embed (precomputed vectors must not reach it)."""

    def __init__(self) -> None:
        super().__init__(dim=DIM)
        self.documents: list[str] = []

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.documents.extend(texts)
        return super().embed_documents(texts)


def _vectors(n: int, seed: int = 7) -> npt.NDArray[np.float32]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, DIM)).astype(np.float32) * 3  # not unit length: normalised on write


def _items(n: int) -> list[dict[str, object]]:
    return [{"content": f"entry number {i} about topic{i % 7}", "category": "pattern"} for i in range(n)]


def _fts_ids(store: KnowledgeStore, word: str) -> set[int]:
    rows = store._db.query("SELECT rowid FROM knowledge_fts WHERE knowledge_fts MATCH ?", (word,))
    return {int(r[0]) for r in rows}


def test_precomputed_vectors_are_stored_and_the_model_is_not_called(data_dir: Path) -> None:
    embedder = CountingEmbedder()
    vectors = _vectors(30)
    with KnowledgeStore.open(data_dir / "k.sqlite", embedder) as store:
        ids = store.add_many(_items(30), vectors=vectors)
        assert embedder.documents == []
        assert store.pending_vectors() == 0
        for index in (0, 17, 29):
            stored = store._vectors.get(ids[index]) if store._vectors is not None else None
            assert stored is not None
            expected = vectors[index] / np.linalg.norm(vectors[index])
            np.testing.assert_allclose(stored, expected, rtol=1e-6, atol=1e-6)
            hits = store.search("unrelated words", mode="vector", top_k=1, query_vector=vectors[index])
            assert [h.entry.id for h in hits] == [ids[index]]


@pytest.mark.parametrize(
    ("vectors", "message"),
    [
        (np.ones((3, DIM), dtype=np.float32), r"vectors must have shape \(4, 64\).*got \(3, 64\)"),
        (np.ones((4, DIM + 1), dtype=np.float32), r"vectors must have shape \(4, 64\).*got \(4, 65\)"),
        (np.ones(DIM, dtype=np.float32), r"vectors must have shape \(4, 64\)"),
        ("not numbers", r"vectors must be an array of numbers"),
    ],
)
def test_vectors_of_the_wrong_shape_are_refused_before_anything_is_written(
    data_dir: Path, vectors: object, message: str
) -> None:
    with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(dim=DIM)) as store:
        with pytest.raises(InvalidInputError, match=message):
            store.add_many(_items(4), vectors=vectors)
        assert store.count() == 0


@pytest.mark.parametrize(
    ("row", "bad", "what"),
    [(3, np.nan, "holds NaN or infinity"), (3, np.inf, "holds NaN"), (2, None, "is all zeros")],
    ids=["nan", "infinity", "zeros"],
)
def test_a_bad_vector_is_named_by_its_row(data_dir: Path, row: int, bad: float | None, what: str) -> None:
    """A vector that is not finite (one component) or is all zeros (``bad`` None) is refused,
    named by its row, and nothing is written."""
    vectors = _vectors(5)
    if bad is None:
        vectors[row] = 0
    else:
        vectors[row, 10] = bad
    with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(dim=DIM)) as store:
        with pytest.raises(InvalidInputError, match=rf"vectors\[{row}\] {what}"):
            store.add_many(_items(5), vectors=vectors)
        assert store.count() == 0


def _with_none(row: int) -> npt.NDArray[np.object_]:
    vectors = _vectors(4).astype(object)
    vectors[row, 5] = None
    return vectors


@pytest.mark.parametrize(
    ("vectors", "message"),
    [
        (_vectors(4).astype(np.complex64), r"^vectors must be real numbers, got complex ones \(complex64\)$"),
        (_with_none(2), r"^vectors\[2\] holds None where a number belongs$"),
    ],
    ids=["complex", "none"],
)
def test_what_a_cast_would_change_silently_is_refused(
    data_dir: Path, vectors: npt.NDArray[np.generic], message: str
) -> None:
    """Complex numbers would lose their imaginary part (with a warning only) and None would read
    as NaN: each is refused in one line that says what it is, and nothing is written."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(dim=DIM)) as store:
            with pytest.raises(InvalidInputError, match=message):
                store.add_many(_items(4), vectors=vectors)
            assert store.count() == 0
        with pytest.raises(InvalidInputError, match=message):  # a vector index's own writes alike
            check_vectors(vectors, DIM)


def test_duplicates_keep_the_stored_vector_and_merge_into_the_first(data_dir: Path) -> None:
    vectors = _vectors(4)
    with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(dim=DIM)) as store:
        first = store.add_many([{"content": "kept entry", "tags": {"a": "1"}}], vectors=vectors[:1])[0]
        items = [
            {"content": "kept entry", "tags": {"b": "2"}},  # a duplicate of the stored entry
            {"content": "new entry", "tags": {"c": "3"}},
            {"content": "new entry", "tags": {"d": "4"}},  # a duplicate within the call
        ]
        ids = store.add_many(items, vectors=vectors[1:])
        assert ids[0] == first and ids[1] == ids[2] != first
        assert store.count() == 2
        assert store._vectors is not None
        kept, new = store._vectors.get(first), store._vectors.get(ids[1])
        assert kept is not None and new is not None
        np.testing.assert_allclose(kept, vectors[0] / np.linalg.norm(vectors[0]), atol=1e-6)
        np.testing.assert_allclose(new, vectors[2] / np.linalg.norm(vectors[2]), atol=1e-6)
        entry = store.get(ids[1])
        assert entry is not None and entry.tags == {"c": "3", "d": "4"}
        merged = store.get(first)
        assert merged is not None and merged.tags == {"a": "1", "b": "2"}


def test_bulk_rows_reach_both_full_text_indexes_exactly(data_dir: Path) -> None:
    items = [
        {"content": "parseHttpRequest handles the payload", "tags": {"lang": "python"}},
        {"content": "支付系统的重试策略 needs idempotency", "category": "pitfall"},
        {"content": "plain words only here"},
    ]
    with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(dim=DIM)) as store:
        ids = store.add_many(items, vectors=_vectors(3))
        assert _fts_ids(store, "http") == {ids[0]}  # the identifier column
        assert _fts_ids(store, "python") == {ids[0]}  # the tag column
        assert _fts_ids(store, "plain") == {ids[2]}
        tri = store._db.query("SELECT rowid FROM knowledge_tri WHERE knowledge_tri MATCH ?", ('"重试策"',))
        assert [int(r[0]) for r in tri] == [ids[1]]
        assert store._db.scalar("SELECT count(*) FROM knowledge_tri_docsize") == 1
        assert [h.entry.id for h in store.search("支付", mode="keyword")] == [ids[1]]
        report = check_knowledge(store._db, full=True)
        assert report.problems == [] and report.fts_rebuilt == []
        # later writes keep them exact: an update and a delete go through their triggers
        store.update(ids[2], content="other words now")
        assert _fts_ids(store, "plain") == set() and _fts_ids(store, "other") == {ids[2]}
        store.delete(ids[0])
        assert _fts_ids(store, "http") == set()


def test_a_failed_batch_leaves_no_full_text_rows_behind(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(dim=DIM)) as store:
        store.add_many(_items(3), vectors=_vectors(3))
        assert store._vectors is not None

        def fail(*args: object, **kwargs: object) -> None:
            raise StorageError("disk full (injected)")

        monkeypatch.setattr(store._vectors, "upsert_many", fail)  # after the rows and their FTS rows
        with pytest.raises(StorageError, match="injected"):
            store.add_many([{"content": "never stored zebra"}], vectors=_vectors(1))
        monkeypatch.undo()
        assert store.count() == 3
        assert _fts_ids(store, "zebra") == set()
        assert store._db.scalar("SELECT count(*) FROM knowledge_fts_docsize") == 3
        new = store.add_many([{"content": "stored zebra"}], vectors=_vectors(1, seed=3))
        assert _fts_ids(store, "zebra") == set(new)


def test_more_items_than_one_batch_are_written_in_order(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memstrata.layers._knowledge_writes as writes

    monkeypatch.setattr(writes, "BULK_BATCH", 7)
    items = _items(30)
    with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(dim=DIM)) as store:
        ids = store.add_many(items, vectors=_vectors(30))
        assert ids == sorted(ids) and len(set(ids)) == 30
        assert [e.content for e in store.list(order_by="id", descending=False, limit=30)] == [
            str(i["content"]) for i in items
        ]
        assert store._db.scalar("SELECT count(*) FROM knowledge_fts_docsize") == 30
        assert store.pending_vectors() == 0


def test_a_store_that_cannot_write_vectors_keeps_the_rows_pending(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    without_default_model(monkeypatch, "no model here (injected)")
    path = data_dir / "k.sqlite"
    with KnowledgeStore.open(path) as store:
        assert store.status()["mode"] == "keyword-only"
        ids = store.add_many(_items(3), vectors=_vectors(3))
        assert (
            len(ids) == 3 and store._db.scalar("SELECT count(*) FROM knowledge WHERE vector_pending = 1") == 3
        )
    embedder = CountingEmbedder()
    with KnowledgeStore.open(path, embedder) as store:  # the model computes them when it is back
        assert store.pending_vectors() == 0 and len(embedder.documents) == 3


def _store_at_version(path: Path, version: int, content: str) -> Database:
    """A knowledge database as schema ``version`` left it, holding one entry of ``content``."""
    db = open_database(path)
    apply_migrations(db, "knowledge", MIGRATIONS[:version])
    with db.transaction():
        db.execute(
            "INSERT INTO knowledge(content, category, scope, content_hash, ident, created_at, updated_at) "
            "VALUES (?, 'pattern', '/', ?, '', 1.0, 1.0)",
            (content, text_hash(content)),
        )
    return db


def test_a_version_1_store_is_migrated_by_name_and_keeps_its_rows(data_dir: Path) -> None:
    path = data_dir / "old.sqlite"
    db = _store_at_version(path, 1, "written by version one")
    assert db.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'knowledge_ai'") == 1
    db.close()
    with KnowledgeStore.open(path, FakeEmbedder(dim=DIM)) as store:
        assert get_meta(store._db, "schema_version") == str(len(MIGRATIONS))
        assert get_meta(store._db, "migration:2") == "bulk-ingest-1"
        assert store._db.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'knowledge_ai'") == 0
        assert [h.entry.content for h in store.search("version one", mode="keyword")] == [
            "written by version one"
        ]
        new = store.add("written by version two")
        assert [h.entry.id for h in store.search("two", mode="keyword")] == [new]


def test_a_version_2_store_trades_its_unique_index_for_the_hash_key_and_still_deduplicates(
    data_dir: Path,
) -> None:
    path = data_dir / "old.sqlite"
    _store_at_version(path, 2, "written by version two").close()
    with KnowledgeStore.open(path, FakeEmbedder(dim=DIM)) as store:
        assert get_meta(store._db, "migration:3") == "dedup-hash-key-1"
        indexes = {r[0] for r in store._db.query("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "knowledge_dedup" not in indexes and "knowledge_hash_key" in indexes
        assert store.add("written by version two") == 1  # the stored row, found by its key
        assert store.add_many([{"content": "written by version two"}], vectors=_vectors(1)) == [1]
        assert store.add("written by version two", scope="/elsewhere") == 2
        assert store.count() == 2


def _plans(db: Database, calls: list[tuple[str, Sequence[object]]]) -> list[str]:
    return [
        " ".join(str(row[3]) for row in db.query("EXPLAIN QUERY PLAN " + sql, params))
        for sql, params in calls
    ]


def test_duplicates_are_looked_up_through_the_hash_key_index(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(dim=DIM)) as store:
        first = store.add("an entry to look up", category="pattern")
        other = store.add("another entry", category="pattern")
        calls: list[tuple[str, Sequence[object]]] = []
        db = store._db
        for name in ("query", "scalar"):
            original = getattr(db, name)

            def capture(sql: str, params: Sequence[object] = (), _original: object = original) -> object:
                if "content_hash" in sql and sql.lstrip().startswith("SELECT id"):
                    calls.append((sql, params))
                return _original(sql, params)  # type: ignore[operator]

            monkeypatch.setattr(db, name, capture)
        assert store.add("an entry to look up", category="pattern") == first
        with pytest.raises(InvalidInputError, match=f"would duplicate entry {first}"):
            store.update(other, content="an entry to look up")
        monkeypatch.undo()
        assert {"IN (" in sql for sql, _ in calls} == {True, False}  # the batch's lookup and the update's
        for plan in _plans(db, calls):
            assert "knowledge_hash_key" in plan and "SCAN knowledge" not in plan


def test_contents_whose_hashes_share_the_key_stay_apart(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two contents with the same first 8 bytes of hash (forced here) are two entries, each found
    again as itself: the whole hash decides."""
    import memstrata.layers._knowledge_edits as edits
    import memstrata.layers._knowledge_schema as schema

    def alike(text: str) -> bytes:
        return b"SAMEKEY!" + text_hash(text)[8:]

    monkeypatch.setattr(schema, "text_hash", alike)
    monkeypatch.setattr(edits, "text_hash", alike)
    with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(dim=DIM)) as store:
        a = store.add("the first content", category="pattern")
        b = store.add_many([{"content": "the second content", "category": "pattern"}], vectors=_vectors(1))[0]
        assert a != b and store.count() == 2
        assert store.add("the second content", category="pattern") == b
        assert store.add_many(
            [{"content": "the first content", "category": "pattern"}], vectors=_vectors(1)
        ) == [a]
        assert store.update(b, content="the second content, changed") is not None
        with pytest.raises(InvalidInputError, match=f"would duplicate entry {a}"):
            store.update(b, content="the first content")
        assert store.count() == 2


def test_a_failing_named_migration_is_named_in_the_error(data_dir: Path) -> None:
    db = open_database(data_dir / "m.sqlite")
    try:
        steps = ["CREATE TABLE t (x INTEGER)", NamedMigration("broken-step", "CREATE TABLE t (y INTEGER)")]
        with pytest.raises(StorageError, match=r"demo migration 2 \(broken-step\) failed"):
            apply_migrations(db, "demo", steps)
        assert get_meta(db, "schema_version") == "1" and get_meta(db, "migration:2") is None
    finally:
        db.close()


def test_the_bulk_page_cache_is_given_back(data_dir: Path) -> None:
    db = open_database(data_dir / "c.sqlite")
    try:
        before = db.scalar("PRAGMA cache_size")
        with bulk_cache(db, 10):
            assert db.scalar("PRAGMA cache_size") == before  # a few rows: left as it is
        with bulk_cache(db, 10_000):
            assert db.scalar("PRAGMA cache_size") == -65_536
            with bulk_cache(db, 10_000):
                assert db.scalar("PRAGMA cache_size") == -65_536
            assert db.scalar("PRAGMA cache_size") == -65_536
        assert db.scalar("PRAGMA cache_size") == before
    finally:
        db.close()


def test_a_write_from_elsewhere_between_batches_is_still_deduplicated(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memstrata.layers._knowledge_writes as writes

    monkeypatch.setattr(writes, "BULK_BATCH", 4)
    path = data_dir / "k.sqlite"
    items = [*_items(8), {"content": "written elsewhere meanwhile", "category": "pattern"}]
    with (
        KnowledgeStore.open(path, FakeEmbedder(dim=DIM)) as store,
        KnowledgeStore.open(path, FakeEmbedder(dim=DIM)) as other,
    ):
        original = store._add_batch
        foreign: list[int] = []

        def add_batch(*args: object, **kwargs: object) -> object:
            result = original(*args, **kwargs)  # type: ignore[arg-type]
            if not foreign:  # after the first batch: another connection commits the last item
                foreign.append(other.add("written elsewhere meanwhile"))
            return result

        monkeypatch.setattr(store, "_add_batch", add_batch)
        ids = store.add_many(items, vectors=_vectors(9))
        assert ids[-1] == foreign[0]
        assert store.count() == 9 and len(set(ids)) == 9
        again = store.add_many(items[:6], vectors=_vectors(6))  # all stored: every id comes back
        assert again == ids[:6] and store.count() == 9


def test_huge_and_tiny_finite_vectors_are_normalised(data_dir: Path) -> None:
    vectors = _vectors(3)
    vectors[0] *= 1e35  # its length overflows float32
    vectors[1] *= 1e-30
    with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(dim=DIM)) as store:
        ids = store.add_many(_items(3), vectors=vectors)
        assert store._vectors is not None
        for index, entry_id in enumerate(ids):
            stored = store._vectors.get(entry_id)
            assert stored is not None and abs(float(np.linalg.norm(stored)) - 1.0) < 1e-5
            direction = vectors[index].astype(np.float64) / np.linalg.norm(vectors[index].astype(np.float64))
            np.testing.assert_allclose(stored, direction, atol=1e-6)
