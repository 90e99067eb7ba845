"""Vectors: durable in sqlite-vec ``vec0`` (cosine), searched from an in-memory mirror.

The durable store is a ``vec0`` table whose filter columns are vec0 metadata columns, so a
filtered KNN inside SQLite is exact. Where sqlite-vec cannot be loaded when a store is created,
the vectors live in a plain table of float32 blobs instead; the backend is recorded in the
database's metadata and reported by :meth:`VectorIndex.status`.

Searches run by default on an in-memory mirror of the vectors (a float32 matrix loaded lazily):
an exact numpy scan that is several times faster than vec0's own scan. ``engine="vec0"`` asks
SQLite. Both engines rank by cosine similarity and agree on ids for the same data, ``k`` and
filters.

Keeping the mirror current: every write through :class:`VectorIndex` also appends the changed
rowids to a change log (``{name}_vec_log``) in the same transaction. A mirror remembers the last
log entry it reflects; when another connection commits (``PRAGMA data_version`` moves) it reads
only the newer entries and re-reads those rows, so a refresh costs what changed, not the table.
It reloads everything only when the log cannot explain the gap (pruned past it, a ``reset``).

At scale (``approximate_from`` live vectors, 100k by default) searches are approximate: a mirror
of unit vectors with enough dimensions sieves its rows by sign codes and scores its int8 rows,
then the best few in float32 (:mod:`._mirror_search`); other mirrors scan the inverted lists
nearest the query (:mod:`._ivf`), stored once built (``{name}_vec_lists``) so that the next process
adopts them. Measured recall@10 >= 0.99, see ``benchmarks/bench_vectors.py``. ``exact=True`` and
smaller mirrors stay exact.
"""

from __future__ import annotations

import contextlib
import json
import numbers
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from memstrata.core.constants import APPROXIMATE_FROM
from memstrata.core.errors import InvalidInputError, StorageError

from ._array_types import FloatArray
from ._bulk_cache import bulk_cache
from ._connection import Database
from ._distinct import distinct
from ._heap import trim_heap
from ._migrations import ensure_metadata, get_meta, set_meta
from ._vector_checks import check_metas, check_vectors, meta_value
from ._vector_inserts import insert_statement
from ._vector_mirror import Mirror, VectorHit
from ._vector_sync import _OP_DELETE, _OP_RESET, _OP_UPSERT, MirrorUpkeep, _rollbacks

__all__ = ["APPROXIMATE_FROM", "VectorHit", "VectorIndex"]

Engine = Literal["auto", "memory", "vec0"]
ENGINES = ("auto", "memory", "vec0")
VEC0_MAX_K = 4096  # sqlite-vec refuses larger k in one KNN query
METADATA_TYPES = ("text", "integer", "float", "boolean")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _int_or(value: Any, default: int = -1) -> int:
    return value if isinstance(value, int) else default


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral) or int(value) <= 0:
        raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _base_type(declared: str) -> str:
    return declared.strip().split()[0].lower() if declared.strip() else ""


