"""JSON-RPC 2.0 over newline-delimited JSON: read requests, run them on a thread pool, write responses.

One message per line. A request ``{"jsonrpc": "2.0", "id", "method", "params"}`` gets one
response line ``{"jsonrpc": "2.0", "id", "result"}`` or ``{"jsonrpc": "2.0", "id", "error":
{"code", "message"}}``; a request without ``id`` is a notification (run, never answered); a JSON
array of requests is a batch, answered by one array of the responses that have ids. A missing
``"jsonrpc"`` member is accepted (older clients of this server never sent it); any other value
than ``"2.0"`` is an invalid request. Params are by name (an object).

Requests of one connection that touch the same *lane* (one agent, one blackboard session, the
file index) run one after another in arrival order; different lanes run in parallel, so
responses may come out of order and are matched by ``id``. A line that cannot be judged (not
JSON, too long, too deep, not a request) is answered with ``"id": null`` and serving goes on.

Each client is a :class:`Connection` with its own lanes, its own subscriptions and one writer
thread, so a response and a pushed notification never share a line and a slow reader never
stalls the others. The same protocol is served on stdin/stdout (:meth:`JsonLinesServer.serve`)
or on a local socket to many clients at once (:meth:`JsonLinesServer.serve_socket`). End of
input drains the requests in flight; SIGTERM stops reading, drains, and returns. A client that
does not read its answers is not read either once :data:`MAX_IN_FLIGHT` of its requests are
running or answered but not written (or :data:`MAX_UNWRITTEN_BYTES` of answers wait); a batch
holds at most :data:`MAX_IN_FLIGHT` requests, and its answers count against those bytes as they
are collected (its members not started once they are reached are answered with an error, not
run). Once the server stops, a client gets ``stop_grace`` seconds to take its answers before its
socket is shut. Out of file descriptors, new clients wait in the socket's backlog until a client
leaves.

The wire rules are in :mod:`._rpc_protocol`, one client in :mod:`._rpc_connection`, the sockets in
:mod:`._rpc_listen`; this module holds the serving loop and re-exports their public names.
"""

from __future__ import annotations

import contextlib
import errno
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from memstrata.core.constants import MIN_LINE_BYTES
from memstrata.core.errors import InvalidInputError

from ._json import MAX_DEPTH
from ._rpc_connection import (
    MAX_IN_FLIGHT,
    MAX_UNWRITTEN_BYTES,
    Connection,
    ServeStats,
    _Batch,
    _local,
    current_connection,
)
from ._rpc_listen import Listener, open_listener
from ._rpc_protocol import (
    DEFAULT_MAX_LINE_BYTES,
    ErrorCode,
    IdentifiedError,
    LineError,
    Method,
    RpcCall,
    _error,
    _Identified,
    _RequestError,
    decode_line,
    error_for,
    judge_request,
    parse_line,
    read_line,
)

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "MAX_IN_FLIGHT",
    "MAX_UNWRITTEN_BYTES",
    "STOP_GRACE_S",
    "Connection",
    "ErrorCode",
    "IdentifiedError",
    "JsonLinesServer",
    "LineError",
    "Listener",
    "Method",
    "ServeStats",
    "current_connection",
    "decode_line",
    "open_listener",
    "parse_line",
    "read_line",
]


STOP_GRACE_S = 10.0
"""Once the server stops, how long a client's answers wait to be read before its socket is shut."""

ACCEPT_RETRY_S = 1.0
"""Out of file descriptors or memory, accept is tried again when a client leaves or this often."""

_OUT_OF_ROOM = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class _Shutdown(BaseException):
    """Raised in the main thread by SIGTERM: stop reading, drain, stop cleanly."""


