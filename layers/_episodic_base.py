"""The episodic store's state: its connection, model, vectors (with their in-memory matrix)
and their upkeep (model changes, pending vectors, consistency); writes, search, archives and
retention build on it (see ``EpisodicMemory``)."""

from __future__ import annotations

import enum
import logging
import os
import uuid as uuidlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from memstrata.core.config import Config
from memstrata.core.errors import (
    EmbeddingError,
    InvalidInputError,
    StorageError,
)
from memstrata.core.validation import (
    check_aware,
)
from memstrata.storage import (
    ConsistencyReport,
    Database,
    Embedder,
    EmbeddingCache,
    KeywordIndex,
    VectorIndex,
    check_consistency,
    embed_documents,
    embedding_mismatch,
    get_meta,
    identifier_words,
    set_meta,
)

from ._archive import ArchiveFile
from ._episode_matrix import Ranking, TimedMatrix
from ._episode_records import (
    CONTEXT_SCHEMA,
    EPISODE_KEYWORDS,
    embed_text,
    episodes_schema,
    query_in,
    refresh_context,
)

log = logging.getLogger("memstrata.episodic")

FloatArray = npt.NDArray[np.float32]
BULK_DELETE_MIN = 500  # fewer vector deletes than this never rebuild the vector table
_RECORD_KEYS = frozenset({"content", "title", "task_run_id", "tags", "kind", "at", "vector"})

_MIGRATIONS: list[str | Callable[[Database], None]] = [
    episodes_schema(archive=False)
    + """
    CREATE TABLE archives (
      path TEXT PRIMARY KEY,
      archive_uuid TEXT NOT NULL,
      episodes INTEGER NOT NULL,
      removed INTEGER NOT NULL,
      first_at_us INTEGER,
      last_at_us INTEGER,
      created_us INTEGER NOT NULL
    );
    """,
]


def _index_turn_context(db: Database) -> None:
    """Migration 2: the neighbouring-episode context index, filled for existing task runs."""
    for statement in CONTEXT_SCHEMA:
        db.execute(statement)
    ids = [int(r[0]) for r in db.query("SELECT id FROM episodes WHERE task_run_id IS NOT NULL ORDER BY id")]
    for start in range(0, len(ids), 5000):
        refresh_context(db, ids[start : start + 5000])


_MIGRATIONS.append(_index_turn_context)
# Migration 3: the uuids of deleted episodes, so an archive made before the deletion never
# brings one back (search with archives drops it, restore skips it)
_MIGRATIONS.append("CREATE TABLE deleted_episodes (uuid TEXT PRIMARY KEY, deleted_us INTEGER NOT NULL)")


class _Default(enum.Enum):
    DEFAULT = "default"

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT = _Default.DEFAULT
"""``search(recency_half_life=DEFAULT)``: use the store's configured half-life."""


@dataclass(slots=True)
class _Item:
    uuid: str
    at_us: int
    kind: str
    task_run_id: str | None
    title: str | None
    content: str
    tags: str
    recorded_us: int
    vector: FloatArray | None = None  # given by the caller; computed from the text when None

    def row(self, ident: int) -> tuple[Any, ...]:
        return (
            ident,
            self.uuid,
            self.at_us,
            self.kind,
            self.task_run_id,
            self.title,
            self.content,
            self.tags,
            self.recorded_us,
            identifier_words(f"{self.title or ''} {self.content}"),
        )


@dataclass(slots=True)
class _Source:
    """Live episodes or one archive, as seen by one search."""

    db: Database
    label: str | None  # None for the live store, else the archive path
    matrix: TimedMatrix | None
    archive: ArchiveFile | None = None
    ranking: Ranking | None = None
    keywords: KeywordIndex | None = None  # None: the archive's full-text index is unusable


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _random_uuid() -> str:
    return str(uuidlib.uuid4())


def _positive_timedelta(value: object, name: str) -> timedelta:
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise InvalidInputError(f"{name} must be a positive datetime.timedelta, got {value!r}")
    return value


