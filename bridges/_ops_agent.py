"""Operations on an agent's episodes, task lifecycle and working memory."""

from __future__ import annotations

from typing import Any

from memstrata.core.constants import MAX_LIST_LIMIT

from . import _convert
from ._operation import (
    AGENT_ID,
    CATEGORY,
    OBJECT,
    QUERY,
    QUEUED,
    SCOPE,
    SEARCH_RESULT,
    STORE,
    TAGS_SCHEMA,
    TEXT,
    TIME,
    TITLE,
    TOP_K,
    Context,
    Effect,
    OperationList,
    Param,
    agent_lane,
    key_schema,
    offset,
    path_string,
    pick,
    returns,
    row_id,
    search_result,
    task_id_schema,
    text_schema,
    times,
)

_OPS = OperationList()
_KEY = Param("key", key_schema("The key."), True)
_MISSING = object()
_TASK_ID = Param("task_id", task_id_schema("The task's id."), True)
_TASK_SPACE = Param(
    "task_id",
    task_id_schema(
        "The task whose working-memory space this is (omit: the agent-wide space). Ending the task "
        "clears its space only.",
        optional=True,
    ),
)
_ONE_RUN = Param("task_run_id", task_id_schema("Only this task run."))
_SINCE = Param("since", {**TIME, "description": "Only episodes at or after this time."})
_UNTIL = Param("until", {**TIME, "description": "Only episodes before this time."})
_EPISODE_ID = Param(
    "episode_id",
    row_id("The episode's id in the agent's episodic memory."),
    True,
)


@_OPS.add(
    "remember",
    "episodes",
    "Record an episode in the agent's episodic memory; returns its {id}.",
    (
        AGENT_ID,
        Param("content", text_schema(TEXT), True),
        Param("title", TITLE),
        Param("task_run_id", task_id_schema("The task run it belongs to.")),
        Param("tags", TAGS_SCHEMA),
        Param("kind", {**CATEGORY, "description": "What kind of episode (note, turn, outcome, ...)."}),
        Param("at", {**TIME, "description": "When it happened (default: now)."}),
    ),
    returns(id="any"),
    Effect.ADDS,
    lane=agent_lane,
)
def _remember(ctx: Context, p: dict[str, Any]) -> Any:
    options = {**pick(p, "title", "task_run_id", "tags", "kind"), **times(p, "at")}
    return {"id": ctx.agent(p).remember(p["content"], **options)}


@_OPS.add(
    "recall",
    "episodes",
    "Search the agent's episodes (hybrid), optionally within a task run or time range.",
    (
        AGENT_ID,
        QUERY,
        Param("top_k", TOP_K),
        _ONE_RUN,
        _SINCE,
        _UNTIL,
    ),
    SEARCH_RESULT,
    Effect.READS,
    lane=agent_lane,
)
def _recall(ctx: Context, p: dict[str, Any]) -> Any:
    options = {**pick(p, "top_k", "task_run_id"), **times(p, "since", "until")}
    found = ctx.agent(p).recall(p["query"], **options)
    return search_result(found, [_convert.episode_hit(h) for h in found])


_PATH = path_string("A file path on the machine that runs memstrata.")


@_OPS.add(
    "list_episodes",
    "episodes",
    "The timeline of the agent's live episodes, newest first (or oldest first), in pages.",
    (
        AGENT_ID,
        _ONE_RUN,
        _SINCE,
        _UNTIL,
        Param(
            "limit",
            {"type": "integer", "minimum": 0, "maximum": MAX_LIST_LIMIT, "description": "At most this many."},
        ),
        Param("offset", offset("Episodes to skip first.")),
        Param(
            "newest_first",
            {"type": "boolean", "description": "Newest first (default) or, if false, oldest first."},
        ),
    ),
    {"type": "array", "items": OBJECT},
    Effect.READS,
    lane=agent_lane,
)
def _list_episodes(ctx: Context, p: dict[str, Any]) -> Any:
    options = {**pick(p, "task_run_id", "limit", "offset", "newest_first"), **times(p, "since", "until")}
    return [_convert.episode(e) for e in ctx.agent(p).list_episodes(**options)]


@_OPS.add(
    "get_episode",
    "episodes",
    "One live episode by id, or null.",
    (AGENT_ID, _EPISODE_ID),
    {"type": ["object", "null"]},
    Effect.READS,
    lane=agent_lane,
)
def _get_episode(ctx: Context, p: dict[str, Any]) -> Any:
    episode = ctx.agent(p).get_episode(p["episode_id"])
    return None if episode is None else _convert.episode(episode)


@_OPS.add(
    "delete_episode",
    "episodes",
    "Delete one live episode for good (no search or later archive returns it); {deleted} says "
    "whether it existed.",
    (AGENT_ID, _EPISODE_ID),
    returns(deleted="boolean"),
    Effect.OVERWRITES,
    lane=agent_lane,
)
def _delete_episode(ctx: Context, p: dict[str, Any]) -> Any:
    return {"deleted": ctx.agent(p).delete_episode(p["episode_id"])}


