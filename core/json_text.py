"""JSON in memstrata: text read exactly, values checked, one range of integers for both.

orjson reads an integer beyond 64 bits as a float, and nothing downstream can tell: a text that
holds a run of 19 digits or more is read again by the standard library, which keeps an integer
outside the signed 64-bit range (what SQLite holds) as an :class:`OutOfRange`, so it is refused
with its digits and place instead. A number too large for a double (``1e400``: valid JSON, which
orjson refuses as a whole text) is read the same way and kept as a :class:`BeyondDouble`, so a
door can refuse it with the request's id and its place rather than failing the whole line.
The doors read requests with it, the actors' codec reads messages with it and an import reads
its records with it. :func:`check_json_value` holds the values given through the Python API to
the same range (the validation module offers it with its other rules).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NoReturn

import orjson

from memstrata.core.errors import InvalidInputError

__all__ = [
    "DOUBLE_RANGE",
    "INT64_MAX",
    "INT64_MIN",
    "INT64_RANGE",
    "BeyondDouble",
    "DoubleRangeError",
    "IntegerRangeError",
    "JsonText",
    "Marker",
    "NumberError",
    "OutOfRange",
    "RangeError",
    "check_json_value",
    "first_marked",
    "has_long_digit_run",
    "json_copy",
    "loads",
    "loads_marking",
    "loads_or_refuse",
    "show_digits",
]

JsonText = bytes | bytearray | memoryview | str
"""What :func:`loads` reads: a JSON text, as bytes (UTF-8) or as a string."""

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
INT64_RANGE = "the 64-bit range (-2**63 to 2**63 - 1)"
"""The integers memstrata accepts, as its messages word them: what SQLite holds."""
DOUBLE_RANGE = "the range of a double (magnitude up to about 1.8e308)"
"""The numbers with a fraction or an exponent memstrata accepts, as its messages word them."""


class Marker:
    """Where a parsed value held a number memstrata refuses: the number as written; ``noun`` and
    ``bounds`` word the refusal (``integer 1234... is outside the 64-bit range ...``)."""

    __slots__ = ("digits",)
    noun: ClassVar[str]
    bounds: ClassVar[str]

    def __init__(self, digits: str) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.digits})"

    def shown(self) -> str:
        """``integer 123...`` or ``number 1e400``, a huge one shortened."""
        return f"{self.noun} {show_digits(self.digits)}"


class OutOfRange(Marker):
    """An integer outside the 64-bit range."""

    __slots__ = ()
    noun, bounds = "integer", INT64_RANGE


class BeyondDouble(Marker):
    """A number too large for a double (``1e400``)."""

    __slots__ = ()
    noun, bounds = "number", DOUBLE_RANGE


class _Refusal(orjson.JSONDecodeError):
    """orjson's error type, naming a position only when there is one to name."""

    def __init__(self, msg: str, doc: str = "", pos: int | None = None) -> None:
        super().__init__(msg, doc, 0 if pos is None else pos)
        if pos is None:
            self.args = (msg,)


class NumberError(_Refusal):
    """A JSON text holds a number no door takes as written: NaN or an infinity (not JSON, though
    many writers emit them) or an integer beyond 64 bits."""


class RangeError(NumberError):
    """A JSON text holds a number outside what memstrata takes (``path`` names where, ``""`` when
    the whole text is that number); a door refuses it as it refuses bad input."""

    def __init__(self, path: str, number: Marker, doc: str, pos: int) -> None:
        self.path = path
        self.digits = number.digits
        where = f" at {path!r}" if path else ""
        super().__init__(f"{number.shown()}{where} is outside {number.bounds}", doc, pos)


class IntegerRangeError(RangeError):
    """An integer outside the 64-bit range: refused, since orjson would read it as a float."""


class DoubleRangeError(RangeError):
    """A number too large for a double: refused, never read as infinity."""


def show_digits(digits: str) -> str:
    """A number as written, for a one-line message (a huge one shortened, its digits counted)."""
    if len(digits) <= 60:
        return digits
    return f"{digits[:24]}...{digits[-8:]} ({sum(c.isdigit() for c in digits)} digits)"


_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * 19
"""19 digits: the shortest integer that can fall outside the 64-bit range (2**63 has 19)."""


def has_long_digit_run(data: bytes) -> bool:
    """Whether ``data`` holds 19 digits in a row: the only texts where an integer can fall outside
    the 64-bit range (10 times faster than a regex)."""
    return data.translate(_DIGITS_AS_ZERO).find(_LONG_RUN) >= 0


_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?')
"""A string or a number of a valid JSON text: finds where an integer is written."""
_NOT_FINITE = "{} is not a JSON number (numbers must be finite)"
_BEYOND_DOUBLE = "number is infinity when parsed as double"
"""orjson's message for a number too large for a double."""


