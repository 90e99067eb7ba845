"""Memory tools for LLM function calling: schemas (OpenAI and Anthropic formats) and a dispatcher.

Hand :func:`openai_tools` or :func:`anthropic_tools` to the model, then pass each tool call to
:func:`dispatch`. The dispatcher never raises: a bad call (unknown tool, wrong types, unknown or
missing arguments) or a failure comes back as ``{"error": "..."}`` so the model can read it and
correct itself.

Where things live:

- ``memory_search`` / ``memory_get`` read the indexed memory files and source trees (the roots
  registered with ``memstrata index``) *and* the agent's saved memories.
- ``memory_add`` (alias ``memory_save``) / ``memory_list`` / ``memory_delete`` keep saved
  memories in the agent's long-term KnowledgeStore under the category ``memory``, with the given
  scope and tags (``source`` becomes the tag ``source``). A saved memory shows up in
  ``memory_search`` with the path ``memory://<id>``, which ``memory_get`` reads back.
- ``knowledge_query`` / ``knowledge_store`` reach the whole KnowledgeStore (any category).
"""

from __future__ import annotations

import atexit
import datetime as dt
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memstrata.errors import InvalidInputError, MemstrataError
from memstrata.messages import check_agent_id

from . import _convert
from ._json import MAX_DEPTH, dumps, json_depth, loads
from ._schema import check, describe_type

if TYPE_CHECKING:
    from memstrata._workspaces import Workspaces

__all__ = [
    "MEMORY_CATEGORY",
    "TOOL_NAMES",
    "anthropic_tools",
    "dispatch",
    "dispatch_json",
    "openai_tools",
    "tool_schemas",
]

MEMORY_CATEGORY = "memory"
"""KnowledgeStore category that holds memories saved through ``memory_add``."""

MEMORY_SCHEME = "memory://"
NO_MEMORIES = (
    "no memories indexed yet: index a workspace with `memstrata index PATH` or save one with memory_add"
)

_CATEGORY_PATTERN = "^[a-z0-9][a-z0-9_-]{0,63}$"
_TEXT_LIMIT = 4_000_000

_TAGS: dict[str, Any] = {
    "description": (
        'Tags as an object {"key": "value"} or a list of "key=value" / bare "key" strings; '
        'a bare tag has the value "".'
    ),
    "anyOf": [
        {
            "type": "object",
            "additionalProperties": {"type": "string", "maxLength": 1000},
            "maxProperties": 64,
        },
        {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 1000}, "maxItems": 64},
    ],
}
_SCOPE: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": 1000,
    "description": 'Path-like scope such as "/" (default) or "/project/auth".',
}


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


@dataclass(frozen=True, slots=True)
class _Tool:
    name: str
    description: str
    schema: dict[str, Any]
    run: Callable[[_Context, dict[str, Any]], Any]


@dataclass(slots=True)
class _Context:
    system: Any
    agent_id: str
    workspaces: Workspaces | None

    def agent(self) -> Any:
        if self.system is None:
            raise MemstrataError("no memory system was given to the dispatcher")
        return self.system.agent(self.agent_id)

    def files(self) -> Workspaces:
        if self.workspaces is None:
            self.workspaces = _default_workspaces(self.system)
        return self.workspaces


# -- tool implementations -----------------------------------------------------------------------


