"""Keyed items: JSON values addressed by (namespace path, key), with optional vectors per field.

The layer orchestrator stores need (LangGraph's ``BaseStore``, conversation histories, vector
memories): upsert by key, values kept apart from the text that is embedded, several vectors per
item (one per indexed field) ranked by the best field, namespace *prefix* search, equality and
range filters on the value evaluated by SQLite (exact: the filter narrows the candidates before
any ranking, so an item is never lost behind a global top-k), an ordered tail read, and time to
live with sweeping. Vectors arrive computed: the caller owns the embedding model.

The parts of the store each hold one concern: :mod:`._item_records` (addresses and records),
:mod:`._item_filters` (filter SQL), :mod:`._item_ranking` (search by meaning),
:mod:`._item_namespaces` (namespace listing) and :mod:`._item_expiry` (time to live).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from memstrata.core.constants import MAX_TTL_MINUTES
from memstrata.core.errors import InvalidInputError
from memstrata.core.validation import check_json_value, check_ttl
from memstrata.storage import Database, NamedMigration, apply_migrations, open_database

from ._item_expiry import ItemExpiry
from ._item_filters import CANONICAL_JSON, canonical_json, filter_sql
from ._item_namespaces import NamespaceListing
from ._item_ranking import ItemRanking
from ._item_records import _AFTER_SEP, SEP, ComputedItemRow, ItemRecord, ItemRow, _record, namespace_key
from ._item_vectors import ItemVectors, vector_blob

__all__ = ["ItemStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    id INTEGER PRIMARY KEY,
    ns TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    expires_at REAL,
    ttl_minutes REAL,
    UNIQUE (ns, key)
);
CREATE INDEX IF NOT EXISTS items_ns_seq ON items (ns, id, expires_at);
CREATE INDEX IF NOT EXISTS items_expiry ON items (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS item_vectors (
    item_id INTEGER NOT NULL REFERENCES items (id) ON DELETE CASCADE,
    field TEXT NOT NULL,
    vec BLOB NOT NULL,
    PRIMARY KEY (item_id, field)
);
"""
_MIGRATIONS = (
    NamedMigration("items", _SCHEMA),  # IF NOT EXISTS: stores made before migrations were counted
    # the model that computed a vector from its field, null for a vector given with the item
    NamedMigration("vector-model", "ALTER TABLE item_vectors ADD COLUMN model TEXT"),
)


