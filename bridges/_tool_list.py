"""The agent-facing tools, in the order they are offered: memory, knowledge, episodes, working
memory, blackboard, items. Every one but the ``memory_*`` composites is one registry operation."""

from __future__ import annotations

from memstrata.core.errors import InvalidInputError

from ._tool_defs import TAG_LIMITS, Tool, derived
from ._tool_memory import MEMORY_TOOLS

__all__ = ["TOOLS", "TOOL_NAMES", "WANTED", "find_tool"]

_DERIVED = (
    derived(
        "knowledge_query",
        "query_knowledge",
        "Search knowledge",
        "Search long-term knowledge learned from earlier tasks (outcomes, pitfalls, patterns, ...); "
        "returns {hits, complete, degraded, warnings}, each hit naming its id and store.",
    ),
    derived(
        "knowledge_store",
        "store_knowledge",
        "Store knowledge",
        "Store long-term knowledge under a category (outcome, pitfall, pattern, codebase, preference or "
        "another lowercase name); returns its {id, store}.",
        require=("category",),
    ),
    derived(
        "knowledge_get", "get_knowledge", "Read knowledge", "One knowledge entry by id and store, or null."
    ),
    derived(
        "knowledge_update",
        "update_knowledge",
        "Update knowledge",
        "Change a knowledge entry's content, category, tags or scope (what is left out stays); the id "
        "stays. Returns the entry as it now is, or null when there is no such id.",
        describe={
            "tags": 'The new tags as "key=value" or bare "key" strings, replacing all of them ([] clears '
            f"them; omit to keep them); {TAG_LIMITS}."
        },
    ),
    derived(
        "knowledge_delete",
        "delete_knowledge",
        "Delete knowledge",
        "Delete one knowledge entry by id and store; {deleted} says whether it existed.",
    ),
    derived(
        "knowledge_list", "list_knowledge", "List knowledge", "Knowledge entries of one store, newest first."
    ),
    derived(
        "episode_remember",
        "remember",
        "Record an episode",
        "Record what happened (an episode) in the agent's episodic memory; returns its {id}.",
    ),
    derived(
        "episode_recall",
        "recall",
        "Recall episodes",
        "Search the agent's episodes, optionally within a task run or a time range; returns "
        "{hits, complete, degraded, warnings}.",
    ),
    derived(
        "episode_list", "list_episodes", "List episodes", "The agent's episodes in time order (a timeline)."
    ),
    derived(
        "working_set",
        "set_working",
        "Set working memory",
        "Set a short-lived working-memory key (of a task, or agent-wide), optionally expiring.",
    ),
    derived(
        "working_get", "get_working", "Read working memory", "Read a working-memory key: {key, found, value}."
    ),
    derived(
        "working_clear",
        "clear_working",
        "Clear working memory",
        "Remove one working-memory key, or all of them; {removed} counts them.",
    ),
    derived(
        "blackboard_publish",
        "publish",
        "Publish a signal",
        "Publish a signal on a session's shared blackboard (as this agent); returns its {key, version}.",
        bind_agent=("publisher",),
    ),
    derived(
        "blackboard_get",
        "get_signal",
        "Read a signal",
        "Read a blackboard signal: {key, value, found, publisher, version, updated_at}.",
    ),
    derived("blackboard_list", "list_signals", "List signals", "The sorted keys of a session's blackboard."),
    derived(
        "item_put",
        "put_item",
        "Store an item",
        "Store a JSON object at a namespace (a path of labels) and key, replacing what was there; "
        "its index fields are embedded so item_search finds it by meaning.",
        json_text=("value",),
        describe={"value": 'The item as JSON object text, e.g. {"status": "open", "n": 2}.'},
    ),
    derived("item_get", "get_item", "Read an item", "The item at a namespace and key, or null."),
    derived(
        "item_search",
        "search_items",
        "Search items",
        "Items under a namespace prefix, ranked by meaning when a query is given (else newest "
        "first), narrowed by a filter on their fields.",
        json_text=("filter",),
        describe={
            "filter": 'Field conditions as JSON object text, e.g. {"status": "open", "n": {"$gte": 2}} '
            "($eq, $ne, $gt, $gte, $lt, $lte; dotted names reach nested fields)."
        },
    ),
    derived(
        "item_delete", "delete_item", "Delete an item", "Delete the item at a namespace and key; {deleted}."
    ),
    derived(
        "item_namespaces",
        "list_namespaces",
        "List item namespaces",
        'The namespaces holding items, sorted ("*" in prefix or suffix matches any label).',
    ),
)

WANTED: tuple[str, ...] = (
    *(t.name for t in MEMORY_TOOLS),
    "knowledge_query",
    "knowledge_store",
    "knowledge_get",
    "knowledge_update",
    "knowledge_delete",
    "knowledge_list",
    "episode_remember",
    "episode_recall",
    "episode_list",
    "working_set",
    "working_get",
    "working_clear",
    "blackboard_publish",
    "blackboard_get",
    "blackboard_list",
    "item_put",
    "item_get",
    "item_search",
    "item_delete",
    "item_namespaces",
)
"""Every tool this module declares; one whose operation the registry lacks is left out of TOOLS."""

TOOLS: tuple[Tool, ...] = (*MEMORY_TOOLS, *(t for t in _DERIVED if t is not None))
TOOL_NAMES: tuple[str, ...] = tuple(t.name for t in TOOLS)
_BY_NAME = {t.name: t for t in TOOLS}


def find_tool(name: str) -> Tool:
    """The tool called ``name``; a clear error listing the tools otherwise."""
    tool = _BY_NAME.get(name)
    if tool is None:
        raise InvalidInputError(f"unknown tool {name[:64]!r} (available: {', '.join(TOOL_NAMES)})")
    return tool
