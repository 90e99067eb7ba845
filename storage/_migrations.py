"""Numbered, transactional schema migrations and the ``metadata`` table.

Every database kind (``knowledge``, ``episodic``, ``files``, ...) declares an ordered list of
migrations; migration *n* (1-based) brings the schema to version *n*. They run on open, each in
its own transaction, so a crash mid-upgrade leaves the previous version intact.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memstrata.errors import SchemaMismatchError

from ._connection import Database

__all__ = ["EmbeddingMismatch", "Migration", "apply_migrations", "embedding_mismatch", "get_meta", "set_meta"]

Migration = str | Callable[[Database], None]

_METADATA_SQL = "CREATE TABLE IF NOT EXISTS metadata (key TEXT PRIMARY KEY, value TEXT NOT NULL)"


def get_meta(db: Database, key: str) -> str | None:
    value = db.scalar("SELECT value FROM metadata WHERE key = ?", (key,))
    return None if value is None else str(value)


def set_meta(db: Database, key: str, value: str | int) -> None:
    db.execute(
        "INSERT INTO metadata(key, value) VALUES (?, ?) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (key, str(value)),
    )


def apply_migrations(db: Database, kind: str, migrations: Sequence[Migration]) -> int:
    """Bring ``db`` to ``len(migrations)``; refuses a database of another kind or a newer schema."""
    with db.transaction():
        db.execute(_METADATA_SQL)
        existing_kind = get_meta(db, "schema_kind")
        if existing_kind is None:
            set_meta(db, "schema_kind", kind)
        elif existing_kind != kind:
            raise SchemaMismatchError(
                f"database {db.path} is a {existing_kind!r} store, not a {kind!r} store"
            )
    version = int(get_meta(db, "schema_version") or 0)
    if version > len(migrations):
        raise SchemaMismatchError(
            f"database {db.path} has schema version {version}, newer than this memstrata "
            f"({len(migrations)}); upgrade memstrata"
        )
    for number in range(version + 1, len(migrations) + 1):
        with db.transaction():
            # re-check inside the write lock: another process may have migrated meanwhile
            current = int(get_meta(db, "schema_version") or 0)
            if current >= number:
                continue
            step = migrations[number - 1]
            if isinstance(step, str):
                for statement in _split_sql(step):
                    db.execute(statement)
            else:
                step(db)
            set_meta(db, "schema_version", number)
    return len(migrations)


def _split_sql(script: str) -> list[str]:
    """Split a script into statements at each ``;`` that completes one (trigger bodies stay whole)."""
    statements: list[str] = []
    buffer = ""
    for piece in script.split(";"):
        buffer += piece + ";"
        if sqlite3.complete_statement(buffer):
            if buffer.strip(" \n\t;"):
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip(" \n\t;"):
        statements.append(buffer.strip())
    return statements


@dataclass(frozen=True, slots=True)
class EmbeddingMismatch:
    """The stored vectors were made by another model or dimension than the current embedder."""

    stored_model: str | None
    stored_dim: int | None
    model: str
    dim: int


def embedding_mismatch(db: Database, model_id: str, dim: int) -> EmbeddingMismatch | None:
    """``None`` when the stored model id and dimension match (or nothing is recorded yet)."""
    stored_model = get_meta(db, "embedding_model")
    stored_dim_text = get_meta(db, "embedding_dim")
    if stored_model is None and stored_dim_text is None:
        return None
    stored_dim = int(stored_dim_text) if stored_dim_text is not None else None
    if stored_model == model_id and stored_dim == dim:
        return None
    return EmbeddingMismatch(stored_model, stored_dim, model_id, dim)
