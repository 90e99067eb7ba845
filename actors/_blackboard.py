"""The blackboard actor: one session's board, with subscriber callbacks on a delivery thread.

The actor owns the :class:`BlackboardState` and decides who is told about each change; a
per-session delivery thread runs the callbacks in the order the changes were made (so each
publisher's order is kept), never on the publisher's thread and never on the actor's, so a slow
subscriber cannot stall publishing. A callback that raises is unsubscribed and counted; the
others carry on. A new subscriber first receives the current matching values, queued in the same
step that registers it, so it misses nothing and sees nothing twice.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from ._base import MemoryActor
from ._concurrency import Activity
from .messages import (
    DeleteSignal,
    ListSignals,
    PublishSignal,
    QuerySignal,
    Signal,
    SignalDeleted,
    SignalList,
    SignalPublished,
    SignalSubscribed,
    SignalUnsubscribed,
    SignalValue,
    SubscribeSignal,
    UnsubscribeSignal,
)

__all__ = ["BlackboardActor", "SubscribeWithCallback", "SubscriberFailed"]

log = logging.getLogger("memstrata.actors")

SignalCallback = Callable[[Signal], Any]


@dataclass(frozen=True, slots=True)
class SubscribeWithCallback:
    """Internal: a :class:`SubscribeSignal` plus the callable to deliver to."""

    request: SubscribeSignal
    callback: SignalCallback


@dataclass(frozen=True, slots=True)
class SubscriberFailed:
    """Internal: the delivery thread reports a callback that raised."""

    subscription_id: int
    error: str


class _Delivery:
    """A FIFO of (subscription, signal) served by one thread."""

    def __init__(
        self,
        session_id: str,
        activity: Activity,
        owner: str,
        on_failure: Callable[[int, BaseException], None],
    ):
        self._activity = activity
        self._owner = owner
        self._on_failure = on_failure
        self._callbacks: dict[int, SignalCallback] = {}
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[int, Signal] | None] = queue.SimpleQueue()
        self.delivered = 0
        self.errors = 0
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"memstrata-board-{session_id}", daemon=True)
        self._thread.start()

    def add(self, sub_id: int, callback: SignalCallback) -> None:
        with self._lock:
            self._callbacks[sub_id] = callback

    def remove(self, sub_id: int) -> bool:
        with self._lock:
            return self._callbacks.pop(sub_id, None) is not None

    def post(self, sub_id: int, signal: Signal) -> None:
        self._activity.begin(self._owner)
        self._queue.put((sub_id, signal))

    def _run(self) -> None:
        _DELIVERY_THREAD.active = True
        for sub_id, signal in iter(self._queue.get, None):  # None: the board stops
            try:
                with self._lock:
                    callback = self._callbacks.get(sub_id)
                if callback is None:
                    continue  # unsubscribed meanwhile
                try:
                    callback(signal)
                    self.delivered += 1
                except BaseException as exc:  # CancelledError, SystemExit too: the thread serves the others
                    with self._lock:
                        self._callbacks.pop(sub_id, None)
                        self.errors += 1
                        self.last_error = f"subscription {sub_id}: {type(exc).__name__}: {exc}"
                    log.warning("blackboard subscriber %s raised and was removed: %s", sub_id, exc)
                    with contextlib.suppress(Exception):
                        self._on_failure(sub_id, exc)
            finally:
                self._activity.done(self._owner)

    def close(self, timeout: float) -> None:
        """Deliver what is queued, then stop (bounded by ``timeout``)."""
        self._queue.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=timeout)


_DELIVERY_THREAD = threading.local()


def on_delivery_thread() -> bool:
    """Whether the caller is a subscriber's callback, on a board's delivery thread (where waiting
    for the system to be idle would wait for the caller itself)."""
    return bool(getattr(_DELIVERY_THREAD, "active", False))


class BlackboardActor(MemoryActor):
    """A session's blackboard; when configured, loaded from ``blackboard/{session}.sqlite`` at
    its start and, on stop, the keys it changed are saved there (other processes' keys stay)."""

    kind = "blackboard"

    def __init__(self, runtime: Any, key: str, owner: str | None = None) -> None:
        super().__init__(runtime, key, owner)
        self._delivery = _Delivery(key, runtime.activity, self.owner, self._subscriber_failed)
        self._board: Any = None  # the state, kept across a crash (see open_layer)
        self._published_at: _dt.datetime | None = None  # the time of the publish being handled

    def _subscriber_failed(self, sub_id: int, exc: BaseException) -> None:
        failed = SubscriberFailed(sub_id, f"{type(exc).__name__}: {exc}")
        self.runtime.post(self.actor_ref, failed, owner=self.owner)

    def open_layer(self) -> Any:
        """The board's state; after a crash, the same one: it is the board (values, versions,
        subscriptions, their ids), which no store could give back whole."""
        if self._board is not None:
            return self._board
        from memstrata.layers import BlackboardState

        state = BlackboardState(clock=self._now, max_value_bytes=self.runtime.config.max_content_bytes)
        if self.runtime.config_actors("blackboard_snapshot"):
            state.restore(self.runtime.path("blackboard", self.key))
        self._board = state
        return state

    def _now(self) -> _dt.datetime:
        """The time a change is dated: a publish's own (taken by its caller), else the clock's."""
        return self._published_at or self.runtime.clock.now()

    def close_layer(self, layer: Any) -> None:
        if self.runtime.config_actors("blackboard_snapshot"):
            layer.snapshot(self.runtime.path("blackboard", self.key))

    def on_stop(self) -> None:
        try:
            super().on_stop()
        finally:
            self._delivery.close(timeout=float(self.runtime.config_actors("stop_timeout_s")))

    def _signal(self, record: Any, *, deleted: bool = False) -> Signal:
        return Signal(
            self.key,
            record.key,
            orjson.loads(record.data),
            record.publisher_id,
            record.version,
            record.updated_at,
            deleted,
        )

    def handle(self, message: Any) -> Any:
        state = self.layer
        if isinstance(message, PublishSignal):
            self._published_at = message.at
            try:
                record, subscribers = state.publish(message.key, message.value, message.publisher_id)
            finally:
                self._published_at = None
            for sub_id in subscribers:
                self._delivery.post(sub_id, self._signal(record))
            return SignalPublished(self.key, record.key, record.version)
        if isinstance(message, DeleteSignal):
            gone, subscribers = state.delete(message.key)
            if gone is None:
                return SignalDeleted(self.key, message.key, False)
            for sub_id in subscribers:
                self._delivery.post(sub_id, self._signal(gone, deleted=True))
            return SignalDeleted(self.key, message.key, True, gone.version)
        if isinstance(message, QuerySignal):
            record = state.get(message.key)
            if record is None:
                return SignalValue(self.key, message.key)
            return SignalValue(
                self.key,
                record.key,
                record.value,
                True,
                record.publisher_id,
                record.version,
                record.updated_at,
            )
        if isinstance(message, ListSignals):
            return SignalList(self.key, message.prefix, tuple(state.list(message.prefix or None)))
        if isinstance(message, SubscribeWithCallback):
            sub_id, current = state.subscribe(message.request.key_or_prefix)
            self._delivery.add(sub_id, message.callback)
            for record in current:
                self._delivery.post(sub_id, self._signal(record))
            return SignalSubscribed(self.key, sub_id, message.request.key_or_prefix)
        if isinstance(message, UnsubscribeSignal):
            self._delivery.remove(message.subscription_id)
            removed = state.unsubscribe(message.subscription_id)
            return SignalUnsubscribed(self.key, message.subscription_id, removed)
        if isinstance(message, SubscriberFailed):
            state.unsubscribe(message.subscription_id)
            return None
        return super().handle(message)

    def status(self) -> dict[str, Any]:
        base = super().status()
        state = self.layer
        if state is not None:
            base["keys"] = len(state)
            base["subscribers"] = state.subscriber_count
        base["delivered"] = self._delivery.delivered
        base["subscriber_errors"] = self._delivery.errors
        base["last_subscriber_error"] = self._delivery.last_error
        return base
