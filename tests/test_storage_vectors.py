"""VectorIndex: vec0, the in-memory engine and the blob fallback agree; the mirror stays true."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from memstrata.errors import InvalidInputError, StorageError
from memstrata.storage import Database, VectorIndex, disable_vec_for_tests, open_database

DIM = 16
META = {"cat": "text", "n": "integer", "score": "float", "flag": "boolean"}
CATS = ("alpha", "beta", "gamma")
Opened = tuple[Database, VectorIndex]  # a connection and the vector index on it


def _data(
    seed: int, n: int, scale: bool = False
) -> tuple[list[int], npt.NDArray[np.float32], list[dict[str, Any]]]:
    rng = np.random.default_rng(seed)
    ids = [int(i) for i in rng.choice(np.arange(1, 10 * n), size=n, replace=False)]
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    if scale:  # cosine must not depend on length
        vectors *= rng.uniform(0.1, 10, size=(n, 1)).astype(np.float32)
    metas = [
        {
            "cat": CATS[int(rng.integers(3))],
            "n": int(rng.integers(5)),
            "score": float(rng.integers(3)) / 2,
            "flag": bool(rng.integers(2)),
        }
        for _ in range(n)
    ]
    return ids, vectors, metas


def _reference(
    ids: list[int],
    vectors: npt.NDArray[np.float32],
    metas: list[dict[str, Any]],
    query: npt.NDArray[np.float32],
    k: int,
    where: dict[str, Any],
    candidates: list[int] | None,
) -> list[int]:
    """A plain exact scan: the answer every engine must give."""
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    q = query / np.linalg.norm(query)
    scored = []
    for rowid, vector, meta in zip(ids, unit, metas, strict=True):
        if any(meta[c] != v for c, v in where.items()):
            continue
        if candidates is not None and rowid not in candidates:
            continue
        scored.append((-float(vector @ q), rowid))
    return [rowid for _, rowid in sorted(scored)[:k]]


def _open(path: Path, vec_enabled: bool | None = None) -> Opened:
    """A vector index at ``path``; ``vec_enabled`` False opens it as if sqlite-vec were missing,
    True as if it were there (``None``: as this process is set)."""
    if vec_enabled is None:
        db = open_database(path)
        return db, VectorIndex(db, "items", DIM, metadata=META)
    disable_vec_for_tests(not vec_enabled)
    try:
        return _open(path)
    finally:
        disable_vec_for_tests(False)


def _fill(
    vec: VectorIndex, seed: int, n: int
) -> tuple[list[int], npt.NDArray[np.float32], list[dict[str, Any]]]:
    """:func:`_data` ``(seed, n)``, upserted into ``vec``: the rows a test then works on."""
    ids, vectors, metas = _data(seed, n)
    vec.upsert_many(ids, vectors, metas)
    return ids, vectors, metas


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Opened]:
    """A vector index at ``v.sqlite`` in the test's folder, closed after the test."""
    db, vec = _open(tmp_path / "v.sqlite")
    try:
        yield db, vec
    finally:
        db.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("scale", [False, True])
def test_engines_agree_with_exact_scan(tmp_path: Path, seed: int, scale: bool) -> None:
    ids, vectors, metas = _data(seed, 300, scale)
    db, vec = _open(tmp_path / "vec0.sqlite")
    assert vec.backend == "vec0"
    blob_db, blob = _open(tmp_path / "blob.sqlite", vec_enabled=False)
    assert blob.backend == "blob" and not blob_db.native_vectors
    for index in (vec, blob):
        with index.db.transaction():
            index.upsert_many(ids, vectors, metas)
    rng = np.random.default_rng(seed + 100)
    filters: list[dict[str, Any]] = [
        {},
        {"cat": "alpha"},
        {"cat": "beta", "n": 2},
        {"flag": True},
        {"score": 0.5, "flag": False},
        {"cat": "missing"},
    ]
    for _ in range(6):
        query = rng.standard_normal(DIM).astype(np.float32)
        subset = [int(i) for i in rng.choice(ids, size=40, replace=False)]
        for where in filters:
            for candidates in (None, subset, [*subset[:5], 999_999]):
                for k in (1, 7, 50, 400):
                    expected = _reference(ids, vectors, metas, query, k, where, candidates)
                    got = {
                        "vec0": vec.search(query, k, where=where, candidates=candidates, engine="vec0"),
                        "memory": vec.search(query, k, where=where, candidates=candidates, engine="memory"),
                        "blob": blob.search(query, k, where=where, candidates=candidates),
                    }
                    for engine, hits in got.items():
                        assert [h.rowid for h in hits] == expected, (engine, where, k)
                    for a, b in zip(got["vec0"], got["memory"], strict=True):
                        assert a.similarity == pytest.approx(b.similarity, abs=1e-5)
    db.close()
    blob_db.close()


