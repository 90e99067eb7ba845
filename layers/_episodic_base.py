"""The episodic store's state: its connection, model, vectors (with their in-memory matrix)
and their upkeep (model changes, pending vectors, consistency); writes, search, archives and
retention build on it (see ``EpisodicMemory``).

This module opens the store (vectors set up for the model, consistency checked); what every part
reads is :mod:`._episodic_state`, pending vectors :mod:`._episodic_pending`, argument checks
:mod:`._episodic_inputs` and the schema :mod:`._episodic_migrations`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from memstrata.core.config import Config
from memstrata.core.errors import EmbeddingError
from memstrata.storage import (
    CheckTarget,
    ConsistencyReport,
    Database,
    Embedder,
    KeywordIndex,
    OpenCheck,
    VectorIndex,
    check_consistency,
    embedding_mismatch,
    get_meta,
    record_embedding,
    set_meta,
)

from ._archive import ArchiveFile
from ._episode_records import EPISODE_KEYWORDS
from ._episode_vectors import EpisodeVectors
from ._episodic_inputs import _random_uuid
from ._episodic_pending import PendingVectors

__all__ = ["EpisodicBase", "log"]

log = logging.getLogger("memstrata.episodic")


class EpisodicBase(PendingVectors):
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
        defer_vectors: bool = False,
    ) -> None:
        # its keyword ranker is the live store's, told of every write made here (:meth:`_indexed`,
        # :meth:`_unindexed`); each archive has its own (``_archive_keywords``)
        super().__init__(db, embedder, EPISODE_KEYWORDS, defer_vectors=defer_vectors)
        self._config = config
        self._clock = clock
        self._half_life = recency_half_life
        self._max_count = retention_max_count
        self._max_age = retention_max_age
        self._archive_dir = archive_dir
        self._problem = embedder_problem
        self._matrix = None
        self._matrix_version = -1
        self._archives: dict[str, tuple[tuple[int, int], ArchiveFile]] = {}
        self._archive_problems: dict[str, str] = {}
        self._matrices: dict[str, EpisodeVectors | None] = {}
        self._archive_keywords: dict[str, KeywordIndex] = {}
        self._repaired = {"embedded": 0, "orphans_removed": 0, "rebuilt": 0}
        self._consistency: ConsistencyReport | None = None
        self._pending_ids = set()
        # the uuid of a new episode or archive; a system sets a seeded source so simulations replay
        self.new_uuid: Callable[[], str] = _random_uuid
        store_uuid = get_meta(db, "store_uuid")  # read first: opening a named store writes nothing
        self._named_here = False  # this open made the store: see name_store
        if store_uuid is None:
            with db.transaction():
                store_uuid = get_meta(db, "store_uuid")  # another process may have named it meanwhile
                if store_uuid is None:
                    store_uuid, self._named_here = _random_uuid(), True
                    set_meta(db, "store_uuid", store_uuid)
        self.store_uuid = store_uuid
        self._find_moved_archives()
        self._setup_vectors()

    def _find_moved_archives(self) -> None:
        """An archive whose recorded path is gone but whose file (same archive uuid) stands in
        this store's archives folder, as after the data dir was moved, is recorded there."""
        if str(self._db.path) == ":memory:":
            return
        folder = self._db.path.parent / "archives"  # the data dir's episodic/archives
        moved = []
        for path, archive_uuid in self._db.query("SELECT path, archive_uuid FROM archives"):
            candidate = folder / Path(path).name
            if Path(path).is_file() or not candidate.is_file() or str(candidate) == path:
                continue
            try:
                found = ArchiveFile(candidate, verify=False)
            except Exception:  # not an archive: the recorded one stays missing, as status says
                continue
            try:
                if found.archive_uuid == archive_uuid:
                    moved.append((str(candidate), path))
            finally:
                found.close()
        if moved:
            with self._db.transaction():
                self._db.executemany("UPDATE OR IGNORE archives SET path = ? WHERE path = ?", moved)
            log.info("episodic store %s: %d archive(s) found in their new place", self._db.path, len(moved))

    def name_store(self, store_uuid: str) -> bool:
        """Give the store ``store_uuid`` if this open created it and no archive holds its uuid
        yet (a seeded system names its stores from the seed, so a simulation leaves the same
        files); a store that existed before keeps its uuid. Returns whether it was named."""
        if not self._named_here:
            return False
        self._named_here = False
        with self._db.transaction():
            set_meta(self._db, "store_uuid", store_uuid)
        self.store_uuid = store_uuid
        return True

    def count_open(self) -> int:
        """Count this open among the store's opens, 1 for the first. A seeded system draws each
        open's uuids from a sequence named after it, so no restart hands out a uuid again, however
        many episodes were deleted or archived since."""
        with self._db.transaction():
            opens = int(get_meta(self._db, "opens") or 0) + 1
            set_meta(self._db, "opens", str(opens))
        return opens

    def _setup_vectors(self) -> None:
        """Open the vector table, rebuild it for a new model, then check the store's consistency
        (a read-only store writes nothing: keyword-only when its vectors cannot serve the model)."""
        db = self._db
        stored_dim_text = get_meta(db, "vector_dim:episodes")
        stored_dim = int(stored_dim_text) if stored_dim_text else None
        embedder = self._embedder
        if embedder is not None and db.read_only:
            problem = _read_only_problem(db, embedder, stored_dim)
            if problem is not None:
                self._problem, self._embedder = problem, None
                embedder = None
        if embedder is None:
            if stored_dim is not None:  # keep archives, restores and deletes consistent
                self._vectors = VectorIndex(db, "episodes", stored_dim, mirror=False)
            self._start_check()
            return
        self._vectors = VectorIndex(db, "episodes", stored_dim or embedder.dim, mirror=False)
        if not self._vectors.available:
            self._problem = f"vectors unavailable: {db.vec_reason}"
            self._embedder = None
            self._start_check()
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
            if get_meta(db, "embedding_model") is None and not db.read_only:
                with db.transaction():
                    record_embedding(db, embedder.model_id, embedder.dim)
        self._start_check()

    def _start_check(self) -> None:
        """The open's check: at once on a small store, beside the first calls on a large one."""
        self._open_check = OpenCheck(self._db, self._check_args(), self.check)

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
            record_embedding(db, embedder.model_id, embedder.dim)
        if old_model and old_model != embedder.model_id:
            self._cache.clear(old_model)
        self._repaired["rebuilt"] = len(rows)
        self._matrix = None

    def _check_args(self) -> CheckTarget:
        """What the consistency check compares: the episodes, their full-text indexes and their
        vectors (none are expected in keyword-only mode: they wait for a model)."""
        hybrid = self._embedder is not None and self._vectors is not None
        return {
            "table": "episodes",
            "fts": {"episodes_fts": None, "episodes_tri": None},
            "vectors": self._vectors,
            "vector_rows": None if hybrid else "0",
        }

    def check(self, *, full: bool = False) -> ConsistencyReport:
        """Compare episodes, full-text indexes and vectors; repair what disagrees (run on open).

        Full-text indexes that disagree with the episodes are rebuilt, vectors of missing episodes
        are deleted and episodes without a vector are embedded (left pending in keyword-only
        mode or when the model fails). ``full=True`` also re-tokenises every episode to verify the
        full-text indexes. The report is kept for :meth:`status`.
        """
        self._open_db()
        hybrid = self._embedder is not None and self._vectors is not None
        report = check_consistency(
            self._db,
            **self._check_args(),
            repair_missing=(self._defer_missing if self.defer_vectors else self._embed_missing)
            if hybrid
            else None,
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


def _read_only_problem(db: Database, embedder: Embedder, stored_dim: int | None) -> str | None:
    """Why a read-only store cannot use its vectors with ``embedder`` (it could not make or
    rebuild them), or ``None``: they serve it as they are."""
    if stored_dim is None:
        return "no vector index (the store is read-only: none is made)"
    if stored_dim == embedder.dim and embedding_mismatch(db, embedder.model_id, embedder.dim) is None:
        return None
    return (
        f"vectors were made by another model ({get_meta(db, 'embedding_model')}); the store is "
        f"read-only, so they are not rebuilt for {embedder.model_id!r}"
    )
