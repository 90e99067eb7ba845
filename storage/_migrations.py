"""Numbered, transactional schema migrations and the ``metadata`` table.

Every database kind (``knowledge``, ``episodic``, ``files``, ...) declares an ordered list of
migrations; migration *n* (1-based) brings the schema to version *n*. They run on open, each in
its own transaction, so a crash mid-upgrade leaves the previous version intact. A step may be
a :class:`NamedMigration`: its name is recorded in ``metadata`` (``migration:<number>``) and in
any error, so that a schema change can be told apart from its neighbours by what it does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memstrata.core.errors import (
    InvalidInputError,
    MemstrataError,
    ReadOnlyError,
    SchemaMismatchError,
    StorageError,
)

from ._connection import Database, split_sql
from ._fulltext import folded_and_symbol_terms

__all__ = [
    "EmbeddingMismatch",
    "Migration",
    "NamedMigration",
    "apply_migrations",
    "embedding_mismatch",
    "ensure_metadata",
    "get_meta",
    "record_embedding",
    "refresh_keyword_terms",
    "schema_version",
    "set_meta",
]


@dataclass(frozen=True, slots=True)
class NamedMigration:
    """A migration step with a name that says what it does (e.g. ``"bulk-ingest-1"``)."""

    name: str
    step: str | Callable[[Database], None]


Migration = str | Callable[[Database], None] | NamedMigration

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
    # read first, without the write lock: a current schema (every open but the first after an
    # upgrade) writes nothing, so opening never waits for another process's write transaction
    existing_kind, version = _recorded_schema(db, kind, migrations)
    if db.read_only:  # served as it is when its schema is current; it cannot be upgraded
        if version < len(migrations):
            raise ReadOnlyError(
                f"database {db.path} is read-only and has schema version {version}, older than "
                f"this memstrata ({len(migrations)}): open it once with write access to upgrade it"
            )
        return version
    if existing_kind is not None and version == len(migrations):
        return version
    with db.transaction():
        db.execute(_METADATA_SQL)
        if _recorded_schema(db, kind, migrations)[0] is None:  # under the lock: maybe done meanwhile
            set_meta(db, "schema_kind", kind)
    for number in range(version + 1, len(migrations) + 1):
        with db.transaction():
            # re-check inside the write lock: another process may have migrated meanwhile
            current = int(get_meta(db, "schema_version") or 0)
            if current >= number:
                continue
            step = migrations[number - 1]
            label = f"{kind} migration {number}"
            if isinstance(step, NamedMigration):
                label += f" ({step.name})"
                set_meta(db, f"migration:{number}", step.name)
                step = step.step
            try:
                if isinstance(step, str):
                    for statement in split_sql(step):
                        db.execute(statement)
                else:
                    step(db)
            except MemstrataError as exc:
                if type(exc) is not StorageError:
                    raise
                raise StorageError(f"{label} failed, {exc}") from exc
            except Exception as exc:
                raise StorageError(
                    f"{label} failed on database {db.path}: {type(exc).__name__}: {exc}"
                ) from exc
            set_meta(db, "schema_version", number)
    return len(migrations)


def _recorded_schema(db: Database, kind: str, migrations: Sequence[Migration]) -> tuple[str | None, int]:
    """The recorded kind (``None`` for a new database) and version; refuses a database of
    another kind or a schema newer than ``migrations``."""
    existing_kind = get_meta(db, "schema_kind")
    if existing_kind is not None and existing_kind != kind:
        raise SchemaMismatchError(f"database {db.path} is a {existing_kind!r} store, not a {kind!r} store")
    version = schema_version(db)
    if version > len(migrations):
        raise SchemaMismatchError(
            f"database {db.path} has schema version {version}, newer than this memstrata "
            f"({len(migrations)}); upgrade memstrata"
        )
    return existing_kind, version


KEYWORD_TERMS = "yo-emoji-nfkc-2"
"""Name of the keyword-terms upgrade: words with ё also indexed with е, emoji indexed as terms
(``yo-emoji-1``), and words such as full-width ``ＡＰＩ`` also indexed as Unicode's compatibility
folding (NFKC) writes them."""


def refresh_keyword_terms(db: Database, *, table: str, column: str, source: str, key: str = "id") -> int:
    """Named migration ``yo-emoji-nfkc-2`` of a keyword index's extra-words ``column``.

    Rows written before it lack the ё -> е spellings, compatibility spellings and emoji terms
    that :func:`~memstrata.storage.identifier_words` now adds; this appends them (``source`` is the SQL
    expression of the indexed text), and the table's update trigger reindexes those rows. Runs
    once per database (recorded in ``metadata``); a read-only database is left as it is, where
    the original spellings still match. Returns how many rows gained terms.
    """
    if db.read_only or get_meta(db, "keyword_terms") == KEYWORD_TERMS:
        return 0
    changed = 0
    with db.transaction():
        if get_meta(db, "keyword_terms") == KEYWORD_TERMS:  # another process did it meanwhile
            return 0
        last = -(2**63)
        while True:
            rows = db.query(
                f"SELECT {key}, {source}, {column} FROM {table} WHERE {key} > ? ORDER BY {key} LIMIT 500",
                (last,),
            )
            if not rows:
                break
            last = rows[-1][0]
            updates = []
            for ident, text, current in rows:
                have = set(str(current or "").split())
                extra = [t for t in folded_and_symbol_terms(str(text or "")) if t not in have]
                if extra:
                    updates.append((" ".join([str(current or ""), *extra]).strip(), ident))
            if updates:
                db.executemany(f"UPDATE {table} SET {column} = ? WHERE {key} = ?", updates)
                changed += len(updates)
        set_meta(db, "keyword_terms", KEYWORD_TERMS)
    return changed


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