def test_large_candidate_sets_and_dead_rows(index: Opened) -> None:
    """Many candidates and many deleted rows take the vectorised paths; answers stay exact."""
    _, vec = index
    ids, vectors, metas = _fill(vec, 21, 3000)
    vec.search(vectors[0], 1)
    gone = set(ids[:900])
    vec.delete_many(gone)
    live = [i for i in ids if i not in gone]
    rng = np.random.default_rng(22)
    for candidates in (ids[:2600], ids[500:], live[:100]):
        for where in ({}, {"cat": "beta"}):
            query = rng.standard_normal(DIM).astype(np.float32)
            keep = [i not in gone for i in ids]
            expected = _reference(
                [i for i, k in zip(ids, keep, strict=True) if k],
                vectors[keep],
                [m for m, k in zip(metas, keep, strict=True) if k],
                query,
                25,
                where,
                list(candidates),
            )
            for engine in ("memory", "vec0"):
                hits = vec.search(query, 25, where=where, candidates=candidates, engine=engine)
                assert [h.rowid for h in hits] == expected, engine


def test_similarity_is_cosine(index: Opened) -> None:
    db, vec = index
    meta = {"cat": "alpha", "n": 1, "score": 0.0, "flag": False}
    base = np.zeros(DIM, dtype=np.float32)
    base[0] = 3.0
    other = np.zeros(DIM, dtype=np.float32)
    other[:2] = [1.0, 1.0]
    with db.transaction():
        vec.upsert_many([1, 2], np.stack([base, other]), [meta, meta])
    for engine in ("vec0", "memory"):
        hits = vec.search(base / 3, 2, engine=engine)  # type: ignore[arg-type]
        assert [h.rowid for h in hits] == [1, 2]
        assert hits[0].similarity == pytest.approx(1.0, abs=1e-6)
        assert hits[1].similarity == pytest.approx(np.sqrt(0.5), abs=1e-6)


@pytest.mark.parametrize("vec_enabled", [True, False])
def test_upsert_twice_never_raises_unique(tmp_path: Path, vec_enabled: bool) -> None:
    db, vec = _open(tmp_path / "v.sqlite", vec_enabled)
    ids, vectors, metas = _data(5, 20)
    with db.transaction():
        vec.upsert_many(ids, vectors, metas)
    with db.transaction():
        vec.upsert_many(ids, vectors[::-1].copy(), metas[::-1])
    vec.upsert(ids[0], vectors[0], metas[0])
    assert vec.count() == 20
    # the same rowid twice in one batch: the last one wins
    fresh = np.random.default_rng(55).standard_normal((2, DIM)).astype(np.float32)
    vec.upsert_many([ids[1], ids[1]], fresh, [metas[2], metas[3]])
    assert vec.count() == 20
    stored = vec.get(ids[1])
    assert stored is not None and np.allclose(stored, fresh[1])
    hits = vec.search(fresh[1], 3)
    assert [h.rowid for h in hits].count(ids[1]) == 1 and hits[0].rowid == ids[1]
    db.close()


