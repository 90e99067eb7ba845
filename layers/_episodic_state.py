"""What every part of an episodic store reads: its connection, model and vectors (held as every
store holds them, :mod:`._indexed_store`), with the in-memory matrix of the vectors kept in line
with the database and the keyword caches told of writes. The store's setup is
:mod:`._episodic_base`; pending vectors :mod:`._episodic_pending`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from memstrata.core.validation import check_aware
from memstrata.storage import Database, Embedder, FloatArray, KeywordIndex, VectorIndex, embed_documents

from ._archive import ArchiveFile
from ._episode_records import EPISODE_COLUMNS, embed_text, query_in, refresh_context
from ._episode_vectors import EpisodeRanking, EpisodeVectors
from ._episodic_inputs import _Item, episode_digest
from ._indexed_store import IndexedStore

__all__ = ["BULK_DELETE_MIN", "EpisodicState", "Held", "held_episodes", "held_uuids"]

BULK_DELETE_MIN = 500  # fewer vector deletes than this never rebuild the vector table

Held = tuple[str, str | None, int | None]
"""Where a uuid is held ("live", "deleted" or "archived"), its episode's digest (``None``: a
deletion recorded before digests were), and the live episode's id."""


def held_uuids(db: Database, uuids: Sequence[str]) -> set[str]:
    """Those of ``uuids`` the store holds: live, deleted, or in an archive it wrote."""
    held: set[str] = set()
    for table in ("episodes", "deleted_episodes", "archived_episodes"):
        held.update(str(r[0]) for r in query_in(db, f"SELECT uuid FROM {table} WHERE uuid IN", uuids))
    return held


def held_episodes(db: Database, uuids: Sequence[str]) -> dict[str, Held]:
    """What the store holds under each of ``uuids`` it holds: live first, then deleted, then
    archived (an episode restored is live, and its archive keeps a copy)."""
    held: dict[str, Held] = {}
    sql = "SELECT uuid, digest FROM archived_episodes WHERE uuid IN"
    held.update((str(u), ("archived", str(d), None)) for u, d in query_in(db, sql, uuids))
    sql = "SELECT uuid, digest FROM deleted_episodes WHERE uuid IN"
    for u, d in query_in(db, sql, uuids):
        held[str(u)] = ("deleted", None if d is None else str(d), None)
    sql = f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE uuid IN"
    held.update((str(r[1]), ("live", episode_digest(r), int(r[0]))) for r in query_in(db, sql, uuids))
    return held


@dataclass(slots=True)
class _Source:
    """Live episodes or one archive, as seen by one search."""

    db: Database
    label: str | None  # None for the live store, else the archive path
    matrix: EpisodeVectors | None
    archive: ArchiveFile | None = None
    ranking: EpisodeRanking | None = None
    keywords: KeywordIndex | None = None  # None: the archive's full-text index is unusable


