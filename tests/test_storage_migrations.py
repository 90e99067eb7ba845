"""Numbered, transactional migrations and the metadata table."""

from __future__ import annotations

from pathlib import Path

import pytest

from memstrata.errors import DatabaseBusyError, InvalidInputError, SchemaMismatchError, StorageError
from memstrata.storage import (
    Database,
    EmbeddingMismatch,
    Migration,
    apply_migrations,
    embedding_mismatch,
    fts_schema,
    get_meta,
    open_database,
    record_embedding,
    schema_version,
    set_meta,
)


def _tables(db: Database) -> set[str]:
    return {r[0] for r in db.query("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_numbered_and_applied_once(tmp_path: Path) -> None:
    calls: list[int] = []

    def second(db: Database) -> None:
        calls.append(2)
        db.execute("ALTER TABLE notes ADD COLUMN title TEXT")

    migrations: list[Migration] = ["CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)", second]
    db = open_database(tmp_path / "m.sqlite")
    assert schema_version(db) == 0
    assert apply_migrations(db, "notes", migrations) == 2
    assert apply_migrations(db, "notes", migrations) == 2
    assert calls == [2] and schema_version(db) == 2
    db.close()

    def third(db: Database) -> None:
        calls.append(3)
        db.execute("CREATE INDEX notes_title ON notes(title)")

    db = open_database(tmp_path / "m.sqlite")
    apply_migrations(db, "notes", [*migrations, third])
    assert calls == [2, 3] and schema_version(db) == 3
    assert get_meta(db, "schema_kind") == "notes"
    db.close()


def test_a_current_schema_is_checked_without_the_write_lock(tmp_path: Path) -> None:
    """Another connection holding the write lock (as another process writing would) does not stop
    an open whose schema is current; one that must migrate waits its bound, then says so. The
    holder uses memstrata's own driver: POSIX locks belong to a process, so a second copy of SQLite
    in it (stdlib ``sqlite3`` beside sqlean) would not see the lock."""
    migrations: list[Migration] = ["CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)"]
    path = tmp_path / "m.sqlite"
    with open_database(path) as db:
        apply_migrations(db, "notes", migrations)
    holder = open_database(path)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with open_database(path, lock_bound_s=0.5) as db:
            assert apply_migrations(db, "notes", migrations) == 1
            with pytest.raises(SchemaMismatchError, match="not a 'other' store"):
                apply_migrations(db, "other", migrations)
            upgrade = [*migrations, "ALTER TABLE notes ADD COLUMN title TEXT"]
            with pytest.raises(DatabaseBusyError, match="stayed locked by another process"):
                apply_migrations(db, "notes", upgrade)
            assert schema_version(db) == 1
            holder.execute("ROLLBACK")
            assert apply_migrations(db, "notes", upgrade) == 2 and schema_version(db) == 2
    finally:
        holder.close()


def test_failing_sql_migration_leaves_the_previous_version(tmp_path: Path) -> None:
    db = open_database(tmp_path / "m.sqlite")
    good = "CREATE TABLE a (x)"
    bad = "CREATE TABLE b (x); INSERT INTO no_such_table VALUES (1)"
    with pytest.raises(StorageError, match=r"notes migration 2 failed.*no_such_table"):
        apply_migrations(db, "notes", [good, bad])
    assert schema_version(db) == 1
    assert "a" in _tables(db) and "b" not in _tables(db)
    db.close()


def test_failing_callable_migration_is_rolled_back_and_named(tmp_path: Path) -> None:
    db = open_database(tmp_path / "m.sqlite")

    def broken(db: Database) -> None:
        db.executescript("CREATE TABLE half (x); INSERT INTO half VALUES (1);")  # joins the transaction
        raise RuntimeError("disk on fire")

    with pytest.raises(StorageError, match=r"notes migration 1 failed.*RuntimeError: disk on fire"):
        apply_migrations(db, "notes", [broken])
    assert schema_version(db) == 0 and "half" not in _tables(db)
    # fixed code migrates normally afterwards
    apply_migrations(db, "notes", ["CREATE TABLE half (x)"])
    assert schema_version(db) == 1
    db.close()


def test_migration_with_triggers_is_split_correctly(tmp_path: Path) -> None:
    db = open_database(tmp_path / "m.sqlite")
    script = "CREATE TABLE docs (id INTEGER PRIMARY KEY, body TEXT); " + fts_schema("docs", ["body"])
    apply_migrations(db, "docs", [script])
    db.execute("INSERT INTO docs(body) VALUES ('hello; world')")
    assert db.scalar("SELECT count(*) FROM docs_fts WHERE docs_fts MATCH 'world'") == 1
    db.close()


def test_kind_mismatch(tmp_path: Path) -> None:
    db = open_database(tmp_path / "m.sqlite")
    apply_migrations(db, "knowledge", ["CREATE TABLE k (x)"])
    with pytest.raises(SchemaMismatchError, match="'knowledge' store, not a 'episodic' store"):
        apply_migrations(db, "episodic", ["CREATE TABLE e (x)"])
    assert "e" not in _tables(db)
    with pytest.raises(InvalidInputError, match="kind"):
        apply_migrations(db, "", [])
    db.close()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    db = open_database(tmp_path / "m.sqlite")
    apply_migrations(db, "notes", ["CREATE TABLE a (x)", "CREATE TABLE b (x)", "CREATE TABLE c (x)"])
    with pytest.raises(SchemaMismatchError, match="schema version 3, newer than this memstrata"):
        apply_migrations(db, "notes", ["CREATE TABLE a (x)", "CREATE TABLE b (x)"])
    db.close()


def test_metadata_round_trip(tmp_path: Path) -> None:
    db = open_database(tmp_path / "m.sqlite")
    assert get_meta(db, "anything") is None  # no metadata table yet: no error
    set_meta(db, "chunker_version", 3)
    set_meta(db, "chunker_version", 4)
    assert get_meta(db, "chunker_version") == "4"
    db.close()
    db = open_database(tmp_path / "m.sqlite")
    assert get_meta(db, "chunker_version") == "4"
    db.close()


def test_embedding_mismatch_detects_model_and_dimension(tmp_path: Path) -> None:
    db = open_database(tmp_path / "m.sqlite")
    apply_migrations(db, "knowledge", [])
    assert embedding_mismatch(db, "all-MiniLM-L6-v2-int8", 384) is None  # nothing recorded yet
    record_embedding(db, "all-MiniLM-L6-v2-int8", 384)
    assert embedding_mismatch(db, "all-MiniLM-L6-v2-int8", 384) is None
    assert embedding_mismatch(db, "BAAI/bge-small-en-v1.5", 384) == EmbeddingMismatch(
        "all-MiniLM-L6-v2-int8", 384, "BAAI/bge-small-en-v1.5", 384
    )
    assert embedding_mismatch(db, "all-MiniLM-L6-v2-int8", 768) == EmbeddingMismatch(
        "all-MiniLM-L6-v2-int8", 384, "all-MiniLM-L6-v2-int8", 768
    )
    db.close()
    db = open_database(tmp_path / "m.sqlite")  # persisted
    assert embedding_mismatch(db, "fake", 64) is not None
    db.close()