@pytest.mark.parametrize("vec_enabled", [True, False])
def test_deletes(tmp_path: Path, vec_enabled: bool) -> None:
    db, vec = _open(tmp_path / "v.sqlite", vec_enabled)
    ids, vectors, _ = _fill(vec, 6, 50)
    vec.search(vectors[0], 5)  # load the mirror before deleting
    vec.delete_many(ids[:10])
    vec.delete(ids[10])
    vec.delete_many([123_456_789])  # unknown: ignored
    assert vec.count() == 39
    assert vec.rowids() == set(ids[11:])
    assert vec.get(ids[0]) is None
    engines = ["memory", "vec0"] if vec_enabled else ["memory"]
    for engine in engines:
        found = {h.rowid for h in vec.search(vectors[0], 100, engine=engine)}  # type: ignore[arg-type]
        assert found == set(ids[11:])
    db.close()


def test_mirror_survives_many_deletes_and_compaction(tmp_path: Path) -> None:
    db = open_database(tmp_path / "v.sqlite")
    vec = VectorIndex(db, "items", DIM)
    rng = np.random.default_rng(9)
    vectors = rng.standard_normal((3000, DIM)).astype(np.float32)
    vec.upsert_many(list(range(1, 3001)), vectors)
    vec.search(vectors[0], 1)
    vec.delete_many(range(1, 2500))  # enough dead rows to compact
    query = vectors[2600]
    assert [h.rowid for h in vec.search(query, 5)] == [h.rowid for h in vec.search(query, 5, engine="vec0")]
    assert vec.search(query, 1)[0].rowid == 2601
    db.close()


def test_chunk_reader_matches_the_virtual_table(tmp_path: Path, index: Opened) -> None:
    """The mirror's fast load from vec0's chunk tables returns exactly what vec0 holds."""
    db, vec = index
    ids, vectors, metas = _fill(vec, 15, 2500)  # several 1024-row chunks
    vec.delete_many(ids[100:1300:3])
    vec.upsert_many(ids[:50], vectors[50:100], metas[50:100])  # moved to new slots
    fast = vec._read_vec0_chunks()
    assert fast is not None
    rowids, stored = fast
    expected = {
        int(r): np.frombuffer(b, dtype=np.float32)
        for r, b in db.query("SELECT rowid, embedding FROM items_vec")
    }
    assert sorted(rowids) == sorted(expected)
    for rowid, row in zip(rowids, stored, strict=True):
        assert np.array_equal(row, expected[rowid])
    fresh_db, fresh = _open(tmp_path / "v.sqlite")
    query = vectors[7]
    assert [h.rowid for h in fresh.search(query, 20)] == [
        h.rowid for h in fresh.search(query, 20, engine="vec0")
    ]
    fresh_db.close()


def test_rollback_restores_the_mirror(index: Opened) -> None:
    db, vec = index
    ids, vectors, metas = _fill(vec, 7, 30)
    query = vectors[0]
    before = [h.rowid for h in vec.search(query, 5)]
    with pytest.raises(RuntimeError), db.transaction():
        vec.upsert(10_000, query * 2, metas[0])  # would be the top hit
        vec.delete_many(ids[:3])
        assert vec.search(query, 1)[0].rowid == 10_000  # visible inside the transaction
        raise RuntimeError("abort")
    assert [h.rowid for h in vec.search(query, 5)] == before
    assert [h.rowid for h in vec.search(query, 5, engine="vec0")] == before
    assert vec.count() == 30


def test_nested_rollback_undoes_only_the_inner_block(index: Opened) -> None:
    db, vec = index
    ids, vectors, metas = _data(8, 10)
    with db.transaction():
        vec.upsert_many(ids[:5], vectors[:5], metas[:5])
        vec.search(vectors[0], 1)
        with pytest.raises(RuntimeError), db.transaction():
            vec.upsert_many(ids[5:], vectors[5:], metas[5:])
            raise RuntimeError("inner")
    assert vec.rowids() == set(ids[:5])
    assert {h.rowid for h in vec.search(vectors[0], 20)} == set(ids[:5])


