"""One JSON-RPC client: its lanes, subscriptions and writer thread, apart from the serving loop."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, Protocol

from ._json import dumps
from ._rpc_protocol import ErrorCode, _error, error_for

__all__ = [
    "MAX_BACKLOG",
    "MAX_BACKLOG_BYTES",
    "MAX_IN_FLIGHT",
    "MAX_UNWRITTEN_BYTES",
    "Connection",
    "ServeStats",
    "current_connection",
    "current_request_id",
]

MAX_IN_FLIGHT = 1024
"""Requests of one client running or answered but not written yet; past that its reader waits."""
MAX_UNWRITTEN_BYTES = 64 << 20
"""Bytes of answers waiting to be written to one client, a batch's counted as they are collected;
past that its reader waits, its requests already read wait to start (each client runs at most
``workers`` requests at once), and the members of a batch that have not started are not run."""
MAX_BACKLOG = 10_000
"""Notifications waiting for one slow client (queued or being written) before its subscriptions
are ended."""
MAX_BACKLOG_BYTES = 64 << 20
"""Bytes of those notifications past which its subscriptions are ended too: a notification holds
a whole value, so the count alone would let one client that does not read hold gigabytes."""


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
    workers: int
    _stats_lock: threading.Lock

    def warn(self, message: str) -> None: ...

    def _submit(self, job: Callable[[], None]) -> None: ...


_local = threading.local()


def current_connection() -> Connection | None:
    """The connection whose request this thread is running (``None`` outside a request)."""
    return getattr(_local, "connection", None)


def current_request_id() -> Any:
    """The id of the request this thread is running; ``None`` for a notification (which takes
    no answer) and outside a request."""
    return getattr(_local, "request_id", None)


class Connection:
    """One client: its lanes, its subscriptions, and a writer thread that owns its output.

    Every line (response, batch, notification) is queued whole and written by one thread, so lines
    never interleave; operations keep per-client state here (``subscriptions``) and register
    ``on_close`` clean-ups, run when the client goes away. An answer counts against the client's
    limits until it is written: past them its reader waits (:meth:`wait_room`), so a client that
    does not read costs bounded memory.
    """

    def __init__(self, server: _Server, writer: IO[bytes], name: str) -> None:
        self.server = server
        self.name = name
        self.subscriptions: dict[tuple[str, int], Any] = {}  # (session, id) -> has .end()
        self.transport: socket.socket | None = None  # a socket client's socket
        self.writer = writer
        # one lock for the output and the counts the reader waits on
        lock = threading.RLock()
        self._out: deque[tuple[bytes | bytearray, bool]] = deque()  # (line, is a notification)
        self._output = threading.Condition(lock)  # the writer waits for lines
        self._room = threading.Condition(lock)  # the reader waits for room, close() for the writer
        self._output_closed = False
        self._write_failed = False
        self._writer_done = False
        self._backlog = 0  # notifications queued or being written
        self._backlog_bytes = 0
        self._answers = 0  # answer lines queued or being written
        self._answer_bytes = 0
        self._held_bytes = 0  # answers collected by batches not complete yet
        self._stopping = False
        self._grace = 0.0
        self.output_abandoned = False
        """Set when the server stopped and this stdio client did not take its answers in time."""
        self._max_in_flight = MAX_IN_FLIGHT
        self._max_unwritten = MAX_UNWRITTEN_BYTES
        self.reading_held = threading.Event()
        """Set while the reader waits for the client to take its answers (backpressure)."""
        self._lane_lock = threading.Lock()
        self._lanes: dict[str, deque[Callable[[], None]]] = {}
        self._idle = threading.Condition(lock)
        self._pending = 0  # requests read and not finished
        self._running = 0  # of those, handed to the pool
        self._parked: deque[Callable[[], None]] = deque()  # ready, waiting to be handed over
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

    def client_gone(self) -> bool:
        """Whether nothing written to the client can reach it any more: a write to it failed, or
        its end is closed (a unix socket it closed or shut, a TCP peer that reset, a pipe nobody
        reads). Long work it asked for ends early on this (``index``). A TCP client that closed
        cleanly is not seen until something is written to it: on TCP that looks the same as a
        client that has only finished sending."""
        if self._write_failed:
            return True
        if not hasattr(select, "poll"):  # not on Windows: the failed write is the only sign
            return False
        try:
            fd = self.transport.fileno() if self.transport is not None else self.writer.fileno()
            poller = select.poll()
            poller.register(fd, 0)  # hang-ups and errors are reported whatever is asked for
            events = poller.poll(0)
        except (OSError, ValueError):  # no descriptor (a stream in memory), or closed already
            return False
        return any(mask & (select.POLLHUP | select.POLLERR) for _fd, mask in events)

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
        False when it was not queued (condition false, client gone, or, when ``limited``, the
        notifications already waiting for it fill :data:`MAX_BACKLOG` or, with this one,
        :data:`MAX_BACKLOG_BYTES`)."""
        line = dumps({"jsonrpc": "2.0", "method": method, "params": params}) + b"\n"
        with self._output:
            if when is not None and not when():
                return False
            if limited and self._backlog_full(len(line)):
                return False
            if not self._queue(line, notification=True):
                return False
        with self.server._stats_lock:
            self.server.stats.notifications += 1
        return True

    def _backlog_full(self, size: int) -> bool:
        """Whether a notification of ``size`` bytes would pass the backlog's limits (one alone
        never does, so a value near the line limit still reaches a client that reads)."""
        if self._backlog >= MAX_BACKLOG:
            return True
        return self._backlog_bytes > 0 and self._backlog_bytes + size > MAX_BACKLOG_BYTES

    def _queue(self, line: bytes | bytearray, *, notification: bool = False) -> bool:
        with self._output:
            if self._output_closed or self._write_failed:
                return False
            self._out.append((line, notification))
            if notification:
                self._backlog += 1
                self._backlog_bytes += len(line)
            else:
                self._answers += 1
                self._answer_bytes += len(line)
            self._output.notify()
        return True

    def _write_loop(self) -> None:
        try:
            while True:
                with self._output:
                    while not self._out and not self._output_closed:
                        self._output.wait()
                    if not self._out:
                        return
                    lines = list(self._out)
                    self._out.clear()
                failed: Exception | None = None
                if not self._write_failed:
                    try:
                        for line, _notification in lines:
                            self.writer.write(line)
                        self.writer.flush()
                    except (OSError, ValueError) as exc:
                        failed = exc
                with self._output:  # written (or dropped): room for more
                    if failed is not None:
                        self._write_failed = True
                        self._out.clear()
                        self._backlog = self._backlog_bytes = self._answers = self._answer_bytes = 0
                    else:
                        for line, notification in lines:
                            if notification:
                                self._backlog -= 1
                                self._backlog_bytes -= len(line)
                            else:
                                self._answers -= 1
                                self._answer_bytes -= len(line)
                    self._room.notify_all()
                self._unpark()
                if failed is not None:
                    self.server.warn(
                        f"{self.name}: cannot write any more ({failed}); draining until end of input"
                    )
        finally:
            with self._output:
                self._writer_done = True
                self._room.notify_all()

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

    def _has_room(self, *, counting_batches: bool) -> bool:
        """Whether one more request may be read: requests running plus answers not written yet
        stay under :data:`MAX_IN_FLIGHT`, and those answers (with the ones batches collected,
        when ``counting_batches``) under :data:`MAX_UNWRITTEN_BYTES`."""
        if self._stopping:  # the rest of the line being read; nothing is read after it
            return True
        if self._pending + self._answers >= self._max_in_flight:
            return False
        unwritten = self._answer_bytes + (self._held_bytes if counting_batches else 0)
        return unwritten < self._max_unwritten

    def wait_room(self) -> bool:
        """Wait (the reader, before reading a line) until the client has taken enough of its
        answers; False once the server stops reading (:meth:`stop_reading`)."""
        with self._room:
            self._hold(counting_batches=True)
            return not self._stopping

    def _hold(self, *, counting_batches: bool) -> None:
        if self._has_room(counting_batches=counting_batches):
            return
        self.reading_held.set()
        try:
            while not self._has_room(counting_batches=counting_batches):
                self._room.wait()
        finally:
            self.reading_held.clear()

    @property
    def max_batch(self) -> int:
        """Requests one batch may hold: as many as the client may have in flight."""
        return self._max_in_flight

    def answers_full(self) -> bool:
        """Whether the answers waiting for this client, batches' included, fill its budget."""
        with self._output:
            return self._answer_bytes + self._held_bytes >= self._max_unwritten

    def budget_text(self) -> str:
        """The answer budget as the errors name it."""
        size = self._max_unwritten
        return f"{size >> 20} MiB" if size % (1 << 20) == 0 else f"{size} bytes"

    def hold(self, size: int) -> None:
        """Count ``size`` bytes a batch collected against the budget until it queues its array."""
        with self._output:
            self._held_bytes += size

    def send_batch(self, parts: list[bytes], held: int) -> None:
        """Queue a batch's serialised responses as one array line; ``parts`` is emptied as the
        line grows, so the answers are never in memory twice, and their bytes held so far
        become the line's, never counting for nothing."""
        line = bytearray(b"[")
        parts.reverse()
        while parts:
            line += parts.pop()
            line += b"," if parts else b"]\n"
        with self._output:
            self._held_bytes -= held
            self._queue(line)
            self._room.notify_all()

    def stop_reading(self, grace: float) -> None:
        """The server stops: the reader stops waiting for room, and :meth:`close` waits at most
        ``grace`` seconds for the client to take its answers, then shuts its socket."""
        with self._room:
            self._stopping = True
            self._grace = grace
            self._room.notify_all()
        self._unpark()  # what was read runs, whether or not the client reads

    def _dispatch(self, job: Callable[[], None], lane: str | None) -> None:
        with self._room:
            # a batch's collected answers are freed only once every member is dispatched
            self._hold(counting_batches=False)
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
        self._start_job(run)

    def _may_start(self) -> bool:
        if self._running >= self.server.workers:  # more would only wait in the pool's queue
            return False
        return self._stopping or self._write_failed or self._answer_bytes < self._max_unwritten

    def _start_job(self, job: Callable[[], None]) -> None:
        """Hand a request to the pool, or park it while this client has enough running or too
        many bytes of answers unwritten (so those stay near :data:`MAX_UNWRITTEN_BYTES`)."""
        with self._room:
            if self._parked or not self._may_start():
                self._parked.append(job)
                return
            self._running += 1
        self.server._submit(job)

    def _unpark(self) -> None:
        jobs: list[Callable[[], None]] = []
        with self._room:
            while self._parked and self._may_start():
                jobs.append(self._parked.popleft())
                self._running += 1
        for job in jobs:
            self.server._submit(job)

    def _finished(self, lane: str | None) -> None:
        if lane is not None:
            with self._lane_lock:
                queue = self._lanes[lane]
                following = queue.popleft() if queue else None
                if following is None:
                    del self._lanes[lane]
            if following is not None:
                self._start_job(following)
        with self._idle:
            self._pending -= 1
            self._running -= 1
            self._room.notify_all()
            if self._pending == 0:
                self._idle.notify_all()
        self._unpark()

    def wait_idle(self) -> None:
        with self._idle:
            while self._pending:
                self._idle.wait()

    def close(self) -> None:
        """After the last request: end its subscriptions, write what is queued, stop the writer.
        Once the server stops (:meth:`stop_reading`), a client that does not take what is queued
        within the grace period has its socket shut, so the blocked write fails and nothing waits
        for it any longer."""
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
        if not self._wait_writer():
            late = f"{self.name}: did not take its answers within {self._grace:g} s of stopping"
            if self.transport is None:  # a pipe: nothing can end the blocked write, so leave it
                self.server.warn(f"{late}; they are dropped")
                self.output_abandoned = True
                return
            self.server.warn(f"{late}; disconnected")
            with contextlib.suppress(OSError):
                self.transport.shutdown(socket.SHUT_RDWR)
        self._thread.join()

    def _wait_writer(self) -> bool:
        """Wait for the writer to end: without limit while serving, ``grace`` seconds once the
        server stops (counted from then, or from now if it stopped already); False if it has not."""
        deadline: float | None = None
        with self._room:
            while not self._writer_done:
                if not self._stopping:
                    self._room.wait()
                    continue
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._grace
                if now >= deadline:
                    return False
                self._room.wait(deadline - now)
        return True