def _tags(value: Any) -> dict[str, str] | None:
    """Tags from either accepted form; ``k=v`` strings split at the first ``=``."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    tags: dict[str, str] = {}
    for item in value:
        key, _, val = str(item).partition("=")
        if not key:
            raise InvalidInputError(f"tag {item!r} has an empty key")
        tags[key] = val
    return tags


def _iso(seconds: Any) -> Any:
    """UNIX seconds as an ISO 8601 UTC string (what a model reads best)."""
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="seconds")
    return _convert.plain(seconds)


def _line_count(text: str) -> int:
    return max(1, text.count("\n") + (0 if text.endswith("\n") else 1))


def _memory_hit(hit: Any, snippet_chars: int) -> dict[str, Any]:
    entry = hit.entry
    content = str(entry.content)
    return {
        "path": _memory_path(entry.id),
        "startLine": 1,
        "endLine": _line_count(content),
        "score": round(float(hit.score), 4),
        "snippet": content[:snippet_chars],
    }


def _memory_search(ctx: _Context, args: dict[str, Any]) -> Any:
    files = ctx.files()
    config = files.config
    limit = args.get("maxResults", config.search.max_results)
    min_score = args.get("minScore", config.search.min_score)
    query = args["query"]
    results: list[dict[str, Any]] = []
    roots = files.roots()
    if roots:
        for hit in files.search(query, max_results=limit, min_score=min_score):
            results.append(
                {
                    "path": str(hit.absolute_path),
                    "startLine": hit.start_line,
                    "endLine": hit.end_line,
                    "score": round(hit.score, 4),
                    "snippet": hit.snippet,
                }
            )
    if ctx.system is not None:
        saved = ctx.agent().query_knowledge(query, category=MEMORY_CATEGORY, top_k=limit, min_score=min_score)
        results.extend(_memory_hit(h, config.search.snippet_chars) for h in saved)
    if not roots and not results and not _has_saved_memories(ctx):
        return {"results": [], "message": NO_MEMORIES}
    results.sort(key=lambda r: -float(r["score"]))
    return results[:limit]


def _has_saved_memories(ctx: _Context) -> bool:
    if ctx.system is None:
        return False
    return bool(ctx.agent().list_knowledge(category=MEMORY_CATEGORY, limit=1))


def _memory_path(ident: int) -> str:
    """The path a saved memory shows in results and memory_get reads back."""
    return f"{MEMORY_SCHEME}{ident}"


def _memory_id(path: str) -> str:
    ident = path[len(MEMORY_SCHEME) :].strip()
    if not ident:
        raise InvalidInputError(f"path {path!r} names no memory id")
    return ident


def _memory_get(ctx: _Context, args: dict[str, Any]) -> Any:
    path = args["path"]
    start = args.get("from", 1)
    count = args.get("lines", 50)
    if path.startswith(MEMORY_SCHEME):
        entry = _saved_memory(ctx, _coerce_id(_memory_id(path)))
        lines = str(entry.content).splitlines(keepends=True)
        chunk = "".join(lines[start - 1 : start - 1 + count])
        return {
            "path": path,
            "from": start,
            "lines": len(lines[start - 1 : start - 1 + count]),
            "text": chunk,
        }
    files = ctx.files()
    if not files.roots():
        return {"error": NO_MEMORIES}
    text = files.get(path, from_line=start, lines=count)
    return {
        "path": str(text.root / text.path),
        "from": text.from_line,
        "lines": text.lines,
        "text": text.text,
    }


def _coerce_id(value: Any) -> Any:
    """Entry ids are integers in the store; a digit string from a model is the same id."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return value


def _saved_memory(ctx: _Context, ident: Any) -> Any:
    if isinstance(ident, bool) or not isinstance(ident, int) or not 0 <= ident < 2**63:
        raise InvalidInputError(f"no saved memory with id {ident!r} (ids are non-negative integers)")
    entry = ctx.agent().get_knowledge(ident)
    if entry is None or entry.category != MEMORY_CATEGORY:
        raise InvalidInputError(f"no saved memory with id {ident!r}")
    return entry


def _memory_add(ctx: _Context, args: dict[str, Any]) -> Any:
    tags = _tags(args.get("tags")) or {}
    if "source" in args:
        tags["source"] = args["source"]
    ident = ctx.agent().store_knowledge(
        args["content"], category=MEMORY_CATEGORY, tags=tags or None, scope=args.get("scope", "/")
    )
    return {"id": ident, "path": _memory_path(ident), "saved": True}


def _memory_list(ctx: _Context, args: dict[str, Any]) -> Any:
    entries = ctx.agent().list_knowledge(
        category=MEMORY_CATEGORY,
        tags=_tags(args.get("tags")),
        scope=args.get("scope"),
        limit=args.get("limit", 20),
        offset=args.get("offset", 0),
    )
    return [
        {
            "id": e.id,
            "path": _memory_path(e.id),
            "content": e.content,
            "scope": e.scope,
            "tags": dict(e.tags),
            "updatedAt": _iso(e.updated_at),
        }
        for e in entries
    ]


def _memory_delete(ctx: _Context, args: dict[str, Any]) -> Any:
    raw = args["id"]
    ident = _coerce_id(_memory_id(raw) if isinstance(raw, str) and raw.startswith(MEMORY_SCHEME) else raw)
    _saved_memory(ctx, ident)
    return {"id": ident, "deleted": ctx.agent().delete_knowledge(ident)}


def _knowledge_query(ctx: _Context, args: dict[str, Any]) -> Any:
    options: dict[str, Any] = {"category": args.get("category")}
    if "topK" in args:
        options["top_k"] = args["topK"]
    hits = ctx.agent().query_knowledge(args["query"], **options)
    return [
        {
            "id": h.entry.id,
            "content": h.entry.content,
            "category": h.entry.category,
            "scope": h.entry.scope,
            "tags": dict(h.entry.tags),
            "score": round(float(h.score), 4),
            "matchType": h.match_type,
        }
        for h in hits
    ]


