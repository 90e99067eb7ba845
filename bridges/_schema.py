"""Check arguments against the very JSON Schemas the bridges publish.

Tool schemas (for LLMs) and server method params are declared once as JSON Schema; this module
enforces the subset they use (``type``, ``anyOf``, ``enum``; strings ``minLength``, ``maxLength``,
``pattern``, ``format: date-time``; numbers ``minimum``, ``maximum``, ``exclusiveMinimum``,
``exclusiveMaximum``; objects ``properties``, ``required``, ``additionalProperties``,
``minProperties``, ``maxProperties``; arrays ``items``, ``minItems``, ``maxItems``), so what a
model is told and what the dispatcher accepts cannot drift apart. A keyword outside this subset
would be a promise nobody keeps: :func:`unsupported` names it, and a test runs it on every
published schema. Failures are one-line :class:`InvalidInputError` messages that name the
argument, written for a model (or a person) to correct the call.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from typing import Any

from memstrata.core.errors import InvalidInputError
from memstrata.core.validation import read_iso_datetime

from ._json import OutOfRange

__all__ = ["check", "describe_type", "pattern", "unsupported"]

_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "object": "an object",
    "array": "an array",
    "null": "null",
}


def describe_type(value: Any) -> str:
    """How a JSON value's type reads in an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | OutOfRange):
        return "an integer"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "an array"
    return f"a {type(value).__name__}"


def _expected(kinds: list[str], value: Any) -> str:
    """The types a value had to have, in words; NaN and the infinities are floats, so a number is
    said to be finite when the value is one of them."""
    number = "a finite number" if isinstance(value, float) and not math.isfinite(value) else "a number"
    return " or ".join(number if k == "number" else _TYPE_NAMES[k] for k in kinds)


def _label(path: str, noun: str) -> str:
    return f"{noun} {path!r}" if path else f"{noun}s"


def _matches_type(kind: str, value: Any) -> Any:
    """The value converted to ``kind`` (an integral float is an integer), or ``_NO``."""
    if kind == "string":
        return value if isinstance(value, str) else _NO
    if kind == "boolean":
        return value if isinstance(value, bool) else _NO
    if kind == "null":
        return value if value is None else _NO
    if kind == "object":
        return value if isinstance(value, Mapping) else _NO
    if kind == "array":
        return list(value) if isinstance(value, list | tuple) else _NO
    if isinstance(value, bool):
        return _NO
    if kind == "integer":
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return _NO
    if kind == "number":
        if isinstance(value, int):
            return value
        if isinstance(value, float) and math.isfinite(value):
            return value
        return _NO
    raise AssertionError(f"schema type {kind!r} is not supported")  # pragma: no cover


_NO = object()


def check(schema: Mapping[str, Any], value: Any, *, path: str = "", noun: str = "argument") -> Any:
    """Validate ``value``; returns it normalised (integral floats as ints, tuples as lists)."""
    if "anyOf" in schema:
        # the options differ by type: the first whose type fits decides (and words the error)
        for option in schema["anyOf"]:
            kind = option.get("type")
            if kind is None or _matches_type(kind, value) is not _NO:
                return check(option, value, path=path, noun=noun)
        expected = _expected([str(o["type"]) for o in schema["anyOf"]], value)
        raise InvalidInputError(f"{_label(path, noun)} must be {expected}, got {describe_type(value)}")
    kinds = schema.get("type")
    if kinds is not None:
        options = [kinds] if isinstance(kinds, str) else list(kinds)
        for kind in options:
            converted = _matches_type(kind, value)
            if converted is not _NO:
                value = converted
                break
        else:
            expected = _expected(options, value)
            raise InvalidInputError(f"{_label(path, noun)} must be {expected}, got {describe_type(value)}")
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(repr(v) for v in schema["enum"])
        raise InvalidInputError(f"{_label(path, noun)} must be one of {allowed}, got {_short(value)}")
    if isinstance(value, str):
        _check_string(schema, value, path, noun)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _check_number(schema, value, path, noun)
    elif isinstance(value, Mapping):
        value = _check_object(schema, value, path, noun)
    elif isinstance(value, list):
        value = _check_array(schema, value, path, noun)
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_HINTS: dict[str, str] = {}


def pattern(regex: str, hint: str) -> str:
    """``regex`` for a schema's ``pattern``, with the words an error uses when a value does not
    match it ("must {hint}"); the published schema carries only the pattern itself."""
    _HINTS[regex] = hint
    return regex


@functools.lru_cache(maxsize=256)
def _compiled(regex: str) -> re.Pattern[str]:
    # ECMA-262's ``$`` (JSON Schema's dialect) matches at the very end only; Python's ``$`` also
    # before a final newline, which would let "id\n" through a pattern anchored at both ends
    if regex.endswith("$") and not regex.endswith("\\$"):
        regex = regex[:-1] + r"\Z"
    return re.compile(regex)


def _is_date_time(value: str) -> bool:
    """What a ``date-time`` param must be: an ISO 8601 date-time with a time zone, read as the
    facade reads one (:func:`~memstrata.core.validation.read_iso_datetime`)."""
    try:
        return read_iso_datetime(value).tzinfo is not None
    except ValueError:
        return False


_FORMATS = {
    "date-time": ("be an ISO 8601 date-time with a time zone (e.g. 2026-05-01T12:00:00Z)", _is_date_time)
}


