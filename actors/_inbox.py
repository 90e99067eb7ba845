"""An actor's mailbox: pykka's queue with the few operations the memory actors need.

Besides pykka's ``put``/``get``: take a run of similar messages waiting at the head (group
commit), look whether a message of some kind waits, refuse messages once closed, and let the
actor wait in its own thread for something else (a vector being computed) while the messages
that arrive meanwhile do not wake it, unless one of them cannot wait (:meth:`Inbox.wait`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import pykka

__all__ = ["Inbox"]


class Inbox(queue.Queue[Any]):
    """pykka's mailbox plus: :meth:`take_while`, so an actor can handle a run of similar messages
    together, in order; :meth:`holds`; :meth:`close`, after which a message put is refused
    (``pykka.ActorDeadError``) rather than left where no one reads it; and :meth:`wait`."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False
        self.arrived: Callable[[], None] | None = None  # told after each put (the lock released)
        self._watch: tuple[Callable[[Any], bool], threading.Event] | None = None

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        with self.mutex:  # unbounded: never waits for room
            if self.closed:
                raise pykka.ActorDeadError("the actor has stopped")
            self._put(item)
            self.unfinished_tasks += 1
            self.not_empty.notify()
            watch = self._watch
            if watch is not None and watch[0](item):
                watch[1].set()
        if self.arrived is not None:
            self.arrived()

    def holds(self, accept: Callable[[Any], bool]) -> bool:
        """Whether an envelope waiting in the mailbox is one ``accept`` accepts."""
        with self.mutex:
            return any(accept(item) for item in self.queue)

    def wait(self, done: threading.Event, urgent: Callable[[Any], bool], timeout: float) -> None:
        """Block the reader (the actor's own thread) until ``done`` is set, a message ``urgent``
        accepts waits here (already, or put meanwhile), or ``timeout`` seconds pass. The other
        messages put meanwhile wait their turn without waking it."""
        with self.mutex:
            if any(urgent(item) for item in self.queue):
                return
            self._watch = (urgent, done)
        try:
            done.wait(timeout)
        finally:
            with self.mutex:
                self._watch = None

    def close(self) -> list[Any]:
        """Refuse every later message; the ones still waiting, in order."""
        with self.mutex:
            self.closed = True
            left = list(self.queue)
            self.queue.clear()
        return left

    def take_while(self, accept: Callable[[Any], bool], limit: int) -> list[Any]:
        taken: list[Any] = []
        with self.mutex:
            while self.queue and len(taken) < limit and accept(self.queue[0]):
                taken.append(self.queue.popleft())
            if taken:
                self.not_full.notify()
        return taken
