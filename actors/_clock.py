"""Clocks: the system's notion of "now", injectable so simulations control time.

Wall time (``now``) stamps episodes and blackboard values; monotonic time (``monotonic``) drives
working-memory expiry and the restart budget window. Timeouts of requests always run on real
time: a simulated clock never makes a caller wait longer or shorter than it asked.
"""

from __future__ import annotations

import datetime as _dt
import threading
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    def now(self) -> _dt.datetime:
        """The current time, timezone-aware (UTC)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> _dt.datetime:
        return _dt.datetime.now(_dt.UTC)

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to (``advance``), for tests and simulations."""

    def __init__(self, start: _dt.datetime | None = None) -> None:
        if start is not None and start.tzinfo is None:
            raise ValueError("ManualClock start must be timezone-aware")
        self._now = start or _dt.datetime(2025, 1, 1, tzinfo=_dt.UTC)
        self._mono = 0.0
        self._lock = threading.Lock()

    def now(self) -> _dt.datetime:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        with self._lock:
            self._now += _dt.timedelta(seconds=seconds)
            self._mono += seconds