class VectorIndex(MirrorUpkeep):
    """Vectors of one table of a store, with equality-filterable metadata columns.

    ``metadata`` maps column names to vec0 types (``text``, ``integer``, ``float``,
    ``boolean``; ``"text partition key"`` is passed through to vec0). Every vector must carry a
    value of the declared type for each column (vec0 stores no NULL metadata).

    Writes join the caller's transaction (call them inside ``db.transaction()``); if that
    transaction rolls back, the mirror re-reads the rows it touched.

    ``approximate_from``: from this many live vectors, searches without ``candidates`` use the
    inverted lists (``None``: always exact).
    """

    def __init__(
        self,
        db: Database,
        name: str,
        dim: int,
        *,
        metadata: Mapping[str, str] | None = None,
        mirror: bool = True,
        approximate_from: int | None = APPROXIMATE_FROM,
    ) -> None:
        dim = _positive_int(dim, "dim")
        if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
            raise InvalidInputError(f"name must be an SQL identifier ([A-Za-z_][A-Za-z0-9_]*), got {name!r}")
        if approximate_from is not None:
            approximate_from = _positive_int(approximate_from, "approximate_from")
        self.metadata = dict(metadata or {})
        for column, declared in self.metadata.items():
            if not _IDENTIFIER.fullmatch(column) or column.lower() in ("rowid", "embedding", "distance", "k"):
                raise InvalidInputError(f"metadata column name {column!r} is not allowed")
            if _base_type(declared) not in METADATA_TYPES:
                raise InvalidInputError(
                    f"metadata column {column!r} has type {declared!r}; "
                    f"use one of {', '.join(METADATA_TYPES)}"
                )
        self.db = db
        self.name = name
        self.dim = dim
        self.use_mirror = mirror
        self.approximate_from = approximate_from
        self._types = {c: _base_type(t) for c, t in self.metadata.items()}
        self._mirror: Mirror | None = None
        self._data_version = -1
        self._seen_generation = -1
        self._rollbacks_seen = 0
        self._log_seq = 0
        self.reloads = 0  # full loads of the mirror
        self.refreshes = 0  # incremental catch-ups from the change log
        self.last_reload_seconds = 0.0
        self._has_log = False
        self.backend = self._ensure_schema()

    # -- schema --------------------------------------------------------------------------------

    @property
    def _pending_table(self) -> str:
        return f"{self.name}_vec_pending_delete"

    def _table_exists(self, name: str) -> bool:
        return (
            self.db.scalar("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
            is not None
        )

    def _ensure_schema(self) -> str:
        key = f"vector_backend:{self.name}"
        backend = get_meta(self.db, key)
        stored_dim = get_meta(self.db, f"vector_dim:{self.name}")
        if backend is not None and stored_dim is not None and int(stored_dim) != self.dim:
            raise StorageError(
                f"vector table {self.table} holds {stored_dim}-dimensional vectors, not {self.dim}; "
                "rebuild it with VectorIndex.reset()"
            )
        has_log = self._table_exists(self.log_table) and self._table_exists(self.partition_table)
        stamped = has_log and self._log_is_stamped()
        if backend is None or (not stamped and not self.db.read_only):
            with self.db.transaction():
                if backend is None:
                    backend = "vec0" if self.db.native_vectors else "blob"
                    ensure_metadata(self.db)
                    self._create(backend)
                    set_meta(self.db, key, backend)
                    set_meta(self.db, f"vector_dim:{self.name}", self.dim)
                self._create_log()
            has_log = stamped = True
        self._has_log, self._log_stamped = has_log, stamped
        self.backend = backend
        if self.available:
            self._apply_pending_deletes()
        return backend

    def _create(self, backend: str) -> None:
        if backend == "vec0":
            cols = "".join(f", {c} {t}" for c, t in self.metadata.items())
            self.db.execute(
                f"CREATE VIRTUAL TABLE IF NOT EXISTS {self.table} USING vec0("
                f"embedding float[{self.dim}] distance_metric=cosine{cols})"
            )
        else:
            cols = "".join(f", {c} {self._types[c]}" for c in self.metadata)
            self.db.execute(
                f"CREATE TABLE IF NOT EXISTS {self.table} "
                f"(rowid INTEGER PRIMARY KEY, embedding BLOB NOT NULL{cols})"
            )

    def _apply_pending_deletes(self) -> None:
        """Deletes recorded while sqlite-vec was missing are applied once it is back."""
        if not self._table_exists(self._pending_table):
            return
        with self.db.transaction():
            pending = [int(r[0]) for r in self.db.query(f"SELECT rowid FROM {self._pending_table}")]
            self._delete_logged(pending)
            self.db.execute(f"DROP TABLE {self._pending_table}")

    def reset(self, dim: int) -> None:
        """Drop every vector and recreate the table for ``dim`` dimensions (model change).

        The new table uses vec0 whenever sqlite-vec is loaded now, even if the old one was a blob
        table.
        """
        dim = _positive_int(dim, "dim")
        old_dim, old_backend = self.dim, self.backend
        backend = "vec0" if self.db.native_vectors else "blob"

        def undo() -> None:
            self.dim, self.backend = old_dim, old_backend
            _rollbacks(self.db, self.table).add(0, None)
            self._bump_generation()

        with self.db.transaction():
            self.db.on_rollback(undo)
            self.db.execute(f"DROP TABLE IF EXISTS {self.table}")
            self.db.execute(f"DROP TABLE IF EXISTS {self._pending_table}")
            self.dim, self.backend = dim, backend
            self._create(backend)
            if self._has_log:
                self.db.execute(f"DELETE FROM {self.partition_table}")
            set_meta(self.db, f"vector_backend:{self.name}", backend)
            set_meta(self.db, f"vector_dim:{self.name}", dim)
            if self._has_log:
                self._log([0], _OP_RESET)
            self._mirror = None
            self._bump_generation()

    @property
    def available(self) -> bool:
        """False when the store was made with vec0 but sqlite-vec cannot be loaded now."""
        return self.backend == "blob" or self.db.native_vectors

    def _require(self) -> None:
        if not self.available:
            raise StorageError(
                f"vector table {self.table} needs sqlite-vec, which could not be loaded "
                f"({self.db.vec_reason})"
            )

    # -- writes --------------------------------------------------------------------------------

    def _check(self, vectors: FloatArray, what: str = "vectors") -> FloatArray:
        return check_vectors(vectors, self.dim, what)

    def _meta_value(self, column: str, value: Any, index: int) -> Any:
        return meta_value(self._types[column], self.table, column, value, index)

    def _metas(self, metas: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return check_metas(self._types, self.table, metas)

    def upsert_many(
        self,
        rowids: Sequence[int],
        vectors: FloatArray,
        metas: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Replace the vectors of ``rowids`` (delete then insert: re-indexing never hits UNIQUE).

        A rowid given twice keeps its last vector.
        """
        self._require()
        if len(rowids) == 0:
            return
        array = self._check(vectors)
        if len(array) != len(rowids):
            raise InvalidInputError(f"{len(rowids)} rowids but {len(array)} vectors")
        meta_rows = self._metas(list(metas) if metas is not None else [{} for _ in rowids])
        if len(meta_rows) != len(rowids):
            raise InvalidInputError(f"{len(rowids)} rowids but {len(meta_rows)} metas")
        last: dict[int, int] = {}
        for index, rowid in enumerate(rowids):
            last[int(rowid)] = index
        ids, picks = list(last), list(last.values())
        if len(ids) != len(rowids):
            array, meta_rows = array[picks], [meta_rows[i] for i in picks]
        columns = list(self.metadata)

        def write() -> Callable[[Mirror], None]:
            self._delete_rows(ids)
            with self._page_cache(len(ids)):
                self._insert_rows(ids, array, meta_rows)
            by_column = {c: [m[c] for m in meta_rows] for c in columns}
            return lambda mirror: mirror.put_many(ids, array, by_column)

        self._write(write, ids, _OP_UPSERT)

    def _insert_rows(
        self, ids: Sequence[int], array: FloatArray, meta_rows: Sequence[Mapping[str, Any]]
    ) -> None:
        columns = list(self.metadata)
        statement = insert_statement(self.table, columns, ids, array, meta_rows)
        if statement is not None:
            self.db.execute(*statement)
            return
        placeholders = ", ".join("?" for _ in range(2 + len(columns)))
        col_sql = "".join(f", {c}" for c in columns)
        self.db.executemany(
            f"INSERT INTO {self.table}(rowid, embedding{col_sql}) VALUES ({placeholders})",
            [(r, array[i].tobytes(), *(meta_rows[i][c] for c in columns)) for i, r in enumerate(ids)],
        )

    def upsert(self, rowid: int, vector: FloatArray, meta: Mapping[str, Any] | None = None) -> None:
        self.upsert_many([rowid], self._check(vector), [meta or {}])

    def delete_many(self, rowids: Iterable[int]) -> None:
        """Delete vectors; unknown rowids are ignored. Without sqlite-vec for a vec0 store the
        deletes are recorded and applied when the store is next opened with sqlite-vec."""
        ids = sorted({int(r) for r in rowids})
        if not ids:
            return
        if not self.available:
            with self.db.transaction():
                pending = self._pending_table
                self.db.execute(f"CREATE TABLE IF NOT EXISTS {pending} (rowid INTEGER PRIMARY KEY)")
                self.db.executemany(f"INSERT OR IGNORE INTO {pending}(rowid) VALUES (?)", [(r,) for r in ids])
            return
        self._delete_logged(ids)

    def _delete_logged(self, ids: Sequence[int]) -> None:
        found: list[int] = []

        def write() -> Callable[[Mirror], None]:
            found.extend(self._delete_rows(ids))
            return lambda mirror: mirror.remove_many(found)

        self._write(write, found, _OP_DELETE)

    def delete(self, rowid: int) -> None:
        self.delete_many([rowid])

    def update_metadata(self, rowid: int, meta: Mapping[str, Any]) -> None:
        """Change filter columns without touching the vector."""
        vector = self.get(rowid)
        if vector is not None:
            self.upsert(rowid, vector, meta)

    def _delete_rows(self, ids: Sequence[int]) -> list[int]:
        """Delete the stored rows among ``ids``; returns those that existed.

        vec0 zeroes a deleted vector inside its chunk blob, walking the blob's overflow pages up to
        the row's offset: ~0.5 ms a row when scattered. Deleting in (chunk, offset) order with a
        larger page cache for the duration keeps each chunk's pages cached: ~4x faster.
        """
        if not ids:
            return []
        id_json = json.dumps([int(i) for i in ids])
        if self.backend == "blob":
            found = [
                int(r[0])
                for r in self.db.query(
                    f"SELECT rowid FROM {self.table} WHERE rowid IN (SELECT value FROM json_each(?))",
                    (id_json,),
                )
            ]
        elif self._table_exists(f"{self.table}_rowids"):
            located = self.db.query(
                f"SELECT rowid, chunk_id, chunk_offset FROM {self.table}_rowids "
                "WHERE rowid IN (SELECT value FROM json_each(?))",
                (id_json,),
            )
            located.sort(key=lambda r: (_int_or(r[1]), _int_or(r[2])))
            found = [int(r[0]) for r in located]
        else:  # an unknown vec0 layout: delete them all (vec0 ignores rowids it does not hold)
            found = [int(i) for i in ids]
        if found:
            with self._page_cache(len(found)):
                self.db.executemany(f"DELETE FROM {self.table} WHERE rowid = ?", [(r,) for r in found])
        return found

    def _page_cache(self, rows: int) -> contextlib.AbstractContextManager[None]:
        return bulk_cache(self.db, rows) if self.backend == "vec0" else contextlib.nullcontext()

    # -- reads ---------------------------------------------------------------------------------

    def get(self, rowid: int) -> FloatArray | None:
        if not self.available:
            return None
        blob = self.db.scalar(f"SELECT embedding FROM {self.table} WHERE rowid = ?", (int(rowid),))
        return None if blob is None else np.frombuffer(blob, dtype=np.float32).copy()

    def count(self) -> int:
        if not self.available:
            return 0
        return int(self.db.scalar(f"SELECT count(*) FROM {self.table}"))

    def rowids(self) -> set[int]:
        if not self.available:
            return set()
        return {int(r[0]) for r in self.db.query(f"SELECT rowid FROM {self.table}")}

    def search(
        self,
        query: FloatArray,
        k: int,
        *,
        where: Mapping[str, Any] | None = None,
        candidates: Iterable[int] | None = None,
        engine: Engine = "auto",
        exact: bool = False,
    ) -> list[VectorHit]:
        """Top-``k`` by cosine similarity, restricted to ``where`` and ``candidates``.

        Exact, except on a mirror of ``approximate_from`` vectors or more, where searches without
        ``candidates`` scan the nearest inverted lists (``exact=True`` forces a full scan).
        ``engine="vec0"`` returns at most 4096 hits (sqlite-vec's limit for one query).
        """
        self._require()
        if engine not in ENGINES:
            raise InvalidInputError(f"engine must be one of {', '.join(ENGINES)}; got {engine!r}")
        q = self._check(query, "query")
        if len(q) != 1:
            raise InvalidInputError(f"query must be one vector of {self.dim} numbers, got shape {q.shape}")
        where = dict(where or {})
        unknown = set(where) - set(self.metadata)
        if unknown:
            raise InvalidInputError(f"unknown vector filter column(s): {sorted(unknown)}")
        try:  # numpy scalars become Python values; a value of another type can match nothing
            where = {c: self._meta_value(c, v, 0) for c, v in where.items()}
        except InvalidInputError:
            return []
        cand = None if candidates is None else np.fromiter((int(c) for c in candidates), dtype=np.int64)
        if cand is not None and len(cand) == 0:
            return []
        if engine == "vec0" or (engine == "auto" and not self.use_mirror and self.backend == "vec0"):
            if self.backend != "vec0":
                raise StorageError(f"vector table {self.table} is not a vec0 table")
            return self._search_vec0(q[0], k, where, cand)
        mirror = self._mirror_now()
        if q.shape[1] != self.dim:
            raise InvalidInputError(
                f"query must have shape (n, {self.dim}): vector table {self.table} was reset to "
                f"{self.dim} dimensions by another connection"
            )
        built, regrouped = mirror.partitions_built, mirror.regroups
        mirror.maintain(self.approximate_from)
        if mirror.partitions_built != built:
            self._save_partition(mirror)
            trim_heap()  # the build's temporaries, as after a load
        elif mirror.regroups != regrouped:
            self._files_due = True  # the index file should hold the rows grouped, as now
        return mirror.search(q[0], k, where, cand, exact=exact)

    def _search_vec0(
        self, q: FloatArray, k: int, where: Mapping[str, Any], cand: npt.NDArray[np.int64] | None
    ) -> list[VectorHit]:
        if k <= 0:
            return []
        sql = f"SELECT rowid, distance FROM {self.table} WHERE embedding MATCH ? AND k = ?"
        params: list[Any] = [q.tobytes(), int(min(k, VEC0_MAX_K))]
        for column, value in where.items():
            sql += f" AND {column} = ?"
            params.append(value)
        if cand is not None:
            sql += " AND rowid IN (SELECT value FROM json_each(?))"
            params.append("[" + ",".join(str(int(c)) for c in distinct(cand)) + "]")
        sql += " ORDER BY distance"
        return [VectorHit(int(r), 1.0 - float(d)) for r, d in self.db.query(sql, params) if d is not None]

    def load(self) -> None:
        """Bring the mirror up to date now (mapped from the index file, caught up from the change
        log, or read from the table), as the next search would; nothing when it is not used."""
        if self.use_mirror and self.available:
            self._mirror_now()

    def allows(self, rowids: npt.NDArray[np.int64], where: Mapping[str, Any]) -> npt.NDArray[np.int8] | None:
        """Whether the filter columns of ``rowids`` match ``where``, read from the mirror (no SQL):
        1 yes, 0 no, -1 not in the index (the caller asks the store). ``None`` when the mirror is
        not used (``mirror=False``, or sqlite-vec missing)."""
        if not self.use_mirror or not self.available:
            return None
        try:
            values = {c: self._meta_value(c, v, 0) for c, v in where.items()}
        except (InvalidInputError, KeyError):
            return np.zeros(len(rowids), dtype=np.int8)  # of another type: matches nothing
        return self._mirror_now().allows(rowids, values)

    def status(self) -> dict[str, Any]:
        """Backend (``vec0`` or ``blob``), whether it can be used now and why not, and the mirror."""
        mirror = self._mirror
        return {
            "backend": self.backend,
            "available": self.available,
            "native_vectors": self.db.native_vectors,
            "reason": None if self.available and self.db.native_vectors else self.db.vec_reason,
            "search_engine": "memory" if self.use_mirror or self.backend == "blob" else "vec0",
            "dim": self.dim,
            "count": self.count(),
            "mirror": self.use_mirror,
            "mirror_loaded": mirror is not None,
            "mirror_rows": 0 if mirror is None else mirror.live,
            "mirror_reloads": self.reloads,
            "mirror_refreshes": self.refreshes,
            "change_log": self._has_log,
            "approximate_from": self.approximate_from,
            "approximate": None if mirror is None else mirror.describe(),
            "index_file": self.files_status(),
        }
