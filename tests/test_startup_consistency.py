"""The open-time consistency check reads checksums of ids, not the ids, and still catches a store
changed behind its back (by another connection, bypassing the layer)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memstrata.errors import DatabaseBusyError
from memstrata.layers import EpisodicMemory, KnowledgeStore
from memstrata.storage import (
    Database,
    VectorIndex,
    _consistency,
    apply_migrations,
    check_consistency,
    connection_defaults,
    disable_vec_for_tests,
    fts_schema,
    open_database,
)
from memstrata.storage._consistency import _fingerprint
from memstrata.storage._driver import _MODULE, _load_vec
from tests._support import VectorRepair, seeded_vector
from tests.fakes import FakeEmbedder


def make_store(path: Path) -> tuple[Database, VectorIndex]:
    db = open_database(path)
    schema = (
        "CREATE TABLE docs (id INTEGER PRIMARY KEY, body TEXT NOT NULL, pending INTEGER NOT NULL DEFAULT 0);"
    )
    schema += fts_schema("docs", ["body"])
    apply_migrations(db, "test", [schema])
    vectors = VectorIndex(db, "docs", 8)
    with db.transaction():
        db.executemany("INSERT INTO docs(id, body) VALUES (?, ?)", [(n, f"doc {n}") for n in range(1, 41)])
        vectors.upsert_many(list(range(1, 41)), np.stack([seeded_vector(n) for n in range(1, 41)]))
    return db, vectors


@pytest.fixture(params=["vec0", "blob", "vec0 beside", "blob beside"])
def store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Database, VectorIndex]]:
    """The same small store on sqlite-vec and on the numpy fallback's blob table; "beside": its
    vector ids fingerprinted on a second connection, as a large store's are."""
    backend, _, beside = request.param.partition(" ")
    readers: list[Database] = []
    if beside:
        monkeypatch.setattr(_consistency, "_BESIDE_FROM_BYTES", 0)
        opened = _consistency.open_database

        def reader(*args: Any, **kwargs: Any) -> Database:
            readers.append(opened(*args, **kwargs))
            return readers[-1]

        monkeypatch.setattr(_consistency, "open_database", reader)
    disable_vec_for_tests(backend == "blob")
    try:
        db, vectors = make_store(tmp_path / "s.sqlite")
        assert vectors.backend == backend
        yield db, vectors
        assert bool(readers) == bool(beside)  # the check ran on a second connection, or not
        assert all(r.read_only for r in readers)
        db.close()
    finally:
        disable_vec_for_tests(False)


def check(db: Database, vectors: VectorIndex, **kwargs: object) -> dict[str, object]:
    report = check_consistency(db, table="docs", fts={"docs_fts": None}, vectors=vectors, **kwargs)  # type: ignore[arg-type]
    return report.as_dict()


def other_connection(db: Database, vectors: VectorIndex) -> Any:
    """A second connection to the same file, as another process (or a hand edit) would have."""
    conn = _MODULE.connect(str(db.path), isolation_level=None)
    if vectors.backend == "vec0":
        _load_vec(conn)
    return conn


