"""The file watcher: watchdog events mark the index dirty; a worker syncs after a debounce.

The worker is the only thread that syncs on the watcher's behalf; it does so through a callback
that uses its own database connection (thread confinement). Events only set a flag and push a
deadline, so a burst of writes (an editor saving, ``git checkout``) costs one sync, started
``debounce_s`` after the last event (and at most ``10 * debounce_s`` after the first). An
optional interval sync catches what events miss (network file systems, inotify overflow). A sync
of the owner clears the flag only when it was not set again after that sync started (each setting
is a new generation), so a change made during that sync is still synced by the worker.
Every failure (the observer cannot start or dies, a sync raises, a callback raises) is caught,
kept for ``status()`` and never reaches the process.

The observer watches the root directory itself, so once the root is deleted (or moved away, or
unmounted) no event can come. The worker therefore looks at the root every ``root_check_s``:
when it is gone, that is reported once (``on_error``, ``status()``) and no sync runs; when a
directory is back at that path (not a symlink: syncs never follow one either), the observer is
started again on it and a sync follows at once. A recreated root is read exactly as a lazy
sync before a search would read it, through the same descriptor-based walk.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from memstrata.core.errors import RootMissingError

__all__ = ["Watcher"]

_IGNORED_EVENTS = {"opened", "closed_no_write"}
_MAX_DELAY_FACTOR = 10
ROOT_CHECK_S = 1.0  # how often the worker looks whether the root was deleted or came back


def _observer_class() -> Any:
    from watchdog.observers import Observer

    return Observer


def _root_identity(root: Path) -> tuple[int, int] | None:
    """``(device, inode)`` of the directory at ``root`` (never through a symlink), or ``None``
    when there is none: a change means the root was replaced by another directory."""
    try:
        st = os.lstat(root)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def _handler_class() -> Any:
    from watchdog.events import FileSystemEventHandler

    return FileSystemEventHandler


class Watcher:
    """Watches ``root``; calls ``run_sync(should_stop)`` in its worker thread when needed."""

    def __init__(
        self,
        root: Path,
        *,
        relevant: Callable[[str, bool], bool],
        run_sync: Callable[[Callable[[], bool]], Any],
        close_worker: Callable[[], None],
        debounce_s: float,
        interval_s: float | None = None,
        on_synced: Callable[[Any], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        events: bool = True,
        root_check_s: float = ROOT_CHECK_S,
    ) -> None:
        self.root = root
        self._relevant = relevant
        self._run_sync = run_sync
        self._close_worker = close_worker
        self.debounce_s = debounce_s
        self.interval_s = interval_s if interval_s else None
        self._on_synced = on_synced
        self._on_error = on_error
        self._events = events
        self.root_check_s = root_check_s
        self._root_identity = _root_identity(root)
        self._next_root_check = 0.0
        self.root_missing = self._root_identity is None
        self.rearms = 0
        self._cond = threading.Condition()
        self._stop = False
        self._dirty = False
        self._generation = 0  # how many times the flag was set: a sync clears only those before it
        self._due = 0.0
        self._first_dirty: float | None = None
        self._last_sync = time.monotonic()
        self._observer: Any = None
        self._worker: threading.Thread | None = None
        self.observer_error: str | None = None
        self.last_error: str | None = None
        self.last_stats: Any = None
        self.syncs = 0
        self.events_seen = 0

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self._next_root_check = time.monotonic() + self.root_check_s
        self._worker = threading.Thread(
            target=self._loop, name=f"memstrata-watch:{self.root.name}", daemon=True
        )
        self._worker.start()
        if self._events:
            self._start_observer()

    def _start_observer(self) -> None:
        watcher = self

        class _Handler(_handler_class()):  # type: ignore[misc]
            def on_any_event(self, event: Any) -> None:
                watcher._event(event)

        try:
            observer = _observer_class()()
            observer.daemon = True
            observer.schedule(_Handler(), str(self.root), recursive=True)
            observer.start()
        except Exception as exc:  # inotify limits, missing backend: lazy sync still works
            self.observer_error = f"file watcher could not start: {type(exc).__name__}: {exc}"
            return
        self.observer_error = None
        with self._cond:
            if self._stop:  # stop() ran meanwhile: it will not see this observer
                stopping = observer
            else:
                stopping, self._observer = None, observer
        if stopping is not None:
            _end_observer(stopping, 1.0)

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        with self._cond:
            observer, self._observer = self._observer, None
        if observer is not None:
            _end_observer(observer, timeout)
        worker, self._worker = self._worker, None
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout)

    @property
    def running(self) -> bool:
        return self._worker is not None and self._worker.is_alive()

    @property
    def observer_alive(self) -> bool:
        return self._observer is not None and bool(self._observer.is_alive())

    @property
    def dirty(self) -> bool:
        return self._dirty

    @property
    def healthy(self) -> bool:
        """Events are being delivered (when asked for) and the worker is alive."""
        if not self.running:
            return False
        return not self._events or self.observer_alive

    def should_stop(self) -> bool:
        return self._stop

    # -- events --------------------------------------------------------------------------------

    def _event(self, event: Any) -> None:
        try:
            if event.event_type in _IGNORED_EVENTS:
                return
            is_dir = bool(event.is_directory)
            paths = [event.src_path, getattr(event, "dest_path", "") or ""]
            if not any(self._relevant_path(p, is_dir) for p in paths if p):
                return
        except Exception:  # a malformed event must not kill the observer thread
            return
        self.mark_dirty()

    def _relevant_path(self, path: Any, is_dir: bool) -> bool:
        text = os.fsdecode(path)
        root = str(self.root)
        if text == root:
            return is_dir
        if not text.startswith(root.rstrip(os.sep) + os.sep):
            return False
        rel = text[len(root.rstrip(os.sep)) + 1 :].replace(os.sep, "/")
        return self._relevant(rel, is_dir)

    def mark_dirty(self) -> None:
        with self._cond:
            now = time.monotonic()
            self.events_seen += 1
            self._generation += 1
            self._dirty = True
            self._due = now + self.debounce_s
            if self._first_dirty is None:
                self._first_dirty = now
            self._cond.notify_all()

    @property
    def generation(self) -> int:
        """How many times the index was marked dirty so far: read before a sync of the owner,
        then given to :meth:`clear_dirty`."""
        with self._cond:
            return self._generation

    def clear_dirty(self, seen: int) -> None:
        """The owner synced everything itself, started at generation ``seen``: unless the index
        was marked dirty since (that change may have come after the sync's walk, so the worker
        still syncs it), nothing is pending; an earlier failure of a background sync no longer
        describes the index."""
        with self._cond:
            if self._generation == seen:
                self._dirty = False
                self._first_dirty = None
        if not self.root_missing:
            self.last_error = None

    # -- worker --------------------------------------------------------------------------------

    def _wait(self) -> bool | None:
        """Block until a sync is due (True) or the root is to be looked at (False); ``None``
        when stopping."""
        with self._cond:
            while not self._stop:
                now = time.monotonic()
                timeout: float | None = None
                if self._events or self.root_missing:
                    if now >= self._next_root_check:
                        self._next_root_check = now + self.root_check_s
                        return False
                    timeout = self._next_root_check - now
                if self._dirty:
                    first = self._first_dirty if self._first_dirty is not None else now
                    due = min(self._due, first + _MAX_DELAY_FACTOR * self.debounce_s)
                    if now >= due:
                        break
                    timeout = due - now if timeout is None else min(timeout, due - now)
                if self.interval_s is not None:
                    next_interval = self._last_sync + self.interval_s
                    if now >= next_interval:
                        break
                    timeout = next_interval - now if timeout is None else min(timeout, next_interval - now)
                self._cond.wait(timeout)
            if self._stop:
                return None
            self._dirty = False
            self._first_dirty = None
            return True

    def _loop(self) -> None:
        try:
            while (due := self._wait()) is not None:
                root = self._follow_root()
                if root == "gone" or (root == "same" and not due):
                    continue
                try:
                    stats = self._run_sync(self.should_stop)
                except BaseException as exc:
                    root = self._follow_root() if isinstance(exc, Exception) else "same"
                    if root == "gone":
                        continue  # the root went away during the sync: reported as missing
                    self._failed(exc)
                    if not isinstance(exc, Exception):
                        raise
                    if root == "back":  # replaced during the sync: the new one is synced next
                        with self._cond:
                            self._dirty, self._due = True, time.monotonic()
                            self._generation += 1
                    continue
                finally:
                    self._last_sync = time.monotonic()
                self.last_stats = stats
                self.last_error = None
                self.syncs += 1
                if self._on_synced is not None:
                    try:
                        self._on_synced(stats)
                    except Exception as exc:
                        self.last_error = f"on_synced callback failed: {type(exc).__name__}: {exc}"
        finally:
            with contextlib.suppress(Exception):
                self._close_worker()

    def _follow_root(self) -> Literal["same", "gone", "back"]:
        """Whether the root is the directory being watched (``same``), is gone (reported once,
        nothing to sync) or is ``back``: a directory at that path again, or another one in its
        place, which is then watched again and to be synced at once."""
        identity = _root_identity(self.root)
        if identity == self._root_identity:
            return "same" if identity is not None else "gone"
        self._root_identity = identity
        if identity is None:
            self.root_missing = True
            self._report(
                RootMissingError(
                    f"root {self.root} is missing (deleted, moved or unmounted): watching resumes when "
                    "a directory is back at that path"
                ),
                "root missing",
            )
            return "gone"
        self.root_missing = False
        if self._events:
            with self._cond:
                observer, self._observer = self._observer, None
            if observer is not None:
                _end_observer(observer, 5.0)
            if self._stop:
                return "gone"
            self._start_observer()
            self.rearms += 1
        with self._cond:
            self._dirty, self._first_dirty = False, None
        return "back"

    def _failed(self, exc: BaseException) -> None:
        self._report(exc, "sync failed")

    def _report(self, exc: BaseException, what: str) -> None:
        self.last_error = f"{what}: {type(exc).__name__}: {exc}"
        if os.environ.get("MEMSTRATA_DEBUG"):
            traceback.print_exception(exc)
        if self._on_error is not None:
            with contextlib.suppress(Exception):
                self._on_error(exc)

    def status(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "events": self._events,
            "observer_alive": self.observer_alive,
            "healthy": self.healthy and self.last_error is None,
            "error": self.observer_error,
            "last_error": self.last_error,
            "debounce_s": self.debounce_s,
            "interval_s": self.interval_s,
            "dirty": self._dirty,
            "root_missing": self.root_missing,
            "rearms": self.rearms,
            "syncs": self.syncs,
            "events_seen": self.events_seen,
        }


def _end_observer(observer: Any, timeout: float) -> None:
    with contextlib.suppress(Exception):
        observer.stop()
        observer.join(timeout)
