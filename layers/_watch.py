"""The file watcher: watchdog events mark the index dirty; a worker syncs after a debounce.

The worker is the only thread that syncs on the watcher's behalf; it does so through a callback
that uses its own database connection (thread confinement). Events only set a flag and push a
deadline, so a burst of writes (an editor saving, ``git checkout``) costs one sync, started
``debounce_s`` after the last event (and at most ``10 * debounce_s`` after the first). An
optional interval sync catches what events miss (network file systems, inotify overflow).
Every failure (the observer cannot start or dies, a sync raises, a callback raises) is caught,
kept for ``status()`` and never reaches the process.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["Watcher"]

_IGNORED_EVENTS = {"opened", "closed_no_write"}
_MAX_DELAY_FACTOR = 10


def _observer_class() -> Any:
    from watchdog.observers import Observer

    return Observer


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
        self._cond = threading.Condition()
        self._stop = False
        self._dirty = False
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
        self._observer = observer

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        observer, self._observer = self._observer, None
        if observer is not None:
            with contextlib.suppress(Exception):
                observer.stop()
                observer.join(timeout)
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
            self._dirty = True
            self._due = now + self.debounce_s
            if self._first_dirty is None:
                self._first_dirty = now
            self._cond.notify_all()

    def clear_dirty(self) -> None:
        """The owner synced everything itself: nothing is pending."""
        with self._cond:
            self._dirty = False
            self._first_dirty = None

    # -- worker --------------------------------------------------------------------------------

    def _wait(self) -> bool:
        """Block until a sync is due; False when stopping."""
        with self._cond:
            while not self._stop:
                now = time.monotonic()
                timeout: float | None = None
                if self._dirty:
                    first = self._first_dirty if self._first_dirty is not None else now
                    due = min(self._due, first + _MAX_DELAY_FACTOR * self.debounce_s)
                    if now >= due:
                        break
                    timeout = due - now
                if self.interval_s is not None:
                    next_interval = self._last_sync + self.interval_s
                    if now >= next_interval:
                        break
                    timeout = next_interval - now if timeout is None else min(timeout, next_interval - now)
                self._cond.wait(timeout)
            if self._stop:
                return False
            self._dirty = False
            self._first_dirty = None
            return True

    def _loop(self) -> None:
        try:
            while self._wait():
                try:
                    stats = self._run_sync(self.should_stop)
                except BaseException as exc:
                    self._failed(exc)
                    if not isinstance(exc, Exception):
                        raise
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

    def _failed(self, exc: BaseException) -> None:
        self.last_error = f"sync failed: {type(exc).__name__}: {exc}"
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
            "syncs": self.syncs,
            "events_seen": self.events_seen,
        }
