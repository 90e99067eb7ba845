"""Workspace and codebase actors: an agent's memory files and the shared source trees.

``WorkspaceActor`` (one per agent with ``workspace`` set and access ``rw`` or ``ro``) owns a
:class:`MemoryFiles` index of the agent's ``MEMORY.md`` and ``memory/*.md``; ``CodebaseActor``
(one per ``[codebases]`` entry) owns a :class:`Codebase` index. Each opens its index in its own
thread, syncs it when its session starts (``SyncFiles``, posted by the runtime), keeps it in
sync with a watcher (1.5 s debounce, optional interval) and lazily before a search, as the
agent's ``[sync]`` section says, and answers ``SearchFiles`` for pre-task retrieval.

A ``rw`` workspace also receives each task's outcome (``NoteOutcome``), appended to
``memory/YYYY-MM-DD.md`` through directory descriptors that never follow a symlink, so nothing
is written outside the workspace; a ``ro`` workspace is indexed but never written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import errno
import hashlib
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memstrata.core.config import Config
from memstrata.core.errors import ConfigError, InvalidInputError, MemstrataError
from memstrata.core.validation import check_path
from memstrata.layers._roots import existing_dir, refused_tree
from memstrata.storage import Embedder
from memstrata.storage._embedding import embed_deadline

from ._base import MemoryActor
from ._store_messages import BoundedSearch, Searched
from .messages import SHARED, FileContext

if TYPE_CHECKING:
    from memstrata.layers import FileHit

__all__ = [
    "CodebaseActor",
    "FilesFound",
    "NoteOutcome",
    "SearchFiles",
    "SyncFiles",
    "WorkspaceActor",
    "check_tree",
]

log = logging.getLogger("memstrata.actors")


@dataclass(frozen=True, slots=True)
class SearchFiles:
    """Internal: the best ``top_k`` chunks for ``query``; answered with :class:`FilesFound`."""

    query: str
    top_k: int


@dataclass(frozen=True, slots=True)
class FilesFound:
    hits: tuple[FileContext, ...]


@dataclass(frozen=True, slots=True)
class SyncFiles:
    """Internal: bring the index up to date with the files now (a session starts)."""


@dataclass(frozen=True, slots=True)
class NoteOutcome:
    """Internal: append a task's outcome to the workspace's daily file (``rw`` only)."""

    task_id: str
    kind: str  # "completed" | "failed"
    text: str
    at: _dt.datetime


def check_tree(raw: object, key: str, data_dir: Path) -> Path:
    """A configured workspace or codebase path, resolved; a :class:`ConfigError` naming ``key``
    for anything that is not a plain existing directory we may index."""
    try:
        text = check_path(raw, f"config key {key!r}")
        root = existing_dir(text, f"config key {key!r}:")
    except InvalidInputError as exc:
        raise ConfigError(str(exc)) from None
    refused = refused_tree(root, data_dir)
    if refused is not None:
        raise ConfigError(f"config key {key!r}: {text!r} {refused}: it cannot be a workspace or codebase")
    return root


def _digest(root: Path) -> str:
    return hashlib.sha256(str(root).encode("utf-8", "surrogateescape")).hexdigest()[:12]


class _FileIndexActor(MemoryActor):
    """One file index behind a mailbox: opened, synced, watched and searched in this thread."""

    kind = "files"
    source = "file"

    def __init__(self, runtime: Any, key: str, owner: str | None = None) -> None:
        super().__init__(runtime, key, owner)
        self.syncs = 0
        self.last_sync_error: str | None = None
        self.searches = 0

    # what a subclass says
    def root(self) -> Path:
        raise NotImplementedError

    def view(self) -> Config:
        """The config this index runs with (an agent's overrides for its workspace)."""
        return self.runtime.config

    def layer_class(self) -> Any:
        raise NotImplementedError

    def db_path(self, root: Path) -> Path:
        raise NotImplementedError

    def _embedder(self) -> tuple[Embedder | None, str | None]:
        """The embedding service of this index (a codebase: the shared one) and, for none, why."""
        return self.runtime.embedding_of(SHARED)

    def open_layer(self) -> Any:
        config = self.view()
        sync = config.sync
        if not sync.lazy:  # searches never wait for a sync
            config = dataclasses.replace(
                config, files=dataclasses.replace(config.files, lazy_sync_wait_s=0.0)
            )
        root = self.root()
        cls = self.layer_class()
        embedder, problem = self._embedder()
        db_path = self.db_path(root)
        if embedder is None:  # keyword-only, as the system is: never load a model here
            layer = cls(root, db_path, cls._rules(root, config), None, problem, config)
        else:
            layer = cls.open(root, db_path=db_path, embedder=embedder, config=config)
        if sync.watch or config.files.sync_interval_s:
            try:
                layer.watch(events=sync.watch, on_synced=self._watch_synced, on_error=self._watch_failed)
            except Exception as exc:  # no watcher (e.g. inotify limits): lazy sync still works
                self.last_sync_error = f"watcher not started: {type(exc).__name__}: {exc}"
                log.warning("%s: %s", self, self.last_sync_error)
        return layer

    def _watch_failed(self, exc: BaseException) -> None:
        self.last_sync_error = f"background sync failed: {type(exc).__name__}: {exc}"

    def _watch_synced(self, stats: Any) -> None:
        """A background sync succeeded: an earlier failure no longer describes the index."""
        self.last_sync_error = None

    def close_layer(self, layer: Any) -> None:
        layer.close()

    def handle(self, message: Any) -> Any:
        if isinstance(message, BoundedSearch):
            limit = self.runtime.config.actors.query_embed_timeout_s
            if message.embed_s is not None:
                limit = min(limit, max(0.0, message.embed_s))
            with embed_deadline(limit) as watch:
                found = self.handle(message.message)
            return Searched(found, watch.degraded)
        if isinstance(message, SearchFiles):
            self.searches += 1
            return FilesFound(tuple(self._context(h) for h in self._search(message.query, message.top_k)))
        if isinstance(message, SyncFiles):
            try:
                stats = self.layer.sync()
            except MemstrataError as exc:  # searches still answer from what is indexed
                self.last_sync_error = f"{type(exc).__name__}: {exc}"
                log.warning("%s: sync failed: %s", self, self.last_sync_error)
                return None
            self.syncs += 1
            self.last_sync_error = None
            return stats
        return super().handle(message)

    def _search(self, query: str, top_k: int) -> list[FileHit]:
        raise NotImplementedError

    def _context(self, hit: FileHit) -> FileContext:
        where = (hit.path, hit.start_line, hit.end_line)
        return FileContext(self.source, *where, hit.score, hit.snippet, hit.language, self.origin())

    def origin(self) -> str:
        return ""

    def status(self) -> dict[str, Any]:
        base = super().status()
        base.update(syncs=self.syncs, searches=self.searches, last_sync_error=self.last_sync_error)
        layer = self.layer
        if layer is not None:
            try:
                state = layer.status()
                base["root"] = state.get("root")
                base["files"] = state.get("files")
                base["chunks"] = state.get("chunks")
                base["mode"] = state.get("mode")
                base["watcher"] = state.get("watcher")
            except Exception as exc:  # a broken index is reported, never hides the rest
                base["error"] = f"{type(exc).__name__}: {exc}"
        return base


class WorkspaceActor(_FileIndexActor):
    """An agent's memory workspace (``MEMORY.md``, ``memory/*.md``); key: the agent id."""

    kind = "workspace"  # its hits' source: "file", as the base says

    def __init__(self, runtime: Any, key: str, owner: str | None = None) -> None:
        super().__init__(runtime, key, owner)
        self.notes = 0
        self.last_note_error: str | None = None

    def root(self) -> Path:
        root = self.runtime.workspace_of(self.key)
        if root is None:
            raise ConfigError(f"agent {self.key} has no workspace (set agents.{self.key}.workspace)")
        return root

    def view(self) -> Config:
        return self.runtime.config.of_agent(self.key)

    def _embedder(self) -> tuple[Embedder | None, str | None]:
        """The agent's embedding service, the one its stores use (see ``Runtime.embedding_of``)."""
        return self.runtime.embedding_of(self.key)

    def layer_class(self) -> Any:
        from memstrata.layers import MemoryFiles

        return MemoryFiles

    def db_path(self, root: Path) -> Path:
        return self.runtime.data_dir / "workspaces" / f"agent-{self.key}-{_digest(root)}.sqlite"

    def _search(self, query: str, top_k: int) -> list[FileHit]:
        return list(self.layer.search(query, max_results=top_k))

    def handle(self, message: Any) -> Any:
        if isinstance(message, NoteOutcome):
            self._note(message)
            return None
        return super().handle(message)

    def _note(self, note: NoteOutcome) -> None:
        """Append the outcome to ``memory/YYYY-MM-DD.md``; refuses symlinks and never leaves the root."""
        if self.runtime.config.for_agent(self.key).workspace_access != "rw":
            return  # read-only: indexed, never written
        at = note.at.astimezone(_dt.UTC)
        text = note.text.replace("\r\n", "\n").rstrip("\n")
        entry = f"\n## {at:%H:%M:%S} task {note.task_id} {note.kind}\n\n{text}\n".encode("utf-8", "replace")
        nofollow = getattr(os, "O_NOFOLLOW", 0)
        directory = getattr(os, "O_DIRECTORY", 0)
        root_fd = os.open(self.root(), os.O_RDONLY | directory)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir("memory", 0o755, dir_fd=root_fd)
            try:
                memory_fd = os.open("memory", os.O_RDONLY | directory | nofollow, dir_fd=root_fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    self._note_failed(f"{self.root()}/memory is not a plain directory (a symlink?)")
                    return
                raise
            try:
                name = f"{at:%Y-%m-%d}.md"
                # O_NONBLOCK: a FIFO put there opens at once (or fails) instead of waiting
                # forever for a reader, holding the actor; fstat then refuses all but a file
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | nofollow
                try:
                    fd = os.open(name, flags, 0o644, dir_fd=memory_fd)
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        self._note_failed(f"memory/{name} is a symlink: not written")
                        return
                    if exc.errno == errno.ENXIO:  # a FIFO without a reader
                        self._note_failed(f"memory/{name} is not a regular file (a FIFO): not written")
                        return
                    raise
                try:
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        self._note_failed(f"memory/{name} is not a regular file: not written")
                        return
                    os.write(fd, entry)
                finally:
                    os.close(fd)
            finally:
                os.close(memory_fd)
        except OSError as exc:
            self._note_failed(f"cannot append to the daily memory file: {exc}")
            return
        finally:
            os.close(root_fd)
        self.notes += 1
        self.last_note_error = None

    def _note_failed(self, reason: str) -> None:
        self.last_note_error = reason
        log.warning("%s: %s", self, reason)

    def status(self) -> dict[str, Any]:
        base = super().status()
        base["access"] = self.runtime.config.for_agent(self.key).workspace_access
        base["notes_written"] = self.notes
        if self.last_note_error:
            base["last_note_error"] = self.last_note_error
        return base


class CodebaseActor(_FileIndexActor):
    """A shared source tree from ``[codebases]`` (read only); key: its name."""

    kind = "codebase"
    source = "code"

    def root(self) -> Path:
        return self.runtime.codebase_root(self.key)

    def layer_class(self) -> Any:
        from memstrata.layers import Codebase

        return Codebase

    def db_path(self, root: Path) -> Path:
        return self.runtime.data_dir / "workspaces" / f"codebase-{self.key}-{_digest(root)}.sqlite"

    def origin(self) -> str:
        return self.key

    def _search(self, query: str, top_k: int) -> list[FileHit]:
        return list(self.layer.search(query, top_k=top_k))