@_OPS.add(
    "archive_episodes",
    "episodes",
    "Move the agent's episodes older than a time (and/or of one task run) into one portable "
    "archive file; {path, archived}. They leave the timeline and recall until restore_episodes "
    "brings them back.",
    (
        AGENT_ID,
        Param("before", {**TIME, "description": "Archive episodes before this time (omit: no time limit)."}),
        _ONE_RUN,
        Param(
            "path", {**_PATH, "description": "The archive file to write (default: one under the data dir)."}
        ),
    ),
    returns(path="string", archived="integer"),
    Effect.ADDS,
    lane=agent_lane,
)
def _archive_episodes(ctx: Context, p: dict[str, Any]) -> Any:
    done = ctx.agent(p).archive_episodes(p.get("path"), **pick(p, "task_run_id"), **times(p, "before"))
    return {"path": done.path, "archived": done.archived}


@_OPS.add(
    "restore_episodes",
    "episodes",
    "Bring the episodes of an archive file back into the agent's memory; {restored} counts the "
    "new ones (restoring twice adds nothing).",
    (AGENT_ID, Param("path", {**_PATH, "description": "The archive file to restore."}, True)),
    returns(restored="integer"),
    Effect.SETS,
    lane=agent_lane,
)
def _restore_episodes(ctx: Context, p: dict[str, Any]) -> Any:
    return {"restored": ctx.agent(p).restore_episodes(p["path"])}


@_OPS.add(
    "promote_episode",
    "episodes",
    "Copy a live episode into long-term knowledge (tagged with its episode_id and task_run_id); "
    "returns the entry with its store. Promoting twice returns the same entry.",
    (
        AGENT_ID,
        _EPISODE_ID,
        Param("category", {**CATEGORY, "description": "The entry's category (default: outcome)."}),
        Param("scope", SCOPE),
        Param("store", STORE),
    ),
    OBJECT,
    Effect.SETS,
    lane=agent_lane,
)
def _promote_episode(ctx: Context, p: dict[str, Any]) -> Any:
    entry = ctx.agent(p).promote_episode(p["episode_id"], **pick(p, "category", "scope", "store"))
    return _convert.knowledge_entry(entry)


@_OPS.add(
    "begin_task",
    "tasks",
    "Pre-task retrieval: the prompt {text, fallback, reason, hits} within the retrieval budget.",
    (AGENT_ID, _TASK_ID, Param("description", text_schema("What the task is."), True)),
    returns(text="string", fallback="boolean"),
    Effect.READS,
    lane=agent_lane,
)
def _begin_task(ctx: Context, p: dict[str, Any]) -> Any:
    return _convert.task_prompt(ctx.agent(p).begin_task(p["task_id"], p["description"]))


def _write_back(name: str, summary: str, text: Param) -> None:
    """Register the task write-back ``name``: ``Agent.<name>(task_id, <text>)``, queued in the
    outbox (durable once answered)."""

    def run(ctx: Context, p: dict[str, Any]) -> Any:
        queued = getattr(ctx.agent(p), name)(p["task_id"], p[text.name])
        return {"task_id": p["task_id"], "queued": True, "outbox_id": getattr(queued, "outbox_id", None)}

    params = (AGENT_ID, _TASK_ID, text)
    _OPS.add(name, "tasks", summary, params, QUEUED, Effect.ADDS, lane=agent_lane)(run)


_write_back(
    "complete_task",
    "Write back a success: durable once answered, stored as knowledge and an episode.",
    Param("summary", text_schema("What was done and learned."), True),
)
_write_back(
    "fail_task",
    "Write back a failure: durable once answered, stored as a pitfall.",
    Param("reason", text_schema("Why it failed."), True),
)


@_OPS.add(
    "set_working",
    "working",
    "Set a working-memory key to any JSON value, in a task's space or the agent-wide one, "
    "optionally expiring.",
    (
        AGENT_ID,
        _KEY,
        Param("value", {"description": "Any JSON value."}, True),
        Param("ttl_s", {"type": "number", "exclusiveMinimum": 0, "description": "Expire after seconds."}),
        _TASK_SPACE,
    ),
    returns(key="string", stored="boolean"),
    Effect.SETS,
    lane=agent_lane,
)
def _set_working(ctx: Context, p: dict[str, Any]) -> Any:
    ctx.agent(p).set_working(p["key"], p["value"], **pick(p, "ttl_s", "task_id"))
    return {"key": p["key"], "stored": True}


@_OPS.add(
    "get_working",
    "working",
    "Read a working-memory key: {key, found, value}.",
    (AGENT_ID, _KEY, _TASK_SPACE),
    returns(found="boolean", value="any"),
    Effect.READS,
    lane=agent_lane,
)
def _get_working(ctx: Context, p: dict[str, Any]) -> Any:
    value = ctx.agent(p).get_working(p["key"], _MISSING, **pick(p, "task_id"))
    found = value is not _MISSING
    return {"key": p["key"], "found": found, "value": value if found else None}


@_OPS.add(
    "clear_working",
    "working",
    "Remove one working-memory key, or every key of one space (a task's or the agent-wide one); "
    "{removed} counts them.",
    (
        AGENT_ID,
        Param("key", key_schema("The key (omit to clear every key of the space).")),
        _TASK_SPACE,
    ),
    returns(removed="integer"),
    Effect.OVERWRITES,
    lane=agent_lane,
)
def _clear_working(ctx: Context, p: dict[str, Any]) -> Any:
    return {"removed": ctx.agent(p).clear_working(p.get("key"), **pick(p, "task_id"))}


OPERATIONS = tuple(_OPS.items)