def _knowledge_store(ctx: _Context, args: dict[str, Any]) -> Any:
    ident = ctx.agent().store_knowledge(
        args["content"], category=args["category"], tags=_tags(args.get("tags"))
    )
    return {"id": ident, "category": args["category"], "stored": True}


_CONTENT = {"type": "string", "minLength": 1, "maxLength": _TEXT_LIMIT}
_QUERY = {"type": "string", "minLength": 1, "maxLength": 100_000, "description": "What to look for."}

_ADD_PROPERTIES = {
    "content": {**_CONTENT, "description": "The memory to save, self-contained."},
    "scope": _SCOPE,
    "tags": _TAGS,
    "source": {
        "type": "string",
        "maxLength": 1000,
        "description": "Where the memory came from (stored as tag).",
    },
}

_TOOLS: dict[str, _Tool] = {
    t.name: t
    for t in (
        _Tool(
            "memory_search",
            "Search memory: indexed memory files (MEMORY.md, memory/*.md), indexed source trees and saved "
            "memories. Returns the best matching passages with their path and line range; read more "
            "with memory_get.",
            _obj(
                {
                    "query": _QUERY,
                    "maxResults": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 100,
                        "description": "Default 6.",
                    },
                    "minScore": {
                        "type": "number",
                        "minimum": 0,
                        "maximum": 1,
                        "description": "Semantic similarity floor, 0-1 (default 0.35).",
                    },
                },
                ["query"],
            ),
            _memory_search,
        ),
        _Tool(
            "memory_get",
            "Read lines of a memory file or saved memory, by the path memory_search returned.",
            _obj(
                {
                    "path": {"type": "string", "minLength": 1, "maxLength": 4096},
                    "from": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "First line, 1-based (default 1).",
                    },
                    "lines": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 10_000,
                        "description": "How many lines (default 50).",
                    },
                },
                ["path"],
            ),
            _memory_get,
        ),
        _Tool(
            "memory_add",
            "Save a memory for later (a fact, decision or preference worth remembering).",
            _obj(_ADD_PROPERTIES, ["content"]),
            _memory_add,
        ),
        _Tool(
            "memory_save",
            "Save a memory for later (same as memory_add); source says where it came from.",
            _obj(_ADD_PROPERTIES, ["content"]),
            _memory_add,
        ),
        _Tool(
            "memory_list",
            "List saved memories, newest first; a scope lists that scope and everything below it.",
            _obj(
                {
                    "scope": _SCOPE,
                    "tags": _TAGS,
                    "limit": {"type": "integer", "minimum": 1, "maximum": 200, "description": "Default 20."},
                    "offset": {"type": "integer", "minimum": 0, "description": "Default 0."},
                },
                [],
            ),
            _memory_list,
        ),
        _Tool(
            "memory_delete",
            "Delete a saved memory by its id (or its memory:// path).",
            _obj(
                {"id": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "minLength": 1}]}},
                ["id"],
            ),
            _memory_delete,
        ),
        _Tool(
            "knowledge_query",
            "Search long-term knowledge learned from earlier tasks (outcomes, pitfalls, patterns, ...).",
            _obj(
                {
                    "query": _QUERY,
                    "category": {
                        "type": "string",
                        "pattern": _CATEGORY_PATTERN,
                        "description": "Only this category (pitfall, outcome, pattern, codebase, ...).",
                    },
                    "topK": {"type": "integer", "minimum": 1, "maximum": 100, "description": "Default 10."},
                },
                ["query"],
            ),
            _knowledge_query,
        ),
        _Tool(
            "knowledge_store",
            "Store long-term knowledge under a category (outcome, pitfall, pattern, codebase, preference or "
            "another lowercase name).",
            _obj(
                {
                    "content": {**_CONTENT, "description": "The knowledge, self-contained."},
                    "category": {"type": "string", "pattern": _CATEGORY_PATTERN},
                    "tags": _TAGS,
                },
                ["content", "category"],
            ),
            _knowledge_store,
        ),
    )
}

TOOL_NAMES: tuple[str, ...] = tuple(_TOOLS)