def loads(data: JsonText, *, lone_surrogates: bool = False) -> Any:
    """Parse JSON; raises ``orjson.JSONDecodeError`` (a ``ValueError``): a :class:`NumberError`
    for NaN or an infinity, an :class:`IntegerRangeError` for an integer beyond 64 bits, a
    :class:`DoubleRangeError` for a number too large for a double. ``lone_surrogates``: as in
    :func:`loads_marking`."""
    value, marked = loads_marking(data, lone_surrogates=lone_surrogates)
    found = first_marked(value) if marked else None
    if found is not None:
        path, marker = found
        text = _text(data)
        pos = next((m.start() for m in _TOKEN.finditer(text) if m.group() == marker.digits), 0)
        error = IntegerRangeError if isinstance(marker, OutOfRange) else DoubleRangeError
        raise error(path, marker, text, pos)
    return value


def loads_or_refuse(data: JsonText, what: str) -> Any:
    """:func:`loads`, its refusals as :class:`~memstrata.core.errors.InvalidInputError` naming
    ``what`` was read (``"message"``, ``"file.jsonl line 3"``), for callers of the Python API."""
    try:
        return loads(data)
    except NumberError as exc:  # valid JSON, but a number no part of memstrata takes
        raise InvalidInputError(f"{what} is refused: {exc}") from exc
    except orjson.JSONDecodeError as exc:
        raise InvalidInputError(f"{what} is not valid JSON: {exc}") from exc


def loads_marking(data: JsonText, *, lone_surrogates: bool = False) -> tuple[Any, bool]:
    """Parse JSON, keeping each integer outside the 64-bit range as an :class:`OutOfRange` and each
    number too large for a double as a :class:`BeyondDouble` (the flag is false when there is
    none), for a door that answers each part of a message on its own.

    ``lone_surrogates`` also reads escaped lone surrogates (``"\\ud800"``), which JSON allows and
    JavaScript's ``JSON.stringify`` writes, but orjson refuses. Raises ``orjson.JSONDecodeError``.
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        beyond_double = exc.msg.startswith(_BEYOND_DOUBLE)
        if not beyond_double and (
            not lone_surrogates or ("surrogate" not in str(exc) and "UTF-8" not in str(exc))
        ):
            _raise_clearer(exc)
        return _read_exactly(_text(data), exc)
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if not has_long_digit_run(raw):
        return value, False
    exact, marked = _read_exactly(_text(data), None)
    return (exact, True) if marked else (value, False)


def _text(data: JsonText) -> str:
    if isinstance(data, str):
        return data
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as bad:  # orjson calls this "surrogates not allowed"
        raise _Refusal(f"invalid UTF-8 at byte {bad.start}") from None


def _read_exactly(text: str, failed: orjson.JSONDecodeError | None) -> tuple[Any, bool]:
    """``text`` read by the standard library: integers beyond 64 bits kept as :class:`OutOfRange`,
    numbers too large for a double as :class:`BeyondDouble`, NaN and infinities refused, as orjson
    refuses them; ``failed`` is orjson's error, raised again when the standard library cannot
    read the text either."""
    marked = False

    def parse_int(digits: str) -> Any:
        nonlocal marked
        if len(digits) - digits.startswith("-") <= 19:
            number = int(digits)
            if INT64_MIN <= number <= INT64_MAX:
                return number
        marked = True
        return OutOfRange(digits)

    def parse_float(digits: str) -> Any:
        nonlocal marked
        number = float(digits)
        if math.isfinite(number):
            return number
        marked = True
        return BeyondDouble(digits)

    try:
        value = json.loads(text, parse_int=parse_int, parse_float=parse_float, parse_constant=_no_constant)
    except orjson.JSONDecodeError:
        raise
    except RecursionError:
        raise _Refusal("recursion limit exceeded") from None
    except json.JSONDecodeError as exc:
        if failed is not None:
            raise failed from None
        raise orjson.JSONDecodeError(exc.msg, text, exc.pos) from None
    return value, marked


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


def first_marked(value: Any) -> tuple[str, Marker] | None:
    """The path (``a.b[0]``, ``""`` for the value itself) and the :class:`Marker` of the first
    refused number in a value read by :func:`loads_marking`, in document order; else ``None``."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, Marker):
            return path, item
        if isinstance(item, dict):
            children = [(child, f"{path}.{key}" if path else key) for key, child in item.items()]
        elif isinstance(item, list):
            children = [(child, f"{path}[{i}]") for i, child in enumerate(item)]
        else:
            continue
        stack.extend(reversed(children))
    return None


# -- values given through the Python API ---------------------------------------------------------


