"""orjson on the wire, made total: any result can be written, any line can be judged.

orjson refuses lone surrogates when writing; a stored text may hold them (the Python API accepts
any ``str``), so the writer falls back to a copy with those code points replaced rather than
failing a response that was already computed. A JSON-RPC message's ``id`` is the exception: it
is written escaped, exactly as the client sent it, since the client matches answers by it.

Reading is :mod:`memstrata.core.json_text` (integers beyond 64 bits refused, not read as floats;
numbers too large for a double refused, not read as infinity), re-exported here for the doors.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import orjson

from memstrata.core.json_text import (
    INT64_RANGE,
    Marker,
    NumberError,
    OutOfRange,
    RangeError,
    first_marked,
    has_long_digit_run,
    loads,
    loads_marking,
    show_digits,
)
from memstrata.core.jsonable import to_jsonable
from memstrata.core.validation import has_lone_surrogate

__all__ = [
    "INT64_RANGE",
    "MAX_DEPTH",
    "Marker",
    "NumberError",
    "OutOfRange",
    "RangeError",
    "dumps",
    "first_marked",
    "has_long_digit_run",
    "json_depth",
    "loads",
    "loads_marking",
    "loads_value",
    "not_json",
    "show_digits",
    "to_jsonable",
]

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects accepted from the outside world."""

_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


class DepthError(orjson.JSONDecodeError):
    """A JSON value nested deeper than :data:`MAX_DEPTH`."""

    def __init__(self) -> None:
        message = f"nested deeper than {MAX_DEPTH} levels"
        super().__init__(message, "", 0)
        self.args = (message,)  # no position: the whole value is too deep


def loads_value(data: str | bytes) -> Any:
    """JSON text from outside (arguments, a value given as text), read as ``memstrata serve``
    reads a message: escaped lone surrogates are read, bytes must be UTF-8, and nesting deeper
    than :data:`MAX_DEPTH` is refused. Raises ``orjson.JSONDecodeError``; :func:`not_json` tells
    text that is not JSON at all from JSON no door takes."""
    value = loads(data, lone_surrogates=True)
    if json_depth(value) > MAX_DEPTH:
        raise DepthError
    return value


def not_json(exc: ValueError) -> bool:
    """Whether ``exc`` (from :func:`loads_value`) says the text is not JSON (NaN and invalid
    UTF-8 included), rather than JSON that is refused: a number beyond 64 bits or a double, or
    nesting deeper than a door reads."""
    if isinstance(exc, RangeError | DepthError):
        return False
    return "depth limit" not in str(exc) and "recursion limit" not in str(exc)


def _default(value: Any) -> Any:
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def dumps(value: Any, *, indent: bool = False) -> bytes:
    """Serialise ``value``; strings with lone surrogates are repaired instead of failing."""
    option = _OPTIONS | (orjson.OPT_INDENT_2 if indent else 0)
    try:
        return orjson.dumps(value, default=_default, option=option)
    except orjson.JSONEncodeError:
        return orjson.dumps(_repair(value), default=_default, option=option)


def _repair(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, Mapping):
        repaired = {_repair(str(k)): _repair(v) for k, v in value.items()}
        request_id = value.get("id")
        if "jsonrpc" in value and isinstance(request_id, str) and has_lone_surrogate(request_id):
            repaired["id"] = orjson.Fragment(json.dumps(request_id))
        return repaired
    if isinstance(value, list | tuple | set | frozenset):
        return [_repair(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _repair({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    return value


def json_depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of a parsed value, counting stops once it passes ``limit`` (iterative)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest
