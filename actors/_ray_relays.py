"""Blackboard subscriptions across processes on Ray: the host's side and the subscriber's side.

A subscriber's callback stays in its own process. The board's host keeps a queue per
subscription (a *relay*) and the subscriber's process runs a thread that fetches the queued
signals (long polling) and calls the callback in publication order. The relays are saved with
the board (see ``_ray_board``): a host that Ray restarts registers them again before it answers
anything, so a subscriber's thread that rides out the restart goes on receiving (first the
current matching values again, with their versions, then new changes). A relay nobody fetches
from for ``RELAY_IDLE_S`` (its subscriber's process is gone) is dropped, so it cannot grow
without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import ray

from ._blackboard import SubscribeWithCallback
from ._ray_board import RelayFailed, RelaySubscribe, SavedRelays
from .messages import SignalSubscribed, SignalUnsubscribed, SubscribeSignal, UnsubscribeSignal

__all__ = ["POLL_S", "RELAY_IDLE_S", "RelayEndpoint", "run_relay"]

log = logging.getLogger("memstrata.actors")

POLL_S = 1.0  # how long a subscriber's thread waits on the host for the next signals
RELAY_IDLE_S = 300.0  # a relay not fetched from for this long has lost its subscriber
_UNKNOWN_S = 30.0  # a relay the host has not heard of for this long is gone (lost in a crash)
_RETRY_S = 120.0  # how long a subscriber's thread waits for a restarting host


class RelayEndpoint:
    """The relay half of a Ray host (mixed into it): subscribe, poll, drop, restore, sweep."""

    key: str
    runtime: Any
    hosts_board: bool

    def _relays_init(self) -> None:
        self._queues: dict[str, asyncio.Queue[Any]] = {}
        self._relay_of: dict[int, str] = {}  # subscription id (the subscriber's) -> relay
        self._polled: dict[str, float] = {}  # relay -> when it was last fetched from (or made)
        self._unknown: dict[str, float] = {}  # relay -> since when a poll names it in vain
        self._restored: asyncio.Lock | None = None
        self._restore_done = not self.hosts_board

    async def _answer(self, message: Any, future: Future[Any]) -> Any:
        raise NotImplementedError

    async def _enqueue(self, kind: str, key: str, message: Any, caller: str, seq: int) -> Future[Any]:
        raise NotImplementedError

    def _deliverer(self, relay: str) -> Callable[[Any], None]:
        signals = self._queue(relay)
        loop = asyncio.get_running_loop()

        def deliver(signal: Any) -> None:  # on the board's delivery thread
            loop.call_soon_threadsafe(signals.put_nowait, signal)

        return deliver

    async def _ready(self) -> None:
        """Register the relays saved before a restart, once, before anything else is served."""
        if self._restore_done:
            return
        if self._restored is None:
            self._restored = asyncio.Lock()
        async with self._restored:
            if self._restore_done:
                return
            ask = SavedRelays()
            saved = await self._answer(ask, self.runtime.request("blackboard", self.key, ask))
            for relay, client, pattern in saved:
                message = RelaySubscribe(
                    SubscribeSignal(pattern, self.key), self._deliverer(relay), relay, client
                )
                answer = await self._answer(message, self.runtime.request("blackboard", self.key, message))
                if isinstance(answer, SignalSubscribed):
                    self._relay_of[answer.subscription_id] = relay
                    self._polled[relay] = time.monotonic()
            self._restore_done = True
            if saved:
                log.info("board %s: %d subscription(s) of other processes restored", self.key, len(saved))

    async def subscribe(self, key: str, request: Any, relay: str, caller: str, seq: int) -> Any:
        """Subscribe on behalf of a subscriber in another process: signals wait for :meth:`poll`."""
        await self._ready()
        self._polled[relay] = time.monotonic()
        message: SubscribeWithCallback = RelaySubscribe(request, self._deliverer(relay), relay)
        answer = await self._answer(message, await self._enqueue("blackboard", key, message, caller, seq))
        if isinstance(answer, SignalSubscribed):
            self._relay_of[answer.subscription_id] = relay
        return answer

    def _unsubscribed(self, message: Any, answer: Any) -> None:
        """An unsubscribe was answered: its relay's subscriber learns it is closed."""
        if isinstance(message, UnsubscribeSignal) and isinstance(answer, SignalUnsubscribed):
            relay = self._relay_of.pop(message.subscription_id, None)
            if relay is not None:
                self._queue(relay).put_nowait(None)

    async def poll(self, relay: str, wait_s: float) -> list[Any] | None:
        """The signals for ``relay`` so far (waiting up to ``wait_s`` for one); None once closed."""
        await self._ready()
        now = time.monotonic()
        if relay not in self._queues:  # its subscribe is on its way, or the relay is gone
            since = self._unknown.setdefault(relay, now)
            if now - since > _UNKNOWN_S:
                self._unknown.pop(relay, None)
                return None
            await asyncio.sleep(wait_s)  # a long poll's pace; the subscribe makes the queue
            return []
        self._unknown.pop(relay, None)
        self._polled[relay] = now
        await self._sweep(now)
        signals = self._queue(relay)
        out: list[Any] = []
        with contextlib.suppress(TimeoutError):
            out.append(await asyncio.wait_for(signals.get(), wait_s))
        while not signals.empty():
            out.append(signals.get_nowait())
        self._polled[relay] = time.monotonic()
        if any(item is None for item in out):
            self._queues.pop(relay, None)
            self._polled.pop(relay, None)
            return None
        return out

    async def _sweep(self, now: float) -> None:
        """Drop the relays no one has fetched from for ``RELAY_IDLE_S``."""
        for relay, when in list(self._polled.items()):
            if now - when > RELAY_IDLE_S:
                log.warning(
                    "board %s: relay %s not fetched for %g s: unsubscribed", self.key, relay, RELAY_IDLE_S
                )
                await self.drop_relay(relay)
                self._queues.pop(relay, None)
                self._polled.pop(relay, None)

    async def drop_relay(self, relay: str, error: str | None = None) -> None:
        """Unsubscribe ``relay``; ``error``: its subscriber's callback raised this (counted in
        the board's ``subscriber_errors``, as the local engine counts it)."""
        sub = next((s for s, r in self._relay_of.items() if r == relay), None)
        if error is not None:
            failed = RelayFailed(sub, error)
            with contextlib.suppress(Exception):
                await self._answer(failed, self.runtime.request("blackboard", self.key, failed))
        if sub is not None:
            with contextlib.suppress(Exception):
                message = UnsubscribeSignal(sub, self.key)
                answer = await self._answer(message, self.runtime.request("blackboard", self.key, message))
                self._unsubscribed(message, answer)

    def _queue(self, relay: str) -> asyncio.Queue[Any]:
        return self._queues.setdefault(relay, asyncio.Queue())


