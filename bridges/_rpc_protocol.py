"""JSON-RPC 2.0 wire rules (error codes, method shape, line checks), shared by `serve` and the MCP door."""

from __future__ import annotations

import json
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

from ._json import MAX_DEPTH, json_depth, loads
from ._schema import describe_type

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "ErrorCode",
    "IdentifiedError",
    "LineError",
    "Method",
    "check_request",
    "decode_line",
    "error_for",
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
