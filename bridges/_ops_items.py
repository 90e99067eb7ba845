"""Operations on the system's item store: JSON objects addressed by (namespace path, key).

The store the orchestrator adapters keep their items in (``{data_dir}/items.sqlite``), so a
client of any door reads and writes the same items an in-process LangGraph or AutoGen agent does.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from memstrata.core.constants import MAX_KEY_CHARS, MAX_LABEL_CHARS, MAX_NAMESPACE_DEPTH

from ._operation import (
    NOT_BLANK,
    Context,
    Effect,
    OperationList,
    Param,
    offset,
    pattern,
    pick,
    returns,
    string,
)

_OPS = OperationList()

_LABEL_RULE = pattern("^[^\\x00\\x1f]+$", "not contain \\x00 or \\x1f")
_LABELS = {"type": "string", "minLength": 1, "maxLength": MAX_LABEL_CHARS, "pattern": _LABEL_RULE}


def _path(description: str, *, min_items: int = 0) -> dict[str, Any]:
    schema = {"type": "array", "items": _LABELS, "maxItems": MAX_NAMESPACE_DEPTH, "description": description}
    return {**schema, "minItems": min_items} if min_items else schema


NAMESPACE = Param(
    "namespace", _path('The item\'s namespace: a path of labels, e.g. ["users", "u1"].', min_items=1), True
)
KEY = Param(
    "key",
    string("The item's key within its namespace.", max_length=MAX_KEY_CHARS, minLength=1, pattern=NOT_BLANK),
    True,
)
LIMIT = {"type": "integer", "minimum": 0, "maximum": 1000, "description": "How many at most."}
OFFSET = offset("How many to skip first (paging).")
_TIME = {"type": ["string", "null"], "description": "ISO 8601 (UTC)."}
ITEM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "namespace": {"type": "array", "items": {"type": "string"}},
        "key": {"type": "string"},
        "value": {"type": "object"},
        "created_at": _TIME,
        "updated_at": _TIME,
        "expires_at": _TIME,
        "score": {"type": ["number", "null"]},
    },
}


def items_lane(params: Mapping[str, Any]) -> str | None:
    """Requests on the item store run in order (a put is seen by the get that follows it)."""
    return "items"


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC).isoformat().replace("+00:00", "Z")


def _item(item: Any) -> dict[str, Any]:
    return {
        "namespace": list(item.namespace),
        "key": item.key,
        "value": item.value,
        "created_at": _iso(item.created_at),
        "updated_at": _iso(item.updated_at),
        "expires_at": _iso(item.expires_at),
        "score": item.score,
    }


@_OPS.add(
    "put_item",
    "items",
    "Store a JSON object at a namespace and key (replacing what was there); the index fields are "
    "embedded so search_items finds it by meaning.",
    (
        NAMESPACE,
        KEY,
        Param("value", {"type": "object", "description": "The item's value: a JSON object."}, True),
        Param(
            "index",
            _path('Fields of the value embedded for search by meaning (dotted paths; "$": all of it).'),
        ),
        Param(
            "ttl_minutes",
            {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": 100_000_000,
                "description": "Delete the item after this many minutes.",
            },
        ),
    ),
    returns(namespace="array", key="string"),
    Effect.SETS,
    lane=items_lane,
)
def _put_item(ctx: Context, p: dict[str, Any]) -> Any:
    ctx.system.items.put(p["namespace"], p["key"], p["value"], **pick(p, "index", "ttl_minutes"))
    return {"namespace": list(p["namespace"]), "key": p["key"]}


@_OPS.add(
    "get_item",
    "items",
    "Read the item at a namespace and key; null when there is none (or it expired).",
    (NAMESPACE, KEY),
    {**ITEM, "type": ["object", "null"]},
    Effect.READS,
    lane=items_lane,
)
def _get_item(ctx: Context, p: dict[str, Any]) -> Any:
    found = ctx.system.items.get(p["namespace"], p["key"])
    return None if found is None else _item(found)


@_OPS.add(
    "search_items",
    "items",
    "Items under a namespace prefix, ranked by meaning when a query is given (else newest first); "
    'filter compares value fields, e.g. {"status": "open", "n": {"$gte": 2}}.',
    (
        Param("prefix", _path("Only items in this namespace or below it (empty: every item).")),
        Param("query", string("Rank the items by how well their index fields match this.", max_length=10000)),
        Param(
            "filter",
            {
                "type": "object",
                "description": "Value fields and what they must equal (or {op: value} with $eq, $ne, "
                "$gt, $gte, $lt, $lte); dotted names reach nested fields.",
            },
        ),
        Param("limit", LIMIT),
        Param("offset", OFFSET),
    ),
    {"type": "array", "items": ITEM},
    Effect.READS,
    lane=items_lane,
)
def _search_items(ctx: Context, p: dict[str, Any]) -> Any:
    found = ctx.system.items.search(p.get("prefix") or (), **pick(p, "query", "filter", "limit", "offset"))
    return [_item(item) for item in found]


@_OPS.add(
    "delete_item",
    "items",
    "Delete the item at a namespace and key for good.",
    (NAMESPACE, KEY),
    {
        "type": "object",
        "properties": {
            "namespace": {"type": "array"},
            "key": {"type": "string"},
            "deleted": {"type": "boolean"},
        },
    },
    Effect.OVERWRITES,
    lane=items_lane,
)
def _delete_item(ctx: Context, p: dict[str, Any]) -> Any:
    deleted = ctx.system.items.delete(p["namespace"], p["key"])
    return {"namespace": list(p["namespace"]), "key": p["key"], "deleted": deleted}


@_OPS.add(
    "list_namespaces",
    "items",
    'The namespaces that hold items, sorted; "*" in prefix or suffix matches any label.',
    (
        Param("prefix", _path("Only namespaces starting with these labels.")),
        Param("suffix", _path("Only namespaces ending with these labels.")),
        Param(
            "max_depth",
            {
                "type": "integer",
                "minimum": 1,
                "maximum": 1000,
                "description": "Cut namespaces to this many labels.",
            },
        ),
        Param("limit", LIMIT),
        Param("offset", OFFSET),
    ),
    {"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
    Effect.READS,
    lane=items_lane,
)
def _list_namespaces(ctx: Context, p: dict[str, Any]) -> Any:
    found = ctx.system.items.list_namespaces(**pick(p, "prefix", "suffix", "max_depth", "limit", "offset"))
    return [list(ns) for ns in found]


OPERATIONS = tuple(_OPS.items)
