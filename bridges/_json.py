"""orjson on the wire, made total: any result can be written, any line can be judged.

orjson refuses lone surrogates when writing; a stored text may hold them (the Python API accepts
any ``str``), so the writer falls back to a copy with those code points replaced rather than
failing a response that was already computed. A JSON-RPC message's ``id`` is the exception: it
is written escaped, exactly as the client sent it, since the client matches answers by it.

orjson reads an integer beyond 64 bits as a float, and nothing downstream can tell: a text that
holds a run of 19 digits or more is read again by the standard library, which keeps an integer
outside the signed 64-bit range (what SQLite holds and the Python API's checks take) as an
:class:`OutOfRange`, so it is refused with its digits and place instead.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, NoReturn

import orjson

from memstrata.core.jsonable import to_jsonable
from memstrata.core.validation import has_lone_surrogate

__all__ = [
    "INT64_RANGE",
    "MAX_DEPTH",
    "IntegerRangeError",
    "NumberError",
    "OutOfRange",
    "dumps",
    "first_out_of_range",
    "json_depth",
    "loads",
    "loads_marking",
    "show_digits",
    "to_jsonable",
]

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects accepted from the outside world."""

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
INT64_RANGE = "the 64-bit range (-2**63 to 2**63 - 1)"
"""The integers every door accepts, as its messages word them: what SQLite and orjson can hold."""

_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


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


# -- reading -------------------------------------------------------------------------------------


class OutOfRange:
    """Where a parsed value held an integer outside the 64-bit range: its digits, as written."""

    __slots__ = ("digits",)

    def __init__(self, digits: str) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"OutOfRange({self.digits})"


class _Refusal(orjson.JSONDecodeError):
    """orjson's error type, naming a position only when there is one to name."""

    def __init__(self, msg: str, doc: str = "", pos: int | None = None) -> None:
        super().__init__(msg, doc, 0 if pos is None else pos)
        if pos is None:
            self.args = (msg,)


class NumberError(_Refusal):
    """A JSON text holds a number no door takes as written: NaN or an infinity (not JSON, though
    many writers emit them) or an integer beyond 64 bits."""


class IntegerRangeError(NumberError):
    """A JSON text holds an integer outside the 64-bit range (``path`` names where, ``""`` when the
    whole text is that integer): refused, since orjson would read it as a float."""

    def __init__(self, path: str, digits: str, doc: str, pos: int) -> None:
        self.path = path
        self.digits = digits
        where = f" at {path!r}" if path else ""
        super().__init__(f"integer {show_digits(digits)}{where} is outside {INT64_RANGE}", doc, pos)


def show_digits(digits: str) -> str:
    """An integer's digits for a one-line message (a huge one shortened, its length given)."""
    if len(digits) <= 60:
        return digits
    return f"{digits[:24]}...{digits[-8:]} ({len(digits) - digits.startswith('-')} digits)"


_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * 19
"""19 digits: the shortest integer that can fall outside the 64-bit range (2**63 has 19)."""
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?')
"""A string or a number of a valid JSON text: finds where an integer is written."""
_NOT_FINITE = "{} is not a JSON number (numbers must be finite)"


def loads(data: bytes | str) -> Any:
    """Parse JSON; raises ``orjson.JSONDecodeError`` (a ``ValueError``): a :class:`NumberError`
    for NaN or an infinity, an :class:`IntegerRangeError` for an integer beyond 64 bits."""
    value, marked = loads_marking(data)
    found = first_out_of_range(value) if marked else None
    if found is not None:
        path, digits = found
        text = _text(data)
        pos = next((m.start() for m in _TOKEN.finditer(text) if m.group() == digits), 0)
        raise IntegerRangeError(path, digits, text, pos)
    return value


def loads_marking(data: bytes | str, *, lone_surrogates: bool = False) -> tuple[Any, bool]:
    """Parse JSON, keeping each integer outside the 64-bit range as an :class:`OutOfRange` (the
    flag is false when there is none), for a door that answers each part of a message on its own.

    ``lone_surrogates`` also reads escaped lone surrogates (``"\\ud800"``), which JSON allows and
    JavaScript's ``JSON.stringify`` writes, but orjson refuses. Raises ``orjson.JSONDecodeError``.
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if not lone_surrogates or ("surrogate" not in str(exc) and "UTF-8" not in str(exc)):
            _raise_clearer(exc)
        return _read_exactly(_text(data), exc)
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if raw.translate(_DIGITS_AS_ZERO).find(_LONG_RUN) < 0:  # 10 times faster than a regex
        return value, False
    exact, marked = _read_exactly(_text(data), None)
    return (exact, True) if marked else (value, False)


def _text(data: bytes | str) -> str:
    if isinstance(data, str):
        return data
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as bad:  # orjson calls this "surrogates not allowed"
        raise _Refusal(f"invalid UTF-8 at byte {bad.start}") from None


def _read_exactly(text: str, failed: orjson.JSONDecodeError | None) -> tuple[Any, bool]:
    """``text`` read by the standard library: integers beyond 64 bits kept as :class:`OutOfRange`,
    NaN, infinities and numbers too large for a double refused, as orjson refuses them; ``failed``
    is orjson's error, raised again when the standard library cannot read the text either."""
    marked = False

    def parse_int(digits: str) -> Any:
        nonlocal marked
        if len(digits) - digits.startswith("-") <= 19:
            number = int(digits)
            if INT64_MIN <= number <= INT64_MAX:
                return number
        marked = True
        return OutOfRange(digits)

    try:
        value = json.loads(text, parse_int=parse_int, parse_float=_finite, parse_constant=_no_constant)
    except orjson.JSONDecodeError:
        raise
    except RecursionError:
        raise _Refusal("recursion limit exceeded") from None
    except json.JSONDecodeError as exc:
        if failed is not None:
            raise failed from None
        raise orjson.JSONDecodeError(exc.msg, text, exc.pos) from None
    return value, marked


def _finite(digits: str) -> float:
    number = float(digits)
    if not math.isfinite(number):
        raise NumberError(f"number {show_digits(digits)} is infinity when parsed as double")
    return number


def _no_constant(name: str) -> NoReturn:
    raise NumberError(_NOT_FINITE.format(name))


def _raise_clearer(exc: orjson.JSONDecodeError) -> NoReturn:
    """orjson's error, naming NaN or an infinity where orjson only sees an unexpected character."""
    doc, pos = exc.doc, exc.pos
    if exc.msg.startswith(("unexpected character", "no digit after sign")):
        if pos > 0 and doc.startswith("-Infinity", pos - 1):
            raise NumberError(_NOT_FINITE.format("-Infinity"), doc, pos - 1) from None
        for token in ("NaN", "Infinity"):
            if doc.startswith(token, pos):
                raise NumberError(_NOT_FINITE.format(token), doc, pos) from None
    raise exc


def first_out_of_range(value: Any) -> tuple[str, str] | None:
    """The path (``a.b[0]``, ``""`` for the value itself) and digits of the first
    :class:`OutOfRange` in a value read by :func:`loads_marking`, in document order; else ``None``."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, OutOfRange):
            return path, item.digits
        if isinstance(item, dict):
            children = [(child, f"{path}.{key}" if path else key) for key, child in item.items()]
        elif isinstance(item, list):
            children = [(child, f"{path}[{i}]") for i, child in enumerate(item)]
        else:
            continue
        stack.extend(reversed(children))
    return None


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
