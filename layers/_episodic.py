"""Episodic memory: what one agent experienced, in time order, searchable and archivable.

Episodes are immutable records (content, title, task run, tags, kind, an aware time). Search
fuses a vector list and a keyword list with Reciprocal Rank Fusion, restricted exactly to a
task run and a time range, optionally decayed by age so recent episodes win ties. Old episodes
move to single-file archives that stay searchable and can be restored into any store.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from memstrata.core.closing import Closeable
from memstrata.core.config import Config
from memstrata.core.constants import MAX_TAGS
from memstrata.core.errors import (
    EmbedderUnavailableError,
    InvalidInputError,
)
from memstrata.core.validation import (
    check_category,
)
from memstrata.storage import (
    ConsistencyReport,
    Embedder,
    apply_migrations,
    get_meta,
    load_embedder,
    open_database,
    refresh_keyword_terms,
)

from ._archive import ARCHIVE_FORMAT, ARCHIVE_VERSION
from ._episode_records import (
    Episode,
    EpisodeHit,
    from_us,
    to_us,
)
from ._episodic_archives import EpisodicArchives
from ._episodic_inputs import (
    DEFAULT,
    _optional_count,
    _path_arg,
    _span_or_configured,
    _utc_now,
    free_archive_path,
)
from ._episodic_migrations import _MIGRATIONS
from ._episodic_state import BULK_DELETE_MIN

__all__ = ["DEFAULT", "Episode", "EpisodeHit", "EpisodicMemory", "promotion_tags"]


def promotion_tags(episode: Episode) -> dict[str, str]:
    """The tags of a knowledge entry promoted from ``episode``: its own, plus ``episode_id`` and
    ``task_run_id`` (``""`` when it had none), so the entry says where it came from. An
    episode with too many tags to add those two is refused by name."""
    tags = {**episode.tags, "episode_id": str(episode.id), "task_run_id": episode.task_run_id or ""}
    if len(tags) > MAX_TAGS:
        raise InvalidInputError(
            f"episode {episode.id} has {len(episode.tags)} tags: with episode_id and task_run_id "
            f"its knowledge entry would have {len(tags)}, over the limit of {MAX_TAGS}"
        )
    return tags


class _KnowledgeSink(Protocol):
    """What :meth:`EpisodicMemory.promote` needs from a ``KnowledgeStore``."""

    def add(self, content: str, *, category: str, tags: dict[str, str]) -> int: ...


class EpisodicMemory(EpisodicArchives, Closeable):
    """One agent's episodic store (``episodic/{agent}.sqlite``). Not thread-safe: one owner.

    Open it with :meth:`open`. Times are timezone-aware datetimes, stored as UTC microseconds;
    time ranges include ``since`` and exclude ``until``.
    """

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
        defer_vectors: bool = False,
    ) -> EpisodicMemory:
        """Open (or create) the store at ``path``.

        ``embedder`` ``None`` loads the configured model (the shared default unless
        ``config.embedding.model`` names another); if none can be loaded the store runs
        keyword-only and :meth:`status` says why. ``clock`` returns aware datetimes (default: UTC
        now) and dates new episodes and measures recency. The other arguments override
        ``config.episodic``; with ``archive_dir`` set, retention archives instead of deleting.
        ``defer_vectors``: writes never call the model, nor does opening for episodes without
        a vector; they stay pending for the owner to compute apart (``pending_texts``,
        ``store_vectors``), as the actors do.
        """
        config = Config.load() if config is None else config  # memstrata.toml and MEMSTRATA_*
        if not isinstance(config, Config):
            raise InvalidInputError(f"config must be a memstrata Config, got {type(config).__name__}")
        if clock is None:
            clock = _utc_now
        elif not callable(clock):
            raise InvalidInputError(f"clock must be a callable returning an aware datetime, got {clock!r}")
        episodic = config.episodic
        half_life = _span_or_configured(recency_half_life, episodic.recency_half_life_s, "recency_half_life")
        max_count = _optional_count(
            retention_max_count if retention_max_count is not None else episodic.retention_max_count,
            "retention_max_count",
        )
        max_age = _span_or_configured(retention_max_age, episodic.retention_max_age_s, "retention_max_age")
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
                settings = config.embedding  # "" or "default": the shared default model
                embedder = load_embedder(settings.model, dim=settings.dim, threads=settings.threads)
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
                defer_vectors=defer_vectors,
            )
        except BaseException:
            db.close()
            raise

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
        db.checkpoint()  # never waits: another process's lock leaves the WAL to a later commit
        return retired

    def _apply_retention(self) -> int:
        if self._max_count is None and self._max_age is None:
            return 0
        db = self._db
        ids: set[int] = set()
        if self._max_age is not None:
            # in microseconds, as integers: an age reaching before year 1 would overflow a datetime
            cutoff = max(to_us(self._now()) - self._max_age // timedelta(microseconds=1), -(2**63))
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
            stem = self.path.stem if str(self.path) != ":memory:" else "episodes"
            target = free_archive_path(self._archive_dir, f"{stem}-retired", self._now())
            return self._archive_ids(target, ordered, remove=True, selection={"selected_by": "retention"})
        with db.transaction():
            self._remove(ordered)
        return len(ordered)

    def _last_check(self) -> ConsistencyReport:
        """The latest consistency report: an explicit :meth:`check`'s, else the open's."""
        opened = self._open_check.report() if self._open_check is not None else None
        report = self._consistency or opened
        assert report is not None
        return report

    def status(self) -> dict[str, Any]:
        """Counts, search mode (``hybrid`` or ``keyword-only`` and why), model, archives, policy."""
        db = self._open_db()
        consistency = self._last_check()  # first: a repair it waits for changes the counts below
        first, last = db.execute("SELECT min(at_us), max(at_us) FROM episodes").fetchone()
        archives = []
        for path, auuid, n, removed, created in db.query(
            "SELECT path, archive_uuid, episodes, removed, created_us FROM archives ORDER BY created_us, path"
        ):
            # opened as a search opens it (once, again when the file changes): a file that is
            # there but is no archive is reported, not only a missing one
            if not os.path.isfile(path):
                problem: str | None = "the file is missing"
            elif self._archive(path) is None:
                problem = self._archive_problems.get(path, "it cannot be read")
            else:
                problem = None
            archives.append(
                {
                    "path": path,
                    "archive_uuid": auuid,
                    "episodes": int(n),
                    "removed_from_live": bool(removed),
                    "created_at": from_us(created).isoformat(),
                    "available": problem is None,
                    "problem": problem,
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
            "keyword_index_file": self._keywords.bm25.files_status(),  # as a knowledge store's
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
            "consistency": consistency.as_dict(),
        }

    def close(self) -> None:
        """Close the store and its archive files (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._open_check is not None:
            self._open_check.close()
        for _, archive in self._archives.values():
            archive.close()
        self._archives.clear()
        self._matrices.clear()
        self._archive_keywords.clear()
        self._matrix = None
        self._db.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("keyword-only" if self._embedder is None else "hybrid")
        return f"EpisodicMemory({str(self.path)!r}, {state})"
