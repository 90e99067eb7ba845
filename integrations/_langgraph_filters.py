"""LangGraph's store filters in the item store's terms: the results LangGraph's own stores give
(``SqliteStore``, ``InMemoryStore``) for infinite and NaN operands, integers beyond 64 bits,
ranges on ``None`` and nested objects, from the operators memstrata's item filter reads."""

from __future__ import annotations

import math
import sys
from typing import Any

from memstrata.errors import InvalidInputError

__all__ = ["item_filter"]

_MAX = sys.float_info.max
_NEVER = {"$gt": _MAX, "$lt": -_MAX}  # no finite number passes both


def _bound(op: str, value: float) -> dict[str, float] | None:
    """A comparison with infinity or NaN as the same test on finite numbers (JSON has no
    infinity, so a stored number is always finite); ``None``: every item passes. NaN equals
    nothing and orders with nothing, so ``$ne`` NaN passes every item (what ``$eq`` does not)."""
    if math.isnan(value):
        return None if op == "$ne" else dict(_NEVER)
    big = _MAX if value > 0 else -_MAX
    if op in ("$lt", "$lte"):
        return {"$lte": big} if value > 0 else dict(_NEVER)
    if op in ("$gt", "$gte"):
        return {"$gte": big} if value < 0 else dict(_NEVER)
    if op == "$eq":
        return dict(_NEVER)
    return None  # "$ne": every item differs from infinity


def _merge(kept: dict[str, Any], name: str, value: Any) -> None:
    """Adds one test to a field's operators: of two bounds on one side the stricter stays."""
    if name not in kept:
        kept[name] = value
    elif name == "$ne":
        if kept[name] != value:  # one "$ne" per field in a filter
            raise InvalidInputError(
                f"a filter cannot hold both $ne {kept[name]!r} and a range on null (which is $ne None)"
            )
    else:
        kept[name] = (min if name.startswith("$l") else max)(kept[name], value)


def item_filter(filter: dict[str, Any] | None) -> dict[str, Any] | None:
    """A LangGraph ``filter`` as memstrata's item filter reads it, with the results of LangGraph's
    ``SqliteStore``: infinite and NaN operands rewritten (see :func:`_bound`), integers beyond 64
    bits as reals, and a range on ``None`` as SQLite evaluates it there (``None`` becomes a blob,
    which sorts above every JSON value: ``$gt``/``$gte`` pass nothing, ``$lt``/``$lte`` every
    value that is not null). Equality with ``None`` passes a null or missing field in both, as
    in ``SqliteStore`` and ``InMemoryStore``."""
    if not filter:
        return filter
    out: dict[str, Any] = {}
    for path, cond in _contained(filter).items():
        ops = cond if isinstance(cond, dict) and all(str(k).startswith("$") for k in cond) else None
        if ops is None:
            ops = {"$eq": cond}
        kept: dict[str, Any] = {}
        for op, value in ops.items():
            if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
                try:  # beyond JSON's integers: compared as a real, as SQLite does
                    value = float(value)
                except OverflowError:
                    value = math.inf if value > 0 else -math.inf
            if value is None and op in ("$gt", "$gte", "$lt", "$lte"):
                bound: dict[str, Any] | None = dict(_NEVER) if op in ("$gt", "$gte") else {"$ne": None}
            elif not isinstance(value, float) or math.isfinite(value):
                bound = {op: value}
            else:
                bound = _bound(op, value)
            for name, limit in (bound or {}).items():
                _merge(kept, name, limit)
        if kept:
            out[path] = kept if (ops is not cond or len(kept) != 1 or "$eq" not in kept) else kept["$eq"]
    return out


def _contained(filter: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """An object in a filter as LangGraph's ``InMemoryStore`` reads it: ``{"meta": {"user":
    "ada"}}`` passes an item whose ``meta`` holds ``user`` ``"ada"``, whatever else it holds;
    each of its keys becomes a dotted path. An object mixing operators and keys is refused, as
    LangGraph's SQL stores refuse it."""
    out: dict[str, Any] = {}
    for key, cond in filter.items():
        path = f"{prefix}{key}"
        if prefix and "." in str(key):
            raise InvalidInputError(f"filter key {key!r} inside {prefix[:-1]!r} holds a '.'")
        operators = [k for k in cond if str(k).startswith("$")] if isinstance(cond, dict) else []
        if not isinstance(cond, dict) or not cond or len(operators) == len(cond):
            out[path] = cond
        elif operators:
            raise InvalidInputError(f"filter {path!r} mixes operators and keys: {sorted(map(str, cond))}")
        else:
            out.update(_contained(cond, f"{path}."))
    return out