class _Batch:
    """Collects the serialised responses of one batch, counting them against the client's answer
    budget as they come; the array is queued when the last one is in."""

    def __init__(self, connection: Connection, expected: int) -> None:
        self._connection = connection
        self._lock = threading.Lock()
        self._left = expected
        self._parts: list[bytes] = []
        self._held = 0

    def refusal(self, request_id: Any, method: str) -> dict[str, Any] | None:
        """The error of a member not run because the client's answers fill its budget (a
        member that started is answered whatever its size, as a single request is)."""
        if not self._connection.answers_full():
            return None
        return _error(
            request_id,
            ErrorCode.RUNTIME_ERROR,
            f"{method}: not run: the answers waiting to be written to this client (this batch's "
            f"included) reached its budget of {self._connection.budget_text()}; send fewer "
            "requests per batch",
        )

    def add(self, response: dict[str, Any] | None) -> None:
        part = None
        if response is not None:
            try:  # one unserialisable result must not cost the other answers
                part = dumps(response)
            except Exception as exc:
                code, text = error_for(exc)
                part = dumps(_error(response.get("id"), code, text))
        with self._lock:
            if part is not None:
                self._parts.append(part)
                self._held += len(part) + 1
                self._connection.hold(len(part) + 1)
            self._left -= 1
            done = self._left == 0
        if done and self._parts:
            self._connection.send_batch(self._parts, self._held)
