"""Filters on an item's JSON value, as SQL that SQLite evaluates before any ranking.

Equality and range operators (``$eq``, ``$ne``, ``$gt``, ...) on keys and nested keys; lists and
objects compare as canonical JSON. Exact: the filter narrows the candidates, so an item is never
lost behind a global top-k.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from memstrata.core.errors import InvalidInputError

__all__ = ["filter_sql"]

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


def _compare(path: str, op: str, value: Any, params: list[Any]) -> str:
    """One comparison of the value at ``path``; lists and objects compare as canonical JSON."""
    if op not in _OPS:
        raise InvalidInputError(f"unknown filter operator {op!r}: use one of {', '.join(_OPS)}")
    sql_op = _OPS[op]
    if isinstance(value, dict | list):
        if op not in ("$eq", "$ne"):
            raise InvalidInputError(f"operator {op!r} does not apply to a list or object filter value")
        params.extend([path, orjson.dumps(value).decode()])
        return f"json_extract(i.value, ?) {'IS' if op == '$eq' else 'IS NOT'} json(?)"
    if value is None:
        params.append(path)
        return f"json_type(i.value, ?) {'=' if op == '$eq' else '!='} 'null'"
    if isinstance(value, bool):
        params.append(path)
        kind = "true" if value else "false"
        if op == "$eq":
            return f"json_type(i.value, ?) = '{kind}'"
        if op == "$ne":
            return f"coalesce(json_type(i.value, ?), '') != '{kind}'"
        raise InvalidInputError(f"operator {op!r} does not apply to a boolean filter value")
    if not isinstance(value, str | int | float):
        raise InvalidInputError(f"filter value {value!r} is not JSON")
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        value = float(value)  # beyond SQLite's integers: compared as a real
    params.extend([path, value])
    if op == "$ne":
        return "json_extract(i.value, ?) IS NOT ?"
    return f"json_extract(i.value, ?) {sql_op} ?"


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
