"""Small concurrency helpers: an idle detector and a timer thread.

``Activity`` counts units of work in flight across all actors (a message enqueued and not yet
handled, a subscriber callback not yet run); ``wait_idle`` waits on a condition until the count
reaches zero, so tests synchronise on the system itself instead of sleeping. A handler that sends
follow-up messages counts them before its own unit ends, so the count never touches zero while
work is still being passed along.

``Scheduler`` runs short callbacks (usually a ``tell``) at a later time on one thread, so actors
can set deadlines without blocking their mailbox.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["Activity", "Scheduler", "TimerHandle"]

log = logging.getLogger("memstrata.actors")


class Activity:
    """Counts work in flight; ``wait_idle`` returns once nothing is left (or the timeout ends)."""

    def __init__(self) -> None:
        self._count = 0
        self._cond = threading.Condition()

    def begin(self, n: int = 1) -> None:
        with self._cond:
            self._count += n

    def done(self, n: int = 1) -> None:
        with self._cond:
            self._count -= n
            if self._count <= 0:
                self._count = 0
                self._cond.notify_all()

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._count

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._count == 0, timeout=timeout)


class TimerHandle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Scheduler:
    """One daemon thread running callbacks at their due time (real monotonic time)."""

    def __init__(self, name: str = "memstrata-scheduler") -> None:
        self._heap: list[tuple[float, int, TimerHandle, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle()
        with self._cond:
            if self._closed:
                handle.cancel()
                return handle
            heapq.heappush(
                self._heap, (time.monotonic() + max(0.0, delay_s), next(self._seq), handle, callback)
            )
            if self._heap[0][2] is handle:  # due before everything else: the thread must wake sooner
                self._cond.notify()
        return handle

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    wait = None if not self._heap else max(0.0, self._heap[0][0] - time.monotonic())
                    self._cond.wait(wait)
                if self._closed:
                    return
                _, _, handle, callback = heapq.heappop(self._heap)
            if handle.cancelled:
                continue
            try:
                callback()
            except Exception:
                log.exception("scheduled callback failed")

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify_all()
        with contextlib.suppress(RuntimeError):
            self._thread.join(timeout=5)
