"""The Blackboard and Subscription handles: session-board calls, apart from the system's lifecycle."""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memstrata.core.errors import InvalidInputError, SystemStoppedError
from memstrata.messages import (
    DeleteSignal,
    ListSignals,
    PublishSignal,
    QuerySignal,
    Signal,
    SignalValue,
    SubscribeSignal,
    UnsubscribeSignal,
)

if TYPE_CHECKING:
    from ._system import MemorySystem

__all__ = ["Blackboard", "Subscription"]


class Subscription:
    """A blackboard subscription; :meth:`unsubscribe` stops further callbacks."""

    def __init__(self, system: MemorySystem, session_id: str, pattern: str) -> None:
        self._system = system
        self.session_id = session_id
        self.pattern = pattern
        self.id = 0  # the board's id for it, set when the board answers
        self._active = True
        self._failed = threading.Event()  # set on the delivery thread when the callback raised

    def _delivering(self, callback: Callable[[Signal], Any]) -> Callable[[Signal], Any]:
        """``callback``, turning this handle inactive when it raises (the board then removes it),
        and never called once unsubscribed (a stopping system delivers what is queued without
        asking the board to remove the subscription first)."""

        def deliver(signal: Signal) -> Any:
            if not self._active:
                return None
            try:
                return callback(signal)
            except BaseException:  # whatever it raises, the board removes it (and goes on)
                self._failed.set()
                raise

        return deliver

    @property
    def active(self) -> bool:
        """False once unsubscribed, or once its callback raised (the board then removed it)."""
        return self._active and not self._failed.is_set()

    def unsubscribe(self) -> bool:
        """Stop delivering to this subscription; True the first time, False once it is inactive.
        No callback starts after this returns (one already running on the delivery thread
        finishes)."""
        if not self.active:
            self._active = False
            return False
        self._active = False
        if self._system.stopped:
            return True
        reply = self._system.ask(UnsubscribeSignal(self.id, self.session_id))
        return bool(reply.removed)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(SystemStoppedError):
            self.unsubscribe()

    def __repr__(self) -> str:
        return f"<Subscription {self.id} {self.pattern!r} on {self.session_id}>"


class Blackboard:
    """A session's shared board: publish/get/list and subscriptions to a key or a ``prefix*``."""

    def __init__(self, system: MemorySystem, session_id: str) -> None:
        self._system = system
        self.session_id = session_id

    def __repr__(self) -> str:
        return f"<Blackboard {self.session_id}>"

    def publish(
        self, key: str, value: Any, publisher: str | None = None, *, wait: bool = False
    ) -> int | None:
        """Set ``key`` to ``value`` (any JSON data) and notify subscribers.

        Fire-and-forget unless ``wait`` (then returns the key's new version). Invalid keys and
        values that are not JSON-serialisable raise at once, in the caller's thread. The value is
        dated now, in the caller's thread, however late the board handles it.
        """
        message = PublishSignal(key, value, publisher, self.session_id, self._system.clock.now())
        if not wait:
            self._system.tell(message)
            return None
        return int(self._system.ask(message).version)

    def get(self, key: str, default: Any = None) -> Any:
        """A copy of the current value of ``key``, or ``default``."""
        reply = self.signal(key)
        return reply.value if reply.found else default

    def signal(self, key: str) -> SignalValue:
        """The current value of ``key`` with its publisher, version and time."""
        return self._system.ask(QuerySignal(key, self.session_id))  # type: ignore[no-any-return]

    def list(self, prefix: str | None = None) -> list[str]:
        """The keys, sorted; only those starting with ``prefix`` when given."""
        return list(self._system.ask(ListSignals(prefix, self.session_id)).keys)

    def delete(self, key: str) -> bool:
        """Remove ``key``; True if it was set. Subscribers receive a signal with ``deleted`` set
        (value null); a later publish continues the key's version count."""
        return bool(self._system.ask(DeleteSignal(key, self.session_id)).deleted)

    def subscribe(self, key_or_prefix: str, callback: Callable[[Signal], Any]) -> Subscription:
        """Call ``callback(signal)`` for every change of a key, or of any key under ``prefix*``.

        The current matching values are delivered at once. Callbacks run on the session's
        delivery thread, in publication order; one that raises is unsubscribed (counted in
        ``status()``) and the others carry on.
        """
        if not callable(callback):
            raise InvalidInputError(f"callback must be callable, got {type(callback).__name__}")
        if inspect.iscoroutinefunction(callback) or inspect.iscoroutinefunction(type(callback).__call__):
            raise InvalidInputError(
                "callback is a coroutine function, which this thread would never await: "
                "iterate AsyncBlackboard.subscribe(...) instead, or pass a plain function"
            )
        subscription = Subscription(self._system, self.session_id, key_or_prefix)
        deliver = subscription._delivering(callback)
        reply = self._system.ask(SubscribeSignal(key_or_prefix, self.session_id), callback=deliver)
        subscription.id = reply.subscription_id
        return subscription