def _first_path(value: Any, found: Callable[[Any], bool]) -> tuple[str, Any] | None:
    """Where the first item that ``found`` accepts sits in ``value`` (``"[2]['x']"``), and the
    item; ``None`` when there is none."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if found(item):
            return path, item
        if isinstance(item, Mapping):
            stack.extend(reversed([(v, f"{path}[{k!r}]") for k, v in item.items()]))
        elif isinstance(item, list | tuple):
            stack.extend(reversed([(v, f"{path}[{i}]") for i, v in enumerate(item)]))
    return None


def _keys_not_text(item: Any) -> bool:
    return isinstance(item, Mapping) and any(not isinstance(key, str) for key in item)


def _not_finite(item: Any) -> bool:
    return isinstance(item, float) and not math.isfinite(item)


def _beyond_int64(item: Any) -> bool:
    return isinstance(item, int) and not INT64_MIN <= item <= INT64_MAX


_JSON_SCALARS = frozenset({str, int, float, bool, type(None)})
_ORJSON_DEPTH = 254  # the deepest nesting orjson writes


def _not_json_data(item: Any) -> bool:
    """Whether ``item`` is neither a JSON container nor a JSON scalar (a ``str``, ``int`` or
    ``float`` subclass, such as a StrEnum or IntEnum member, is written as its value)."""
    return not isinstance(item, dict | list | tuple | str | int | float | None)


def _only_json_data(value: Any) -> bool:
    """Whether ``value`` holds JSON data only: the fast pass of :func:`_not_json_data` over it,
    for a value orjson has written (so it has no cycle and a bounded depth)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) in _JSON_SCALARS:
            continue
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif _not_json_data(item):
            return False
    return True


def _refuse_first(value: object, found_in: Callable[[Any], bool], message: Callable[[str, Any], str]) -> None:
    """Refuse ``value`` with ``message(where, what)`` for the first part of it ``found_in`` finds."""
    found = _first_path(value, found_in)
    if found is not None:
        raise InvalidInputError(message(*found))


def _refuse_not_json_data(value: object, name: str) -> None:
    _refuse_first(
        value,
        _not_json_data,
        lambda at, item: (
            f"{name} must be JSON-serialisable data: found a {type(item).__qualname__} at "
            f"value{at} (not JSON serializable)"
        ),
    )


def check_json_value(value: object, name: str) -> bytes:
    """The orjson bytes of ``value``: JSON data only. NaN and infinity are rejected (JSON has no
    such numbers: they would read back as ``null``), and so are integers outside the 64-bit range
    (orjson writes up to 2**64 - 1, but SQLite's JSON functions and every door hold 64 bits
    signed), anything orjson cannot write, and the objects orjson writes as another type (a
    datetime or a UUID as text, a dataclass as an object, an Enum member as its value): the
    caller would read back something else than it gave."""
    try:
        data = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError) as exc:
        if "Recursion limit" in str(exc):  # a value that holds itself: no walk of it would end
            raise InvalidInputError(
                f"{name} must be JSON data nested at most {_ORJSON_DEPTH} levels deep "
                "(a list or object that holds itself never ends)"
            ) from None
        _refuse_beyond_int64(value, name)
        if "Dict key must be str" not in str(exc):
            _refuse_not_json_data(value, name)
            raise InvalidInputError(f"{name} must be JSON-serialisable data: {exc}") from exc
        # object keys must be text (1 and "1" would become one key); a str subclass (a StrEnum
        # member) is text, written as its value
        found = _first_path(value, _keys_not_text)
        if found is not None:
            key = next(k for k in found[1] if not isinstance(k, str))
            raise InvalidInputError(
                f"{name} must have text object keys; found {key!r} ({type(key).__name__}) in value{found[0]}"
            ) from None
        data = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    if b"null" in data:  # orjson writes NaN and infinity as null: only then look for them
        _refuse_first(
            value,
            _not_finite,
            lambda at, _: (
                f"{name} must be JSON data without NaN or infinity (they would read back as null); "
                f"found one at value{at}"
            ),
        )
    if has_long_digit_run(data):  # only then can an integer fall outside the range
        _refuse_beyond_int64(value, name)
    if not _only_json_data(value):
        _refuse_not_json_data(value, name)
    return data


def json_copy(value: object, name: str) -> Any:
    """The JSON data ``value`` is, as a new object that shares nothing with it (checked as
    :func:`check_json_value` checks it): a message holding it stays as it was sent when its
    sender goes on changing its own object (tuples come back as lists)."""
    return orjson.loads(check_json_value(value, name))


def _refuse_beyond_int64(value: object, name: str) -> None:
    _refuse_first(
        value,
        _beyond_int64,
        lambda at, item: (
            f"{name} must hold integers within {INT64_RANGE}; found {show_digits(str(item))} at value{at}"
        ),
    )
