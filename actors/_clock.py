"""Clocks: the system's notion of "now", injectable so simulations control time.

Wall time (``now``) stamps knowledge, episodes, write-backs and blackboard values; monotonic time
(``monotonic``) drives working-memory expiry, the restart budget window and the pre-task retrieval
deadline (a :class:`ManualClock`'s ``advance`` fires the deadlines it passes). How long a *caller*
waits for an answer is always bounded by real time, so a simulation never hangs.

:class:`IdSource` makes the ids a system invents (episode uuids) reproducible: seeded, each
owner's ids are a function of the seed, the owner and how many ids it took before.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import math
import threading
import time
import uuid
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from memstrata.core.validation import check_aware
from memstrata.layers._working import NS_PER_S, seconds_to_ns

__all__ = ["Clock", "IdSource", "ManualClock", "SystemClock"]


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
    """A clock that moves only when told to (``advance``), for tests and simulations.

    Time is one exact count of nanoseconds, from which both ``now`` and ``monotonic`` are read:
    the same total advance gives the same time however it is split, and the two never drift
    apart (``now`` shows whole microseconds, the most a ``datetime`` holds).
    """

    def __init__(self, start: _dt.datetime | None = None) -> None:
        self._start = (  # in UTC, as Clock.now is: what it dates reads the same from any zone
            _dt.datetime(2025, 1, 1, tzinfo=_dt.UTC)
            if start is None
            else check_aware(start, "start").astimezone(_dt.UTC)
        )
        self._elapsed_ns = 0
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def now(self) -> _dt.datetime:
        with self._lock:
            elapsed_ns = self._elapsed_ns
        return self._start + _dt.timedelta(microseconds=elapsed_ns // 1000)

    def monotonic(self) -> float:
        with self._lock:
            elapsed_ns = self._elapsed_ns
        return elapsed_ns / NS_PER_S  # the float nearest the exact count

    def monotonic_ns(self) -> int:
        """:meth:`monotonic` as the exact count of nanoseconds (deadlines compare these)."""
        with self._lock:
            return self._elapsed_ns

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, counted to the nearest nanosecond; deadlines that
        are now due fire (on the system's timer thread)."""
        if not seconds >= 0 or not math.isfinite(seconds):
            raise ValueError(f"a clock only moves forward by a finite step (advance by {seconds!r})")
        step_ns = seconds_to_ns(seconds)
        with self._lock:
            self._elapsed_ns += step_ns
            listeners = list(self._listeners)
        for listener in listeners:  # outside the lock: a listener may read the clock
            listener()

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every :meth:`advance` (a scheduler wakes up to fire timers)."""
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)


class IdSource:
    """Unique ids for the things a system names (episodes).

    Without a seed: random uuid4. With a seed: each ``scope`` (e.g. ``episode:planner``) gets a
    sequence of uuid-shaped ids derived from ``(seed, scope, n)``, so two runs with the same seed
    that do the same things per owner name them the same, whatever the threads' interleaving
    across owners.
    """

    def __init__(self, seed: int | str | None = None) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | str)):
            raise ValueError(f"seed must be an integer, a string or None, got {seed!r}")
        self.seed = seed
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def uuid(self, scope: str) -> str:
        if self.seed is None:
            return str(uuid.uuid4())
        with self._lock:
            n = self._counts.get(scope, 0) + 1
            self._counts[scope] = n
        digest = hashlib.blake2b(f"{self.seed!r}\x00{scope}\x00{n}".encode(), digest_size=16).digest()
        return str(uuid.UUID(bytes=digest, version=4))

    def for_scope(self, scope: str) -> Callable[[], str]:
        """A function returning the next id of ``scope`` (what a layer calls for a new id)."""
        return lambda: self.uuid(scope)
