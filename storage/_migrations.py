"""Numbered, transactional schema migrations and the ``metadata`` table.

Every database kind (``knowledge``, ``episodic``, ``files``, ...) declares an ordered list of
migrations; migration *n* (1-based) brings the schema to version *n*. They run on open, each in
its own transaction, so a crash mid-upgrade leaves the previous version intact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memstrata.errors import InvalidInputError, MemstrataError, SchemaMismatchError, StorageError

from ._connection import Database, split_sql

__all__ = [
    "EmbeddingMismatch",
    "Migration",
    "apply_migrations",
    "embedding_mismatch",
    "ensure_metadata",
    "get_meta",
    "record_embedding",
    "schema_version",
    "set_meta",
]

Migration = str | Callable[[Database], None]

_METADATA_SQL = "CREATE TABLE IF NOT EXISTS metadata (key TEXT PRIMARY KEY, value TEXT NOT NULL)"


def ensure_metadata(db: Database) -> None:
    """Create the ``metadata`` table if this database has none yet (idempotent)."""
    db.execute(_METADATA_SQL)


def get_meta(db: Database, key: str) -> str | None:
    """The recorded value of ``key``, or ``None`` (also when the database has no metadata yet)."""
    if db.scalar("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'metadata'") is None:
        return None
    value = db.scalar("SELECT value FROM metadata WHERE key = ?", (key,))
    return None if value is None else str(value)


def schema_version(db: Database) -> int:
    """The number of the last migration applied (0 for a new database)."""
    return int(get_meta(db, "schema_version") or 0)


def set_meta(db: Database, key: str, value: str | int) -> None:
    ensure_metadata(db)
    db.execute(
        "INSERT INTO metadata(key, value) VALUES (?, ?) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (key, str(value)),
    )


def apply_migrations(db: Database, kind: str, migrations: Sequence[Migration]) -> int:
    """Bring ``db`` to ``len(migrations)``; refuses a database of another kind or a newer schema.

    Each migration runs in its own transaction together with the version bump, so a failing
    migration leaves the database at the previous version and raises :class:`StorageError`
    naming the kind and number (a :class:`MemstrataError` raised by a callable propagates as is).
    """
    if not kind or not isinstance(kind, str):
        raise InvalidInputError(f"kind must be a non-empty string, got {kind!r}")
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
            try:
                if isinstance(step, str):
                    for statement in split_sql(step):
                        db.execute(statement)
                else:
                    step(db)
            except MemstrataError as exc:
                if type(exc) is not StorageError:
                    raise
                raise StorageError(f"{kind} migration {number} failed, {exc}") from exc
            except Exception as exc:
                raise StorageError(
                    f"{kind} migration {number} failed on database {db.path}: {type(exc).__name__}: {exc}"
                ) from exc
            set_meta(db, "schema_version", number)
    return len(migrations)


_split_sql = split_sql  # older name


@dataclass(frozen=True, slots=True)
class EmbeddingMismatch:
    """The stored vectors were made by another model or dimension than the current embedder."""

    stored_model: str | None
    stored_dim: int | None
    model: str
    dim: int


def record_embedding(db: Database, model_id: str, dim: int) -> None:
    """Record which model and dimension made the stored vectors (after a (re)build completes)."""
    set_meta(db, "embedding_model", model_id)
    set_meta(db, "embedding_dim", int(dim))


def embedding_mismatch(db: Database, model_id: str, dim: int) -> EmbeddingMismatch | None:
    """``None`` when the stored model id and dimension match (or nothing is recorded yet)."""
    stored_model = get_meta(db, "embedding_model")
    stored_dim_text = get_meta(db, "embedding_dim")
    if stored_model is None and stored_dim_text is None:
        return None
    try:
        stored_dim = int(stored_dim_text) if stored_dim_text is not None else None
    except ValueError:
        stored_dim = None
    if stored_model == model_id and stored_dim == dim:
        return None
    return EmbeddingMismatch(stored_model, stored_dim, model_id, dim)
