"""Memory files and codebases: indexed in chunks with line ranges, searchable, read back safely.

:class:`MemoryFiles` indexes an agent workspace's notes (``MEMORY.md``, ``memory.md``,
``memory/**/*.md`` and configured extra paths); :class:`Codebase` indexes a source tree (files
with configured extensions, outside hidden and pruned directories). Both keep their database in
the data dir, never in the tree, so a read-only tree works. Both sync incrementally (explicit
``sync()``, lazily before ``search()``, from a watchdog watcher with a debounce, or on an
interval) and serve ``get()`` only for files their rules allow, inside the root.

An index object is used by one thread at a time (its owner, typically an actor). ``watch()``
starts a watcher whose worker syncs through its own connection to the same database; syncs of
the owner and of the worker never run at the same time.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Self

from memstrata.core.closing import Closeable
from memstrata.core.config import Config
from memstrata.core.errors import (
    EmbedderUnavailableError,
    InvalidInputError,
    MemstrataError,
    StorageError,
)
from memstrata.core.validation import (
    check_int,
    check_language,
    check_min_score,
    check_mode,
    check_path,
    check_text,
)
from memstrata.storage import Embedder, load_embedder

from ._chunk import split_lines
from ._chunk_file import language_names
from ._file_results import FileHit, FileHits, SyncStats
from ._index_db import IndexDatabase, SearchRow
from ._paths import (
    SkipFile,
    SourceRules,
    decode,
    normalise_extra,
    read_source,
    resolve_request,
)
from ._roots import check_root_text
from ._snippet import make_snippet
from ._sync_plan import Plan, SyncResult
from ._watch import Watcher

__all__ = ["Codebase", "FileHit", "FileHits", "MemoryFiles", "SyncStats"]


ProgressCallback = Callable[[int, int, str], None]
_MAX_LINES = 100_000
_MAX_RESULTS = 1_000
_CHEAP_CHECK_S = 0.05  # a lazy check this fast runs before every search
_CHECK_COST_FACTOR = 5.0  # slower ones run at most once per 5x their cost


def known_languages(config: Config) -> dict[str, str]:
    """The language filters an index of this config accepts (see :func:`language_names`): the
    chunkers' languages and those of the configured code extensions and extra memory paths."""
    files = config.files
    return language_names([*files.code_extensions, *(PurePosixPath(p).suffix for p in files.extra_paths)])


def _check_language(language: object, config: Config) -> str | None:
    return None if language is None else check_language(language, known_languages(config))


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")[:40] or "root"


