"""JSON-RPC 2.0 wire rules (error codes, method shape, line checks), shared by `serve` and the MCP door."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import IO, Any

from memstrata.core.errors import (
    DatabaseBusyError,
    InvalidInputError,
    MemstrataError,
    SystemStoppedError,
)

from ._json import MAX_DEPTH, Marker, first_marked, json_depth, loads_marking, show_digits
from ._schema import check, describe_type

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "ErrorCode",
    "IdentifiedError",
    "LineError",
    "Method",
    "RpcCall",
    "check_request",
    "decode_line",
    "error_for",
    "judge_request",
    "parse_line",
    "read_line",
]

DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024


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


class _RequestError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


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
    """A line parsed as JSON; raises :class:`LineError` (parse error, or nested too deep).

    A request holding an integer beyond 64 bits or a number too large for a double (never read
    as infinity) comes back wrapped, so :func:`check_request` refuses it with its id (a batch's
    other requests still run).
    """
    try:
        message, marked = loads_marking(line, lone_surrogates=True)
    except ValueError as exc:
        if "depth" in str(exc) or "recursion" in str(exc).lower():
            raise _RequestError(
                ErrorCode.INVALID_REQUEST, f"request nested deeper than {max_depth} levels"
            ) from exc
        raise _RequestError(ErrorCode.PARSE_ERROR, f"invalid JSON: {_one_line(str(exc))}") from exc
    if not marked:
        return message
    if isinstance(message, list):
        return [_RefusedNumber.wrap(item) for item in message]
    return _RefusedNumber.wrap(message)


@dataclass(frozen=True, slots=True)
class _RefusedNumber:
    """A request that holds a number memstrata refuses (:class:`Marker`) at ``path``."""

    request: Any
    path: str
    number: Marker

    @staticmethod
    def wrap(message: Any) -> Any:
        found = first_marked(message)
        return message if found is None else _RefusedNumber(message, *found)

    def error(self) -> _RequestError:
        number, bounds = self.number.shown(), self.number.bounds
        method = self.request.get("method") if isinstance(self.request, dict) else None
        if self.path.startswith("params.") and isinstance(method, str):
            return _RequestError(
                ErrorCode.INVALID_PARAMS,
                f"{method[:100]}: {number} in param {self.path[7:]!r} is outside {bounds}",
            )
        return _RequestError(ErrorCode.INVALID_REQUEST, f"{number} at {self.path!r} is outside {bounds}")


def check_request(request: Any, *, max_depth: int = MAX_DEPTH, require_id: bool = True) -> dict[str, Any]:
    """A parsed message judged as a request object with a string or integer ``id`` (required
    unless ``require_id`` is false), nested at most ``max_depth`` levels."""
    refused = request if isinstance(request, _RefusedNumber) else None
    if refused is not None:
        request = refused.request
    if not isinstance(request, dict):
        raise _RequestError(
            ErrorCode.INVALID_REQUEST, f"a request must be a JSON object, got {describe_type(request)}"
        )
    request_id = request.get("id")
    if isinstance(request_id, Marker):
        raise _RequestError(
            ErrorCode.INVALID_REQUEST,
            f"a request's 'id' {show_digits(request_id.digits)} is outside {request_id.bounds}",
        )
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
    if refused is not None:
        raise _Identified(request_id, refused.error(), notification="id" not in request)
    return request


def decode_line(line: bytes, *, max_depth: int = MAX_DEPTH, require_id: bool = True) -> dict[str, Any]:
    """One request line judged as JSON: an object, with a string or integer ``id`` (required
    unless ``require_id`` is false), nested at most ``max_depth`` levels.

    Raises :class:`LineError` when the line cannot be answered with an id, and
    :class:`IdentifiedError` (carrying the id) when it can. Shared by every line-based door.
    """
    return check_request(parse_line(line, max_depth=max_depth), max_depth=max_depth, require_id=require_id)


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


@dataclass(slots=True)
class RpcCall:
    """A request judged answerable: its id (none for a notification), method and params."""

    request_id: Any
    notification: bool
    method: Method
    params: dict[str, Any]


def judge_request(request: Any, methods: Mapping[str, Method], *, max_depth: int = MAX_DEPTH) -> RpcCall:
    """One request object judged; raises ``_RequestError``/``_Identified`` when it is not one."""
    request = check_request(request, max_depth=max_depth, require_id=False)
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
        method = methods.get(name)
        if method is None:
            raise _RequestError(
                ErrorCode.METHOD_NOT_FOUND,
                f"unknown method {name[:100]!r} (available: {', '.join(sorted(methods))})",
            )
        params = request.get("params")
        if isinstance(params, dict):  # an optional param given as null is left out
            required = method.params.get("required", ())
            params = {k: v for k, v in params.items() if v is not None or k in required}
        try:
            params = check(method.params, {} if params is None else params, noun="param")
        except InvalidInputError as exc:
            raise _RequestError(ErrorCode.INVALID_PARAMS, f"{name}: {_one_line(str(exc))}") from exc
    except _RequestError as exc:
        raise _Identified(request_id, exc, notification=notification) from None
    return RpcCall(request_id, notification, method, params)