def _optional_count(value: object, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{name} must be a non-negative integer or None, got {value!r}")
    return value


def _path_arg(value: object, name: str) -> Path:
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise InvalidInputError(f"{name} must be a file path, got {value!r}")
    return Path(os.fspath(value)).expanduser().absolute()


class EpisodicBase:
    """Connection, model, vectors and their upkeep of one store (see ``EpisodicMemory``)."""

    def __init__(
        self,
        db: Database,
        *,
        embedder: Embedder | None,
        embedder_problem: str | None,
        config: Config,
        clock: Callable[[], datetime],
        recency_half_life: timedelta | None,
        retention_max_count: int | None,
        retention_max_age: timedelta | None,
        archive_dir: Path | None,
    ) -> None:
        self._db = db
        self.path = db.path
        self._config = config
        self._clock = clock
        self._half_life = recency_half_life
        self._max_count = retention_max_count
        self._max_age = retention_max_age
        self._archive_dir = archive_dir
        self._embedder = embedder
        self._problem = embedder_problem
        self._cache = EmbeddingCache(db)
        self._vectors: VectorIndex | None = None
        self._matrix: TimedMatrix | None = None
        self._matrix_version = -1
        self._archives: dict[str, tuple[tuple[int, int], ArchiveFile]] = {}
        self._archive_problems: dict[str, str] = {}
        self._matrices: dict[str, TimedMatrix | None] = {}
        # the one keyword ranker (storage.KeywordIndex) of the live store and of each archive;
        # the live one is told of every write made here (:meth:`_indexed`, :meth:`_unindexed`)
        self._keywords = KeywordIndex(db, EPISODE_KEYWORDS)
        self._archive_keywords: dict[str, KeywordIndex] = {}
        self._repaired = {"embedded": 0, "orphans_removed": 0, "rebuilt": 0}
        self._consistency: ConsistencyReport | None = None
        self._last_error: str | None = None  # the embedder's last failure (episodes kept, vectors pending)
        self._pending_ids: set[int] = set()  # recorded here without a vector since the model failed
        self._closed = False
        # the uuid of a new episode; a system sets a seeded source so simulations replay exactly
        self.new_uuid: Callable[[], str] = _random_uuid
        with db.transaction():
            store_uuid = get_meta(db, "store_uuid")
            if store_uuid is None:
                store_uuid = str(uuidlib.uuid4())
                set_meta(db, "store_uuid", store_uuid)
        self.store_uuid = store_uuid
        self._setup_vectors()

    def _setup_vectors(self) -> None:
        """Open the vector table, rebuild it for a new model, then check the store's consistency."""
        db = self._db
        stored_dim_text = get_meta(db, "vector_dim:episodes")
        stored_dim = int(stored_dim_text) if stored_dim_text else None
        embedder = self._embedder
        if embedder is None:
            if stored_dim is not None:  # keep archives, restores and deletes consistent
                self._vectors = VectorIndex(db, "episodes", stored_dim, mirror=False)
            self.check()
            return
        self._vectors = VectorIndex(db, "episodes", stored_dim or embedder.dim, mirror=False)
        if not self._vectors.available:
            self._problem = f"vectors unavailable: {db.vec_reason}"
            self._embedder = None
            self.check()
            return
        changed = embedding_mismatch(db, embedder.model_id, embedder.dim) is not None
        if changed or self._vectors.dim != embedder.dim:
            try:
                self._rebuild_vectors(embedder)
            except EmbeddingError as exc:  # the old vectors stay; keyword-only until the next open
                self._problem = f"re-embedding for model {embedder.model_id!r} failed: {exc}"
                self._last_error = str(exc)
                self._embedder = None
        else:
            if get_meta(db, "embedding_model") is None:
                with db.transaction():
                    set_meta(db, "embedding_model", embedder.model_id)
                    set_meta(db, "embedding_dim", embedder.dim)
        self.check()

    def _embed(
        self, embedder: Embedder, titles_contents: Sequence[tuple[str | None, str, int | None]]
    ) -> FloatArray:
        """Vectors of ``(title, content, at_us)`` episodes (the date is part of what is embedded)."""
        return embed_documents(embedder, [embed_text(t, c, a) for t, c, a in titles_contents], self._cache)

    def _rebuild_vectors(self, embedder: Embedder) -> None:
        """Re-embed every episode for a new model; the old vectors stay until the new set is ready."""
        assert self._vectors is not None
        db = self._db
        old_model = get_meta(db, "embedding_model")
        rows = db.query("SELECT id, title, content, at_us FROM episodes ORDER BY id")
        vectors = self._embed(embedder, [(r[1], r[2], r[3]) for r in rows])
        with db.transaction():
            self._vectors.reset(embedder.dim)
            if rows:
                self._vectors.upsert_many([int(r[0]) for r in rows], vectors)
            set_meta(db, "embedding_model", embedder.model_id)
            set_meta(db, "embedding_dim", embedder.dim)
        if old_model and old_model != embedder.model_id:
            self._cache.clear(old_model)
        self._repaired["rebuilt"] = len(rows)
        self._matrix = None

    def check(self, *, full: bool = False) -> ConsistencyReport:
        """Compare episodes, full-text indexes and vectors; repair what disagrees (run on open).

        Full-text indexes that disagree with the episodes are rebuilt, vectors of missing episodes
        are deleted and episodes without a vector are embedded (left pending in keyword-only
        mode or when the model fails). ``full=True`` also re-tokenises every episode to verify the
        full-text indexes. The report is kept for :meth:`status`.
        """
        self._open_db()
        vectors = self._vectors
        hybrid = self._embedder is not None and vectors is not None
        report = check_consistency(
            self._db,
            table="episodes",
            fts={"episodes_fts": None, "episodes_tri": None},
            vectors=vectors,
            vector_rows=None if hybrid else "0",  # keyword-only: vectors wait for a model
            repair_missing=self._embed_missing if hybrid else None,
            full=full,
        )
        self._consistency = report
        self._repaired["embedded"] += report.vectors_repaired
        self._repaired["orphans_removed"] += report.orphan_vectors_removed
        if report.problems:
            self._matrix = None
        if report.fts_rebuilt:
            self._keywords.reset()
        return report

    def pending_vectors(self) -> int:
        """Episodes recorded without a vector since the model failed (found by keywords meanwhile)."""
        self._open_db()
        return len(self._pending_ids) if self._embedder is not None and self._vectors is not None else 0

    def catch_up_vectors(self) -> int:
        """Embed pending episodes now (a bounded batch); returns how many are still pending. The
        owner calls this again later while the model is faulty (the actors do, with backoff)."""
        self._open_db()
        if self._pending_ids:
            self._embed_missing(sorted(self._pending_ids)[:1000])
        return self.pending_vectors()

    def _embed_missing(self, ids: Sequence[int]) -> int:
        """Embed episodes that have no vector; returns how many got one (0 if the model fails)."""
        embedder, vectors = self._embedder, self._vectors
        if embedder is None or vectors is None or not ids:
            return 0
        done = 0
        for start in range(0, len(ids), 1000):
            batch = ids[start : start + 1000]
            rows = query_in(self._db, "SELECT id, title, content, at_us FROM episodes WHERE id IN", batch)
            if not rows:
                self._pending_ids.difference_update(batch)  # removed meanwhile: nothing to embed
                continue
            try:
                array = self._embed(embedder, [(r[1], r[2], r[3]) for r in rows])
            except EmbeddingError as exc:
                self._last_error = str(exc)
                self._pending_ids.update(int(i) for i in ids[start:])
                break
            with self._db.transaction():
                self._db.on_rollback(self._drop_matrix)
                present = {
                    int(r[0])
                    for r in query_in(self._db, "SELECT id FROM episodes WHERE id IN", [r[0] for r in rows])
                }
                keep = [n for n, r in enumerate(rows) if int(r[0]) in present]
                if keep:
                    vectors.upsert_many([int(rows[n][0]) for n in keep], array[keep])
            self._pending_ids.difference_update(batch)
            done += len(keep)
        self._matrix = None
        return done

    # -- small helpers -------------------------------------------------------------------------

    def _open_db(self) -> Database:
        if self._closed:
            raise StorageError(f"episodic memory {self.path} is closed")
        return self._db

    def _now(self) -> datetime:
        return check_aware(self._clock(), "the clock's value")

    @property
    def keyword_only(self) -> bool:
        return self._embedder is None

    @property
    def embedder(self) -> Embedder | None:
        return self._embedder

    def _drop_matrix(self) -> None:
        self._matrix = None

    def _indexed(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Episode rows (as :meth:`_Item.row`) just inserted: the keyword index's caches follow."""
        self._db.on_rollback(self._keywords.reset)
        self._keywords.bm25.added([(r[0], r[6], r[5] or "", r[9]) for r in rows])

    def _unindexed(self, ids: Sequence[int]) -> None:
        """Episodes just deleted: the keyword index's caches follow."""
        self._db.on_rollback(self._keywords.reset)
        self._keywords.bm25.removed(list(ids))

    def _matrix_now(self) -> TimedMatrix | None:
        """The in-memory vectors, reloaded when another connection changed the store."""
        if self._embedder is None or self._vectors is None:
            return None
        version = self._db.data_version()
        if self._matrix is None or version != self._matrix_version:
            self._matrix = self._load_matrix(self._vectors)
            self._matrix_version = version
        return self._matrix

    def _load_matrix(self, vectors: VectorIndex) -> TimedMatrix:
        db = self._db
        rows = db.query("SELECT id, at_us, task_run_id FROM episodes ORDER BY id")
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        at = np.array([r[1] for r in rows], dtype=np.int64)
        runs = [r[2] for r in rows]
        matrix = TimedMatrix(vectors.dim)
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
        vectors = self._vectors
        if vectors is None or not vectors.available:
            return {}
        sql = f"SELECT rowid, embedding FROM {vectors.table} WHERE rowid IN"
        return {int(r): bytes(b) for r, b in query_in(self._db, sql, ids)}

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