class JsonLinesServer:
    """Serve a method table over a pair of byte streams, or over a listening socket."""

    def __init__(
        self,
        methods: Mapping[str, Method],
        *,
        workers: int = 4,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_depth: int = MAX_DEPTH,
        debug: bool = False,
        log: IO[str] | None = None,
        stop_grace: float = STOP_GRACE_S,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        if workers < 1:
            raise InvalidInputError(f"workers must be at least 1, got {workers}")
        if not stop_grace >= 0:
            raise InvalidInputError(f"stop_grace must be at least 0 seconds, got {stop_grace}")
        if max_line_bytes < MIN_LINE_BYTES:
            raise InvalidInputError(f"max_line_bytes must be at least {MIN_LINE_BYTES}, got {max_line_bytes}")
        self.methods = dict(methods)
        self.workers = workers
        self.max_line_bytes = max_line_bytes
        self.max_depth = max_depth
        self.debug = debug
        self.stop_grace = stop_grace
        self._on_stop = on_stop  # told when a stop is first asked for (see _stopping)
        self._log = log
        self.stats = ServeStats()
        self._stats_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._stop_requested = False
        self._interruptible = False
        self._connections: set[Connection] = set()
        self._connections_lock = threading.Condition()
        self._left = 0  # connections closed so far
        self.output_abandoned = False  # stdio: answers left unwritten to a client that stopped reading
        self._listener: Listener | None = None

    @property
    def connections(self) -> list[Connection]:
        with self._connections_lock:
            return list(self._connections)

    def wait_connections(self, predicate: Callable[[int], bool], timeout: float) -> bool:
        """Wait until ``predicate(number of open connections)`` holds; False after ``timeout``."""
        with self._connections_lock:
            return self._connections_lock.wait_for(lambda: predicate(len(self._connections)), timeout)

    def warn(self, message: str) -> None:
        stream = self._log if self._log is not None else sys.stderr
        with contextlib.suppress(Exception):
            stream.write(f"memstrata serve: {message}\n")
            stream.flush()

    def _count(self, name: str) -> None:
        with self._stats_lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    def _submit(self, job: Callable[[], None]) -> None:
        assert self._pool is not None
        self._pool.submit(job)

    # -- execution -----------------------------------------------------------------------------

    def _run(self, connection: Connection, call: RpcCall, batch: _Batch | None) -> None:
        after: list[Callable[[], None]] = []
        _local.connection = connection
        _local.request_id = None if call.notification else call.request_id
        _local.after = after
        try:
            refused = None
            if batch is not None and not call.notification:  # a notification adds no answer
                refused = batch.refusal(call.request_id, call.method.name)
            if refused is not None:
                self._count("errors")
            response: dict[str, Any] | None = refused or self._response(call)
            if call.notification:
                response = None
            if batch is not None:
                batch.add(response)
            elif response is not None:
                connection.send(response)
        finally:
            _local.connection = None
            _local.request_id = None
            _local.after = None
            for action in after:
                with contextlib.suppress(Exception):
                    action()

    def _response(self, call: RpcCall) -> dict[str, Any]:
        """Run ``call``: its result, or the error it raised."""
        try:
            result = call.method.run(call.params)
            return {"jsonrpc": "2.0", "id": call.request_id, "result": result}
        except Exception as exc:
            code, message = error_for(exc)
            if code is ErrorCode.INTERNAL_ERROR and self.debug:
                self.warn("".join(traceback.format_exception(exc)).rstrip())
            self._count("errors")
            return _error(call.request_id, code, f"{call.method.name}: {message}")

    def _start(self, connection: Connection, call: RpcCall, batch: _Batch | None) -> None:
        try:
            lane = call.method.lane(call.params)
        except Exception:
            lane = None
        connection._dispatch(lambda: self._run(connection, call, batch), lane)

    def _handle_line(self, connection: Connection, line: bytes) -> None:
        try:
            message = parse_line(line, max_depth=self.max_depth)
        except _RequestError as exc:
            self._count("bad_lines")
            self._count("errors")
            connection.send(_error(None, exc.code, str(exc)))
            return
        if not isinstance(message, list):
            self._handle_one(connection, message, None)
            return
        if not message:
            self._count("bad_lines")
            self._count("errors")
            connection.send(_error(None, ErrorCode.INVALID_REQUEST, "an empty batch is not a request"))
            return
        if len(message) > connection.max_batch:  # more than the client may have in flight
            self._count("bad_lines")
            self._count("errors")
            text = f"a batch holds at most {connection.max_batch} requests, got {len(message)}"
            connection.send(_error(None, ErrorCode.INVALID_REQUEST, f"{text}: send them in smaller batches"))
            return
        batch = _Batch(connection, len(message))
        for item in message:
            self._handle_one(connection, item, batch)

    def _handle_one(self, connection: Connection, message: Any, batch: _Batch | None) -> None:
        try:
            call = judge_request(message, self.methods, max_depth=self.max_depth)
        except (_RequestError, _Identified) as exc:
            error = exc.error if isinstance(exc, _Identified) else exc
            request_id = exc.request_id if isinstance(exc, _Identified) else None
            # a notification's errors are not answered, unless it is not even a valid notification
            answered = not (isinstance(exc, _Identified) and exc.notification)
            answered = answered or error.code == ErrorCode.INVALID_REQUEST
            self._count("bad_lines" if answered and request_id is None else "requests")
            self._count("errors")
            response = _error(request_id, error.code, str(error)) if answered else None
            if batch is not None:
                batch.add(response)
            elif response is not None:
                connection.send(response)
            return
        self._count("requests")
        self._start(connection, call, batch)

    def _read_loop(self, connection: Connection, reader: IO[bytes], *, interruptible: bool) -> None:
        while not self._stop_requested:
            if not connection.wait_room():  # backpressure: the client reads its answers first
                return
            if interruptible:
                self._interruptible = True
            try:
                line = read_line(reader, self.max_line_bytes)
            except _RequestError as exc:
                self._count("bad_lines")
                self._count("errors")
                connection.send(_error(None, exc.code, str(exc)))
                continue
            except (ConnectionError, OSError):  # the client went away mid-line
                return
            finally:
                if interruptible:
                    self._interruptible = False
            if line is None:
                return
            if line.strip():
                self._handle_line(connection, line)

    # -- serving -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        """The worker pool and the SIGTERM/SIGINT handlers (main thread only) while serving."""
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():

            def _stop(signum: int, frame: Any) -> None:
                if self._stop_requested:  # asked twice: stop waiting for requests in flight
                    raise KeyboardInterrupt
                self._stopping()
                if self._interruptible:  # interrupt a blocking read or accept, never a dispatch
                    raise _Shutdown

            for signum in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(ValueError, OSError):
                    previous[signum] = signal.signal(signum, _stop)
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="memstrata-serve")
        try:
            self._start_workers()
            yield
        finally:
            try:
                self._pool.shutdown(wait=True)
            finally:
                for signum, handler in previous.items():
                    with contextlib.suppress(ValueError, OSError, TypeError):
                        signal.signal(signum, handler)

    def _start_workers(self) -> None:
        """Start every worker now (each waits at a gate until all have started), so serving
        never needs a new thread for a request: one thread too many can cost a client, not a
        request already read."""
        assert self._pool is not None
        gate = threading.Event()
        try:
            for _ in range(self.workers):
                self._pool.submit(gate.wait)
        finally:
            gate.set()

    def serve(self, reader: IO[bytes], writer: IO[bytes]) -> ServeStats:
        """Serve one client until end of input (or SIGTERM/SIGINT in the main thread). Once
        stopped by a signal, a client that does not read its answers within ``stop_grace``
        seconds loses them: :attr:`output_abandoned` is then true and ``writer`` is left to a
        thread blocked on it, so the caller must neither flush nor close it."""
        with self._running():
            connection = self._open(writer, "stdio")
            try:
                self._read_loop(connection, reader, interruptible=True)
            except _Shutdown:
                pass
            finally:
                if self._stop_requested:
                    self.warn("stopping: finishing the requests in flight")
                    connection.stop_reading(self.stop_grace)
                self._close(connection)
                self.output_abandoned = connection.output_abandoned
        return self.stats

    def serve_socket(self, listener: Listener) -> ServeStats:
        """Serve every client that connects until SIGTERM/SIGINT (or :meth:`stop`); each one has
        its own lanes and subscriptions, and one leaving never stops the others."""
        threads: list[threading.Thread] = []
        waiting = False  # for room to accept a client: said once, and once when it ends
        self._listener = listener
        with self._running():
            try:
                while not self._stop_requested:
                    self._interruptible = True
                    left = self._left
                    try:
                        client, _address = listener.sock.accept()
                    except OSError as exc:
                        if self._stop_requested:
                            break
                        if exc.errno not in _OUT_OF_ROOM:
                            raise
                        self._wait_for_room(exc, waiting, left)
                        waiting = True
                        continue
                    finally:
                        self._interruptible = False
                    if waiting:
                        self.warn("accepting clients again")
                        waiting = False
                    self._count("connections")
                    thread = self._accepted(client, f"client-{self.stats.connections}")
                    threads = [t for t in threads if t.is_alive()]
                    if thread is not None:
                        threads.append(thread)
            except _Shutdown:
                pass
            finally:
                self.warn("stopping: finishing the requests in flight")
                listener.close()
                for connection in self.connections:
                    connection.stop_reading(self.stop_grace)  # a reader waiting for room stops too
                    if connection.transport is not None:  # end of input for its reader: drain, close
                        with contextlib.suppress(OSError):
                            connection.transport.shutdown(socket.SHUT_RD)
                for thread in threads:
                    thread.join()
        return self.stats

    def _wait_for_room(self, error: OSError, said: bool, left: int) -> None:
        """Out of file descriptors or memory: new clients wait in the socket's backlog until a
        client leaves after ``left`` had (or :data:`ACCEPT_RETRY_S` passes: what is short may be
        freed elsewhere), while the clients already connected are served."""
        if not said:
            self.warn(
                f"cannot accept a client ({error.strerror or error}): new clients wait until one "
                "leaves; the connected ones are served"
            )
        with self._connections_lock:
            self._connections_lock.wait_for(lambda: self._stop_requested or self._left > left, ACCEPT_RETRY_S)

    def _accepted(self, client: socket.socket, name: str) -> threading.Thread | None:
        """Serve a new client on threads of its own; refuse it (closed, one line logged) when a
        thread cannot be started, e.g. at a pids or memory limit: the others are still served."""
        writer = client.makefile("wb")
        connection: Connection | None = None
        try:
            connection = self._open(writer, name)  # seen by the shutdown of serve_socket
            connection.transport = client
            thread = threading.Thread(
                target=self._serve_client,
                args=(connection, client),
                name=f"memstrata-{name}",
                daemon=True,
            )
            thread.start()
        except RuntimeError as exc:  # "can't start new thread"
            self.warn(f"{name}: refused, cannot start a thread for it ({exc})")
            if connection is not None:
                self._close(connection)  # nothing queued: its writer ends at once
            for stream in (writer, client):
                with contextlib.suppress(OSError):
                    stream.close()
            return None
        return thread

    def _stopping(self) -> None:
        """Mark the server stopping and tell ``on_stop`` the first time: long work in flight (an
        index of a large tree) can then end early rather than keep the process."""
        first = not self._stop_requested
        self._stop_requested = True
        if first and self._on_stop is not None:
            try:
                self._on_stop()
            except Exception as exc:  # stopping goes on: the requests in flight are still answered
                self.warn(f"stopping: {type(exc).__name__}: {exc}")

    def stop(self) -> None:
        """Stop accepting clients (from another thread); :meth:`serve_socket` then drains."""
        self._stopping()
        with self._connections_lock:  # wakes a wait for room to accept
            self._connections_lock.notify_all()
        listener = self._listener
        if listener is not None:  # wakes the accept() of serve_socket
            with contextlib.suppress(OSError):
                listener.sock.shutdown(socket.SHUT_RDWR)

    def _serve_client(self, connection: Connection, client: socket.socket) -> None:
        reader = client.makefile("rb")
        try:
            if not self._stop_requested:
                self._read_loop(connection, reader, interruptible=False)
        except Exception as exc:
            self.warn(f"{connection.name}: {type(exc).__name__}: {exc}")
        finally:
            self._close(connection)
            for stream in (reader, connection.writer, client):
                with contextlib.suppress(OSError):
                    stream.close()

    def _open(self, writer: IO[bytes], name: str) -> Connection:
        connection = Connection(self, writer, name)
        with self._connections_lock:
            self._connections.add(connection)
            self._connections_lock.notify_all()
        return connection

    def _close(self, connection: Connection) -> None:
        try:
            connection.close()
        finally:
            with self._connections_lock:
                self._connections.discard(connection)
                self._left += 1
                self._connections_lock.notify_all()
