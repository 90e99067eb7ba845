"""Filters on an item's JSON value, as SQL that SQLite evaluates before any ranking.

Equality and range operators (``$eq``, ``$ne``, ``$gt``, ...) on keys and nested keys. A
comparison meets only values of the filter value's JSON type: ``{"$gt": 2}`` passes numbers
(never a string, boolean, list or object, which SQLite would otherwise order above or beside
them), ``{"$lt": "m"}`` strings; ``$ne`` passes everything ``$eq`` does not (other types and a
missing field included). Lists and objects compare as canonical JSON, by ``$eq``/``$ne`` only;
booleans by ``$eq``/``$ne`` only. ``None`` (JSON null) stands for "null or missing":
``{"f": None}`` passes an item whose ``f`` is null or absent, ``{"f": {"$ne": None}}`` one that
holds any other value; range operators refuse ``None``. Exact: the filter narrows the
candidates, so an item is never lost behind a global top-k.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from memstrata.core.errors import InvalidInputError

__all__ = ["CANONICAL_JSON", "canonical_json", "filter_sql"]

CANONICAL_JSON = "memstrata_canonical_json"  # the SQL function the item store registers

_FILTER_KEY = re.compile(r"[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*")
_OPS = {"$eq": "=", "$ne": "!=", "$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}


def _json_path(field: str) -> str:
    """A filter key (``"a.b"`` or ``"a-b"``) as a quoted SQLite JSON path."""
    if not isinstance(field, str) or not _FILTER_KEY.fullmatch(field):
        raise InvalidInputError(
            f"Invalid filter key {field!r}: use letters, digits, '_', '-' and '.' between nested keys"
        )
    parts = field.split(".")
    return "$" + "".join('."' + p.replace('"', '""') + '"' for p in parts)


_NUMBER = "coalesce(json_type(i.value, ?), '') IN ('integer', 'real')"
_TEXT = "coalesce(json_type(i.value, ?), '') = 'text'"
_LIST = "coalesce(json_type(i.value, ?), '') = 'array'"
_OBJECT = "coalesce(json_type(i.value, ?), '') = 'object'"


def _compare(path: str, op: str, value: Any, params: list[Any]) -> str:
    """One comparison of the value at ``path``, of the filter value's own JSON type only (a
    number never meets a string, a boolean, a list or an object, whatever SQLite's order of
    types would say); lists and objects compare as canonical JSON; ``None`` (JSON null) matches
    a null or a missing field alike."""
    if op not in _OPS:
        raise InvalidInputError(f"unknown filter operator {op!r}: use one of {', '.join(_OPS)}")
    sql_op = _OPS[op]
    if value is None:
        if op not in ("$eq", "$ne"):
            raise InvalidInputError(f"operator {op!r} does not apply to a null filter value")
        params.append(path)
        return f"json_extract(i.value, ?) IS {'' if op == '$eq' else 'NOT '}NULL"
    if isinstance(value, bool):
        params.append(path)
        kind = "true" if value else "false"
        if op == "$eq":
            return f"json_type(i.value, ?) = '{kind}'"
        if op == "$ne":
            return f"coalesce(json_type(i.value, ?), '') != '{kind}'"
        raise InvalidInputError(f"operator {op!r} does not apply to a boolean filter value")
    if isinstance(value, dict | list):
        if op not in ("$eq", "$ne"):
            raise InvalidInputError(f"operator {op!r} does not apply to a list or object filter value")
        kind, operand = (_LIST if isinstance(value, list) else _OBJECT), "?"
        value = canonical_json(orjson.dumps(value).decode())
        params.extend([path, path, value])
        test = f"{kind} AND {CANONICAL_JSON}(json_extract(i.value, ?)) = ?"
        return f"NOT ({test})" if op == "$ne" else f"({test})"
    elif isinstance(value, str):
        kind, operand = _TEXT, "?"
    elif isinstance(value, int | float):
        kind, operand = _NUMBER, "?"
        if isinstance(value, int) and not -(2**63) <= value < 2**63:
            value = float(value)  # beyond SQLite's integers: compared as a real
    else:
        raise InvalidInputError(f"filter value {value!r} is not JSON")
    params.extend([path, path, value])
    test = f"{kind} AND json_extract(i.value, ?) {'=' if op == '$ne' else sql_op} {operand}"
    # a field of another type (or none) differs from the value; a range never passes it
    return f"NOT ({test})" if op == "$ne" else f"({test})"


def filter_sql(filter: Mapping[str, Any] | None, params: list[Any]) -> list[str]:
    clauses: list[str] = []
    for field, cond in (filter or {}).items():
        path = _json_path(field)
        if isinstance(cond, dict) and cond and all(isinstance(k, str) and k.startswith("$") for k in cond):
            for op, value in cond.items():
                clauses.append(_compare(path, op, value, params))
        else:
            clauses.append(_compare(path, "$eq", cond, params))
    return clauses


def canonical_json(text: str | None) -> str | None:
    """A JSON list or object in one form whatever its key order: keys sorted, and a float that
    is a whole number written as the integer (``2.0`` and ``2`` are one JSON number)."""
    if text is None:
        return None
    return orjson.dumps(_canonical(orjson.loads(text)), option=orjson.OPT_SORT_KEYS).decode()


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer() and -(2**63) <= value < 2**63:
        return int(value)
    return value