def _check_string(schema: Mapping[str, Any], value: str, path: str, noun: str) -> None:
    label = _label(path, noun)
    if "minLength" in schema and len(value) < schema["minLength"]:
        if schema["minLength"] == 1:
            raise InvalidInputError(f"{label} must not be empty")
        raise InvalidInputError(f"{label} must be at least {schema['minLength']} characters long")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        raise InvalidInputError(
            f"{label} is too long ({len(value)} characters, at most {schema['maxLength']})"
        )
    if "pattern" in schema and not _compiled(schema["pattern"]).search(value):
        hint = _HINTS.get(schema["pattern"]) or f"match the pattern {schema['pattern']}"
        raise InvalidInputError(f"{label} must {hint}, got {_short(value)}")
    if schema.get("format") in _FORMATS:
        words, valid = _FORMATS[schema["format"]]
        if not valid(value):
            raise InvalidInputError(f"{label} must {words}, got {_short(value)}")


def _shown(value: float) -> str:
    """A number as an error shows it: an integer beyond 64 bits (an integral float such as 1e308,
    taken as an integer) with an exponent, not in hundreds of digits."""
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        try:
            return f"{value:.6g}"
        except OverflowError:  # beyond a double too: only a caller in Python can pass one
            return "an integer beyond the range of a double"
    return str(value)


def _check_number(schema: Mapping[str, Any], value: float, path: str, noun: str) -> None:
    label = _label(path, noun)
    if "minimum" in schema and value < schema["minimum"]:
        raise InvalidInputError(f"{label} must be at least {schema['minimum']}, got {_shown(value)}")
    if "maximum" in schema and value > schema["maximum"]:
        raise InvalidInputError(f"{label} must be at most {schema['maximum']}, got {_shown(value)}")
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        raise InvalidInputError(
            f"{label} must be greater than {schema['exclusiveMinimum']}, got {_shown(value)}"
        )
    if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
        raise InvalidInputError(
            f"{label} must be less than {schema['exclusiveMaximum']}, got {_shown(value)}"
        )


def _check_object(
    schema: Mapping[str, Any], value: Mapping[Any, Any], path: str, noun: str
) -> dict[str, Any]:
    properties: Mapping[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    out: dict[str, Any] = {}
    for key in schema.get("required", ()):
        if key not in value:
            raise InvalidInputError(f"missing required {noun} {_join(path, key)!r}")
    for key, item in value.items():
        if not isinstance(key, str):
            raise InvalidInputError(f"{_label(path, noun)} has a non-string key {_short(key)}")
        if "propertyNames" in schema:
            check(schema["propertyNames"], key, path=f"{path} key" if path else "key", noun=noun)
        sub = _join(path, key)
        if key in properties:
            out[key] = check(properties[key], item, path=sub, noun=noun)
        elif extra is False:
            known = ", ".join(properties) or "none"
            where = f" in {path!r}" if path else ""
            raise InvalidInputError(f"unknown {noun} {key!r}{where} (expected: {known})")
        elif isinstance(extra, Mapping):
            out[key] = check(extra, item, path=sub, noun=noun)
        else:
            out[key] = item
    if "maxProperties" in schema and len(out) > schema["maxProperties"]:
        raise InvalidInputError(f"{_label(path, noun)} has more than {schema['maxProperties']} entries")
    if "minProperties" in schema and len(out) < schema["minProperties"]:
        raise InvalidInputError(f"{_label(path, noun)} has fewer than {schema['minProperties']} entries")
    return out


def _check_array(schema: Mapping[str, Any], value: list[Any], path: str, noun: str) -> list[Any]:
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        raise InvalidInputError(f"{_label(path, noun)} has more than {schema['maxItems']} items")
    if "minItems" in schema and len(value) < schema["minItems"]:
        raise InvalidInputError(f"{_label(path, noun)} has fewer than {schema['minItems']} items")
    items = schema.get("items")
    if items is not None:
        value = [check(items, item, path=f"{path}[{i}]", noun=noun) for i, item in enumerate(value)]
    return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


_ENFORCED = frozenset(
    {
        "type",
        "anyOf",
        "enum",
        "minLength",
        "maxLength",
        "pattern",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "properties",
        "required",
        "additionalProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "items",
        "minItems",
        "maxItems",
    }
)
_WORDS = frozenset({"description", "title"})  # annotations: they constrain nothing


def unsupported(schema: Any, where: str = "schema") -> list[str]:
    """Every keyword of ``schema`` (and of the schemas inside it) that :func:`check` would not
    enforce, as ``where: keyword`` lines: a published schema must promise nothing the dispatcher
    lets through."""
    if not isinstance(schema, Mapping):
        return []
    found = [f"{where}: {key!r}" for key in schema if key not in _ENFORCED | _WORDS and key != "format"]
    if "format" in schema and schema["format"] not in _FORMATS:
        found.append(f"{where}: format {schema['format']!r}")
    for name, sub in schema.get("properties", {}).items():
        found += unsupported(sub, f"{where}.{name}")
    for i, option in enumerate(schema.get("anyOf", ())):
        found += unsupported(option, f"{where}.anyOf[{i}]")
    for key in ("items", "additionalProperties", "propertyNames"):
        found += unsupported(schema.get(key), f"{where}.{key}")
    return found
