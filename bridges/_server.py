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
input drains the requests in flight; SIGTERM stops reading, drains, and returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import IntEnum
from typing import IO, Any

from memstrata.core.errors import (
    DatabaseBusyError,
    InvalidInputError,
    MemstrataError,
    SystemStoppedError,
)

from ._json import MAX_DEPTH, dumps, json_depth, loads
from ._schema import check, describe_type

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
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

DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024
_MAX_IN_FLIGHT = 1024
MAX_BACKLOG = 10_000
"""Notifications waiting for one slow client before its subscriptions are ended."""


class ErrorCode(IntEnum):
    """Error codes: JSON-RPC 2.0's own, then memstrata's in the server-error range."""

    PARSE_ERROR = -32700  # the line is not JSON (or not UTF-8)
    INVALID_REQUEST = -32600  # not a request object, bad id/jsonrpc, too long, too deep, empty batch
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602  # wrong, missing or unknown params; invalid values (InvalidInputError)
    INTERNAL_ERROR = -32603  # a bug: unexpected exception (details on stderr with --debug)
    RUNTIME_ERROR = -32000  # memstrata failed (storage, embedding, ...): MemstrataError
    BUSY = -32001  # the database stayed locked by another process: retry later
    STOPPED = -32002  # the memory system is stopping or stopped


@dataclass(frozen=True, slots=True)
class Method:
    """A served method: its params schema, the lane it runs in, and what it does."""

    name: str
    params: Mapping[str, Any]
    run: Callable[[dict[str, Any]], Any]
    lane: Callable[[dict[str, Any]], str | None] = field(default=lambda _params: None)
    description: str = ""


@dataclass(slots=True)
class ServeStats:
    requests: int = 0
    errors: int = 0
    bad_lines: int = 0
    notifications: int = 0  # pushed to clients (subscriptions)
    connections: int = 0  # accepted so far


class _RequestError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Shutdown(BaseException):
    """Raised in the main thread by SIGTERM: stop reading, drain, stop cleanly."""


def _one_line(text: str) -> str:
    return " ".join(str(text).split()) or "error"


def error_for(exc: BaseException) -> tuple[ErrorCode, str]:
    """The protocol error code and one-line message for an exception raised by a method."""
    if isinstance(exc, _RequestError):
        return exc.code, _one_line(str(exc))
    if isinstance(exc, InvalidInputError):
        return ErrorCode.INVALID_PARAMS, _one_line(str(exc))
    if isinstance(exc, DatabaseBusyError):
        return ErrorCode.BUSY, _one_line(str(exc))
    if isinstance(exc, SystemStoppedError):
        return ErrorCode.STOPPED, _one_line(str(exc))
    if isinstance(exc, MemstrataError):
        return ErrorCode.RUNTIME_ERROR, _one_line(str(exc))
    if isinstance(exc, ValueError):  # the layers' documented argument errors are ValueErrors
        return ErrorCode.INVALID_PARAMS, _one_line(str(exc))
    return ErrorCode.INTERNAL_ERROR, _one_line(f"internal error: {type(exc).__name__}: {exc}")