class EpisodicState(IndexedStore):
    """The shared state of one store and the in-memory matrix of its vectors (a base of
    ``EpisodicMemory``)."""

    _noun = "episodic memory"
    _clock: Callable[[], datetime]
    _matrix: EpisodeVectors | None
    _matrix_version: int

    def _now(self) -> datetime:
        return check_aware(self._clock(), "the clock's value")

    @property
    def keyword_only(self) -> bool:
        return self._embedder is None

    def _embed(
        self, embedder: Embedder, titles_contents: Sequence[tuple[str | None, str, int | None]]
    ) -> FloatArray:
        """Vectors of ``(title, content, at_us)`` episodes (the date is part of what is embedded)."""
        return embed_documents(embedder, [embed_text(t, c, a) for t, c, a in titles_contents], self._cache)

    def _drop_matrix(self) -> None:
        self._matrix = None

    def _indexed(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Episode rows (as :meth:`_Item.row`) just inserted: the keyword index's caches follow."""
        self._db.on_rollback(self._keywords.reset)
        self._keywords.bm25.added([(r[0], r[6], r[5] or "", r[9]) for r in rows])

    def _insert_rows(self, ids: Sequence[int], items: Sequence[_Item], vectors: FloatArray | None) -> None:
        """Insert ``items`` as the episodes ``ids`` inside the caller's transaction: their keyword
        index, their neighbours' context and, given ``vectors``, their vectors follow."""
        written = [item.row(ident) for ident, item in zip(ids, items, strict=True)]
        self._db.executemany(
            f"INSERT INTO episodes({EPISODE_COLUMNS}, ident) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            written,
        )
        self._indexed(written)
        refresh_context(self._db, ids)
        if vectors is not None and self._vectors is not None and self._vectors.available:
            self._vectors.upsert_many(ids, vectors)
            if self._matrix is not None:
                self._matrix.add(ids, vectors, [i.at_us for i in items], [i.task_run_id for i in items])

    def _unindexed(self, ids: Sequence[int]) -> None:
        """Episodes just deleted: the keyword index's caches follow."""
        self._db.on_rollback(self._keywords.reset)
        self._keywords.bm25.removed(list(ids))

    def _matrix_now(self) -> EpisodeVectors | None:
        """The in-memory vectors, reloaded when another connection changed the store."""
        if self._embedder is None or self._vectors is None:
            return None
        version = self._db.data_version()
        if self._matrix is None or version != self._matrix_version:
            self._matrix = self._load_matrix(self._vectors)
            self._matrix_version = version
        return self._matrix

    def _load_matrix(self, vectors: VectorIndex) -> EpisodeVectors:
        db = self._db
        rows = db.query("SELECT id, at_us, task_run_id FROM episodes ORDER BY id")
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        at = np.array([r[1] for r in rows], dtype=np.int64)
        runs = [r[2] for r in rows]
        matrix = EpisodeVectors(vectors.dim)
        cursor = db.execute(f"SELECT rowid, embedding FROM {vectors.table}")
        while True:
            chunk = cursor.fetchmany(8192)
            if not chunk:
                break
            if len(ids) == 0:
                break
            rowids = np.array([r[0] for r in chunk], dtype=np.int64)
            pos = np.minimum(np.searchsorted(ids, rowids), len(ids) - 1)
            known = ids[pos] == rowids  # a vector without its episode is an orphan: skipped
            if not known.any():
                continue
            blob = b"".join(r[1] for r, k in zip(chunk, known, strict=True) if k)
            block = np.frombuffer(blob, dtype=np.float32).reshape(-1, vectors.dim)
            where = pos[known]
            matrix.add(ids[where].tolist(), block, at[where].tolist(), [runs[int(p)] for p in where])
        return matrix

    def _stored_vectors(self, ids: Sequence[int]) -> dict[int, bytes]:
        """The stored vectors of ``ids``: from the in-memory vectors when they are loaded (an
        archive of thousands read them one by one from vec0 at ~0.15 ms each), else the table."""
        vectors = self._vectors
        if vectors is None or not vectors.available:
            return {}
        matrix = self._matrix_now() if self._matrix is not None else None
        found = matrix.stored(ids) if matrix is not None else {}
        missing = [i for i in ids if i not in found]
        if missing:
            sql = f"SELECT rowid, embedding FROM {vectors.table} WHERE rowid IN"
            found.update((int(r), bytes(b)) for r, b in query_in(self._db, sql, missing))
        return found

    def _delete_vectors(self, ids: Sequence[int]) -> None:
        """Delete vectors inside the caller's transaction.

        vec0 rewrites part of a chunk for every row deleted from it, so removing thousands of
        scattered rows (an archive of old episodes) costs far more than writing the survivors
        into a fresh table; past a threshold the table is rebuilt from the in-memory matrix,
        which holds the stored bytes exactly.
        """
        vectors = self._vectors
        if vectors is None or not ids:
            return
        matrix = self._matrix_now() if vectors.available and vectors.backend == "vec0" else None
        remaining = len(matrix) - len(ids) if matrix is not None else 0
        if matrix is None or len(ids) < BULK_DELETE_MIN or len(ids) * 20 < remaining:
            vectors.delete_many(ids)
            return
        matrix.remove(ids)
        keep_ids, keep = matrix.live()
        vectors.reset(vectors.dim)
        for start in range(0, len(keep_ids), 10_000):
            vectors.upsert_many(keep_ids[start : start + 10_000].tolist(), keep[start : start + 10_000])