def run_relay(
    handle: Any,
    relay: str,
    callback: Callable[[Any], Any],
    closed: threading.Event,
    stopped: Callable[[], bool],
) -> None:
    """The subscriber's thread: fetch the relay's signals and call ``callback`` on each, in order,
    until the subscription closes; rides out a restart of the host for up to ``_RETRY_S``."""
    failing_since: float | None = None
    while not closed.is_set() and not stopped():
        try:
            signals = ray.get(handle.poll.remote(relay, POLL_S), timeout=POLL_S + 30)
        except BaseException as exc:  # Ray raises SystemExit in threads when it shuts down
            if closed.is_set() or stopped() or isinstance(exc, SystemExit | KeyboardInterrupt):
                return
            now = time.monotonic()
            failing_since = now if failing_since is None else failing_since
            if now - failing_since > _RETRY_S:
                log.warning("subscription relay %s stopped: its host did not come back: %s", relay, exc)
                return
            closed.wait(0.5)  # the host is restarting: ask again
            continue
        failing_since = None
        if signals is None:
            if not closed.is_set():
                log.info("subscription relay %s closed by its host", relay)
            return
        for signal in signals:
            try:
                callback(signal)
            except Exception as exc:
                log.warning("a subscriber raised and is unsubscribed: %s", exc)
                closed.set()
                with contextlib.suppress(Exception):  # counted and unsubscribed in the board
                    ray.get(handle.drop_relay.remote(relay, f"{type(exc).__name__}: {exc}"), timeout=_RETRY_S)
                return