def test_another_connections_commit_refreshes_the_mirror(tmp_path: Path) -> None:
    path = tmp_path / "v.sqlite"
    db_a, vec_a = _open(path)
    db_b, vec_b = _open(path)
    ids, vectors, metas = _data(10, 40)
    vec_a.upsert_many(ids[:20], vectors[:20], metas[:20])
    assert {h.rowid for h in vec_a.search(vectors[0], 100)} == set(ids[:20])  # mirror loaded
    with db_b.transaction():
        vec_b.upsert_many(ids[20:], vectors[20:], metas[20:])
        vec_b.delete_many(ids[:5])
    assert {h.rowid for h in vec_a.search(vectors[0], 100)} == set(ids[5:])
    assert vec_a.search(vectors[30], 1)[0].rowid == ids[30]
    db_a.close()
    db_b.close()


def test_two_indexes_on_one_connection_see_each_others_writes(tmp_path: Path) -> None:
    db = open_database(tmp_path / "v.sqlite")
    first = VectorIndex(db, "items", DIM)
    second = VectorIndex(db, "items", DIM)
    rng = np.random.default_rng(11)
    vectors = rng.standard_normal((4, DIM)).astype(np.float32)
    first.upsert_many([1, 2], vectors[:2])
    assert {h.rowid for h in first.search(vectors[0], 10)} == {1, 2}
    second.upsert_many([3, 4], vectors[2:])
    second.delete(1)
    assert {h.rowid for h in first.search(vectors[0], 10)} == {2, 3, 4}
    first.upsert(5, vectors[0])
    assert {h.rowid for h in second.search(vectors[0], 10)} == {2, 3, 4, 5}
    db.close()


def test_concurrent_writer_thread_keeps_mirrors_exact(tmp_path: Path) -> None:
    path = tmp_path / "v.sqlite"
    db, vec = _open(path)
    ids, vectors, metas = _data(12, 200)
    vec.upsert_many(ids[:100], vectors[:100], metas[:100])
    vec.search(vectors[0], 1)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            other, other_vec = _open(path)
            for start in range(100, 200, 10):
                with other.transaction():
                    other_vec.upsert_many(
                        ids[start : start + 10], vectors[start : start + 10], metas[start : start + 10]
                    )
            other.close()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    thread.join()
    assert not errors
    assert {h.rowid for h in vec.search(vectors[0], 500)} == set(ids)
    db.close()


def test_vec0_store_opened_without_sqlite_vec_is_reported_unavailable(tmp_path: Path, no_vec: None) -> None:
    path = tmp_path / "v.sqlite"
    disable_vec_for_tests(False)
    db, vec = _open(path)
    ids, vectors, metas = _fill(vec, 13, 10)
    db.close()

    disable_vec_for_tests(True)
    db, vec = _open(path)
    status = vec.status()
    assert status["backend"] == "vec0"
    assert status["available"] is False and status["native_vectors"] is False
    assert "disabled" in status["reason"]
    with pytest.raises(StorageError, match="needs sqlite-vec"):
        vec.search(vectors[0], 3)
    with pytest.raises(StorageError, match="needs sqlite-vec"):
        vec.upsert(ids[0], vectors[0], metas[0])
    vec.delete_many(ids[:2])  # recorded, applied once sqlite-vec is back
    db.close()

    disable_vec_for_tests(False)
    db, vec = _open(path)
    assert vec.available and vec.status()["reason"] is None
    assert vec.rowids() == set(ids[2:])
    db.close()


def test_reset_changes_dimension_and_upgrades_a_blob_store(tmp_path: Path) -> None:
    path = tmp_path / "v.sqlite"
    db, vec = _open(path, vec_enabled=False)
    _, _, metas = _fill(vec, 14, 5)
    db.close()
    db = open_database(path)
    with pytest.raises(StorageError, match="reset"):
        VectorIndex(db, "items", DIM * 2, metadata=META)
    vec = VectorIndex(db, "items", DIM, metadata=META)
    assert vec.backend == "blob"
    vec.reset(DIM * 2)
    assert vec.backend == "vec0" and vec.dim == DIM * 2 and vec.count() == 0
    wide = np.ones(DIM * 2, dtype=np.float32)
    vec.upsert(1, wide, metas[0])
    assert vec.search(wide, 1, engine="vec0")[0].rowid == 1
    db.close()
    db = open_database(path)
    again = VectorIndex(db, "items", DIM * 2, metadata=META)
    assert again.backend == "vec0" and again.count() == 1
    db.close()