class ItemStore(ItemExpiry, NamespaceListing, ItemRanking, ItemVectors):
    """Items in one SQLite file (or ``:memory:``). Thread-safe: one lock serialises the connection.

    ``clock`` returns seconds (``time.time`` by default); expiry compares against it.
    """

    def __init__(self, path: Path | str | Database, *, clock: Callable[[], float] = time.time) -> None:
        self._db = path if isinstance(path, Database) else open_database(path, load_vec=False)
        self._own_db = not isinstance(path, Database)
        self._clock = clock
        self._lock = threading.RLock()
        self._writes = 0  # own writes; other connections' show in PRAGMA data_version
        self._mirror: tuple[tuple[int, int], npt.NDArray[np.int64], npt.NDArray[np.float32]] | None = None
        # filters compare lists and objects in one form, whatever their key order
        self._db.conn.create_function(CANONICAL_JSON, 1, canonical_json, deterministic=True)
        with self._lock:
            apply_migrations(self._db, "items", _MIGRATIONS)

    @property
    def path(self) -> Path:
        return self._db.path

    def close(self) -> None:
        with self._lock:
            if self._own_db:
                self._db.close()

    # writes -------------------------------------------------------------------------------

    def put_many(
        self,
        rows: Iterable[ItemRow | ComputedItemRow],
        *,
        delete: Iterable[tuple[Sequence[str], str]] = (),
    ) -> int:
        """Upsert ``(namespace, key, value, vectors, ttl_minutes[, model])`` rows in one
        transaction, after deleting the ``delete`` keys in it; returns how many of those existed.

        ``vectors`` ``None`` keeps no vector (stored, not searchable by meaning); a mapping
        replaces the item's vectors by one per field, the caller's own unless a ``model`` says
        it computed them from those fields. ``ttl_minutes`` ``None``: never expires.
        """
        now = self._clock()
        prepared = []
        for namespace, key, value, vectors, ttl, *computed in rows:
            ns = namespace_key(namespace)
            if not isinstance(key, str):
                raise InvalidInputError(f"item key must be a string, got {key!r}")
            if not isinstance(value, dict):
                raise InvalidInputError(f"item value must be a dict, got {type(value).__name__}")
            check_ttl(ttl, "ttl", unit="minutes", high=MAX_TTL_MINUTES)
            text = check_json_value(value, f"item value for key {key!r}").decode()
            blobs = None
            if vectors is not None:
                blobs = [
                    (f, vector_blob(v, f"vector of field {f!r} of key {key!r}")) for f, v in vectors.items()
                ]
            prepared.append((ns, key, text, blobs, ttl, computed[0] if computed else None))
        gone_keys = [(namespace_key(ns), key) for ns, key in delete]
        with self._lock, self._db.transaction():
            gone = self._delete_keys(gone_keys)
            self._check_dims({len(b) // 4 for p in prepared for _, b in p[3] or ()})
            for ns, key, text, blobs, ttl, model in prepared:
                expires = now + ttl * 60.0 if ttl is not None else None
                row = self._db.execute(
                    "INSERT INTO items (ns, key, value, created_at, updated_at, expires_at, ttl_minutes)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (ns, key)"
                    " DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at,"
                    " expires_at = excluded.expires_at,"
                    " ttl_minutes = excluded.ttl_minutes RETURNING id",
                    (ns, key, text, now, now, expires, ttl),
                ).fetchone()
                item_id = row[0]
                self._db.execute("DELETE FROM item_vectors WHERE item_id = ?", (item_id,))
                if blobs:
                    self._db.executemany(
                        "INSERT INTO item_vectors (item_id, field, vec, model) VALUES (?, ?, ?, ?)",
                        [(item_id, f, b, model) for f, b in blobs],
                    )
        return gone

    def export_rows(self) -> list[dict[str, Any]]:
        """Every stored item (expired ones not yet swept too) with its times, lifetime, vectors
        and ``seq``, its place in the order items were first stored (which :meth:`tail` and
        :meth:`pop_last` follow), as plain JSON-ready dicts, by namespace then key."""
        with self._lock:
            rows = self._db.query(
                "SELECT id, ns, key, value, created_at, updated_at, expires_at, ttl_minutes FROM items"
                " ORDER BY ns, key"
            )
            vecs: dict[int, dict[str, list[float]]] = {}
            models: dict[int, str | None] = {}
            for item_id, field, blob, model in self._db.query(
                "SELECT item_id, field, vec, model FROM item_vectors ORDER BY item_id, field"
            ):
                vecs.setdefault(int(item_id), {})[field] = np.frombuffer(blob, dtype=np.float32).tolist()
                models[int(item_id)] = model
        seq = {item_id: n for n, item_id in enumerate(sorted(int(r[0]) for r in rows))}
        return [
            {
                "namespace": r[1].split(SEP),
                "key": r[2],
                "value": orjson.loads(r[3]),
                "created_at": r[4],
                "updated_at": r[5],
                "expires_at": r[6],
                "ttl_minutes": r[7],
                "vectors": vecs.get(int(r[0])),
                "vectors_model": models.get(int(r[0])),
                "seq": seq[int(r[0])],
            }
            for r in rows
        ]

    def import_rows(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Upsert exported items keeping their times, expiry, vectors and the model that
        computed them (``vectors_model``, null or absent: the caller's); returns how many. New
        items are stored in ``seq`` order (absent: in the order given), so the order they were
        first stored in survives an export."""
        prepared = []
        for n, row in enumerate(rows):
            try:
                ns = namespace_key(row["namespace"])
                key, value = row["key"], row["value"]
                times = [row["created_at"], row["updated_at"]]
                expires, ttl = row.get("expires_at"), row.get("ttl_minutes")
                vectors = row.get("vectors") or {}
                model = row.get("vectors_model")
                seq = row.get("seq", n)
            except (KeyError, TypeError) as exc:
                raise InvalidInputError(f"item record {n} lacks a field: {exc}") from exc
            if not isinstance(key, str) or not isinstance(value, dict):
                raise InvalidInputError(f"item record {n}: key must be a string and value an object")
            if not all(isinstance(t, int | float) for t in times) or not isinstance(vectors, dict):
                raise InvalidInputError(f"item record {n}: bad times or vectors")
            if not isinstance(seq, int) or isinstance(seq, bool):
                raise InvalidInputError(f"item record {n}: seq must be an integer: {seq!r}")
            if model is not None and not isinstance(model, str):
                raise InvalidInputError(
                    f"item record {n}: vectors_model must be a string or null, not {model!r}"
                )
            blobs = [(f, vector_blob(v, f"item record {n} vector {f!r}")) for f, v in vectors.items()]
            text = check_json_value(value, f"item record {n} value").decode()
            prepared.append((seq, ns, key, text, *times, expires, ttl, blobs, model))
        prepared.sort(key=lambda p: p[0])  # stable: rows without a seq keep their order
        with self._lock, self._db.transaction():
            self._writes += 1
            self._check_dims({len(b) // 4 for p in prepared for _, b in p[8]})
            for _, ns, key, text, created, updated, expires, ttl, blobs, model in prepared:
                item_id = self._db.execute(
                    "INSERT INTO items (ns, key, value, created_at, updated_at, expires_at, ttl_minutes)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (ns, key)"
                    " DO UPDATE SET value = excluded.value, created_at = excluded.created_at,"
                    " updated_at = excluded.updated_at,"
                    " expires_at = excluded.expires_at, ttl_minutes = excluded.ttl_minutes RETURNING id",
                    (ns, key, text, created, updated, expires, ttl),
                ).fetchone()[0]
                self._db.execute("DELETE FROM item_vectors WHERE item_id = ?", (item_id,))
                self._db.executemany(
                    "INSERT INTO item_vectors (item_id, field, vec, model) VALUES (?, ?, ?, ?)",
                    [(item_id, f, b, model) for f, b in blobs],
                )
        return len(prepared)

    def delete_many(self, keys: Iterable[tuple[Sequence[str], str]]) -> int:
        """Really delete items (vectors go with them); returns how many existed."""
        pairs = [(namespace_key(ns), key) for ns, key in keys]
        with self._lock, self._db.transaction():
            return self._delete_keys(pairs)

    def _delete_keys(self, pairs: Sequence[tuple[str, str]]) -> int:
        """Delete items by (stored namespace, key) in the caller's transaction; how many existed."""
        self._writes += 1
        gone = 0
        for ns, key in pairs:
            gone += self._db.execute("DELETE FROM items WHERE ns = ? AND key = ?", (ns, key)).rowcount
        return gone

    def delete_namespace(self, namespace: Sequence[str]) -> int:
        """Delete every item of exactly this namespace."""
        ns = namespace_key(namespace)
        with self._lock, self._db.transaction():
            self._writes += 1
            return int(self._db.execute("DELETE FROM items WHERE ns = ?", (ns,)).rowcount)

    def pop_last(self, namespace: Sequence[str]) -> ItemRecord | None:
        """Remove and return the most recently inserted live item of a namespace."""
        ns = namespace_key(namespace)
        with self._lock, self._db.transaction():
            self._writes += 1
            row = self._db.execute(
                "SELECT id, ns, key, value, created_at, updated_at, expires_at FROM items i"
                " WHERE ns = ? AND (expires_at IS NULL OR expires_at > ?) ORDER BY id DESC LIMIT 1",
                (ns, self._clock()),
            ).fetchone()
            if row is None:
                return None
            self._db.execute("DELETE FROM items WHERE id = ?", (row[0],))
            return _record(row)

    # reads --------------------------------------------------------------------------------

    def get(self, namespace: Sequence[str], key: str, *, refresh_ttl: bool = False) -> ItemRecord | None:
        ns = namespace_key(namespace)
        with self._lock:
            now = self._clock()
            row = self._db.execute(
                "SELECT id, ns, key, value, created_at, updated_at, expires_at FROM items i"
                " WHERE ns = ? AND key = ? AND (expires_at IS NULL OR expires_at > ?)",
                (ns, key, now),
            ).fetchone()
            if row is None:
                return None
            return self._refreshed([_record(row)], now)[0] if refresh_ttl else _record(row)

    def tail(self, namespace: Sequence[str], limit: int | None = None) -> list[ItemRecord]:
        """The last ``limit`` live items of a namespace in insertion order (all when ``None``);
        an index walk from the end, never a replay of the whole namespace."""
        ns = namespace_key(namespace)
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise InvalidInputError(f"limit must be a non-negative integer, got {limit!r}")
        with self._lock:
            rows = self._db.query(
                "SELECT id, ns, key, value, created_at, updated_at, expires_at FROM items i"
                " WHERE ns = ? AND (expires_at IS NULL OR expires_at > ?) ORDER BY id DESC LIMIT ?",
                (ns, self._clock(), -1 if limit is None else limit),
            )
        return [_record(r) for r in reversed(rows)]

    def search(
        self,
        prefix: Sequence[str],
        *,
        query_vector: Sequence[float] | None = None,
        filter: Mapping[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        refresh_ttl: bool = False,
    ) -> list[ItemRecord]:
        """Items under a namespace prefix (the namespace itself and its descendants).

        With ``query_vector``: ranked by cosine similarity of the best-matching field vector, over
        every item the prefix and filter admit (exact); items without vectors follow, unscored.
        Without: most recently updated first.
        """
        if not isinstance(limit, int) or limit < 0:
            raise InvalidInputError(f"limit must be a non-negative integer, got {limit!r}")
        if not isinstance(offset, int) or offset < 0:
            raise InvalidInputError(f"offset must be a non-negative integer, got {offset!r}")
        params: list[Any] = []
        where = ["(i.expires_at IS NULL OR i.expires_at > ?)"]
        if prefix:
            ns = namespace_key(prefix)
            # one index range holds ns and its descendants; the check on the character after ns
            # drops the siblings in that range (a label going on with a control character)
            where.append("i.ns >= ? AND i.ns < ? AND (i.ns = ? OR substr(i.ns, ?, 1) = ?)")
            params_ns: list[Any] = [ns, ns + _AFTER_SEP, ns, len(ns) + 1, SEP]
        else:
            params_ns = []
        with self._lock:
            now = self._clock()
            params = [now, *params_ns]
            where.extend(filter_sql(filter, params))
            sql_where = " AND ".join(where)
            cols = "i.id, i.ns, i.key, i.value, i.created_at, i.updated_at, i.expires_at"
            if query_vector is None:
                rows = self._db.query(
                    f"SELECT {cols} FROM items i WHERE {sql_where} ORDER BY i.updated_at DESC, i.id DESC"
                    " LIMIT ? OFFSET ?",
                    (*params, limit, offset),
                )
                records = [_record(r) for r in rows]
            else:
                records = self._ranked(cols, sql_where, params, query_vector, limit, offset)
            if refresh_ttl and records:
                records = self._refreshed(records, now)
        return records

    def count(self, namespace: Sequence[str] | None = None) -> int:
        with self._lock:
            if namespace is None:
                return int(self._db.scalar("SELECT count(*) FROM items"))
            return int(
                self._db.scalar("SELECT count(*) FROM items WHERE ns = ?", (namespace_key(namespace),))
            )
