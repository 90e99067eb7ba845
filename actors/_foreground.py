"""Pre-task retrievals in flight, and the write-back steps that step aside for them.

A pre-task retrieval is mostly Python: its searches hold the GIL, and on a small machine every
other thread running Python meanwhile (another agent's write-back being stored, its vectors
being written) lengthens it, each time it takes the GIL back. Nobody waits on a write-back step
at once (its outcome is durable in the outbox already), so an actor about to handle one first
waits while retrievals are in flight (:meth:`Foreground.yield_to`), boundedly:

- never when a retrieval in flight needs the actor (it would hold up the very retrieval it
  steps aside for), and it stops waiting as soon as one that does starts;
- never once a message that is not a write-back step waits in its mailbox (a caller waits on
  that one), and it stops waiting when one arrives;
- never for a retrieval past its own deadline (its agent's actor crashed before answering);
- at most ``actors.writeback_yield_s`` after the step was posted, so a write-back is late by
  at most that per step, and never lost; and not at all once the system is stopping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

__all__ = ["Foreground"]

_Actor = tuple[str, str]  # (kind, key)


class Foreground:
    """The retrievals in flight: for each, the actors it needs and its deadline."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active: dict[int, tuple[frozenset[_Actor], float]] = {}
        self._tokens = 0
        self._waiting = 0
        self._closed = False
        self.yields = 0  # write-back steps that waited, in all

    def enter(self, actors: Iterable[_Actor], timeout_s: float) -> int:
        """A retrieval starts: it needs ``actors`` and is over within ``timeout_s``; a token for
        :meth:`leave`. An actor waiting already stops if this one needs it."""
        now = time.monotonic()
        with self._cond:
            for token in [t for t, (_, deadline) in self._active.items() if deadline <= now]:
                del self._active[token]
            self._tokens += 1
            self._active[self._tokens] = (frozenset(actors), now + timeout_s)
            if self._waiting:
                self._cond.notify_all()
            return self._tokens

    def leave(self, token: int) -> None:
        """The retrieval ``token`` has answered."""
        with self._cond:
            if self._active.pop(token, None) is not None and self._waiting:
                self._cond.notify_all()

    def poke(self) -> None:
        """A message arrived in some mailbox: the actors waiting look whether it is theirs."""
        if self._waiting:  # read without the lock: a waiter counts itself before it looks
            with self._cond:
                self._cond.notify_all()

    def close(self) -> None:
        """The system is stopping: nothing waits any more."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def yield_to(self, actor: _Actor, limit: float, urgent: Callable[[], bool]) -> bool:
        """Wait, ``limit`` seconds at most, while retrievals that do not need ``actor`` are in
        flight and none that does, until ``urgent()`` (a message that is not a write-back step
        waits in the actor's mailbox); whether it waited."""
        if not self._active:  # the usual case, read without the lock: nothing to wait for
            return False
        with self._cond:
            now = time.monotonic()
            if not self._holds_back(actor, now) or urgent():
                return False
            self.yields += 1
            end = now + limit
            self._waiting += 1
            try:
                while now < end and self._holds_back(actor, now) and not urgent():
                    self._cond.wait(end - now)
                    now = time.monotonic()
            finally:
                self._waiting -= 1
            return True

    def _holds_back(self, actor: _Actor, now: float) -> bool:
        """Whether a retrieval in flight within its deadline keeps ``actor`` waiting: one that
        does not need it, while none that does (lock held)."""
        if self._closed:
            return False
        live = False
        for actors, deadline in self._active.values():
            if deadline <= now:
                continue
            if actor in actors:
                return False
            live = True
        return live