def tool_schemas(names: list[str] | None = None, *, agent_id_argument: bool = False) -> list[dict[str, Any]]:
    """``[{name, description, parameters}]``: the neutral form the other formats are built from.

    ``agent_id_argument`` adds an optional ``agent_id`` argument (used by the MCP server, where one
    server serves several agents).
    """
    chosen = TOOL_NAMES if names is None else names
    out = []
    for name in chosen:
        if name not in _TOOLS:
            raise InvalidInputError(f"unknown tool {name!r} (available: {', '.join(TOOL_NAMES)})")
        tool = _TOOLS[name]
        schema = _copy(tool.schema)
        if agent_id_argument:
            schema["properties"]["agent_id"] = {
                "type": "string",
                "minLength": 1,
                "maxLength": 200,
                "description": "Which agent's memory to use (default: the server's agent).",
            }
        out.append({"name": tool.name, "description": tool.description, "parameters": schema})
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def openai_tools(names: list[str] | None = None) -> list[dict[str, Any]]:
    """Tools in the OpenAI function-calling format (``{"type": "function", "function": {...}}``)."""
    return [{"type": "function", "function": t} for t in tool_schemas(names)]


def anthropic_tools(names: list[str] | None = None) -> list[dict[str, Any]]:
    """Tools in the Anthropic format (``{"name", "description", "input_schema"}``)."""
    return [
        {"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
        for t in tool_schemas(names)
    ]


# -- dispatch ------------------------------------------------------------------------------------


def _parse_arguments(arguments: Any) -> Any:
    if arguments is None:
        return {}
    if isinstance(arguments, bytes | bytearray | memoryview):
        arguments = bytes(arguments).decode("utf-8", "replace")
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}
        try:
            arguments = loads(arguments)
        except ValueError as exc:
            raise InvalidInputError(f"arguments are not valid JSON: {exc}") from exc
    if not isinstance(arguments, Mapping):
        raise InvalidInputError(f"arguments must be a JSON object, got {describe_type(arguments)}")
    if json_depth(arguments) > MAX_DEPTH:
        raise InvalidInputError(f"arguments are nested deeper than {MAX_DEPTH} levels")
    return arguments


def _error(message: str) -> dict[str, str]:
    return {"error": message}


def dispatch(
    name: str,
    arguments: Mapping[str, Any] | str | bytes | None,
    system: Any,
    *,
    agent_id: str = "default",
    workspaces: Workspaces | None = None,
) -> Any:
    """Run one tool call; returns its JSON-ready result or ``{"error": "..."}`` (never raises).

    ``arguments`` may be a dict or the JSON string a model produced. ``system`` is a running
    :class:`memstrata.MemorySystem`; ``workspaces`` the file-index registry (by default the one in
    the system's data dir).
    """
    try:
        if not isinstance(name, str) or name not in _TOOLS:
            shown = name if isinstance(name, str) else describe_type(name)
            return _error(f"unknown tool {shown!r} (available: {', '.join(TOOL_NAMES)})")
        tool = _TOOLS[name]
        args = check(tool.schema, _parse_arguments(arguments))
        check_agent_id(agent_id)
        return tool.run(_Context(system, agent_id, workspaces), args)
    except MemstrataError as exc:
        return _error(f"{name}: {exc}")
    except (ValueError, TypeError, LookupError, OSError) as exc:
        return _error(f"{name}: {type(exc).__name__}: {exc}")
    except Exception as exc:  # the tool loop must survive anything a call can provoke
        return _error(f"{name}: internal error ({type(exc).__name__}: {exc})")


def dispatch_json(
    name: str,
    arguments: Mapping[str, Any] | str | bytes | None,
    system: Any,
    *,
    agent_id: str = "default",
    workspaces: Workspaces | None = None,
) -> str:
    """:func:`dispatch`, with the result as the JSON text a tool-result message carries."""
    return dumps(dispatch(name, arguments, system, agent_id=agent_id, workspaces=workspaces)).decode("utf-8")


# -- the default file-index registry -------------------------------------------------------------

_REGISTRIES: weakref.WeakKeyDictionary[Any, Workspaces] = weakref.WeakKeyDictionary()
_REGISTRY_LOCK = threading.Lock()


def _default_workspaces(system: Any) -> Workspaces:
    """The registry in the system's data dir, opened once per system with its shared embedder."""
    from memstrata._workspaces import Workspaces

    config = getattr(system, "config", None)
    if config is None:
        raise MemstrataError("no workspace registry was given and the memory system has no config")
    with _REGISTRY_LOCK:
        registry = _REGISTRIES.get(system)
        if registry is None:
            registry = Workspaces(config.data_dir, config=config, embedder=getattr(system, "embedder", None))
            _REGISTRIES[system] = registry
        return registry


@atexit.register
def _close_registries() -> None:
    with _REGISTRY_LOCK:
        for registry in list(_REGISTRIES.values()):
            registry.close()
        _REGISTRIES.clear()