def test_bad_input_is_named(index: Opened) -> None:
    db, vec = index
    meta = {"cat": "alpha", "n": 1, "score": 0.5, "flag": True}
    good = np.ones(DIM, dtype=np.float32)
    cases: list[tuple[Any, str]] = [
        (lambda: vec.upsert(1, np.ones(DIM + 1, dtype=np.float32), meta), r"shape \(n, 16\)"),
        (lambda: vec.upsert(1, np.full(DIM, np.nan, dtype=np.float32), meta), "NaN"),
        (lambda: vec.upsert(1, np.zeros(DIM, dtype=np.float32), meta), "zero vector"),
        (lambda: vec.upsert(1, good, {"cat": "alpha"}), "lacks metadata column 'n'"),
        (lambda: vec.upsert(1, good, {**meta, "n": "one"}), r"\['n'\] must be a integer"),
        (lambda: vec.upsert(1, good, {**meta, "cat": 5}), r"\['cat'\] must be a text"),
        (lambda: vec.upsert(1, good, {**meta, "flag": 2}), r"\['flag'\] must be a boolean"),
        (lambda: vec.upsert(1, good, {**meta, "other": 1}), "unknown column"),
        (lambda: vec.upsert_many([1, 2], np.stack([good]), [meta]), "2 rowids but 1 vectors"),
        (lambda: vec.search(good, 3, where={"nope": 1}), "unknown vector filter"),
        (lambda: vec.search(good, 3, engine="faiss"), "engine must be one of"),  # type: ignore[arg-type]
        (lambda: vec.search(np.zeros(DIM, dtype=np.float32), 3), "zero vector"),
        (lambda: VectorIndex(db, "bad name", DIM), "name must be an SQL identifier"),
        (lambda: VectorIndex(db, "x", 0), "dim must be a positive integer"),
        (lambda: VectorIndex(db, "x", DIM, metadata={"c": "json"}), "has type 'json'"),
    ]
    for call, message in cases:
        with pytest.raises(InvalidInputError, match=message):
            call()
    vec.upsert(1, good, {**meta, "score": 1})  # an int for a float column is accepted
    assert vec.count() == 1


def test_metadata_update_and_empty_cases(index: Opened) -> None:
    _, vec = index
    good = np.ones(DIM, dtype=np.float32)
    assert vec.search(good, 5) == [] and vec.search(good, 5, engine="vec0") == []
    vec.upsert(1, good, {"cat": "alpha", "n": 1, "score": 0.5, "flag": True})
    assert vec.search(good, 0) == [] and vec.search(good, 5, candidates=[]) == []
    vec.update_metadata(
        1, {"cat": "beta", "n": np.int64(1), "score": np.float32(0.5), "flag": np.bool_(True)}
    )
    for engine in ("memory", "vec0"):
        numpy_filters = {"n": np.int32(1), "score": np.float64(0.5), "flag": np.bool_(True)}
        assert len(vec.search(good, 5, where=numpy_filters, engine=engine)) == 1
        assert vec.search(good, 5, where={"n": "one"}, engine=engine) == []
    for engine in ("memory", "vec0"):
        assert vec.search(good, 5, where={"cat": "alpha"}, engine=engine) == []  # type: ignore[arg-type]
        assert len(vec.search(good, 5, where={"cat": "beta"}, engine=engine)) == 1  # type: ignore[arg-type]


def test_status_reports_backend(index: Opened) -> None:
    db, vec = index
    status = vec.status()
    assert status["backend"] == "vec0" and status["available"] and status["native_vectors"]
    assert status["search_engine"] == "memory" and status["count"] == 0 and status["dim"] == DIM
    no_mirror = VectorIndex(db, "other", DIM, mirror=False)
    assert no_mirror.status()["search_engine"] == "vec0"
