"""Episodic memory: what one agent experienced, in time order, searchable and archivable.

Episodes are immutable records (content, title, task run, tags, kind, an aware time). Search
fuses a vector list and a keyword list with Reciprocal Rank Fusion, restricted exactly to a
task run and a time range, optionally decayed by age so recent episodes win ties. Old episodes
move to single-file archives that stay searchable and can be restored into any store.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
import os
import uuid as uuidlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from memstrata.core.constants import EMBED_CHARS, MAX_TITLE_CHARS
from memstrata.core.validation import (
    check_aware,
    check_category,
    check_content,
    check_optional_text,
    check_tags,
    check_task_id,
    check_top_k,
)
from memstrata.storage import (
    PLAIN_RRF_K,
    ConsistencyReport,
    Database,
    Embedder,
    EmbeddingCache,
    FusedArrays,
    KeywordQuery,
    VectorIndex,
    apply_migrations,
    best_score,
    build_keyword_query,
    check_consistency,
    default_embedder,
    embed_documents,
    embed_query,
    embedding_mismatch,
    fuse,
    fusion_weights,
    get_meta,
    identifier_words,
    load_embedder,
    match_type,
    open_database,
    set_meta,
    validate_mode,
)
from memstrata.storage._migrations import refresh_keyword_terms

from memstrata.config import Config
from memstrata.errors import (
    ArchiveError,
    EmbedderUnavailableError,
    EmbeddingError,
    InvalidInputError,
    MemstrataError,
    StorageError,
)

from ._archive import ARCHIVE_FORMAT, ARCHIVE_VERSION, ArchiveFile, describe_filter, write_archive
from ._episode_matrix import Ranking, TimedMatrix
from ._episodes import (
    CONTEXT_SCHEMA,
    CONTEXT_TURNS,
    EPISODE_COLUMNS,
    MAX_NEIGHBOURS,
    Episode,
    EpisodeHit,
    dump_tags,
    embed_text,
    episode_from_row,
    episodes_schema,
    from_us,
    has_context,
    keyword_lists,
    load_tags,
    neighbouring_episodes,
    query_in,
    refresh_context,
    time_conditions,
    to_us,
)

__all__ = ["DEFAULT", "Episode", "EpisodeHit", "EpisodicMemory", "promotion_tags"]


def promotion_tags(episode: Episode) -> dict[str, str]:
    """The tags of a knowledge entry promoted from ``episode``: its own, plus ``episode_id`` and
    ``task_run_id`` (``""`` when it had none), so the entry says where it came from."""
    return {**episode.tags, "episode_id": str(episode.id), "task_run_id": episode.task_run_id or ""}


log = logging.getLogger("memstrata.episodic")

FloatArray = npt.NDArray[np.float32]
MAX_DEPTH = 10_000  # deepest candidate lists recency decay may ask for
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


class _KnowledgeSink(Protocol):
    """What :meth:`EpisodicMemory.promote` needs from a ``KnowledgeStore``."""

    def add(self, content: str, *, category: str, tags: dict[str, str]) -> int: ...


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


class EpisodicMemory:
    """One agent's episodic store (``episodic/{agent}.sqlite``). Not thread-safe: one owner.

    Open it with :meth:`open`. Times are timezone-aware datetimes, stored as UTC microseconds;
    time ranges include ``since`` and exclude ``until``.
    """

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

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        embedder: Embedder | None = None,
        *,
        config: Config | None = None,
        clock: Callable[[], datetime] | None = None,
        recency_half_life: timedelta | None = None,
        retention_max_count: int | None = None,
        retention_max_age: timedelta | None = None,
        archive_dir: str | os.PathLike[str] | None = None,
    ) -> EpisodicMemory:
        """Open (or create) the store at ``path``.

        ``embedder`` ``None`` loads the configured model (the shared default unless
        ``config.embedding.model`` names another); if none can be loaded the store runs
        keyword-only and :meth:`status` says why. ``clock`` returns aware datetimes (default: UTC
        now) and dates new episodes and measures recency. The other arguments override
        ``config.episodic``; with ``archive_dir`` set, retention archives instead of deleting.
        """
        config = Config.load() if config is None else config  # memstrata.toml and MEMSTRATA_*
        if not isinstance(config, Config):
            raise InvalidInputError(f"config must be a memstrata Config, got {type(config).__name__}")
        if clock is None:
            clock = _utc_now
        elif not callable(clock):
            raise InvalidInputError(f"clock must be a callable returning an aware datetime, got {clock!r}")
        episodic = config.episodic
        if recency_half_life is not None:
            half_life: timedelta | None = _positive_timedelta(recency_half_life, "recency_half_life")
        elif episodic.recency_half_life_s:
            half_life = timedelta(seconds=episodic.recency_half_life_s)
        else:
            half_life = None
        max_count = _optional_count(
            retention_max_count if retention_max_count is not None else episodic.retention_max_count,
            "retention_max_count",
        )
        if retention_max_age is not None:
            max_age: timedelta | None = _positive_timedelta(retention_max_age, "retention_max_age")
        elif episodic.retention_max_age_s:
            max_age = timedelta(seconds=episodic.retention_max_age_s)
        else:
            max_age = None
        target = _path_arg(path, "path") if str(path) != ":memory:" else Path(":memory:")
        folder = archive_dir if archive_dir is not None else episodic.archive_dir
        archive_folder = None
        if folder is not None:
            archive_folder = Path(os.fspath(folder)).expanduser()
            if not archive_folder.is_absolute():
                archive_folder = (target.parent / archive_folder).absolute()

        problem = None
        if embedder is None:
            try:
                if config.embedding.model in ("", "default"):
                    embedder = default_embedder()
                else:
                    embedder = load_embedder(
                        config.embedding.model, dim=config.embedding.dim, threads=config.embedding.threads
                    )
            except EmbedderUnavailableError as exc:
                embedder, problem = None, str(exc)
        elif not isinstance(embedder, Embedder):
            raise InvalidInputError(
                f"embedder must implement the Embedder protocol, got {type(embedder).__name__}"
            )

        db = open_database(target)
        try:
            apply_migrations(db, "episodic", _MIGRATIONS)
            refresh_keyword_terms(
                db, table="episodes", column="ident", source="coalesce(title, '') || ' ' || content"
            )
            return cls(
                db,
                embedder=embedder,
                embedder_problem=problem,
                config=config,
                clock=clock,
                recency_half_life=half_life,
                retention_max_count=max_count,
                retention_max_age=max_age,
                archive_dir=archive_folder,
            )
        except BaseException:
            db.close()
            raise

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

    # -- writing -------------------------------------------------------------------------------

    def _item(
        self,
        content: object,
        title: object,
        task_run_id: object,
        tags: object,
        kind: object,
        at: object,
        prefix: str = "",
        now: datetime | None = None,
        vector: object = None,
    ) -> _Item:
        now = self._now() if now is None else now
        when = now if at is None else check_aware(at, f"{prefix}at")
        return _Item(
            uuid=self.new_uuid(),
            at_us=to_us(when),
            kind=check_category(kind, f"{prefix}kind"),
            task_run_id=check_task_id(task_run_id, f"{prefix}task_run_id", optional=True),
            title=check_optional_text(title, f"{prefix}title", max_chars=MAX_TITLE_CHARS),
            content=check_content(content, f"{prefix}content", max_bytes=self._config.max_content_bytes),
            tags=dump_tags(check_tags(tags, f"{prefix}tags")),
            recorded_us=to_us(now),
            vector=self._checked_vector(vector, f"{prefix}vector"),
        )

    def _checked_vector(self, vector: object, name: str) -> FloatArray | None:
        """A caller's vector for an episode, unit length; ``None`` in keyword-only mode (there is
        no model it could belong to)."""
        if vector is None or self._embedder is None:
            return None
        dim = self._embedder.dim
        try:
            array = np.asarray(vector, dtype=np.float32).reshape(-1)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"{name} must be an array of {dim} numbers: {exc}") from exc
        norm = float(np.linalg.norm(array)) if array.shape == (dim,) else 0.0
        if array.shape != (dim,) or not math.isfinite(norm) or norm == 0.0:
            raise InvalidInputError(
                f"{name} must be {dim} finite numbers, not all zero (a vector of the store's model "
                f"{self._embedder.model_id!r}); got shape {array.shape}"
            )
        unit: FloatArray = (array / norm).astype(np.float32)
        return unit

    def record(
        self,
        content: str,
        *,
        title: str | None = None,
        task_run_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        kind: str = "note",
        at: datetime | None = None,
        vector: FloatArray | None = None,
    ) -> int:
        """Store one episode; returns its id once the write is committed.

        ``at`` must be timezone-aware (default: the clock's now). ``kind`` is a short label such
        as ``note``, ``observation`` or ``task-outcome`` (``[a-z0-9][a-z0-9_-]{0,63}``).
        ``vector``: the episode's vector, already computed with the store's model (e.g. shared
        with a knowledge entry of the same text), instead of embedding title and content;
        ignored in keyword-only mode.
        """
        self._open_db()
        return self._insert([self._item(content, title, task_run_id, tags, kind, at, vector=vector)])[0]

    def record_many(self, items: Iterable[Mapping[str, Any]]) -> list[int]:
        """Store many episodes in one transaction with one embedding batch; returns their ids.

        Each item is a mapping with :meth:`record`'s keyword names (``content`` required). All
        items are checked before anything is written.
        """
        self._open_db()
        if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
            raise InvalidInputError(f"items must be an iterable of mappings, got {type(items).__name__}")
        now = self._now()
        checked: list[_Item] = []
        for n, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise InvalidInputError(f"items[{n}] must be a mapping, got {type(item).__name__}")
            unknown = set(item) - _RECORD_KEYS
            if unknown:
                raise InvalidInputError(f"items[{n}] has unknown key(s) {sorted(map(str, unknown))}")
            if "content" not in item:
                raise InvalidInputError(f"items[{n}] lacks 'content'")
            checked.append(
                self._item(
                    item["content"],
                    item.get("title"),
                    item.get("task_run_id"),
                    item.get("tags"),
                    item.get("kind", "note"),
                    item.get("at"),
                    prefix=f"items[{n}].",
                    now=now,
                    vector=item.get("vector"),
                )
            )
        return self._insert(checked)

    def _next_id(self) -> int:
        return 1 + int(
            self._db.scalar(
                "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'episodes'), 0), "
                "coalesce((SELECT max(id) FROM episodes), 0))"
            )
        )

    def _insert(self, items: Sequence[_Item], vectors: FloatArray | None = None) -> list[int]:
        if not items:
            return []
        db = self._db
        embedder = self._embedder
        embedded = False
        if vectors is None and embedder is not None:
            rows = [i.vector for i in items]
            todo = [n for n, row in enumerate(rows) if row is None]  # the others came with a vector
            try:
                if todo:
                    computed = self._embed(
                        embedder, [(items[n].title, items[n].content, items[n].at_us) for n in todo]
                    )
                    for row, n in zip(computed, todo, strict=True):
                        rows[n] = row
                    embedded = True
                vectors = np.stack([row for row in rows if row is not None]).astype(np.float32, copy=False)
            except EmbeddingError as exc:  # the episodes are stored anyway; their vectors are pending
                self._last_error = str(exc)
                log.warning("episodic %s: storing without vectors, the embedder failed: %s", self.path, exc)
        with db.transaction():
            db.on_rollback(self._drop_matrix)
            start = self._next_id()
            ids = list(range(start, start + len(items)))
            db.executemany(
                f"INSERT INTO episodes({EPISODE_COLUMNS}, ident) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [item.row(ident) for ident, item in zip(ids, items, strict=True)],
            )
            refresh_context(db, ids)
            if vectors is not None and self._vectors is not None and self._vectors.available:
                self._vectors.upsert_many(ids, vectors)
                if self._matrix is not None:
                    self._matrix.add(ids, vectors, [i.at_us for i in items], [i.task_run_id for i in items])
        if vectors is None and embedder is not None:
            self._pending_ids.update(ids)
        elif embedded and self._pending_ids:  # the model works again: catch up (bounded per write)
            self._embed_missing(sorted(self._pending_ids)[:1000])
        return ids

    # -- reading -------------------------------------------------------------------------------

    def get(self, episode_id: int) -> Episode | None:
        """The live episode with this id, or ``None``."""
        db = self._open_db()
        if isinstance(episode_id, bool) or not isinstance(episode_id, int):
            raise InvalidInputError(f"episode_id must be an integer, got {episode_id!r}")
        row = db.execute(f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE id = ?", (episode_id,)).fetchone()
        return None if row is None else episode_from_row(row)

    def deleted_uuids(self, uuids: Iterable[str]) -> set[str]:
        """Those of ``uuids`` whose episode was deleted (see :meth:`delete`)."""
        db = self._open_db()
        sql = "SELECT uuid FROM deleted_episodes WHERE uuid IN"
        return {str(r[0]) for r in query_in(db, sql, list(uuids))}

    def count(self) -> int:
        """Live episodes (archived ones are not counted)."""
        return int(self._open_db().scalar("SELECT count(*) FROM episodes"))

    def _bounds(self, since: object, until: object) -> tuple[int | None, int | None]:
        since_us = None if since is None else to_us(check_aware(since, "since"))
        until_us = None if until is None else to_us(check_aware(until, "until"))
        if since_us is not None and until_us is not None and since_us > until_us:
            raise InvalidInputError(
                f"since ({from_us(since_us).isoformat()}) is after until ({from_us(until_us).isoformat()})"
            )
        return since_us, until_us

    def timeline(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        task_run_id: str | None = None,
        limit: int | None = 100,
        newest_first: bool = False,
        offset: int = 0,
    ) -> list[Episode]:
        """Live episodes in time order, oldest first (``since`` inclusive, ``until`` exclusive).

        ``limit`` caps the count (``None``: all); ``newest_first=True`` returns the most recent
        ones, newest first; ``offset`` skips that many first (pages of a long timeline).
        """
        db = self._open_db()
        since_us, until_us = self._bounds(since, until)
        run = check_task_id(task_run_id, "task_run_id", optional=True)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise InvalidInputError(f"limit must be a non-negative integer or None, got {limit!r}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidInputError(f"offset must be a non-negative integer, got {offset!r}")
        conds, params = time_conditions(since_us, until_us, run)
        where = " WHERE " + " AND ".join(conds) if conds else ""
        order = "DESC" if newest_first else "ASC"
        sql = f"SELECT {EPISODE_COLUMNS} FROM episodes e{where} ORDER BY e.at_us {order}, e.id {order}"
        if limit is not None or offset:
            sql += " LIMIT ? OFFSET ?"
            params += [-1 if limit is None else limit, offset]
        return [episode_from_row(r) for r in db.query(sql, params)]

    def delete(self, episode_id: int) -> bool:
        """Delete a live episode for good: its row, vector and full-text entries, and its words
        in its neighbours' conversation context. True if it existed.

        Its uuid is remembered: an archive file written before keeps its copy (archives never
        change once written), but ``search(include_archives=True)`` drops that copy and
        :meth:`restore` skips it, so no search and no archive brings it back.
        """
        db = self._open_db()
        if isinstance(episode_id, bool) or not isinstance(episode_id, int):
            raise InvalidInputError(f"episode_id must be an integer, got {episode_id!r}")
        with db.transaction():
            row = db.execute(
                "SELECT task_run_id, at_us, uuid FROM episodes WHERE id = ?", (episode_id,)
            ).fetchone()
            if row is None:
                return False
            run, at_us, uuid = row
            db.execute(
                "INSERT OR REPLACE INTO deleted_episodes(uuid, deleted_us) VALUES (?, ?)",
                (str(uuid), to_us(self._now())),
            )
            near: list[int] = []
            if run is not None:  # the neighbours whose context held its text
                near += [
                    int(r[0])
                    for r in db.query(
                        "SELECT id FROM episodes WHERE task_run_id = ? AND (at_us, id) < (?, ?) "
                        "ORDER BY at_us DESC, id DESC LIMIT ?",
                        (run, at_us, episode_id, CONTEXT_TURNS),
                    )
                ]
                near += [
                    int(r[0])
                    for r in db.query(
                        "SELECT id FROM episodes WHERE task_run_id = ? AND (at_us, id) > (?, ?) "
                        "ORDER BY at_us, id LIMIT ?",
                        (run, at_us, episode_id, CONTEXT_TURNS),
                    )
                ]
            db.on_rollback(self._drop_matrix)
            db.execute("DELETE FROM episodes WHERE id = ?", (episode_id,))
            self._delete_vectors([episode_id])
            if self._matrix is not None:
                self._matrix.remove([episode_id])
            self._pending_ids.discard(episode_id)
            if near and has_context(db):
                refresh_context(db, near)
        return True

    # -- search --------------------------------------------------------------------------------

    def search(
        self,
        query: str,
        *,
        top_k: int = 10,
        task_run_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        mode: str = "hybrid",
        recency_half_life: timedelta | _Default | None = DEFAULT,
        include_archives: bool = False,
        neighbours: int = 0,
    ) -> list[EpisodeHit]:
        """Hybrid search, best first: vector and keyword lists fused by weighted RRF
        (``storage.fuse``); an episode's keyword side also counts the words of its neighbours
        in the same task run, at a lower weight.

        Filters are exact: ``task_run_id`` equality, ``since`` inclusive, ``until`` exclusive.
        ``recency_half_life`` multiplies each fused score by ``0.5 ** (age / half_life)``
        (``None``: no decay; default: the store's setting). ``include_archives`` also searches
        the archives this store created; their hits have ``hit.source == "archive"``.
        ``neighbours`` (conversation mode, for episodes that are turns of a dialogue) returns with
        each hit the ``neighbours`` episodes of its task run before and after it
        (``hit.neighbours``, in time order, the hit included). Any string is a valid query.
        """
        self._open_db()
        if not isinstance(query, str):
            raise InvalidInputError(f"query must be a string, got {type(query).__name__}")
        check_top_k(top_k)
        run = check_task_id(task_run_id, "task_run_id", optional=True)
        since_us, until_us = self._bounds(since, until)
        mode = validate_mode(mode)
        if recency_half_life is DEFAULT:
            half_life = self._half_life
        elif recency_half_life is None:
            half_life = None
        else:
            half_life = _positive_timedelta(recency_half_life, "recency_half_life")
        if not isinstance(include_archives, bool):
            raise InvalidInputError(f"include_archives must be True or False, got {include_archives!r}")
        if (
            isinstance(neighbours, bool)
            or not isinstance(neighbours, int)
            or not 0 <= neighbours <= MAX_NEIGHBOURS
        ):
            raise InvalidInputError(
                f"neighbours must be an integer from 0 to {MAX_NEIGHBOURS}, got {neighbours!r}"
            )
        now_us = to_us(self._now()) if half_life is not None else 0

        if not query.strip():
            return []
        keywords = build_keyword_query(query) if mode != "vector" else KeywordQuery(None, None, ())
        query_vector = None
        if mode != "keyword" and self._embedder is not None:
            try:
                query_vector = embed_query(self._embedder, query[:EMBED_CHARS])
            except EmbeddingError as exc:
                self._last_error = str(exc)
                if mode == "vector":  # nothing else was asked for: an empty answer would be wrong
                    raise
                log.warning(
                    "episodic %s: searching by keywords only, the embedder failed: %s", self.path, exc
                )
        if query_vector is None and keywords.empty:
            return []

        sources = [_Source(self._db, None, self._matrix_now() if query_vector is not None else None)]
        if include_archives:
            sources.extend(self._archive_sources(since_us, until_us, query_vector is not None))
        if query_vector is not None:
            for source in sources:
                if source.matrix is not None:
                    source.ranking = source.matrix.rank(
                        query_vector, since_us=since_us, until_us=until_us, task_run_id=run
                    )
        hits = _Search(
            self,
            sources,
            query_vector,
            keywords,
            time_conditions(since_us, until_us, run),
            top_k=top_k,
            half_life_us=None if half_life is None else half_life / timedelta(microseconds=1),
            now_us=now_us,
        ).run()
        if neighbours:
            databases = {s.label: s.db for s in sources}
            hits = [
                replace(
                    h, neighbours=neighbouring_episodes(databases[h.episode.archive], h.episode, neighbours)
                )
                if h.episode.archive in databases
                else h
                for h in hits
            ]
        return hits

    def _archive_sources(self, since_us: int | None, until_us: int | None, vectors: bool) -> list[_Source]:
        sources = []
        rows = self._db.query("SELECT path, first_at_us, last_at_us FROM archives ORDER BY created_us, path")
        for path, first, last in rows:
            if first is not None and until_us is not None and first >= until_us:
                continue
            if last is not None and since_us is not None and last < since_us:
                continue
            archive = self._archive(path)
            if archive is None:
                continue
            matrix = None
            if vectors and self._embedder is not None:
                matrix = self._archive_matrix(path, archive)
            sources.append(_Source(archive.db, path, matrix, archive))
        return sources

    def _archive(self, path: str) -> ArchiveFile | None:
        """A tracked archive, opened once and reopened if the file changes; ``None`` if unusable."""
        try:
            stat = os.stat(path)
            signature = (stat.st_mtime_ns, stat.st_size)
        except OSError as exc:
            self._archive_unusable(path, f"cannot read it: {exc.strerror or exc}")
            return None
        cached = self._archives.get(path)
        if cached is not None and cached[0] == signature:
            return cached[1]
        if cached is not None:
            cached[1].close()
            del self._archives[path]
            self._matrices.pop(path, None)
        try:
            archive = ArchiveFile(Path(path), verify=False)
        except ArchiveError as exc:
            self._archive_unusable(path, str(exc))
            return None
        self._archives[path] = (signature, archive)
        self._archive_problems.pop(path, None)
        return archive

    def _archive_unusable(self, path: str, problem: str) -> None:
        if self._archive_problems.get(path) != problem:
            log.warning("episodic archive %s is skipped: %s", path, problem)
        self._archive_problems[path] = problem

    def _archive_matrix(self, path: str, archive: ArchiveFile) -> TimedMatrix | None:
        """The archive's vectors, if the current model made them (else it is searched by keywords)."""
        embedder = self._embedder
        if embedder is None or archive.model_id != embedder.model_id or archive.dim != embedder.dim:
            return None
        if path not in self._matrices:
            try:
                self._matrices[path] = archive.matrix()
            except ArchiveError as exc:
                self._archive_unusable(path, str(exc))
                self._matrices[path] = None
        return self._matrices[path]

    # -- archives ------------------------------------------------------------------------------

    def archive(
        self,
        path: str | os.PathLike[str],
        *,
        before: datetime | None = None,
        task_run_id: str | None = None,
        remove: bool = True,
    ) -> int:
        """Move episodes into a new archive file at ``path``; returns how many were archived.

        Selects episodes older than ``before`` (exclusive) and/or of ``task_run_id`` (all if
        neither is given). The file is written, synced and checked before the episodes are
        removed from the live store, in one transaction. With ``remove=False`` they are copied.
        Nothing matched: no file is written and 0 is returned. The archive is tracked by this
        store so ``search(include_archives=True)`` finds its episodes.
        """
        db = self._open_db()
        target = _path_arg(path, "path")
        before_us = None if before is None else to_us(check_aware(before, "before"))
        run = check_task_id(task_run_id, "task_run_id", optional=True)
        if not isinstance(remove, bool):
            raise InvalidInputError(f"remove must be True or False, got {remove!r}")
        conds, params = time_conditions(None, before_us, run)
        where = " WHERE " + " AND ".join(conds) if conds else ""
        ids = [
            int(r[0]) for r in db.query(f"SELECT e.id FROM episodes e{where} ORDER BY e.at_us, e.id", params)
        ]
        selection = describe_filter(before, run)
        return self._archive_ids(target, ids, remove=remove, selection=selection)

    def _rows(self, ids: Sequence[int]) -> list[Any]:
        rows = query_in(self._db, f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE id IN", ids)
        rows.sort(key=lambda r: (r[2], r[0]))
        return rows

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

    def _archive_ids(
        self, path: Path, ids: Sequence[int], *, remove: bool, selection: Mapping[str, str | int]
    ) -> int:
        if not ids:
            return 0
        db = self._db
        rows = self._rows(ids)
        if remove and len(ids) >= BULK_DELETE_MIN:
            self._matrix_now()  # before the transaction: scans are slow beside many dirty pages
        ids = [int(r[0]) for r in rows]
        model = get_meta(db, "embedding_model")
        dim_text = get_meta(db, "embedding_dim")
        vectors = self._stored_vectors(ids) if model and dim_text else {}
        meta: dict[str, str | int] = {
            **selection,
            "source_store_uuid": self.store_uuid,
            "source_path": str(self.path),
        }
        archive_uuid = write_archive(
            path,
            rows,
            vectors,
            model_id=model,
            dim=int(dim_text) if dim_text else None,
            meta=meta,
        )
        try:
            with db.transaction():
                db.on_rollback(self._drop_matrix)
                if remove:
                    query_in(db, "DELETE FROM episodes WHERE id IN", ids)
                    self._delete_vectors(ids)
                db.execute(
                    "INSERT OR REPLACE INTO archives(path, archive_uuid, episodes, removed, first_at_us, "
                    "last_at_us, created_us) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        str(path),
                        archive_uuid,
                        len(rows),
                        int(remove),
                        rows[0][2],
                        rows[-1][2],
                        to_us(self._now()),
                    ),
                )
                if remove and self._matrix is not None:
                    self._matrix.remove(ids)
        except BaseException:
            with contextlib.suppress(OSError):
                path.unlink()  # the live store kept everything; the copy is not tracked
            raise
        return len(rows)

    def restore(self, path: str | os.PathLike[str]) -> int:
        """Bring an archive's episodes back into this store; returns how many were added.

        Idempotent: episodes are matched by uuid, so restoring twice adds nothing. Into the store
        that archived them they get their original ids back; into another store, new ids. Stored
        vectors are reused when the archive was embedded by this store's model. A damaged,
        truncated or foreign file raises :class:`ArchiveError` and changes nothing.
        """
        db = self._open_db()
        target = _path_arg(path, "path")
        archive = ArchiveFile(target, verify=True)
        try:
            rows = archive.rows()
            stored = archive.vectors()
            same_store = archive.source_store_uuid == self.store_uuid
            archive_model, archive_dim = archive.model_id, archive.dim
        finally:
            archive.close()
        uuids = [str(r[1]) for r in rows]
        live = {str(r[0]) for r in query_in(db, "SELECT uuid FROM episodes WHERE uuid IN", uuids)}
        live |= self.deleted_uuids(uuids)  # deleted for good: never restored
        todo = []
        seen: set[str] = set()
        for row in rows:
            if row[1] not in live and row[1] not in seen:
                seen.add(row[1])
                todo.append(row)
        if not todo:
            return 0

        vectors = self._restore_vectors(todo, stored, archive_model, archive_dim)
        items = [
            _Item(
                uuid=str(r[1]),
                at_us=int(r[2]),
                kind=str(r[3]),
                task_run_id=r[4],
                title=r[5],
                content=str(r[6]),
                tags=dump_tags(check_tags(load_tags(r[7]))),
                recorded_us=int(r[8]),
            )
            for r in todo
        ]
        with db.transaction():
            db.on_rollback(self._drop_matrix)
            keep: set[int] = set()
            if same_store:
                wanted = [int(r[0]) for r in todo]
                taken = {int(r[0]) for r in query_in(db, "SELECT id FROM episodes WHERE id IN", wanted)}
                keep = set(wanted) - taken
            next_id = max([self._next_id() - 1, *keep]) + 1
            ids: list[int] = []
            for row in todo:
                if int(row[0]) in keep:
                    ids.append(int(row[0]))
                else:
                    ids.append(next_id)
                    next_id += 1
            db.executemany(
                f"INSERT INTO episodes({EPISODE_COLUMNS}, ident) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [item.row(ident) for ident, item in zip(ids, items, strict=True)],
            )
            refresh_context(db, ids)
            if vectors is not None and self._vectors is not None and self._vectors.available:
                self._vectors.upsert_many(ids, vectors)
                if self._matrix is not None:
                    self._matrix.add(ids, vectors, [i.at_us for i in items], [i.task_run_id for i in items])
        return len(todo)

    def _restore_vectors(
        self, rows: Sequence[Any], stored: Mapping[int, bytes], model: str | None, dim: int | None
    ) -> FloatArray | None:
        """The archive's own vectors when the same model made them, else fresh ones (or none)."""
        embedder = self._embedder
        if embedder is not None:
            current_model, current_dim = embedder.model_id, embedder.dim
        else:  # keyword-only: keep the archive's vectors if they match what this store holds
            current_model = get_meta(self._db, "embedding_model") or ""
            current_dim = self._vectors.dim if self._vectors is not None else 0
        if model == current_model and dim == current_dim and all(int(r[0]) in stored for r in rows):
            blob = b"".join(stored[int(r[0])] for r in rows)
            return np.frombuffer(blob, dtype=np.float32).reshape(len(rows), current_dim).copy()
        if embedder is None:
            return None
        return self._embed(embedder, [(r[5], r[6], r[2]) for r in rows])

    # -- promotion -----------------------------------------------------------------------------

    def promote(
        self,
        episode_ids: Iterable[int],
        knowledge_store: _KnowledgeSink,
        *,
        category: str = "outcome",
    ) -> list[int]:
        """Copy episodes into a ``KnowledgeStore``; returns the knowledge entry ids.

        Each entry keeps the episode's tags plus ``episode_id`` and ``task_run_id`` (``""``
        when the episode had none), so long-term knowledge can say where it came from. Every
        id is checked before anything is added.
        """
        self._open_db()
        if isinstance(episode_ids, str | bytes) or not isinstance(episode_ids, Iterable):
            raise InvalidInputError(f"episode_ids must be an iterable of integers, got {episode_ids!r}")
        ids = list(episode_ids)
        check_category(category, "category")
        add = getattr(knowledge_store, "add", None)
        if not callable(add):
            raise InvalidInputError(
                f"knowledge_store must have an add() method, got {type(knowledge_store).__name__}"
            )
        episodes = []
        for ident in ids:
            episode = self.get(ident)
            if episode is None:
                raise InvalidInputError(f"episode_ids: there is no live episode {ident}")
            episodes.append(episode)
        new_ids = []
        for episode in episodes:
            tags = promotion_tags(episode)
            new_ids.append(knowledge_store.add(episode.content, category=category, tags=tags))
        return new_ids

    # -- retention, durability, status ---------------------------------------------------------

    def commit(self) -> int:
        """Apply the retention policy, then make every write durable; returns episodes retired."""
        db = self._open_db()
        retired = self._apply_retention()
        with contextlib.suppress(StorageError):  # a reader may hold the WAL: the commit is still synced
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        return retired

    def _apply_retention(self) -> int:
        if self._max_count is None and self._max_age is None:
            return 0
        db = self._db
        ids: set[int] = set()
        if self._max_age is not None:
            cutoff = to_us(self._now() - self._max_age)
            ids.update(int(r[0]) for r in db.query("SELECT id FROM episodes WHERE at_us < ?", (cutoff,)))
        if self._max_count is not None:
            ids.update(
                int(r[0])
                for r in db.query(
                    "SELECT id FROM episodes ORDER BY at_us DESC, id DESC LIMIT -1 OFFSET ?",
                    (self._max_count,),
                )
            )
        if not ids:
            return 0
        ordered = sorted(ids)
        if len(ordered) >= BULK_DELETE_MIN:
            self._matrix_now()  # before the transaction: scans are slow beside many dirty pages
        if self._archive_dir is not None:
            self._archive_dir.mkdir(parents=True, exist_ok=True)
            stamp = self._now().astimezone(UTC).strftime("%Y%m%dT%H%M%S%fZ")
            stem = self.path.stem if str(self.path) != ":memory:" else "episodes"
            target = self._archive_dir / f"{stem}-retired-{stamp}.sqlite"
            n = 1
            while target.exists():
                n += 1
                target = self._archive_dir / f"{stem}-retired-{stamp}-{n}.sqlite"
            return self._archive_ids(target, ordered, remove=True, selection={"selected_by": "retention"})
        with db.transaction():
            db.on_rollback(self._drop_matrix)
            query_in(db, "DELETE FROM episodes WHERE id IN", ordered)
            self._delete_vectors(ordered)
            if self._matrix is not None:
                self._matrix.remove(ordered)
        return len(ordered)

    def status(self) -> dict[str, Any]:
        """Counts, search mode (``hybrid`` or ``keyword-only`` and why), model, archives, policy."""
        db = self._open_db()
        first, last = db.execute("SELECT min(at_us), max(at_us) FROM episodes").fetchone()
        archives = []
        for path, auuid, n, removed, created in db.query(
            "SELECT path, archive_uuid, episodes, removed, created_us FROM archives ORDER BY created_us, path"
        ):
            archives.append(
                {
                    "path": path,
                    "archive_uuid": auuid,
                    "episodes": int(n),
                    "removed_from_live": bool(removed),
                    "created_at": from_us(created).isoformat(),
                    "available": os.path.isfile(path) and path not in self._archive_problems,
                    "problem": self._archive_problems.get(path)
                    or (None if os.path.isfile(path) else "the file is missing"),
                }
            )
        vectors = self._vectors
        episodes = self.count()
        vector_count = vectors.count() if vectors is not None else 0
        return {
            "kind": "episodic",
            "path": str(self.path),
            "store_uuid": self.store_uuid,
            "episodes": episodes,
            "vectors": vector_count,
            # episodes still to embed (keyword-only mode, or stored while the model failed)
            "pending_vectors": max(0, episodes - vector_count),
            "last_error": self._last_error,
            "mode": "keyword-only" if self._embedder is None else "hybrid",
            "keyword_only_reason": self._problem if self._embedder is None else None,
            "model": get_meta(db, "embedding_model"),
            "dim": int(get_meta(db, "embedding_dim") or 0) or None,
            "vector_backend": vectors.backend if vectors is not None else None,
            "oldest": None if first is None else from_us(first).isoformat(),
            "newest": None if last is None else from_us(last).isoformat(),
            "archives": archives,
            "archive_format": {"format": ARCHIVE_FORMAT, "format_version": ARCHIVE_VERSION},
            "recency_half_life_s": None if self._half_life is None else self._half_life.total_seconds(),
            "retention": {
                "max_count": self._max_count,
                "max_age_s": None if self._max_age is None else self._max_age.total_seconds(),
                "archive_dir": None if self._archive_dir is None else str(self._archive_dir),
            },
            "repaired_on_open": dict(self._repaired),
            "consistency": None if self._consistency is None else self._consistency.as_dict(),
        }

    def close(self) -> None:
        """Close the store and its archive files (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for _, archive in self._archives.values():
            archive.close()
        self._archives.clear()
        self._matrices.clear()
        self._matrix = None
        self._db.close()

    def __enter__(self) -> EpisodicMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("keyword-only" if self._embedder is None else "hybrid")
        return f"EpisodicMemory({str(self.path)!r}, {state})"


class _Search:
    """One search over live episodes and (optionally) archives, as a single corpus.

    The vector list merges every source's exact ranking by cosine similarity; each keyword
    sub-list (words, CJK trigrams, short CJK runs) merges by its score, and the sub-lists fuse
    by RRF as in a single store. An archived copy of an episode that is live again, or that an
    earlier archive also holds, is dropped (matched by uuid).

    With recency decay, an old episode ranked first can fall below a recent one ranked far
    down both lists, so the lists deepen (x4 per round) until no episode outside them could
    reach the top ``k``; past ``MAX_DEPTH`` the vector list is the whole exact ranking and the
    keyword list stops at ``MAX_DEPTH``. Episodes are int64 keys ``source << 40 | id`` and
    fusion runs in numpy, so deep rounds stay cheap.
    """

    def __init__(
        self,
        memory: EpisodicMemory,
        sources: list[_Source],
        query_vector: FloatArray | None,
        keywords: KeywordQuery,
        conditions: tuple[list[str], list[Any]],
        *,
        top_k: int,
        half_life_us: float | None,
        now_us: int,
    ) -> None:
        self.memory = memory
        self.sources = sources
        self.query_vector = query_vector
        self.keywords = keywords
        self.conds, self.params = conditions
        self.top_k = top_k
        self.half_life_us = half_life_us
        self.now_us = now_us
        search = memory._config.search
        self.rrf_k = search.rrf_k
        self.use_vectors = query_vector is not None and any(s.ranking is not None for s in sources)
        self.use_keywords = not keywords.empty
        self.weights = fusion_weights(
            self.use_vectors, self.use_keywords, search.vector_weight, search.keyword_weight
        )
        self.depth = max(search.depth, top_k)
        self.shadowed: dict[int, bool] = {}
        self.owner: dict[str, int] = {}
        self.keyword_cache: dict[int, tuple[int, list[list[tuple[int, float, int]]]]] = {}

    def run(self) -> list[EpisodeHit]:
        if not self.weights:
            return []
        depth = self.depth
        best = best_score(self.weights, self.rrf_k)
        newest_log_decay: float | None = None
        while True:
            full = depth > MAX_DEPTH
            vkeys, vsims, vat, vector_more = self._vector_list(depth, full=full)
            kkeys, kat, keyword_more = self._keyword_list(min(depth, MAX_DEPTH))
            lists: list[_Keys] = []
            ats: list[_Ints] = []
            if self.use_vectors:
                lists.append(vkeys)
                ats.append(vat)
            if self.use_keywords:
                lists.append(kkeys)
                ats.append(kat)
            fused = _Fused.of(fuse(lists, self.weights, self.rrf_k), ats)
            if self.half_life_us is None:
                order = np.lexsort((fused.first, -fused.scores))
                scores = fused.scores[order]
                break
            # log space: a decay of 0.5 ** (a year / an hour) underflows, yet still ranks
            logs = np.log(fused.scores) + self._log_decay(fused.at)
            order = np.lexsort((fused.first, -fused.at, -logs))
            if full:
                scores = np.exp(logs[order])
                break
            mores = [vector_more] if self.use_vectors else []
            if self.use_keywords:
                mores.append(keyword_more)
            unseen = sum(w for w, more in zip(self.weights, mores, strict=True) if more)
            if unseen == 0:
                scores = np.exp(logs[order])
                break
            if newest_log_decay is None:
                newest_log_decay = float(self._log_decay(np.array([self._newest_at()], dtype=np.int64))[0])
            if len(order) < self.top_k:
                depth *= 4
                continue
            # an unseen episode scores at most unseen / (k + depth + 1) / best, decayed as the newest
            kth = float(logs[order[self.top_k - 1]]) - newest_log_decay
            if kth >= math.log(unseen / (self.rrf_k + depth + 1) / best):
                scores = np.exp(logs[order])
                break
            # the k-th score only grows with depth, so this depth is always enough
            log_needed = math.log(unseen / best) - kth  # log(k + depth + 1) that would do
            if log_needed > math.log(self.rrf_k + MAX_DEPTH + 1):
                depth = MAX_DEPTH + 1
            else:
                needed = math.ceil(math.exp(log_needed)) - self.rrf_k - 1
                depth = max(depth + 1, min(depth * 4, needed))
        top = order[: self.top_k]
        return self._hits(fused, top, scores[: self.top_k], vsims)

    def _log_decay(self, at_us: _Ints) -> npt.NDArray[np.float64]:
        """``log(0.5 ** (age / half_life))``; episodes dated in the future do not decay."""
        assert self.half_life_us is not None
        age = np.maximum(0, self.now_us - at_us).astype(np.float64)
        return -age / self.half_life_us * math.log(2)

    def _newest_at(self) -> int:
        """The newest time any allowed episode has, in any source (bounds unseen episodes)."""
        where = " WHERE " + " AND ".join(self.conds) if self.conds else ""
        newest = [
            s.db.scalar(f"SELECT max(e.at_us) FROM episodes e{where}", self.params) for s in self.sources
        ]
        return max((int(n) for n in newest if n is not None), default=self.now_us)

    # -- candidate lists -----------------------------------------------------------------------

    def _vector_list(self, depth: int, *, full: bool) -> tuple[_Keys, FloatArray, _Ints, bool]:
        empty = np.zeros(0, dtype=np.int64)
        if not self.use_vectors:
            return empty, np.zeros(0, dtype=np.float32), empty, False
        keys, sims, ats = [], [], []
        more = False
        for index, source in enumerate(self.sources):
            if source.ranking is None:
                continue
            size = len(source.ranking) if full else depth
            ids, scores, at = source.ranking.top(size)
            more = more or len(source.ranking) > size
            keys.append((np.int64(index) << _SHIFT) | ids)
            sims.append(scores)
            ats.append(at)
        key = np.concatenate(keys) if keys else empty
        sim = np.concatenate(sims) if sims else np.zeros(0, dtype=np.float32)
        at_all = np.concatenate(ats) if ats else empty
        if len(keys) > 1:
            keep = self._unshadowed(key)
            key, sim, at_all = key[keep], sim[keep], at_all[keep]
            order = np.argsort(-sim, kind="stable")  # source order breaks ties
            if not full and len(order) > depth:
                order, more = order[:depth], True
            key, sim, at_all = key[order], sim[order], at_all[order]
        return key, sim, at_all, more

    def _keyword_list(self, depth: int) -> tuple[_Keys, _Ints, bool]:
        empty = np.zeros(0, dtype=np.int64)
        if not self.use_keywords:
            return empty, empty, False
        fetched = [self._source_keywords(index, depth) for index in range(len(self.sources))]
        more = any(len(sub) > depth or len(sub) >= limit for limit, lists in fetched for sub in lists)
        per_source = [[sub[:depth] for sub in lists] for _, lists in fetched]
        count = max((len(lists) for lists in per_source), default=0)
        subkeys: list[_Keys] = []
        subats: list[_Ints] = []
        for n in range(count):
            parts = [
                (index, lists[n]) for index, lists in enumerate(per_source) if n < len(lists) and lists[n]
            ]
            if not parts:
                subkeys.append(empty)
                subats.append(empty)
                continue
            key = np.concatenate(
                [(np.int64(i) << _SHIFT) | np.array([r[0] for r in rows]) for i, rows in parts]
            )
            score = np.concatenate([np.array([r[1] for r in rows], dtype=np.float64) for _, rows in parts])
            at = np.concatenate([np.array([r[2] for r in rows], dtype=np.int64) for _, rows in parts])
            if len(parts) > 1:
                keep = self._unshadowed(key)
                key, score, at = key[keep], score[keep], at[keep]
                order = np.argsort(-score, kind="stable")
                if len(order) > depth:
                    order, more = order[:depth], True
                key, at = key[order], at[order]
            subkeys.append(key.astype(np.int64))
            subats.append(at)
        if len(subkeys) == 1:
            return subkeys[0], subats[0], more
        fused = _Fused.of(fuse(subkeys, [1.0] * len(subkeys), PLAIN_RRF_K), subats)
        order = np.lexsort((fused.first, -fused.scores))[:depth]
        return fused.keys[order], fused.at[order], more

    def _source_keywords(self, index: int, depth: int) -> tuple[int, list[list[tuple[int, float, int]]]]:
        """One source's keyword sub-lists, at least ``depth`` long where possible, and the limit
        they were fetched with. FTS5 scores every match whatever the limit, so with decay (which
        may deepen) they are fetched once at the deepest limit and sliced in later rounds."""
        cached = self.keyword_cache.get(index)
        if cached is not None and (cached[0] >= depth or all(len(sub) < cached[0] for sub in cached[1])):
            return cached
        limit = max(depth, MAX_DEPTH) if self.half_life_us is not None else depth
        source = self.sources[index]
        try:
            lists = keyword_lists(source.db, self.keywords, limit, self.conds, self.params)
        except MemstrataError as exc:
            if source.label is None:
                raise
            self.memory._archive_unusable(source.label, f"its full-text index failed: {exc}")
            lists = []
        self.keyword_cache[index] = (limit, lists)
        return limit, lists

    def _unshadowed(self, keys: _Keys) -> npt.NDArray[np.bool_]:
        """Mask dropping archived copies of episodes that are live or held by an earlier archive."""
        unknown: dict[int, list[int]] = {}
        for key in keys.tolist():
            if key >> _SHIFT and key not in self.shadowed:
                unknown.setdefault(key >> _SHIFT, []).append(key & _MASK)
        for index in sorted(unknown):
            archive = self.sources[index].archive
            assert archive is not None
            uuids = archive.uuids(unknown[index])
            sql = "SELECT uuid FROM episodes WHERE uuid IN"
            live = {str(r[0]) for r in query_in(self.sources[0].db, sql, list(uuids.values()))}
            gone = "SELECT uuid FROM deleted_episodes WHERE uuid IN"  # deleted for good: never shown
            live |= {str(r[0]) for r in query_in(self.sources[0].db, gone, list(uuids.values()))}
            for ident, uuid in uuids.items():
                key = (index << _SHIFT) | ident
                owner = self.owner.setdefault(uuid, key)
                self.shadowed[key] = uuid in live or owner != key
        return np.array([not self.shadowed.get(k, False) for k in keys.tolist()], dtype=bool)

    # -- results -------------------------------------------------------------------------------

    def _hits(
        self, fused: _Fused, top: _Ints, scores: npt.NDArray[np.float64], similarities: FloatArray
    ) -> list[EpisodeHit]:
        keys = fused.keys[top].tolist()
        wanted: dict[int, list[int]] = {}
        for key in keys:
            wanted.setdefault(key >> _SHIFT, []).append(key & _MASK)
        episodes: dict[int, Episode] = {}
        for index, ids in wanted.items():
            source = self.sources[index]
            for row in query_in(source.db, f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE id IN", ids):
                episodes[(index << _SHIFT) | int(row[0])] = episode_from_row(row, source.label)
        hits = []
        for position, key in enumerate(keys):
            episode = episodes.get(key)
            if episode is None:  # removed by another connection between the two queries
                continue
            n = int(top[position])
            vrank = (int(fused.ranks[0][n]) or None) if self.use_vectors else None
            krank = (int(fused.ranks[-1][n]) or None) if self.use_keywords else None
            sim = float(similarities[vrank - 1]) if vrank else None
            matrix = self.sources[key >> _SHIFT].matrix
            if sim is None and matrix is not None and self.query_vector is not None:
                sim = matrix.similarity(key & _MASK, self.query_vector)
            hits.append(
                EpisodeHit(
                    episode=episode,
                    score=min(1.0, max(0.0, float(scores[position]))),
                    match_type=match_type(vrank, krank),
                    similarity=sim,
                    vector_rank=vrank,
                    keyword_rank=krank,
                )
            )
        return hits


_Keys = npt.NDArray[np.int64]
_Ints = npt.NDArray[np.int64]
_SHIFT = 40  # an episode key is ``source << 40 | id``
_MASK = (1 << _SHIFT) - 1


@dataclass(slots=True)
class _Fused:
    """:func:`storage.fuse`'s result with each key's episode time (for recency decay)."""

    keys: _Keys  # distinct keys
    scores: npt.NDArray[np.float64]  # fused, normalised to 0..1
    first: _Ints  # first appearance across the lists (ties keep it)
    at: _Ints
    ranks: list[_Ints]  # 1-based rank in each list, 0 where absent

    @classmethod
    def of(cls, fused: FusedArrays, ats: Sequence[_Ints]) -> _Fused:
        every = np.concatenate(ats) if ats else np.zeros(0, dtype=np.int64)
        at = every[fused.first] if len(every) else np.zeros(0, dtype=np.int64)
        return cls(fused.keys, fused.scores, fused.first, at.astype(np.int64), fused.ranks)