def _error(request_id: Any, code: ErrorCode, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": int(code), "message": message}}


_REQUEST_KEYS = frozenset({"id", "method", "params", "jsonrpc"})
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

    def __init__(self, server: JsonLinesServer, writer: IO[bytes], name: str) -> None:
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


@dataclass(slots=True)
class _Call:
    request_id: Any
    notification: bool
    method: Method
    params: dict[str, Any]


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
    ) -> None:
        if workers < 1:
            raise InvalidInputError(f"workers must be at least 1, got {workers}")
        if max_line_bytes < 64:
            raise InvalidInputError(f"max_line_bytes must be at least 64, got {max_line_bytes}")
        self.methods = dict(methods)
        self.workers = workers
        self.max_line_bytes = max_line_bytes
        self.max_depth = max_depth
        self.debug = debug
        self._log = log
        self.stats = ServeStats()
        self._stats_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._stop_requested = False
        self._interruptible = False
        self._connections: set[Connection] = set()
        self._connections_lock = threading.Condition()
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

    # -- judging a line ------------------------------------------------------------------------

    def _call(self, request: Any) -> _Call:
        """One request object judged; raises ``_RequestError``/``_Identified`` when it is not one."""
        request = check_request(request, max_depth=self.max_depth, require_id=False)
        notification = "id" not in request
        request_id = request.get("id")
        try:
            if "jsonrpc" in request and request["jsonrpc"] != "2.0":
                raise _RequestError(
                    ErrorCode.INVALID_REQUEST,
                    f"'jsonrpc' must be \"2.0\", got {str(request['jsonrpc'])[:20]!r}",
                )
            unknown = sorted(set(request) - _REQUEST_KEYS)
            if unknown:
                raise _RequestError(
                    ErrorCode.INVALID_REQUEST,
                    f"unknown request field {unknown[0]!r} (expected jsonrpc, id, method, params)",
                )
            name = request.get("method")
            if not isinstance(name, str):
                raise _RequestError(
                    ErrorCode.INVALID_REQUEST, f"'method' must be a string, got {describe_type(name)}"
                )
            method = self.methods.get(name)
            if method is None:
                raise _RequestError(
                    ErrorCode.METHOD_NOT_FOUND,
                    f"unknown method {name[:100]!r} (available: {', '.join(sorted(self.methods))})",
                )
            params = request.get("params")
            try:
                params = check(method.params, {} if params is None else params, noun="param")
            except InvalidInputError as exc:
                raise _RequestError(ErrorCode.INVALID_PARAMS, f"{name}: {_one_line(str(exc))}") from exc
        except _RequestError as exc:
            raise _Identified(request_id, exc, notification=notification) from None
        return _Call(request_id, notification, method, params)

    # -- execution -----------------------------------------------------------------------------

    def _run(self, connection: Connection, call: _Call, batch: _Batch | None) -> None:
        after: list[Callable[[], None]] = []
        _local.connection = connection
        _local.after = after
        response: dict[str, Any] | None
        try:
            try:
                result = call.method.run(call.params)
                response = {"jsonrpc": "2.0", "id": call.request_id, "result": result}
            except Exception as exc:
                code, message = error_for(exc)
                if code is ErrorCode.INTERNAL_ERROR and self.debug:
                    self.warn("".join(traceback.format_exception(exc)).rstrip())
                self._count("errors")
                response = _error(call.request_id, code, f"{call.method.name}: {message}")
            if call.notification:
                response = None
            if batch is not None:
                batch.add(response)
            elif response is not None:
                connection.send(response)
        finally:
            _local.connection = None
            _local.after = None
            for action in after:
                with contextlib.suppress(Exception):
                    action()

    def _start(self, connection: Connection, call: _Call, batch: _Batch | None) -> None:
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
        batch = _Batch(connection, len(message))
        for item in message:
            self._handle_one(connection, item, batch)

    def _handle_one(self, connection: Connection, message: Any, batch: _Batch | None) -> None:
        try:
            call = self._call(message)
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
                self._stop_requested = True
                if self._interruptible:  # interrupt a blocking read or accept, never a dispatch
                    raise _Shutdown

            for signum in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(ValueError, OSError):
                    previous[signum] = signal.signal(signum, _stop)
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="memstrata-serve")
        try:
            yield
        finally:
            try:
                self._pool.shutdown(wait=True)
            finally:
                for signum, handler in previous.items():
                    with contextlib.suppress(ValueError, OSError, TypeError):
                        signal.signal(signum, handler)

    def serve(self, reader: IO[bytes], writer: IO[bytes]) -> ServeStats:
        """Serve one client until end of input (or SIGTERM/SIGINT in the main thread)."""
        with self._running():
            connection = self._open(writer, "stdio")
            try:
                self._read_loop(connection, reader, interruptible=True)
            except _Shutdown:
                pass
            finally:
                if self._stop_requested:
                    self.warn("stopping: finishing the requests in flight")
                self._close(connection)
        return self.stats

    def serve_socket(self, listener: Listener) -> ServeStats:
        """Serve every client that connects until SIGTERM/SIGINT (or :meth:`stop`); each one has
        its own lanes and subscriptions, and one leaving never stops the others."""
        threads: list[threading.Thread] = []
        self._listener = listener
        with self._running():
            try:
                while not self._stop_requested:
                    self._interruptible = True
                    try:
                        client, _address = listener.sock.accept()
                    except OSError:
                        if self._stop_requested:
                            break
                        raise
                    finally:
                        self._interruptible = False
                    self._count("connections")
                    name = f"client-{self.stats.connections}"
                    connection = self._open(client.makefile("wb"), name)  # seen by the shutdown below
                    connection.transport = client
                    thread = threading.Thread(
                        target=self._serve_client,
                        args=(connection, client),
                        name=f"memstrata-{name}",
                        daemon=True,
                    )
                    thread.start()
                    threads = [t for t in threads if t.is_alive()]
                    threads.append(thread)
            except _Shutdown:
                pass
            finally:
                self.warn("stopping: finishing the requests in flight")
                listener.close()
                for connection in self.connections:
                    if connection.transport is not None:  # end of input for its reader: drain, close
                        with contextlib.suppress(OSError):
                            connection.transport.shutdown(socket.SHUT_RD)
                for thread in threads:
                    thread.join()
        return self.stats

    def stop(self) -> None:
        """Stop accepting clients (from another thread); :meth:`serve_socket` then drains."""
        self._stop_requested = True
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
                self._connections_lock.notify_all()


