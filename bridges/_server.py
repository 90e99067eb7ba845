"""The JSON-lines protocol machinery: read requests, run them on a thread pool, write responses.

One request per line on the input, ``{"id", "method", "params"}``; one response per line on the
output, ``{"id", "result"}`` or ``{"id", "error": {"code", "message"}}``. Requests that touch the
same *lane* (one agent, one blackboard session, the file index) run one after another in arrival
order; different lanes run in parallel, so responses may come out of order and are matched by
``id``. A line that cannot be judged (not JSON, too long, too deep, not a request) is answered
with ``"id": null`` and the server keeps serving. End of input drains every request in flight,
then the caller stops the memory system (which flushes write-backs).
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import IntEnum
from typing import IO, Any

from memstrata.errors import (
    DatabaseBusyError,
    InvalidInputError,
    MemstrataError,
    SystemStoppedError,
)

from ._json import MAX_DEPTH, dumps, json_depth, loads
from ._schema import check, describe_type

__all__ = ["DEFAULT_MAX_LINE_BYTES", "ErrorCode", "JsonLinesServer", "Method", "ServeStats"]

DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024
_MAX_IN_FLIGHT = 1024


class ErrorCode(IntEnum):
    """Error codes of the JSON-lines protocol (JSON-RPC 2.0 numbering where one exists)."""

    PARSE_ERROR = -32700  # the line is not JSON (or not UTF-8)
    INVALID_REQUEST = -32600  # not a request object, bad id, too long, too deeply nested
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


_REQUEST_KEYS = frozenset({"id", "method", "params", "jsonrpc"})


class JsonLinesServer:
    """Serve a method table over a pair of byte streams."""

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
        self._write_lock = threading.Lock()
        self._lane_lock = threading.Lock()
        self._lanes: dict[str, deque[Callable[[], None]]] = {}
        self._in_flight = threading.Semaphore(_MAX_IN_FLIGHT)
        self._idle = threading.Condition()
        self._pending = 0
        self._writer: IO[bytes] | None = None
        self._write_failed = False
        self._pool: ThreadPoolExecutor | None = None
        self._reading = False
        self._stop_requested = False

    # -- output --------------------------------------------------------------------------------

    def _warn(self, message: str) -> None:
        stream = self._log if self._log is not None else sys.stderr
        with contextlib.suppress(Exception):
            stream.write(f"memstrata serve: {message}\n")
            stream.flush()

    def _send(self, response: dict[str, Any]) -> None:
        try:
            line = dumps(response) + b"\n"
        except Exception as exc:  # an unserialisable result is a bug; the client still gets an answer
            code, message = error_for(exc)
            line = dumps({"id": response.get("id"), "error": {"code": int(code), "message": message}}) + b"\n"
        with self._write_lock:
            if self._write_failed or self._writer is None:
                return
            try:
                self._writer.write(line)
                self._writer.flush()
            except (OSError, ValueError) as exc:
                self._write_failed = True
                self._warn(f"cannot write responses any more ({exc}); draining until end of input")

    def _send_error(self, request_id: Any, code: ErrorCode, message: str) -> None:
        with self._write_lock:
            self.stats.errors += 1
        self._send({"id": request_id, "error": {"code": int(code), "message": message}})

    # -- input ---------------------------------------------------------------------------------

    def _read_line(self, reader: IO[bytes]) -> bytes | None:
        """The next line, or ``None`` at end of input; an oversized line raises ``_RequestError``."""
        line = reader.readline(self.max_line_bytes + 1)
        if not line:
            return None
        if len(line) > self.max_line_bytes and not (
            line.endswith(b"\n") and len(line) - 1 <= self.max_line_bytes
        ):
            while line and not line.endswith(b"\n"):  # skip the rest of the oversized line
                line = reader.readline(1 << 20)
            raise _RequestError(
                ErrorCode.INVALID_REQUEST, f"request line longer than {self.max_line_bytes} bytes"
            )
        return line

    def _parse(self, line: bytes) -> tuple[Any, Method, dict[str, Any]]:
        try:
            request = _loads(line)
        except ValueError as exc:
            if "depth" in str(exc) or "recursion" in str(exc).lower():
                raise _RequestError(
                    ErrorCode.INVALID_REQUEST, f"request nested deeper than {self.max_depth} levels"
                ) from exc
            raise _RequestError(ErrorCode.PARSE_ERROR, f"invalid JSON: {_one_line(str(exc))}") from exc
        if not isinstance(request, dict):
            raise _RequestError(
                ErrorCode.INVALID_REQUEST, f"a request must be a JSON object, got {describe_type(request)}"
            )
        request_id = request.get("id")
        if "id" not in request or isinstance(request_id, bool) or not isinstance(request_id, str | int):
            raise _RequestError(
                ErrorCode.INVALID_REQUEST,
                "a request needs an 'id' that is a string or an integer"
                + ("" if "id" not in request else f", got {describe_type(request_id)}"),
            )
        if json_depth(request, self.max_depth + 1) > self.max_depth + 1:
            raise _Identified(
                request_id,
                _RequestError(
                    ErrorCode.INVALID_REQUEST, f"request nested deeper than {self.max_depth} levels"
                ),
            )
        unknown = sorted(set(request) - _REQUEST_KEYS)
        if unknown:
            raise _Identified(
                request_id,
                _RequestError(
                    ErrorCode.INVALID_REQUEST,
                    f"unknown request field {unknown[0]!r} (expected id, method, params)",
                ),
            )
        name = request.get("method")
        if not isinstance(name, str):
            raise _Identified(
                request_id,
                _RequestError(
                    ErrorCode.INVALID_REQUEST, f"'method' must be a string, got {describe_type(name)}"
                ),
            )
        method = self.methods.get(name)
        if method is None:
            raise _Identified(
                request_id,
                _RequestError(
                    ErrorCode.METHOD_NOT_FOUND,
                    f"unknown method {name[:100]!r} (available: {', '.join(sorted(self.methods))})",
                ),
            )
        params = request.get("params")
        if params is None:
            params = {}
        try:
            params = check(method.params, params, noun="param")
        except InvalidInputError as exc:
            raise _Identified(
                request_id, _RequestError(ErrorCode.INVALID_PARAMS, f"{name}: {_one_line(str(exc))}")
            ) from exc
        return request_id, method, params

    # -- execution -----------------------------------------------------------------------------

    def _run(self, request_id: Any, method: Method, params: dict[str, Any]) -> None:
        try:
            result = method.run(params)
        except Exception as exc:
            code, message = error_for(exc)
            if code is ErrorCode.INTERNAL_ERROR and self.debug:
                self._warn("".join(traceback.format_exception(exc)).rstrip())
            self._send_error(request_id, code, f"{method.name}: {message}")
            return
        self._send({"id": request_id, "result": result})

    def _job(
        self, request_id: Any, method: Method, params: dict[str, Any], lane: str | None
    ) -> Callable[[], None]:
        def job() -> None:
            try:
                self._run(request_id, method, params)
            finally:
                self._finished(lane)

        return job

    def _finished(self, lane: str | None) -> None:
        if lane is not None:
            with self._lane_lock:
                queue = self._lanes[lane]
                following = queue.popleft() if queue else None
                if following is None:
                    del self._lanes[lane]
            if following is not None:
                self._submit(following)
        self._in_flight.release()
        with self._idle:
            self._pending -= 1
            if self._pending == 0:
                self._idle.notify_all()

    def _submit(self, job: Callable[[], None]) -> None:
        assert self._pool is not None
        self._pool.submit(job)

    def _dispatch(self, request_id: Any, method: Method, params: dict[str, Any]) -> None:
        try:
            lane = method.lane(params)
        except Exception:
            lane = None
        self._in_flight.acquire()
        with self._idle:
            self._pending += 1
        job = self._job(request_id, method, params, lane)
        if lane is not None:
            with self._lane_lock:
                queue = self._lanes.get(lane)
                if queue is not None:  # the lane is busy: run after the requests before it
                    queue.append(job)
                    return
                self._lanes[lane] = deque()
        self._submit(job)

    def wait_idle(self) -> None:
        with self._idle:
            while self._pending:
                self._idle.wait()

    def serve(self, reader: IO[bytes], writer: IO[bytes]) -> ServeStats:
        """Serve until end of input (or SIGTERM/SIGINT in the main thread); every request is answered."""
        self._writer = writer
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():

            def _stop(signum: int, frame: Any) -> None:
                if self._stop_requested:  # asked twice: stop waiting for requests in flight
                    raise KeyboardInterrupt
                self._stop_requested = True
                if self._reading:  # interrupt the blocking read; never a half-dispatched request
                    raise _Shutdown

            for signum in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(ValueError, OSError):
                    previous[signum] = signal.signal(signum, _stop)
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="memstrata-serve")
        try:
            self._loop(reader)
        except _Shutdown:
            pass
        finally:
            if self._stop_requested:
                self._warn("stopping: finishing the requests in flight")
            self.wait_idle()
            self._pool.shutdown(wait=True)
            for signum, handler in previous.items():
                with contextlib.suppress(ValueError, OSError, TypeError):
                    signal.signal(signum, handler)
        return self.stats

    def _loop(self, reader: IO[bytes]) -> None:
        while not self._stop_requested:
            self._reading = True
            try:
                line = self._read_line(reader)
            except _RequestError as exc:
                self._reading = False
                self.stats.bad_lines += 1
                self._send_error(None, exc.code, str(exc))
                continue
            finally:
                self._reading = False
            if line is None:
                return
            if not line.strip():
                continue
            try:
                request_id, method, params = self._parse(line)
            except _Identified as exc:
                self.stats.requests += 1
                self._send_error(exc.request_id, exc.error.code, str(exc.error))
                continue
            except _RequestError as exc:
                self.stats.bad_lines += 1
                self._send_error(None, exc.code, str(exc))
                continue
            self.stats.requests += 1
            self._dispatch(request_id, method, params)


def _loads(line: bytes) -> Any:
    """orjson, except for escaped lone surrogates (``"\\ud800"``), which JSON allows and
    JavaScript's ``JSON.stringify`` writes, but orjson refuses: those lines go to the stdlib parser."""
    try:
        return loads(line)
    except ValueError as exc:
        if "surrogate" not in str(exc):
            raise
        try:
            return json.loads(line.decode("utf-8"))
        except RecursionError as deep:
            raise ValueError("recursion limit exceeded") from deep
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise exc from None


class _Identified(Exception):
    """A request error for a request whose id is known (answered with that id)."""

    def __init__(self, request_id: Any, error: _RequestError) -> None:
        super().__init__(str(error))
        self.request_id = request_id
        self.error = error
