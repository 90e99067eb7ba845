"""The registry of indexed roots: which folders are indexed, as what, and where their index lives.

``memstrata index PATH`` registers a root (a memory workspace or a source tree) in
``workspaces.sqlite`` in the data dir; ``search``, ``get`` and ``watch`` (CLI, JSON-lines server,
LLM tools, MCP) then share it. Each root's layer object (:class:`MemoryFiles` or
:class:`Codebase`) owns one SQLite connection; every call into it holds that root's lock, so any
thread may use a :class:`Workspaces` while each layer stays confined to one caller at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson

from memstrata.core.closing import Closeable
from memstrata.core.config import Config
from memstrata.core.errors import (
    EmbedderUnavailableError,
    InvalidInputError,
    PathOutsideRootError,
    StorageError,
)
from memstrata.core.validation import check_language, check_path, show_path

from ._workspace_paths import exists_under, is_within, refuse_ambiguous, through_root_link
from ._workspace_results import (
    KINDS,
    FileText,
    Kind,
    Workspace,
    WorkspaceHit,
    WorkspaceHits,
    _plain,
    _row_to_workspace,
    _stats_dict,
)
from ._workspace_search import missing_warning, search_roots

if TYPE_CHECKING:
    from memstrata.storage import Database, Embedder

__all__ = ["FileText", "Kind", "Workspace", "WorkspaceHit", "WorkspaceHits", "Workspaces", "detect_kind"]

log = logging.getLogger("memstrata.files")

_MIGRATIONS = [
    """
    CREATE TABLE roots (
        root TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('memory', 'code')),
        db_path TEXT NOT NULL,
        added_at TEXT NOT NULL,
        last_sync_at TEXT,
        last_stats TEXT,
        PRIMARY KEY (root, kind)
    );
    """
]


def detect_kind(root: Path, data_dir: Path | None = None) -> Kind:
    """A memory workspace when it holds ``MEMORY.md`` (or ``memory.md``) or ``memory/``, else
    code. A ``memory/`` folder that is memstrata's own ``data_dir`` (as ``Config(data_dir=
    "./memory")`` makes in a project) does not count: it holds databases, not notes."""
    if (root / "MEMORY.md").is_file() or (root / "memory.md").is_file():
        return "memory"
    notes = root / "memory"
    if notes.is_dir() and (data_dir is None or notes.resolve() != Path(data_dir).resolve()):
        return "memory"
    return "code"


def _normalise_root(path: str | os.PathLike[str], name: str = "path") -> Path:
    """Absolute, symlinks resolved: one folder has one registry key however it is spelled.
    ``name`` is how the caller calls the argument (``path``, ``root``) in an error."""
    from memstrata.layers._roots import existing_dir

    return existing_dir(check_path(path, name), name)


class _Handle:
    """A layer object and the lock that confines it to one caller at a time."""

    __slots__ = ("layer", "lock", "watching")

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.lock = threading.RLock()
        self.watching = False


class Workspaces(Closeable):
    """Registry of indexed roots in a data dir, with their layer objects opened on demand."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        config: Config | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        from memstrata.storage import Embedder, apply_migrations, open_database

        self.data_dir = Path(check_path(data_dir, "data_dir"))
        if config is not None and not isinstance(config, Config):
            raise InvalidInputError(f"config must be a Config or None, got {type(config).__name__}")
        if embedder is not None and not isinstance(embedder, Embedder):  # a runtime-checkable protocol
            raise InvalidInputError(
                f"embedder must implement the Embedder protocol or be None, got {type(embedder).__name__}"
            )
        if config is None:  # memstrata.toml and MEMSTRATA_* apply, with this data dir
            config = dataclasses.replace(Config.load(), data_dir=self.data_dir)
        self.config = config
        self._embedder = embedder
        self._model_error: str | None = None
        self._lock = threading.RLock()
        self._handles: dict[tuple[Path, Kind], _Handle] = {}
        self._closed = False
        self._stopping = threading.Event()  # see stop_syncs
        with self._connections():
            self._db: Database = open_database(self.data_dir / "workspaces.sqlite", load_vec=False)
        try:
            apply_migrations(self._db, "workspaces", _MIGRATIONS)
        except BaseException:
            self._db.close()
            raise

    @classmethod
    def open(
        cls,
        data_dir: str | os.PathLike[str],
        *,
        config: Config | None = None,
        embedder: Embedder | None = None,
    ) -> Workspaces:
        return cls(data_dir, config=config, embedder=embedder)

    # -- registry ------------------------------------------------------------------------------

    def roots(self) -> list[Workspace]:
        """Every registered root, memory workspaces first, then in registration order."""
        with self._lock:
            self._check_open()
            rows = self._db.query(
                "SELECT root, kind, db_path, added_at, last_sync_at, last_stats FROM roots "
                "ORDER BY kind = 'code', added_at, root"
            )
        return [_row_to_workspace(row) for row in rows]

    def find(
        self, path: str | os.PathLike[str], kind: Kind | None = None, *, name: str = "path"
    ) -> list[Workspace]:
        """The registrations of exactly this root (one per kind)."""
        root = _normalise_root(path, name)
        return [w for w in self.roots() if w.root == root and (kind is None or w.kind == kind)]

    def _registered(self, root: Path, kind: Kind) -> Workspace | None:
        return next((w for w in self.roots() if (w.root, w.kind) == (root, kind)), None)

    def _planned(self, root: Path, kind: Kind) -> Workspace:
        """A root not registered yet, with the place of its index."""
        digest = hashlib.sha256(str(root).encode("utf-8", "surrogatepass")).hexdigest()[:16]
        db_path = self.data_dir / "workspaces" / f"{kind}-{digest}.sqlite"
        return Workspace(root, kind, db_path, dt.datetime.now(dt.UTC), None, None)

    def _register(self, ws: Workspace) -> Workspace:
        now = dt.datetime.now(dt.UTC).isoformat()
        with self._lock, self._db.transaction():
            self._db.execute(
                "INSERT INTO roots(root, kind, db_path, added_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(root, kind) DO NOTHING",
                (str(ws.root), ws.kind, str(ws.db_path), now),
            )
        return self._registered(ws.root, ws.kind) or ws

    def forget(self, path: str | os.PathLike[str], kind: Kind | None = None) -> int:
        """Unregister a root and delete its index files (the folder itself is never touched). A
        root whose folder is gone is found by its path as registered (absolute, with the symlinks
        that still exist resolved), so its index can still be dropped."""
        try:
            found = self.find(path, kind)
        except InvalidInputError:
            gone = Path(os.path.realpath(os.path.expanduser(check_path(path, "path"))))
            found = [w for w in self.roots() if w.root == gone and (kind is None or w.kind == kind)]
            if not found:
                raise
        for ws in found:
            self._discard(ws)
        return len(found)

    def _discard(self, ws: Workspace) -> None:
        """Close a root's layer, unregister it and delete its index files (never the folder)."""
        with self._lock:
            handle = self._handles.pop((ws.root, ws.kind), None)
        if handle is not None:
            with handle.lock:
                _close_layer(handle)
        with self._lock, self._db.transaction():
            self._db.execute("DELETE FROM roots WHERE root = ? AND kind = ?", (str(ws.root), ws.kind))
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                Path(str(ws.db_path) + suffix).unlink()

    # -- layers --------------------------------------------------------------------------------

    def _handle(self, ws: Workspace) -> _Handle:
        key = (ws.root, ws.kind)
        with self._lock:
            self._check_open()
            handle = self._handles.get(key)
            if handle is None:
                handle = _Handle(self._open_layer(ws))
                self._handles[key] = handle
            return handle

    def _open_layer(self, ws: Workspace) -> Any:
        from memstrata.layers import Codebase, MemoryFiles

        opener = MemoryFiles.open if ws.kind == "memory" else Codebase.open
        embedder = self._model()
        with self._connections():
            return opener(ws.root, db_path=ws.db_path, embedder=embedder, config=self.config)

    def _model(self) -> Embedder | None:
        """The model of every root's layer: the one given, else the configured one, loaded once
        on first need (a layer given none loads a copy of its own). ``None`` when it cannot be
        loaded: each layer then tries and says in its status why it is keyword-only."""
        if self._embedder is None and self._model_error is None:
            from memstrata.storage import load_embedder

            settings = self.config.embedding
            try:
                self._embedder = load_embedder(settings.model, dim=settings.dim, threads=settings.threads)
            except EmbedderUnavailableError as exc:
                self._model_error = str(exc)
                log.warning("file search runs KEYWORD-ONLY: %s", exc)
        return self._embedder

    def _connections(self) -> contextlib.AbstractContextManager[None]:
        """The configured lock bound and sync for the databases opened here, as the actors'."""
        from memstrata.storage import configured

        return configured(self.config.storage)

    @contextlib.contextmanager
    def _using(self, ws: Workspace) -> Iterator[Any]:
        handle = self._handle(ws)
        with handle.lock:
            yield handle.layer

    def index(
        self,
        path: str | os.PathLike[str],
        *,
        kind: Kind | Literal["auto"] = "auto",
        progress: Callable[..., None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> tuple[Workspace, Any]:
        """Register ``path`` (if new) and bring its index up to date; returns it and the SyncStats.
        A new root is registered once its index opened; when its first sync fails too, it is
        unregistered and its index deleted: a failed ``index`` leaves nothing behind. After
        :meth:`stop_syncs`, or once ``should_stop()`` is true, the sync starts no file
        (``complete`` False)."""
        if kind not in ("auto", *KINDS):
            raise InvalidInputError(f"kind must be 'auto', 'memory' or 'code', got {kind!r}")
        if should_stop is not None and not callable(should_stop):
            raise InvalidInputError("should_stop must be a callable () -> bool or None")
        root = _normalise_root(path)
        self._check_indexable(path, root)
        chosen: Kind = detect_kind(root, self.data_dir) if kind == "auto" else kind
        known = self._registered(root, chosen)
        ws = known or self._planned(root, chosen)
        try:
            with self._using(ws) as layer:
                if known is None:
                    ws = self._register(ws)
                stats = layer.sync(progress=progress, should_stop=self._stop_check(should_stop))
        except Exception:
            if known is None:  # the error that stopped it is the one to see, not a failed cleanup
                with contextlib.suppress(StorageError):
                    self._discard(ws)
            raise
        return self._record_sync(ws, stats), stats

    def _stop_check(self, should_stop: Callable[[], bool] | None) -> Callable[[], bool]:
        """True once :meth:`stop_syncs` was called or ``should_stop()`` says so."""
        if should_stop is None:
            return self._stopping.is_set
        return lambda: self._stopping.is_set() or bool(should_stop())

    def _check_indexable(self, path: str | os.PathLike[str], root: Path) -> None:
        """The rule the config applies to its workspaces and codebases, and a path the registry
        can store (the databases hold text, which bytes that are not UTF-8 cannot be)."""
        from memstrata.layers._roots import check_root_text, refused_tree

        refused = refused_tree(root, self.data_dir)
        if refused is not None:
            raise InvalidInputError(f"path '{show_path(os.fspath(path))}' {refused}: it cannot be indexed")
        check_root_text(root)

    def _record_sync(self, ws: Workspace, stats: Any) -> Workspace:
        stats_dict = _stats_dict(stats)
        now = dt.datetime.now(dt.UTC)
        with self._lock:
            if self._closed:
                return ws
            with self._db.transaction():
                self._db.execute(
                    "UPDATE roots SET last_sync_at = ?, last_stats = ? WHERE root = ? AND kind = ?",
                    (now.isoformat(), orjson.dumps(stats_dict).decode(), str(ws.root), ws.kind),
                )
        return dataclasses.replace(ws, last_sync_at=now, last_stats=stats_dict)

    def _select(self, root: str | os.PathLike[str] | None) -> list[Workspace]:
        if root is None:
            return self.roots()
        selected = self.find(root, name="root")
        if not selected:
            given = Path(os.path.abspath(os.path.expanduser(os.fspath(root))))
            place = given.parent.resolve() / given.name  # as it was registered, link or not
            if given.is_symlink() and any(w.root == place for w in self.roots()):
                raise InvalidInputError(
                    f"root {os.fspath(root)!r} was indexed as a folder and is now a symlink to "
                    f"{str(given.resolve())!r}: index that folder, or put the root back"
                )
            raise InvalidInputError(f"root {os.fspath(root)!r} is not indexed (run: memstrata index PATH)")
        return selected

    def search(
        self,
        query: str,
        *,
        root: str | os.PathLike[str] | None = None,
        max_results: int | None = None,
        min_score: float | None = None,
        language: str | None = None,
    ) -> WorkspaceHits:
        """Search every indexed root (or one), best first across roots.

        ``min_score`` (default ``search.min_score``) is the cosine floor of memory workspaces; a
        codebase gets a floor only when ``min_score`` is given. ``language`` applies to every
        root (memory notes are ``markdown``); an unknown one is refused, naming the known ones.
        Hits are ranked across roots as one index would rank them (see ``_workspace_search``).
        A root whose folder is gone, or whose index cannot be opened or searched, is skipped and
        named with why in the result's ``warnings`` (the others still answer); searched alone
        (``root``), it raises. ``complete`` is False when a root's sync ran out of its budget
        before the search; ``degraded`` joins the roots' reasons for a ranking not hybrid.
        """
        if not isinstance(query, str):
            raise InvalidInputError(f"query must be a string, got {type(query).__name__}")
        limit = self.config.search.max_results if max_results is None else max_results
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidInputError(f"max_results must be a positive integer, got {limit!r}")
        floor = self.config.search.min_score if min_score is None else min_score
        if language is not None:  # refused before any root is searched, whichever roots there are
            from memstrata.layers._files import known_languages

            language = check_language(language, known_languages(self.config))
        found = search_roots(
            self._select(root),
            self._using,
            query,
            limit=limit,
            floor=floor,
            min_score=min_score,
            language=language,
            alone=root is not None,
            search=self.config.search,
        )
        self._check_open()  # closed while searching: its roots were not searched
        return found

    def get(
        self,
        path: str | os.PathLike[str],
        *,
        root: str | os.PathLike[str] | None = None,
        from_line: int = 1,
        lines: int = 50,
    ) -> FileText:
        """Read lines of an indexed file: an absolute path inside a root, or one relative to a root."""
        raw = check_path(path)
        candidates = self._select(root)
        if not candidates:
            raise InvalidInputError("no memories indexed yet (run: memstrata index PATH)")
        expanded = os.path.expanduser(raw)
        if os.path.isabs(expanded):
            absolute = os.path.normpath(expanded)
            inside = [w for w in candidates if is_within(absolute, w.root)]
            if not inside:  # e.g. through a symlink to a root, as `index` resolves it
                absolute = through_root_link(absolute, candidates)
                inside = [w for w in candidates if is_within(absolute, w.root)]
            if not inside:
                raise PathOutsideRootError(f"path {raw!r} is not inside an indexed root")
            inside.sort(key=lambda w: len(str(w.root)), reverse=True)  # the deepest root first
            ws, relative = self._serving([(w, os.path.relpath(absolute, w.root)) for w in inside])
        else:
            existing = [w for w in candidates if exists_under(w.root, raw)]
            refuse_ambiguous(raw, existing)
            ws, relative = self._serving([(w, raw) for w in existing]) if existing else (candidates[0], raw)
        with self._using(ws) as layer:
            found = layer.get_lines(relative, from_line=from_line, lines=lines)
        return FileText(ws.root, ws.kind, Path(relative).as_posix(), from_line, len(found), "\n".join(found))

    def _serving(self, places: list[tuple[Workspace, str]]) -> tuple[Workspace, str]:
        """Of the roots holding a file (the deepest first, a root of two kinds twice), the first
        whose rules serve it, with its path there (a ``.py`` file of a folder indexed as memory
        and as code is the code index's; a memory workspace inside a code root does not hide the
        code root's files), so get serves what a search returns; the first when none does, whose
        layer then says why."""
        from memstrata.layers._paths import normalise_relative

        if len(places) > 1:
            for ws, relative in places:
                try:
                    rel = normalise_relative(relative)
                except InvalidInputError:  # the layer refuses it with the same words
                    break
                with self._using(ws) as layer:
                    if layer.rules.allows(rel):
                        return ws, relative
        return places[0]

    def watch(
        self,
        path: str | os.PathLike[str],
        *,
        kind: Kind | Literal["auto"] = "auto",
        on_synced: Callable[[Workspace, Any], None] | None = None,
        on_error: Callable[[Workspace, BaseException], None] | None = None,
    ) -> list[Workspace]:
        """Keep a root in sync with its files (indexing it first if it is new).

        ``on_synced(workspace, stats)`` runs in the watcher's thread after each background sync,
        ``on_error(workspace, exc)`` after each that fails, and once when the root goes away
        (:class:`~memstrata.errors.RootMissingError`); watching resumes when it is back.
        """
        found = self.find(path) if kind == "auto" else self.find(path, kind)
        if not found:
            ws, _ = self.index(path, kind=kind)
            found = [ws]
        for ws in found:
            handle = self._handle(ws)

            def synced(stats: Any, ws: Workspace = ws) -> None:
                recorded = self._record_sync(ws, stats)
                if on_synced is not None:
                    on_synced(recorded, stats)

            def failed(exc: BaseException, ws: Workspace = ws) -> None:
                if on_error is not None:
                    on_error(ws, exc)

            with handle.lock:
                if not handle.watching:
                    handle.layer.watch(on_synced=synced, on_error=failed)
                    handle.watching = True
        return found

    def status(self) -> list[dict[str, Any]]:
        """Registry rows plus each open layer's own status (opening layers that are not open yet)."""
        out = []
        for ws in self.roots():
            entry = ws.as_dict()
            entry["missing"] = not ws.root.is_dir()
            if entry["missing"]:  # reported, not opened: its index stays until it is forgotten
                entry["warning"] = missing_warning(ws)
                out.append(entry)
                continue
            try:
                with self._using(ws) as layer:
                    entry["index"] = _plain(layer.status())
            except Exception as exc:  # a broken index is reported, never hides the others
                entry["error"] = f"{type(exc).__name__}: {exc}"
            out.append(entry)
        return out

    def stop_syncs(self) -> None:
        """Make each :meth:`index` in flight, and every later one, stop before its next file or
        embedding batch: what it indexed stays, the rest waits for the next sync (its stats say
        ``complete`` False). For a server that is stopping, where an index of a large tree could
        otherwise keep the process for minutes after its client has gone."""
        self._stopping.set()

    def close(self) -> None:
        """Stop watchers and close every layer and the registry; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            handles = list(self._handles.values())
            self._handles.clear()
        for handle in handles:
            with handle.lock:
                _close_layer(handle)
        self._db.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("the workspace registry is closed")


def _close_layer(handle: _Handle) -> None:
    if handle.watching:
        with contextlib.suppress(Exception):
            handle.layer.stop_watching()
        handle.watching = False
    with contextlib.suppress(Exception):
        handle.layer.close()
