"""Small concurrency helpers: an idle detector and a timer thread.

``Activity`` counts units of work in flight across all actors (a message enqueued and not yet
handled, a subscriber callback not yet run), in all and per owner (an agent, ``session:{id}``,
``codebase:{name}``: whose actor will do the work); ``wait_idle`` waits on a condition until the
count (of everyone, or of one owner) reaches zero, so tests synchronise on the system itself
instead of sleeping, and retiring one agent waits for its own work only. A handler that sends
follow-up messages counts them before its own unit ends, so the count never touches zero while
work is still being passed along.

``Scheduler`` runs short callbacks (usually a ``tell``) at a later time on one thread, so actors
can set deadlines without blocking their mailbox. A timer set ``on_clock`` is due on the system's
clock: with a manual clock (one with ``add_listener``, e.g. ``ManualClock``) it fires when the
clock is advanced past it, never by real time passing; other timers run on real time. Those
timers count whole nanoseconds, as the manual clock does, so a deadline set at 0.1 s for 0.2 s
fires when the clock reaches 0.3 s, which the float sum (0.30000000000000004) would not.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from memstrata.layers._working import seconds_to_ns

__all__ = ["Activity", "Scheduler", "TimerHandle"]

log = logging.getLogger("memstrata.actors")


class Activity:
    """Counts work in flight, in all and by owner; ``wait_idle`` returns once nothing is left
    (or the timeout ends)."""

    def __init__(self) -> None:
        self._count = 0
        self._owned: Counter[str] = Counter()
        self._cond = threading.Condition()

    def begin(self, owner: str, n: int = 1) -> None:
        with self._cond:
            self._count += n
            self._owned[owner] += n

    def done(self, owner: str, n: int = 1) -> None:
        with self._cond:
            self._count -= n
            left = self._owned[owner] - n
            if left > 0:
                self._owned[owner] = left
            else:
                self._owned.pop(owner, None)
            if self._count <= 0:
                self._count = 0
            if self._count == 0 or left <= 0:
                self._cond.notify_all()

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._count

    def wait_idle(self, timeout: float | None = None, owner: str | None = None) -> bool:
        """Whether nothing is in flight (``owner``: nothing of that owner's) within ``timeout``."""
        with self._cond:
            if owner is None:
                return self._cond.wait_for(lambda: self._count == 0, timeout=timeout)
            return self._cond.wait_for(lambda: self._owned[owner] <= 0, timeout=timeout)


class TimerHandle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


_Timer = tuple[float, int, TimerHandle, Callable[[], None]]  # due: monotonic seconds, or ns on a clock


class Scheduler:
    """One daemon thread running callbacks at their due time (real monotonic time, or the
    manual clock's time for timers set ``on_clock``)."""

    def __init__(self, name: str = "memstrata-scheduler", *, clock: Any = None) -> None:
        self._heap: list[_Timer] = []
        self._clock_heap: list[_Timer] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        # a clock that reports its advances is simulated: its timers wait for it, not for real time
        self._manual = clock if callable(getattr(clock, "add_listener", None)) else None
        if self._manual is not None:
            self._manual.add_listener(self._wake)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def call_later(
        self, delay_s: float, callback: Callable[[], None], *, on_clock: bool = False
    ) -> TimerHandle:
        handle = TimerHandle()
        with self._cond:
            if self._closed:
                handle.cancel()
                return handle
            if on_clock and self._manual is not None:
                due = self._clock_ns() + seconds_to_ns(max(0.0, delay_s))
                heapq.heappush(self._clock_heap, (due, next(self._seq), handle, callback))
                self._cond.notify()  # it may be due already (a zero delay)
                return handle
            heapq.heappush(
                self._heap, (time.monotonic() + max(0.0, delay_s), next(self._seq), handle, callback)
            )
            if self._heap[0][2] is handle:  # due before everything else: the thread must wake sooner
                self._cond.notify()
        return handle

    def _due(self) -> _Timer | None:
        """The first timer that is due, popped; ``None`` when none is (called under the lock)."""
        if self._heap and self._heap[0][0] <= time.monotonic():
            return heapq.heappop(self._heap)
        if self._clock_heap and self._manual is not None and self._clock_heap[0][0] <= self._clock_ns():
            return heapq.heappop(self._clock_heap)
        return None

    def _clock_ns(self) -> int:
        """The manual clock's time in whole nanoseconds (exact when it counts them)."""
        exact = getattr(self._manual, "monotonic_ns", None)
        return int(exact()) if callable(exact) else seconds_to_ns(float(self._manual.monotonic()))  # type: ignore[union-attr]

    def _run(self) -> None:
        while True:
            with self._cond:
                timer = None
                while not self._closed:
                    timer = self._due()
                    if timer is not None:
                        break
                    wait = None if not self._heap else max(0.0, self._heap[0][0] - time.monotonic())
                    self._cond.wait(wait)
                if self._closed or timer is None:
                    return
                _, _, handle, callback = timer
            if handle.cancelled:
                continue
            try:
                callback()
            except Exception:
                log.exception("scheduled callback failed")

    def close(self) -> None:
        if self._manual is not None:
            self._manual.remove_listener(self._wake)
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._clock_heap.clear()
            self._cond.notify_all()
        with contextlib.suppress(RuntimeError):
            self._thread.join(timeout=5)
