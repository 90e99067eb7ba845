"""Operations on long-term knowledge: store, query, get, list, delete; every entry names its store."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memstrata.core.constants import MAX_LIST_LIMIT
from memstrata.core.errors import InvalidInputError

from . import _convert
from ._operation import (
    AGENT_ID,
    CATEGORY,
    ENTRY_ID,
    OBJECT,
    QUERY,
    SCOPE,
    SCORE,
    SEARCH_RESULT,
    STORE,
    TAGS_SCHEMA,
    TEXT,
    TOP_K,
    Context,
    Effect,
    OperationList,
    Param,
    agent_lane,
    offset,
    pick,
    returns,
    search_result,
    text_schema,
)

_OPS = OperationList()

SHARED_STORE = "shared"


def _in_shared(ctx: Context, params: Mapping[str, Any]) -> bool:
    """``store`` names the agent's own store (default) or the shared one; nothing else."""
    store = params.get("store")
    if store is None or store == params["agent_id"]:
        return False
    if store == SHARED_STORE:
        return True
    raise InvalidInputError(
        f"store must be the agent's id {params['agent_id']!r} or 'shared', got {str(store)[:64]!r}"
    )


def _store_name(params: Mapping[str, Any], shared: bool) -> str:
    return SHARED_STORE if shared else params["agent_id"]


def _named_entry(entry: Any, params: Mapping[str, Any], shared: bool) -> dict[str, Any] | None:
    """A knowledge entry in its bridge form, naming its store; no entry stays ``None``."""
    if entry is None:
        return None
    return {**_convert.knowledge_entry(entry), "store": _store_name(params, shared)}


@_OPS.add(
    "store_knowledge",
    "knowledge",
    "Store long-term knowledge; returns its {id, store}. Same content, category and scope -> same id.",
    (
        AGENT_ID,
        Param("content", text_schema(TEXT), True),
        Param("category", CATEGORY),
        Param("tags", TAGS_SCHEMA),
        Param("scope", SCOPE),
        Param("shared", {"type": "boolean", "description": "Store it in the shared store."}),
    ),
    returns(id="integer", store="string"),
    Effect.SETS,
    lane=agent_lane,
)
def _store_knowledge(ctx: Context, p: dict[str, Any]) -> Any:
    shared = bool(p.get("shared"))
    ident = ctx.agent(p).store_knowledge(p["content"], shared=shared, **pick(p, "category", "tags", "scope"))
    return {"id": ident, "store": _store_name(p, shared)}


@_OPS.add(
    "query_knowledge",
    "knowledge",
    "Hybrid search of long-term knowledge; hits best first, each naming its store.",
    (
        AGENT_ID,
        QUERY,
        Param("category", CATEGORY),
        Param("top_k", TOP_K),
        Param("tags", TAGS_SCHEMA),
        Param("scope", SCOPE),
        Param(
            "mode",
            {"type": "string", "enum": ["hybrid", "vector", "keyword"], "description": "How to rank."},
        ),
        Param("min_score", SCORE),
        Param("include_shared", {"type": "boolean", "description": "Also search the shared store."}),
    ),
    SEARCH_RESULT,
    Effect.READS,
    lane=agent_lane,
)
def _query_knowledge(ctx: Context, p: dict[str, Any]) -> Any:
    options = pick(p, "category", "top_k", "tags", "scope", "mode", "min_score", "include_shared")
    found = ctx.agent(p).query_knowledge(p["query"], **options)
    return search_result(found, [_convert.knowledge_hit(h) for h in found])


@_OPS.add(
    "get_knowledge",
    "knowledge",
    "One knowledge entry by id and store, or null.",
    (AGENT_ID, Param("entry_id", ENTRY_ID, True), Param("store", STORE)),
    {"type": ["object", "null"]},
    Effect.READS,
    lane=agent_lane,
)
def _get_knowledge(ctx: Context, p: dict[str, Any]) -> Any:
    shared = _in_shared(ctx, p)
    entry = ctx.agent(p).get_knowledge(p["entry_id"], shared=shared)
    return _named_entry(entry, p, shared)


@_OPS.add(
    "list_knowledge",
    "knowledge",
    "Knowledge entries of one store, newest first.",
    (
        AGENT_ID,
        Param("store", STORE),
        Param("category", CATEGORY),
        Param("tags", TAGS_SCHEMA),
        Param("scope", {**SCOPE, "description": "That scope and its descendants."}),
        Param(
            "limit",
            {"type": "integer", "minimum": 0, "maximum": MAX_LIST_LIMIT, "description": "At most."},
        ),
        Param("offset", offset("Entries to skip.")),
    ),
    {"type": "array", "items": OBJECT},
    Effect.READS,
    lane=agent_lane,
)
def _list_knowledge(ctx: Context, p: dict[str, Any]) -> Any:
    shared = _in_shared(ctx, p)
    entries = ctx.agent(p).list_knowledge(
        shared=shared, **pick(p, "category", "tags", "scope", "limit", "offset")
    )
    return [_named_entry(e, p, shared) for e in entries]


@_OPS.add(
    "update_knowledge",
    "knowledge",
    "Change fields of one knowledge entry by id and store, keeping its id; the entry as it now is, "
    "or null when there is no such id. New content is embedded again; a change that would duplicate "
    "another entry (same content, category and scope) is refused and changes nothing.",
    (
        AGENT_ID,
        Param("entry_id", ENTRY_ID, True),
        Param("store", STORE),
        Param("content", text_schema("The new text (omit to keep it).")),
        Param("category", {**CATEGORY, "description": "The new category (omit to keep it)."}),
        Param(
            "tags",
            {
                **TAGS_SCHEMA,
                "description": 'The new tags as {"key": "value"}, replacing all of '
                "them ({} clears them; omit to keep them).",
            },
        ),
        Param("scope", {**SCOPE, "description": "The new path-like scope (omit to keep it)."}),
    ),
    {"type": ["object", "null"]},
    Effect.OVERWRITES,
    lane=agent_lane,
)
def _update_knowledge(ctx: Context, p: dict[str, Any]) -> Any:
    shared = _in_shared(ctx, p)
    entry = ctx.agent(p).update_knowledge(
        p["entry_id"], shared=shared, **pick(p, "content", "category", "tags", "scope")
    )
    return _named_entry(entry, p, shared)


@_OPS.add(
    "delete_knowledge",
    "knowledge",
    "Delete one knowledge entry by id and store; {deleted} says whether it existed.",
    (AGENT_ID, Param("entry_id", ENTRY_ID, True), Param("store", STORE)),
    returns(deleted="boolean"),
    Effect.OVERWRITES,
    lane=agent_lane,
)
def _delete_knowledge(ctx: Context, p: dict[str, Any]) -> Any:
    deleted = ctx.agent(p).delete_knowledge(p["entry_id"], shared=_in_shared(ctx, p))
    return {"deleted": bool(deleted)}


OPERATIONS = tuple(_OPS.items)