def default_db_path(config: Config, kind: str, root: Path) -> Path:
    """``<data_dir>/files/<kind>-<root name>-<12 hex of sha256(resolved root)>.sqlite``: one
    database per tree, outside the tree."""
    digest = hashlib.sha256(str(root).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return Path(config.data_dir) / "files" / f"{kind}-{_slug(root.name)}-{digest}.sqlite"


class _FileIndex(Closeable):
    """What memory files and codebases share: store, sync triggers, safe reads, status."""

    _kind: ClassVar[str]
    _schema_kind: ClassVar[str]

    def __init__(
        self,
        root: Path,
        db_path: Path,
        rules: SourceRules,
        embedder: Embedder | None,
        embedder_error: str | None,
        config: Config,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.db_path = db_path
        self.rules = rules
        self.config = config
        self._embedder = embedder
        self._embedder_error = embedder_error
        self._clock = clock
        self._store: IndexDatabase | None = self._open_store()
        self._sync_lock = threading.Lock()
        self._watcher: Watcher | None = None
        self._last_check = float("-inf")
        self._check_cost = 0.0
        self._last_stats: SyncStats | None = None
        self._behind = False  # the last sync or check left changes unindexed
        self._last_sync_at: float | None = None
        self._stats_lock = threading.Lock()
        self._lazy_error: str | None = None

    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str],
        *,
        db_path: str | os.PathLike[str] | None = None,
        embedder: Embedder | None = None,
        config: Config | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> Self:
        """Open (creating if needed) the index of ``root``. Nothing is read until a sync.

        ``embedder`` ``None`` loads the configured model; when none can be loaded the index
        works keyword-only and ``status()`` says why. ``db_path`` defaults to
        ``<data_dir>/files/<kind>-<name>-<hash of the resolved root>.sqlite``. ``clock``
        (seconds, ``time.monotonic`` by default) times syncs against their budget.
        """
        config = config if config is not None else Config.load()  # MEMSTRATA_*, memstrata.toml
        if not isinstance(config, Config):
            raise InvalidInputError(f"config must be a memstrata Config, got {type(config).__name__}")
        if not isinstance(root, str | os.PathLike) or not os.fspath(root):
            raise InvalidInputError(f"root must be a directory path, got {root!r}")
        given = check_path(root, "root")
        try:
            resolved = Path(os.path.realpath(given))
            is_dir = resolved.is_dir()
        except OSError as exc:  # a name too long for the file system, ...
            raise InvalidInputError(f"root {given!r} cannot be used: {exc.strerror}") from None
        if not is_dir:
            raise InvalidInputError(f"root {given!r} is not a directory")
        check_root_text(resolved)
        rules = cls._rules(resolved, config)
        path = Path(db_path) if db_path is not None else default_db_path(config, cls._kind, resolved)
        error = None
        if embedder is None:
            try:
                embedder = load_embedder(
                    config.embedding.model, dim=config.embedding.dim, threads=config.embedding.threads
                )
            except EmbedderUnavailableError as exc:
                error = str(exc)
        return cls(resolved, path, rules, embedder, error, config, clock=clock)

    @classmethod
    def _rules(cls, root: Path, config: Config) -> SourceRules:
        raise NotImplementedError

    def _open_store(self) -> IndexDatabase:
        return IndexDatabase(
            self.db_path,
            kind=self._schema_kind,
            root=self.root,
            rules=self.rules,
            embedder=self._embedder,
            config=self.config,
        )

    @property
    def store(self) -> IndexDatabase:
        if self._store is None:
            raise StorageError(f"the {self._kind} index of {self.root} is closed")
        return self._store

    # -- sync ----------------------------------------------------------------------------------

    def sync(
        self, progress: ProgressCallback | None = None, *, should_stop: Callable[[], bool] | None = None
    ) -> SyncStats:
        """Index new and changed files, prune deleted ones; ``progress(done, total, path)`` once
        the files to read are known (``done`` 0, ``path`` empty), then after each file. Once
        ``should_stop()`` is true no file and no embedding batch is started: what was indexed
        stays, the rest is left for the next sync (``complete`` is then False)."""
        if progress is not None and not callable(progress):
            raise InvalidInputError("progress must be a callable (done, total, path) or None")
        if should_stop is not None and not callable(should_stop):
            raise InvalidInputError("should_stop must be a callable () -> bool or None")
        store = self.store
        watcher = self._watcher
        with self._sync_lock:
            seen = watcher.generation if watcher is not None else 0
            result = store.sync(progress=progress, should_stop=should_stop, clock=self._clock)
        if watcher is not None:
            watcher.clear_dirty(seen)  # a change seen during the sync is left for the watcher
        return self._record(result)

    def _record(self, result: SyncResult) -> SyncStats:
        stats = SyncStats._from(result)
        with self._stats_lock:
            self._last_stats = stats
            self._behind = not stats.complete
            self._last_sync_at = time.time()
        return stats

    @property
    def sync_error(self) -> str | None:
        """Why the last sync before a search failed (its results may be stale), or ``None``."""
        return self._lazy_error

    def _lazy_sync(self) -> bool:
        """Before a search: sync what changed, for at most ``files.lazy_sync_wait_s``; with 0,
        only look whether anything changed and leave it to the watcher or the next ``sync()``.
        False when files may be left unindexed (the budget ran out, a sync still runs, or
        changes wait for one)."""
        store = self.store
        wait = self.config.files.lazy_sync_wait_s
        watcher = self._watcher
        now = self._clock()
        forced = watcher is not None and watcher.dirty
        cost = self._check_cost
        recent = cost >= _CHEAP_CHECK_S and now - self._last_check < cost * _CHECK_COST_FACTOR
        if (forced and wait <= 0) or (recent and not forced):
            # changes known to be pending, or a large tree: re-checked at most once per 5x its cost
            return self._known_complete()
        if not self._sync_lock.acquire(timeout=wait):
            return False  # the watcher is syncing and takes longer: search what is indexed
        complete = True
        try:
            seen = watcher.generation if watcher is not None else 0
            started = time.perf_counter()
            plan: Plan = store.plan()
            self._check_cost = time.perf_counter() - started
            if wait <= 0:  # searches never wait for a sync
                complete = not store.behind(plan)
                with self._stats_lock:
                    self._behind = not complete
            elif plan.dirty:
                result = store.sync(plan=plan, deadline=now + wait, newest_first=True, clock=self._clock)
                self._record(result)
                complete = bool(result.complete)
                if result.complete and watcher is not None:
                    watcher.clear_dirty(seen)
            self._lazy_error = None
        except MemstrataError as exc:
            # a search still answers from what is indexed, marked incomplete; status() and
            # sync_error say why it may be stale
            self._lazy_error = f"sync before search failed: {type(exc).__name__}: {exc}"
            complete = False
        finally:
            self._sync_lock.release()
            self._last_check = self._clock()
        return complete

    def _known_complete(self) -> bool:
        """Without looking at the files: False when changes are known to be pending (seen by
        the watcher, being synced, or left by the last sync or check)."""
        if (self._watcher is not None and self._watcher.dirty) or self._sync_lock.locked():
            return False
        with self._stats_lock:
            return not self._behind

    # -- search --------------------------------------------------------------------------------

    def _search(
        self, query: object, top_k: int, min_score: float | None, mode: str, language: str | None
    ) -> FileHits:
        text = check_text(query, "query", allow_empty=True)
        if not text.strip():
            return FileHits()
        complete = self._lazy_sync()
        rows = self.store.search(text, top_k=top_k, min_score=min_score, mode=mode, language=language)
        limit = self.config.search.snippet_chars
        hits = (self._hit(row, text, limit) for row in rows)
        return FileHits(hits, complete=complete, degraded=rows.degraded)

    def _hit(self, row: SearchRow, query: str, limit: int) -> FileHit:
        return FileHit(
            path=row.path,
            start_line=row.start_line,
            end_line=row.end_line,
            score=row.score,
            snippet=make_snippet(row.text, query, limit),
            match_type=row.match_type,
            language=row.language,
            similarity=row.similarity,
        )

    # -- reads ---------------------------------------------------------------------------------

    def get(self, path: str, *, from_line: int = 1, lines: int = 50) -> str:
        """Lines ``from_line .. from_line + lines - 1`` (1-based) of a file this index may hold.

        ``path`` is relative to the root. ``..``, absolute paths and symlinks leaving the root
        raise :class:`PathOutsideRootError`; files the rules do not allow, missing, binary or
        oversized files raise :class:`InvalidInputError`. Past the end of the file: ``""``.
        """
        return "\n".join(self.get_lines(path, from_line=from_line, lines=lines))

    def get_lines(self, path: str, *, from_line: int = 1, lines: int = 50) -> list[str]:
        """:meth:`get` as the list of lines read, without their line breaks: its length tells a
        blank line (``[""]``) from the end of the file (``[]``), which the joined text cannot."""
        check_int(from_line, "from_line", 1, 2**31)
        check_int(lines, "lines", 1, _MAX_LINES)
        rel, target = resolve_request(self.root, path, self.rules)
        try:  # checked above, read here through descriptors again: a swap in between only fails
            data, _ = read_source(self.root, target, self.rules.max_bytes)
        except SkipFile as skip:
            raise InvalidInputError(f"path {rel!r} cannot be served: {skip.reason}") from None
        all_lines = split_lines(decode(data))
        return all_lines[from_line - 1 : from_line - 1 + lines]

    # -- watching ------------------------------------------------------------------------------

    def watch(
        self,
        *,
        on_synced: Callable[[SyncStats], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        events: bool = True,
    ) -> None:
        """Keep the index in sync in the background: watchdog events (debounced by
        ``files.watch_debounce_ms``) and, if ``files.sync_interval_s`` is set, an interval.
        ``on_synced(stats)`` runs in the watcher's thread after each of its syncs."""
        self.store  # noqa: B018 - raises when closed
        if self._watcher is not None:
            return
        holder: dict[str, IndexDatabase] = {}

        def run_sync(should_stop: Callable[[], bool]) -> SyncStats:
            store = holder.get("store")
            if store is None:
                store = holder["store"] = self._open_store()
            with self._sync_lock:
                result = store.sync(should_stop=should_stop, clock=self._clock)
            return self._record(result)

        def close_worker() -> None:
            store = holder.pop("store", None)
            if store is not None:
                store.close()

        files = self.config.files
        watcher = Watcher(
            self.root,
            relevant=self._relevant,
            run_sync=run_sync,
            close_worker=close_worker,
            debounce_s=files.watch_debounce_ms / 1000.0,
            interval_s=files.sync_interval_s,
            on_synced=on_synced,
            on_error=on_error,
            events=events,
        )
        watcher.start()
        self._watcher = watcher

    def _relevant(self, rel: str, is_dir: bool) -> bool:
        if is_dir:
            return self.rules.descend(rel)
        return self.rules.allows(rel)

    def stop_watching(self) -> None:
        """Stop the watcher and join its threads (a sync in progress stops before its next file
        or embedding batch)."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.stop()

    # -- status --------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        store = self.store
        with self._stats_lock:
            last = self._last_stats
            last_at = self._last_sync_at
        embedding: dict[str, Any]
        if store.semantic and self._embedder is not None:
            embedding = {"model": self._embedder.model_id, "dim": self._embedder.dim, "available": True}
        else:
            reason = self._embedder_error or (
                "the vector table cannot be used (sqlite-vec missing)" if self._embedder is not None else None
            )
            embedding = {"model": None, "available": False, "reason": f"KEYWORD-ONLY: {reason}"}
        return {
            "kind": self._kind,
            "root": str(self.root),
            "db_path": str(self.db_path),
            "mode": "hybrid" if store.semantic else "keyword-only",
            "embedding": embedding,
            "chunker": store.signature,
            "sources": self.rules.describe(),
            **store.counts(),
            "vectors": store.vectors.status() if store.vectors is not None else None,
            "consistency": store.consistency.as_dict(),
            "last_sync": None if last is None else {**last.as_dict(), "at": last_at},
            "lazy_sync_error": self._lazy_error,
            "watcher": self._watcher.status() if self._watcher is not None else {"running": False},
        }

    # -- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop watching and close the database (idempotent)."""
        self.stop_watching()
        store, self._store = self._store, None
        if store is not None:
            with self._sync_lock:
                store.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if self._watcher is not None:
                self._watcher.stop(timeout=1.0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"


class MemoryFiles(_FileIndex):
    """An agent workspace's Markdown memory: ``MEMORY.md``, ``memory.md``, ``memory/**/*.md``
    and ``files.extra_paths`` (inside the workspace), minus ``files.exclude``."""

    _kind = "memory"
    _schema_kind = "files"

    @classmethod
    def _rules(cls, root: Path, config: Config) -> SourceRules:
        files = config.files
        return SourceRules(
            kind="memory",
            exclude=tuple(files.exclude),
            extra=normalise_extra(root, files.extra_paths),
            max_bytes=files.max_file_bytes,
        )

    def search(
        self,
        query: str,
        *,
        max_results: int | None = None,
        min_score: float | None = None,
        mode: str = "hybrid",
        language: str | None = None,
    ) -> FileHits:
        """Best chunks for ``query`` (hybrid vector + keyword, fused with RRF), best first.

        ``min_score`` (default ``search.min_score``) is a cosine floor on the semantic side
        only: keyword matches are never dropped by it. ``language`` keeps one language, as
        :meth:`Codebase.search` does (notes are ``markdown``, or ``text`` for ``.txt``).
        """
        search = self.config.search
        top_k = check_int(
            search.max_results if max_results is None else max_results, "max_results", 1, _MAX_RESULTS
        )
        floor = check_min_score(search.min_score if min_score is None else min_score)
        return self._search(query, top_k, floor, check_mode(mode), _check_language(language, self.config))


class Codebase(_FileIndex):
    """A source tree: files with ``files.code_extensions`` outside hidden directories and
    ``files.pruned_dirs``, at most ``files.max_file_bytes`` each, binary files skipped."""

    _kind = "codebase"
    _schema_kind = "codebase"

    @classmethod
    def _rules(cls, root: Path, config: Config) -> SourceRules:
        files = config.files
        extensions = frozenset(
            e.lower() if e.startswith(".") else f".{e.lower()}" for e in files.code_extensions
        )
        return SourceRules(
            kind="codebase",
            extensions=extensions,
            pruned=frozenset(files.pruned_dirs),
            exclude=tuple(files.exclude),
            max_bytes=files.max_file_bytes,
        )

    def search(
        self,
        query: str,
        *,
        top_k: int = 10,
        language: str | None = None,
        min_score: float | None = None,
        mode: str = "hybrid",
    ) -> FileHits:
        """Best chunks for ``query``, optionally only in one ``language`` (``"python"``,
        ``"rust"``, ...; extensions like ``"py"`` work too; an unknown one is refused, naming
        the known ones). ``min_score`` defaults to none:
        code embeds with lower similarities than prose, and ranks matter more than a floor."""
        top = check_int(top_k, "top_k", 1, _MAX_RESULTS)
        floor = check_min_score(min_score)
        return self._search(query, top, floor, check_mode(mode), _check_language(language, self.config))
