"""The methods ``memstrata serve`` offers: params schemas, lanes and calls into the facade.

Params are named as in the Python API, plus ``agent_id`` (agent methods) and ``session_id``
(blackboard methods). Optional params that are left out take the Python API's defaults.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memstrata.errors import InvalidInputError

from . import _convert
from ._server import Method

if TYPE_CHECKING:
    from memstrata._workspaces import Workspaces

__all__ = ["build_methods", "parse_time"]

_ID = {"type": "string", "minLength": 1, "maxLength": 256}
_TEXT = {"type": "string"}
_TAGS = {"type": "object", "additionalProperties": {"type": "string"}}
_COUNT = {"type": "integer", "minimum": 1}
_SCORE = {"type": "number", "minimum": 0, "maximum": 1}
_TIME = {"type": "string", "minLength": 1, "maxLength": 64, "description": "ISO 8601 with a time zone"}


def _obj(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": list(required),
        "additionalProperties": False,
    }


def _pick(params: dict[str, Any], *names: str) -> dict[str, Any]:
    """The optional params that were given (the rest keep the Python API's defaults)."""
    return {name: params[name] for name in names if name in params}


def parse_time(value: str, name: str) -> dt.datetime:
    text = value.strip()
    if text.endswith(("z", "Z")):
        text = text[:-1] + "+00:00"
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise InvalidInputError(f"{name} must be an ISO 8601 date-time, got {value[:64]!r}") from exc
    if parsed.tzinfo is None:
        raise InvalidInputError(f"{name} must include a time zone (e.g. 2024-05-01T12:00:00Z), got {value!r}")
    return parsed


def _times(params: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: parse_time(params[name], name) for name in names if name in params}


def _agent_lane(params: dict[str, Any]) -> str:
    return f"agent:{params['agent_id']}"


def _session_lane(params: dict[str, Any]) -> str:
    return f"session:{params['session_id']}"


def _files_lane(params: dict[str, Any]) -> str:
    return "files"


def build_methods(
    system: Any, workspaces: Workspaces, *, extra_status: Callable[[], Any] | None = None
) -> dict[str, Method]:
    """The method table for a running system and workspace registry."""

    def agent(params: dict[str, Any]) -> Any:
        return system.agent(params["agent_id"])

    def board(params: dict[str, Any]) -> Any:
        return system.blackboard(params["session_id"])

    def store_knowledge(p: dict[str, Any]) -> Any:
        ident = agent(p).store_knowledge(p["content"], **_pick(p, "category", "tags", "scope", "shared"))
        return {"id": ident}

    def query_knowledge(p: dict[str, Any]) -> Any:
        options = _pick(p, "category", "top_k", "tags", "scope", "mode", "min_score", "include_shared")
        return [_convert.knowledge_hit(h) for h in agent(p).query_knowledge(p["query"], **options)]

    def remember(p: dict[str, Any]) -> Any:
        options = {**_pick(p, "title", "task_run_id", "tags", "kind"), **_times(p, "at")}
        return {"id": agent(p).remember(p["content"], **options)}

    def recall(p: dict[str, Any]) -> Any:
        options = {**_pick(p, "top_k", "task_run_id"), **_times(p, "since", "until")}
        return [_convert.episode_hit(h) for h in agent(p).recall(p["query"], **options)]

    def begin_task(p: dict[str, Any]) -> Any:
        return _convert.task_prompt(agent(p).begin_task(p["task_id"], p["description"]))

    def complete_task(p: dict[str, Any]) -> Any:
        queued = agent(p).complete_task(p["task_id"], p["summary"])
        return {"task_id": p["task_id"], "queued": True, "outbox_id": getattr(queued, "outbox_id", None)}

    def fail_task(p: dict[str, Any]) -> Any:
        queued = agent(p).fail_task(p["task_id"], p["reason"])
        return {"task_id": p["task_id"], "queued": True, "outbox_id": getattr(queued, "outbox_id", None)}

    def publish(p: dict[str, Any]) -> Any:
        version = board(p).publish(p["key"], p["value"], p.get("publisher"), wait=True)
        return {"key": p["key"], "version": version}

    def get_signal(p: dict[str, Any]) -> Any:
        signal = board(p).signal(p["key"])
        return {
            "key": p["key"],
            "value": signal.value,
            "found": signal.found,
            "publisher": signal.publisher_id,
            "version": signal.version,
            "updated_at": _convert.plain(signal.updated_at),
        }

    def list_signals(p: dict[str, Any]) -> Any:
        return list(board(p).list(p.get("prefix")))

    def search_files(p: dict[str, Any]) -> Any:
        hits = workspaces.search(p["query"], **_pick(p, "root", "max_results", "min_score", "language"))
        return [h.as_dict() for h in hits]

    def get_file(p: dict[str, Any]) -> Any:
        return workspaces.get(p["path"], **_pick(p, "root", "from_line", "lines")).as_dict()

    def index(p: dict[str, Any]) -> Any:
        ws, stats = workspaces.index(p["path"], **_pick(p, "kind"))
        return {"root": str(ws.root), "kind": ws.kind, "stats": _convert.plain(stats)}

    def status(p: dict[str, Any]) -> Any:
        out = {"system": _convert.plain(system.status()), "workspaces": workspaces.status()}
        if extra_status is not None:
            out["server"] = extra_status()
        return out

    agent_id = {"agent_id": _ID}
    session_id = {"session_id": _ID}
    table = [
        Method(
            "store_knowledge",
            _obj(
                {**agent_id, "content": _TEXT},
                {"category": _TEXT, "tags": _TAGS, "scope": _TEXT, "shared": {"type": "boolean"}},
            ),
            store_knowledge,
            _agent_lane,
            "Store long-term knowledge; returns {id}.",
        ),
        Method(
            "query_knowledge",
            _obj(
                {**agent_id, "query": _TEXT},
                {
                    "category": _TEXT,
                    "top_k": _COUNT,
                    "tags": _TAGS,
                    "scope": _TEXT,
                    "mode": {"type": "string", "enum": ["hybrid", "vector", "keyword"]},
                    "min_score": _SCORE,
                    "include_shared": {"type": "boolean"},
                },
            ),
            query_knowledge,
            _agent_lane,
            "Hybrid search of long-term knowledge; returns hits, best first.",
        ),
        Method(
            "remember",
            _obj(
                {**agent_id, "content": _TEXT},
                {"title": _TEXT, "task_run_id": _TEXT, "tags": _TAGS, "kind": _TEXT, "at": _TIME},
            ),
            remember,
            _agent_lane,
            "Record an episode; returns {id}.",
        ),
        Method(
            "recall",
            _obj(
                {**agent_id, "query": _TEXT},
                {"top_k": _COUNT, "task_run_id": _TEXT, "since": _TIME, "until": _TIME},
            ),
            recall,
            _agent_lane,
            "Search episodic memory; returns hits, best first.",
        ),
        Method(
            "begin_task",
            _obj({**agent_id, "task_id": _TEXT, "description": _TEXT}),
            begin_task,
            _agent_lane,
            "Pre-task retrieval; returns the prompt {text, fallback, reason, hits}.",
        ),
        Method(
            "complete_task",
            _obj({**agent_id, "task_id": _TEXT, "summary": _TEXT}),
            complete_task,
            _agent_lane,
            "Write back a success (durable once answered).",
        ),
        Method(
            "fail_task",
            _obj({**agent_id, "task_id": _TEXT, "reason": _TEXT}),
            fail_task,
            _agent_lane,
            "Write back a failure as a pitfall (durable once answered).",
        ),
        Method(
            "publish",
            _obj({**session_id, "key": _TEXT, "value": {}}, {"publisher": _TEXT}),
            publish,
            _session_lane,
            "Publish a blackboard signal (any JSON value).",
        ),
        Method(
            "get_signal",
            _obj({**session_id, "key": _TEXT}),
            get_signal,
            _session_lane,
            "Read a blackboard signal; value is null when unset.",
        ),
        Method(
            "list_signals",
            _obj(session_id, {"prefix": _TEXT}),
            list_signals,
            _session_lane,
            "The sorted keys of a session's blackboard (optionally under a prefix).",
        ),
        Method(
            "search_files",
            _obj(
                {"query": _TEXT},
                {"root": _TEXT, "max_results": _COUNT, "min_score": _SCORE, "language": _TEXT},
            ),
            search_files,
            _files_lane,
            "Search every indexed root (or one); hits with root, path and line range.",
        ),
        Method(
            "get_file",
            _obj({"path": _TEXT}, {"root": _TEXT, "from_line": _COUNT, "lines": _COUNT}),
            get_file,
            _files_lane,
            "Read lines of an indexed file.",
        ),
        Method(
            "index",
            _obj({"path": _TEXT}, {"kind": {"type": "string", "enum": ["auto", "memory", "code"]}}),
            index,
            _files_lane,
            "Index (or re-sync) a folder; returns its root, kind and sync stats.",
        ),
        Method(
            "status",
            _obj({}),
            status,
            lambda _p: None,
            "Drivers, model, counts, sync state, degraded agents.",
        ),
    ]
    return {m.name: m for m in table}
