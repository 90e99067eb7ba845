"""One JSON-RPC client: its lanes, subscriptions and writer thread, apart from the serving loop."""

from __future__ import annotations

import socket
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, Protocol

from ._json import dumps
from ._rpc_protocol import _error, error_for

__all__ = ["MAX_BACKLOG", "Connection", "ServeStats", "current_connection"]

_MAX_IN_FLIGHT = 1024
MAX_BACKLOG = 10_000
"""Notifications waiting for one slow client before its subscriptions are ended."""


@dataclass(slots=True)
class ServeStats:
    requests: int = 0
    errors: int = 0
    bad_lines: int = 0
    notifications: int = 0  # pushed to clients (subscriptions)
    connections: int = 0  # accepted so far


class _Server(Protocol):
    """What a connection uses of its server (:class:`memstrata.bridges._server.JsonLinesServer`)."""

    stats: ServeStats
    _stats_lock: threading.Lock

    def warn(self, message: str) -> None: ...

    def _submit(self, job: Callable[[], None]) -> None: ...


_local = threading.local()


def current_connection() -> Connection | None:
    """The connection whose request this thread is running (``None`` outside a request)."""
    return getattr(_local, "connection", None)


class Connection:
    """One client: its lanes, its subscriptions, and a writer thread that owns its output.

    Every line (response, batch, notification) is queued whole and written by one thread, so lines
    never interleave; operations keep per-client state here (``subscriptions``) and register
    ``on_close`` clean-ups, run when the client goes away.
    """

    def __init__(self, server: _Server, writer: IO[bytes], name: str) -> None:
        self.server = server
        self.name = name
        self.subscriptions: dict[tuple[str, int], Any] = {}  # (session, id) -> has .end()
        self.transport: socket.socket | None = None  # a socket client's socket
        self.writer = writer
        self._out: deque[bytes] = deque()
        self._output = threading.Condition()
        self._output_closed = False
        self._write_failed = False
        self._backlog = 0
        self._lane_lock = threading.Lock()
        self._lanes: dict[str, deque[Callable[[], None]]] = {}
        self._in_flight = threading.Semaphore(_MAX_IN_FLIGHT)
        self._idle = threading.Condition()
        self._pending = 0
        self._cleanups: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._write_loop, name=f"memstrata-out-{name}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"<Connection {self.name}>"

    # -- output --------------------------------------------------------------------------------

    @property
    def output_lock(self) -> threading.Condition:
        """Held while a line is queued: change what decides whether to notify under it."""
        return self._output

    @property
    def open(self) -> bool:
        return not (self._output_closed or self._write_failed)

    def send(self, message: Any) -> None:
        """Queue one response (or batch) line."""
        try:
            line = dumps(message) + b"\n"
        except Exception as exc:  # an unserialisable result is a bug; the client still gets an answer
            code, text = error_for(exc)
            request_id = message.get("id") if isinstance(message, dict) else None
            line = dumps(_error(request_id, code, text)) + b"\n"
        self._queue(line)

    def notify(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        when: Callable[[], bool] | None = None,
        limited: bool = True,
    ) -> bool:
        """Queue a notification if ``when()`` still holds (checked under :attr:`output_lock`);
        False when it was not queued (condition false, client gone, or, when ``limited``, more
        than :data:`MAX_BACKLOG` notifications already wait for it)."""
        line = dumps({"jsonrpc": "2.0", "method": method, "params": params}) + b"\n"
        with self._output:
            if when is not None and not when():
                return False
            if limited and self._backlog >= MAX_BACKLOG:
                return False
            if not self._queue(line, notification=True):
                return False
        with self.server._stats_lock:
            self.server.stats.notifications += 1
        return True

    def _queue(self, line: bytes, *, notification: bool = False) -> bool:
        with self._output:
            if self._output_closed or self._write_failed:
                return False
            self._out.append(line)
            if notification:
                self._backlog += 1
            self._output.notify()
        return True

    def _write_loop(self) -> None:
        while True:
            with self._output:
                while not self._out and not self._output_closed:
                    self._output.wait()
                if not self._out:
                    return
                lines = list(self._out)
                self._out.clear()
                self._backlog = 0
            if self._write_failed:
                continue
            try:
                for line in lines:
                    self.writer.write(line)
                self.writer.flush()
            except (OSError, ValueError) as exc:
                with self._output:
                    self._write_failed = True
                    self._out.clear()
                self.server.warn(f"{self.name}: cannot write any more ({exc}); draining until end of input")

    # -- requests ------------------------------------------------------------------------------

    def after_reply(self, action: Callable[[], None]) -> None:
        """Run ``action`` once the current request's response is queued (at once outside one)."""
        pending = getattr(_local, "after", None)
        if pending is None or current_connection() is not self:
            action()
        else:
            pending.append(action)

    def on_close(self, cleanup: Callable[[], None]) -> None:
        self._cleanups.append(cleanup)

    def _dispatch(self, job: Callable[[], None], lane: str | None) -> None:
        self._in_flight.acquire()
        with self._idle:
            self._pending += 1

        def run() -> None:
            try:
                job()
            finally:
                self._finished(lane)

        if lane is not None:
            with self._lane_lock:
                queue = self._lanes.get(lane)
                if queue is not None:  # the lane is busy: run after the requests before it
                    queue.append(run)
                    return
                self._lanes[lane] = deque()
        self.server._submit(run)

    def _finished(self, lane: str | None) -> None:
        if lane is not None:
            with self._lane_lock:
                queue = self._lanes[lane]
                following = queue.popleft() if queue else None
                if following is None:
                    del self._lanes[lane]
            if following is not None:
                self.server._submit(following)
        self._in_flight.release()
        with self._idle:
            self._pending -= 1
            if self._pending == 0:
                self._idle.notify_all()

    def wait_idle(self) -> None:
        with self._idle:
            while self._pending:
                self._idle.wait()

    def close(self) -> None:
        """After the last request: end its subscriptions, write what is queued, stop the writer."""
        self.wait_idle()
        while self.subscriptions:  # each has end(): no notification once it returns
            _key, subscription = self.subscriptions.popitem()
            try:
                subscription.end()
            except Exception as exc:
                self.server.warn(f"{self.name}: ending a subscription failed: {type(exc).__name__}: {exc}")
        for cleanup in reversed(self._cleanups):
            try:
                cleanup()
            except Exception as exc:
                self.server.warn(f"{self.name}: clean-up failed: {type(exc).__name__}: {exc}")
        self._cleanups.clear()
        with self._output:
            self._output_closed = True
            self._output.notify()
        self._thread.join()


class _Batch:
    """Collects the responses of one batch; the array is queued when the last one is in."""

    def __init__(self, connection: Connection, expected: int) -> None:
        self._connection = connection
        self._lock = threading.Lock()
        self._left = expected
        self._responses: list[dict[str, Any]] = []

    def add(self, response: dict[str, Any] | None) -> None:
        if response is not None and "result" in response:
            try:  # one unserialisable result must not cost the other answers
                dumps(response)
            except Exception as exc:
                code, text = error_for(exc)
                response = _error(response.get("id"), code, text)
        with self._lock:
            if response is not None:
                self._responses.append(response)
            self._left -= 1
            done = self._left == 0
        if done and self._responses:
            self._connection.send(self._responses)