def test_a_consistent_store_is_not_read_row_by_row(
    store: tuple[Database, VectorIndex], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, vectors = store

    def no_sets(self: VectorIndex) -> set[int]:
        raise AssertionError("the checksums agree: the id sets must not be read")

    monkeypatch.setattr(VectorIndex, "rowids", no_sets)
    report = check(db, vectors)
    assert report["consistent"] and report["vectors"] == 40
    # rows that need no vector (pending): all-ids checksum differs, the wanted rows' one agrees
    with db.transaction():
        db.execute("UPDATE docs SET pending = 1 WHERE id IN (7, 8)")
        vectors.delete_many([7, 8])
    report = check(db, vectors, vector_rows="pending = 0")
    assert report["consistent"] and report["vectors"] == 38


def test_a_swap_behind_our_back_keeps_the_counts_and_is_still_caught(
    store: tuple[Database, VectorIndex],
) -> None:
    """One vector lost and one vector without a row: the counts agree, the checksums do not."""
    db, vectors = store
    conn = other_connection(db, vectors)
    conn.execute(f"DELETE FROM {vectors.table} WHERE rowid = 5")
    conn.execute(
        f"INSERT INTO {vectors.table}(rowid, embedding) VALUES (?, ?)", (77, seeded_vector(77).tobytes())
    )
    conn.close()
    assert vectors.count() == 40  # the same count as before
    embed = VectorRepair(vectors)
    report = check(db, vectors, repair_missing=embed)
    assert not report["consistent"]
    assert report["orphan_vectors_removed"] == 1 and report["missing_vectors"] == 1
    assert embed.asked == [[5]] and vectors.rowids() == set(range(1, 41))
    assert check(db, vectors)["consistent"]


def test_a_row_deleted_behind_our_back_leaves_an_orphan_vector_that_is_removed(
    store: tuple[Database, VectorIndex],
) -> None:
    db, vectors = store
    conn = other_connection(db, vectors)
    conn.execute("DELETE FROM docs WHERE id = 12")
    conn.close()
    report = check(db, vectors)
    assert report["orphan_vectors_removed"] == 1 and 12 not in vectors.rowids()
    assert check(db, vectors)["consistent"]


def test_fingerprints_of_large_ids_stay_in_range_and_tell_sets_apart(tmp_path: Path) -> None:
    db = open_database(tmp_path / "f.sqlite")
    try:
        big = [2**62, 2**63 - 1, -(2**62)]
        with db.transaction():
            for table, ids in (
                ("a", [*big, 10, 20, 30]),
                ("b", [*big, 10, 15, 35]),
                ("c", [30, 20, 10, *big]),
            ):
                db.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY)")
                db.executemany(f"INSERT INTO {table}(id) VALUES (?)", [(i,) for i in ids])
        a, b, c = (_fingerprint(db, "id", t) for t in ("a", "b", "c"))
        assert a == c  # the same ids in another order
        assert a[:2] == b[:2] and a != b  # same count and same sum of ids: the squares differ
        assert a[3] and b[3]  # squares past 64 bits: residues modulo a prime
        assert _fingerprint(db, "id", "a WHERE 0") == (0, 0, 0, False)
        small = _fingerprint(db, "id", "b WHERE id BETWEEN 0 AND 100")
        assert small == (3, 60, 10**2 + 15**2 + 35**2, False)  # plain sums while they fit
        assert small != _fingerprint(db, "id", "a WHERE id BETWEEN 0 AND 100")
    finally:
        db.close()


def test_a_store_that_agrees_is_checked_without_the_write_lock(
    store: tuple[Database, VectorIndex],
) -> None:
    """Another connection of this process holds the write lock (as another process writing
    would): the check of a store that agrees still answers, one that must repair waits its bound."""
    db, vectors = store
    holder = other_connection(db, vectors)
    holder.execute("BEGIN IMMEDIATE")
    db.lock_bound_s = 0.5
    db.execute("PRAGMA busy_timeout = 100")  # one attempt's wait within that bound
    try:
        assert check(db, vectors)["consistent"]
        with pytest.raises(DatabaseBusyError, match="stayed locked by another process"):
            check(db, vectors, full=True)  # FTS5's integrity check runs under the lock
        holder.execute(f"DELETE FROM {vectors.table} WHERE rowid = 3")
        holder.execute("COMMIT")
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(DatabaseBusyError, match="stayed locked by another process"):
            check(db, vectors, repair_missing=VectorRepair(vectors))
        holder.execute("ROLLBACK")
        assert check(db, vectors, repair_missing=VectorRepair(vectors))["vectors_repaired"] == 1
    finally:
        holder.close()


@pytest.mark.parametrize("kind", ["knowledge", "episodic"])
def test_a_store_opens_and_reads_while_another_connection_writes(tmp_path: Path, kind: str) -> None:
    """Opening a store whose schema is current and whose check agrees writes nothing, so it
    does not wait for another process's write transaction (readers never wait)."""
    path = tmp_path / f"{kind}.sqlite"
    opener: Any = KnowledgeStore if kind == "knowledge" else EpisodicMemory
    with opener.open(path, FakeEmbedder()) as layer:
        if kind == "knowledge":
            layer.add("the ledger retries on conflict", category="pattern")
        else:
            layer.record("the ledger retried on conflict")
    holder = open_database(path)  # memstrata's driver: see test_storage_migrations
    holder.execute("BEGIN IMMEDIATE")
    try:
        with connection_defaults(lock_bound_s=0.5), opener.open(path, FakeEmbedder()) as layer:
            assert len(layer.search("ledger conflict")) == 1
    finally:
        holder.close()