# -- listening sockets ---------------------------------------------------------------------------

_LOOPBACK = {"127.0.0.1": socket.AF_INET, "localhost": socket.AF_INET, "::1": socket.AF_INET6}


@dataclass(slots=True)
class Listener:
    """A bound, listening socket and how to tidy up after it (the unix socket file)."""

    sock: socket.socket
    address: str  # as given to --listen, with the real port for tcp:...:0
    path: str | None = None
    _inode: tuple[int, int] | None = None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.path is not None and self._inode is not None:
            with contextlib.suppress(OSError):
                info = os.lstat(self.path)
                if (info.st_dev, info.st_ino) == self._inode:  # still ours: remove it
                    os.unlink(self.path)
            self._inode = None


def open_listener(spec: str) -> Listener:
    """Bind ``unix:PATH`` (a socket file, mode 0600) or ``tcp:HOST:PORT`` (loopback hosts only)."""
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in ("unix", "tcp") or not rest:
        raise InvalidInputError(f"--listen must be unix:PATH or tcp:127.0.0.1:PORT, got {spec!r}")
    if kind == "unix":
        return _unix_listener(rest)
    host, sep, port_text = rest.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise InvalidInputError(f"--listen tcp: needs HOST:PORT with a port 0-65535, got {spec!r}")
    family = _LOOPBACK.get(host)
    if family is None:
        raise InvalidInputError(
            f"--listen {spec!r}: only a loopback host (127.0.0.1, localhost, [::1]) is served; "
            "the protocol has no authentication"
        )
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1" if host == "localhost" else host, int(port_text)))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise InvalidInputError(f"--listen {spec!r}: cannot listen: {exc.strerror or exc}") from exc
    port = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    return Listener(sock, f"tcp:{shown}:{port}")


