"""Vectors: durable in sqlite-vec ``vec0`` (cosine), searched exactly.

The durable store is a ``vec0`` table whose filter columns are vec0 metadata columns, so a
filtered KNN inside SQLite is exact. Where sqlite-vec cannot be loaded when a store is created,
the vectors live in a plain table of float32 blobs instead; the backend is recorded in the
database's metadata and reported by :meth:`VectorIndex.status`.

Searches run by default on an in-memory mirror of the vectors (a float32 matrix loaded lazily,
kept current by this process's writes and refreshed when another process commits): an exact
numpy scan that is several times faster than vec0's own scan. ``engine="vec0"`` asks SQLite.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from memstrata.errors import InvalidInputError, StorageError

from ._connection import Database
from ._migrations import get_meta, set_meta

__all__ = ["VectorHit", "VectorIndex"]

Engine = Literal["auto", "memory", "vec0"]
FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class VectorHit:
    rowid: int
    similarity: float  # cosine similarity, -1..1


class _Mirror:
    """A growable float32 matrix of the live vectors plus their metadata codes."""

    def __init__(self, dim: int, columns: Sequence[str]) -> None:
        self.dim = dim
        self.columns = list(columns)
        self.matrix: FloatArray = np.zeros((0, dim), dtype=np.float32)
        self.rowids = np.zeros(0, dtype=np.int64)
        self.alive = np.zeros(0, dtype=bool)
        self.codes: dict[str, npt.NDArray[np.int32]] = {c: np.zeros(0, dtype=np.int32) for c in columns}
        self.vocab: dict[str, dict[Any, int]] = {c: {} for c in columns}
        self.position: dict[int, int] = {}
        self.size = 0
        self.dead = 0

    def _grow(self, need: int) -> None:
        capacity = len(self.rowids)
        if need <= capacity:
            return
        new_capacity = max(need, capacity * 2, 1024)
        matrix = np.zeros((new_capacity, self.dim), dtype=np.float32)
        matrix[: self.size] = self.matrix[: self.size]
        self.matrix = matrix
        self.rowids = np.resize(self.rowids, new_capacity)
        alive = np.zeros(new_capacity, dtype=bool)
        alive[: self.size] = self.alive[: self.size]
        self.alive = alive
        for c in self.columns:
            self.codes[c] = np.resize(self.codes[c], new_capacity)

    def code(self, column: str, value: Any) -> int:
        vocab = self.vocab[column]
        if value not in vocab:
            vocab[value] = len(vocab)
        return vocab[value]

    def put_many(
        self, rowids: Sequence[int], vectors: FloatArray, metas: Sequence[Mapping[str, Any]]
    ) -> None:
        for rowid in rowids:
            self.remove(rowid)
        start = self.size
        self._grow(start + len(rowids))
        end = start + len(rowids)
        self.matrix[start:end] = vectors
        self.rowids[start:end] = rowids
        self.alive[start:end] = True
        for c in self.columns:
            self.codes[c][start:end] = [self.code(c, m.get(c)) for m in metas]
        for offset, rowid in enumerate(rowids):
            self.position[int(rowid)] = start + offset
        self.size = end

    def remove(self, rowid: int) -> None:
        pos = self.position.pop(int(rowid), None)
        if pos is not None:
            self.alive[pos] = False
            self.dead += 1

    def compact(self) -> None:
        if self.dead <= max(1024, self.size // 4):
            return
        keep = np.flatnonzero(self.alive[: self.size])
        self.matrix = self.matrix[keep].copy()
        self.rowids = self.rowids[keep].copy()
        self.alive = np.ones(len(keep), dtype=bool)
        for c in self.columns:
            self.codes[c] = self.codes[c][keep].copy()
        self.position = {int(r): i for i, r in enumerate(self.rowids)}
        self.size = len(keep)
        self.dead = 0

    def search(
        self,
        query: FloatArray,
        k: int,
        where: Mapping[str, Any],
        candidates: npt.NDArray[np.int64] | None,
    ) -> list[VectorHit]:
        self.compact()
        if self.size == 0 or k <= 0:
            return []
        if candidates is not None:
            positions = np.fromiter(
                (p for p in (self.position.get(int(r)) for r in candidates) if p is not None), dtype=np.int64
            )
            mask = np.ones(len(positions), dtype=bool)
            for column, value in where.items():
                code = self.vocab[column].get(value)
                if code is None:
                    return []
                mask &= self.codes[column][positions] == code
            positions = positions[mask]
            if len(positions) == 0:
                return []
            scores = self.matrix[positions] @ query
        else:
            scores = self.matrix[: self.size] @ query
            valid = self.alive[: self.size].copy()
            for column, value in where.items():
                code = self.vocab[column].get(value)
                if code is None:
                    return []
                valid &= self.codes[column][: self.size] == code
            if not valid.all():
                scores = np.where(valid, scores, -np.inf)
            positions = None
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
        top = top[np.argsort(-scores[top], kind="stable")]
        hits = []
        for i in top:
            score = float(scores[i])
            if score == -np.inf:
                break
            pos = int(i) if positions is None else int(positions[i])
            hits.append(VectorHit(int(self.rowids[pos]), score))
        return hits


class VectorIndex:
    """Vectors of one table of a store, with equality-filterable metadata columns.

    Writes join the caller's transaction (call them inside ``db.transaction()``); the mirror
    is rebuilt from SQLite if that transaction rolls back.
    """

    def __init__(
        self,
        db: Database,
        name: str,
        dim: int,
        *,
        metadata: Mapping[str, str] | None = None,
        mirror: bool = True,
    ) -> None:
        if dim <= 0:
            raise InvalidInputError(f"dim must be positive, got {dim}")
        self.db = db
        self.name = name
        self.dim = dim
        self.metadata = dict(metadata or {})
        self.use_mirror = mirror
        self._mirror: _Mirror | None = None
        self._data_version = -1
        self.backend = self._ensure_schema()

    # -- schema --------------------------------------------------------------------------------

    @property
    def table(self) -> str:
        return f"{self.name}_vec"

    def _ensure_schema(self) -> str:
        key = f"vector_backend:{self.name}"
        backend = get_meta(self.db, key)
        stored_dim = get_meta(self.db, f"vector_dim:{self.name}")
        if backend is not None and stored_dim is not None and int(stored_dim) != self.dim:
            raise StorageError(
                f"vector table {self.table} holds {stored_dim}-dimensional vectors, not {self.dim}; "
                "rebuild it with VectorIndex.reset()"
            )
        if backend is None:
            backend = "vec0" if self.db.native_vectors else "blob"
            with self.db.transaction():
                self._create(backend)
                set_meta(self.db, key, backend)
                set_meta(self.db, f"vector_dim:{self.name}", self.dim)
        return backend

    def _create(self, backend: str) -> None:
        if backend == "vec0":
            cols = "".join(f", {c} {t}" for c, t in self.metadata.items())
            self.db.execute(
                f"CREATE VIRTUAL TABLE IF NOT EXISTS {self.table} USING vec0("
                f"embedding float[{self.dim}] distance_metric=cosine{cols})"
            )
        else:
            cols = "".join(f", {c} {t}" for c, t in self.metadata.items())
            self.db.execute(
                f"CREATE TABLE IF NOT EXISTS {self.table} "
                f"(rowid INTEGER PRIMARY KEY, embedding BLOB NOT NULL{cols})"
            )

    def reset(self, dim: int) -> None:
        """Drop every vector and recreate the table for ``dim`` dimensions (model change)."""
        with self.db.transaction():
            self.db.execute(f"DROP TABLE IF EXISTS {self.table}")
            self.dim = dim
            self._create(self.backend)
            set_meta(self.db, f"vector_dim:{self.name}", dim)
        self._mirror = None

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

    def _check(self, vectors: FloatArray) -> FloatArray:
        array = np.asarray(vectors, dtype=np.float32)
        if array.ndim == 1:
            array = array.reshape(1, -1)
        if array.ndim != 2 or array.shape[1] != self.dim:
            raise InvalidInputError(f"vectors must have shape (n, {self.dim}), got {array.shape}")
        if not np.isfinite(array).all():
            raise InvalidInputError("vectors contain NaN or infinity")
        return np.ascontiguousarray(array)

    def upsert_many(
        self,
        rowids: Sequence[int],
        vectors: FloatArray,
        metas: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Replace the vectors of ``rowids`` (delete then insert: re-indexing never hits UNIQUE)."""
        self._require()
        if len(rowids) == 0:
            return
        array = self._check(vectors)
        if len(array) != len(rowids):
            raise InvalidInputError(f"{len(rowids)} rowids but {len(array)} vectors")
        metas = list(metas) if metas is not None else [{} for _ in rowids]
        columns = list(self.metadata)
        placeholders = ", ".join("?" for _ in range(2 + len(columns)))
        col_sql = "".join(f", {c}" for c in columns)
        with self.db.transaction():
            self.db.on_rollback(self._invalidate)
            self.db.executemany(f"DELETE FROM {self.table} WHERE rowid = ?", [(int(r),) for r in rowids])
            self.db.executemany(
                f"INSERT INTO {self.table}(rowid, embedding{col_sql}) VALUES ({placeholders})",
                [
                    (int(r), array[i].tobytes(), *(m.get(c) for c in columns))
                    for i, (r, m) in enumerate(zip(rowids, metas, strict=True))
                ],
            )
            if self._mirror is not None:
                self._mirror.put_many([int(r) for r in rowids], array, metas)

    def upsert(self, rowid: int, vector: FloatArray, meta: Mapping[str, Any] | None = None) -> None:
        self.upsert_many([rowid], self._check(vector), [meta or {}])

    def delete_many(self, rowids: Iterable[int]) -> None:
        ids = [(int(r),) for r in rowids]
        if not ids or not self.available:
            return
        with self.db.transaction():
            self.db.on_rollback(self._invalidate)
            self.db.executemany(f"DELETE FROM {self.table} WHERE rowid = ?", ids)
            if self._mirror is not None:
                for (r,) in ids:
                    self._mirror.remove(r)

    def delete(self, rowid: int) -> None:
        self.delete_many([rowid])

    def update_metadata(self, rowid: int, meta: Mapping[str, Any]) -> None:
        """Change filter columns without touching the vector."""
        vector = self.get(rowid)
        if vector is not None:
            self.upsert(rowid, vector, meta)

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
    ) -> list[VectorHit]:
        """Exact top-``k`` by cosine similarity, restricted to ``where`` and ``candidates``."""
        self._require()
        q = self._check(query)[0]
        where = dict(where or {})
        unknown = set(where) - set(self.metadata)
        if unknown:
            raise InvalidInputError(f"unknown vector filter column(s): {sorted(unknown)}")
        cand = None if candidates is None else np.fromiter((int(c) for c in candidates), dtype=np.int64)
        if cand is not None and len(cand) == 0:
            return []
        if engine == "vec0" or (engine == "auto" and not self.use_mirror and self.backend == "vec0"):
            if self.backend != "vec0":
                raise StorageError(f"vector table {self.table} is not a vec0 table")
            return self._search_vec0(q, k, where, cand)
        return self._mirror_now().search(q, k, where, cand)

    def _search_vec0(
        self, q: FloatArray, k: int, where: Mapping[str, Any], cand: npt.NDArray[np.int64] | None
    ) -> list[VectorHit]:
        if k <= 0:
            return []
        sql = f"SELECT rowid, distance FROM {self.table} WHERE embedding MATCH ? AND k = ?"
        params: list[Any] = [q.tobytes(), int(min(k, 4096))]
        for column, value in where.items():
            sql += f" AND {column} = ?"
            params.append(value)
        if cand is not None:
            sql += " AND rowid IN (SELECT value FROM json_each(?))"
            params.append("[" + ",".join(str(int(c)) for c in cand) + "]")
        sql += " ORDER BY distance"
        return [VectorHit(int(r), 1.0 - float(d)) for r, d in self.db.query(sql, params)]

    def _mirror_now(self) -> _Mirror:
        version = self.db.data_version()
        if self._mirror is None or version != self._data_version:
            self._mirror = self._load()
            self._data_version = version
        return self._mirror

    def _load(self) -> _Mirror:
        mirror = _Mirror(self.dim, list(self.metadata))
        col_sql = "".join(f", {c}" for c in self.metadata)
        cursor = self.db.execute(f"SELECT rowid, embedding{col_sql} FROM {self.table}")
        while True:
            rows = cursor.fetchmany(8192)
            if not rows:
                break
            vectors = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(
                len(rows), self.dim
            )
            metas = [dict(zip(self.metadata, r[2:], strict=True)) for r in rows]
            mirror.put_many([int(r[0]) for r in rows], vectors, metas)
        return mirror

    def _invalidate(self) -> None:
        self._mirror = None

    def status(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "available": self.available,
            "dim": self.dim,
            "mirror": self.use_mirror,
            "mirror_loaded": self._mirror is not None,
        }