def _unix_listener(path: str) -> Listener:
    path = os.path.abspath(os.path.expanduser(path))
    if len(os.fsencode(path)) >= 104:
        raise InvalidInputError(f"--listen unix:{path}: the path is too long for a socket (max 103 bytes)")
    with contextlib.suppress(FileNotFoundError):
        info = os.lstat(path)
        if not stat.S_ISSOCK(info.st_mode):
            raise InvalidInputError(f"--listen unix:{path}: the path exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:  # nobody listens: a stale file left by a server that died
            os.unlink(path)
        else:
            raise InvalidInputError(f"--listen unix:{path}: another server is listening there")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:  # the file is created 0600 (only this user may connect); Linux takes the mode from here
        os.fchmod(sock.fileno(), 0o600)
        previous = None
    except OSError:  # elsewhere: through the umask, which is process-wide, so only as a fallback
        previous = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise InvalidInputError(f"--listen unix:{path}: cannot listen: {exc.strerror or exc}") from exc
    finally:
        if previous is not None:
            os.umask(previous)
    os.chmod(path, 0o600)
    sock.listen(64)
    info = os.lstat(path)
    return Listener(sock, f"unix:{path}", path, (info.st_dev, info.st_ino))


# -- reading and judging lines (shared with the MCP server) --------------------------------------


def read_line(reader: IO[bytes], max_line_bytes: int) -> bytes | None:
    """The next line, or ``None`` at end of input; an oversized line is skipped and raises
    :class:`LineError` (so the caller answers it and goes on with the next line)."""
    line = reader.readline(max_line_bytes + 1)
    if not line:
        return None
    if len(line) > max_line_bytes and not (line.endswith(b"\n") and len(line) - 1 <= max_line_bytes):
        while line and not line.endswith(b"\n"):  # skip the rest of the oversized line
            line = reader.readline(1 << 20)
        raise _RequestError(ErrorCode.INVALID_REQUEST, f"request line longer than {max_line_bytes} bytes")
    return line


def parse_line(line: bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """A line parsed as JSON; raises :class:`LineError` (parse error, or nested too deep)."""
    try:
        return _loads(line)
    except ValueError as exc:
        if "depth" in str(exc) or "recursion" in str(exc).lower():
            raise _RequestError(
                ErrorCode.INVALID_REQUEST, f"request nested deeper than {max_depth} levels"
            ) from exc
        raise _RequestError(ErrorCode.PARSE_ERROR, f"invalid JSON: {_one_line(str(exc))}") from exc


def check_request(request: Any, *, max_depth: int = MAX_DEPTH, require_id: bool = True) -> dict[str, Any]:
    """A parsed message judged as a request object with a string or integer ``id`` (required
    unless ``require_id`` is false), nested at most ``max_depth`` levels."""
    if not isinstance(request, dict):
        raise _RequestError(
            ErrorCode.INVALID_REQUEST, f"a request must be a JSON object, got {describe_type(request)}"
        )
    request_id = request.get("id")
    if ("id" in request or require_id) and (
        isinstance(request_id, bool) or not isinstance(request_id, str | int)
    ):
        raise _RequestError(
            ErrorCode.INVALID_REQUEST,
            "a request needs an 'id' that is a string or an integer"
            + ("" if "id" not in request else f", got {describe_type(request_id)}"),
        )
    if json_depth(request, max_depth + 1) > max_depth + 1:
        raise _Identified(
            request_id,
            _RequestError(ErrorCode.INVALID_REQUEST, f"request nested deeper than {max_depth} levels"),
            notification="id" not in request,
        )
    return request


def decode_line(line: bytes, *, max_depth: int = MAX_DEPTH, require_id: bool = True) -> dict[str, Any]:
    """One request line judged as JSON: an object, with a string or integer ``id`` (required
    unless ``require_id`` is false), nested at most ``max_depth`` levels.

    Raises :class:`LineError` when the line cannot be answered with an id, and
    :class:`IdentifiedError` (carrying the id) when it can. Shared by every line-based door.
    """
    return check_request(parse_line(line, max_depth=max_depth), max_depth=max_depth, require_id=require_id)


def _loads(line: bytes) -> Any:
    """orjson, except for escaped lone surrogates (``"\\ud800"``), which JSON allows and
    JavaScript's ``JSON.stringify`` writes, but orjson refuses: those lines go to the stdlib parser."""
    try:
        return loads(line)
    except ValueError as exc:
        if "surrogate" not in str(exc) and "UTF-8" not in str(exc):
            raise
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as bad:  # orjson calls this "surrogates not allowed"
            raise ValueError(f"invalid UTF-8 at byte {bad.start}") from None
        try:
            return json.loads(line.decode("utf-8"))
        except RecursionError as deep:
            raise ValueError("recursion limit exceeded") from deep
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise exc from None


class _Identified(Exception):
    """A request error for a request whose id is known (answered with that id, unless it is a
    notification, which is never answered)."""

    def __init__(self, request_id: Any, error: _RequestError, *, notification: bool = False) -> None:
        super().__init__(str(error))
        self.request_id = request_id
        self.error = error
        self.notification = notification


LineError = _RequestError
"""A line that cannot be answered with an id: answer it with ``"id": null`` (``code``, message)."""
IdentifiedError = _Identified
"""A line whose id is known: answer it with ``request_id`` (``error.code``, message)."""
