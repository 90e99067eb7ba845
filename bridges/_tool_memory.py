"""The ``memory_*`` tools: one memory made of indexed files and the agent's saved memories.

- ``memory_search`` / ``memory_get`` read the indexed memory files and source trees (the roots
  registered with ``memstrata index``) *and* the agent's saved memories.
- ``memory_add`` (alias ``memory_save``) / ``memory_list`` / ``memory_delete`` keep saved memories
  in the agent's own knowledge store under the category ``memory``, with the given scope and tags
  (``source`` becomes the tag ``source``). A saved memory shows up in ``memory_search`` with the
  path ``memory://<id>``, which ``memory_get`` reads back.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from memstrata.core.constants import (
    MAX_ENTRY_ID,
    MAX_PATH_CHARS,
    MAX_SCOPE_CHARS,
    MAX_TAG_VALUE_CHARS,
    MAX_TOP_K,
)
from memstrata.core.errors import InvalidInputError
from memstrata.core.validation import check_scope

from . import _convert
from ._operation import MAX_FROM_LINE, NO_CONTROL, NOT_BLANK, Operation, Param, offset
from ._tool_defs import TAGS, TAGS_FILTER, Tool, ToolContext, operation, tags_map

if TYPE_CHECKING:
    from memstrata._workspace_search import Ranked

__all__ = ["MEMORY_CATEGORY", "MEMORY_TOOLS", "NO_MEMORIES"]

MEMORY_CATEGORY = "memory"
"""Knowledge category that holds memories saved through ``memory_add``."""

MEMORY_SCHEME = "memory://"
NO_MEMORIES = (
    "no memories indexed yet: index a workspace with `memstrata index PATH` or save one with memory_add"
)
_TEXT_LIMIT = 4_000_000
_FILES, _SAVED = 0, 1  # the sources of memory_search, in the order that wins a tie


def _iso(seconds: Any) -> Any:
    """UNIX seconds as an ISO 8601 UTC string (what a model reads best)."""
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="seconds")
    return _convert.plain(seconds)


def _lines(text: str) -> list[str]:
    """A saved memory's lines as memory files count them (``\r\n`` and ``\r`` end a line too;
    form feeds and other separators do not), without their line ends."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return lines[:-1] if len(lines) > 1 and not lines[-1] else lines


def _memory_path(ident: int) -> str:
    """The path a saved memory shows in results and memory_get reads back."""
    return f"{MEMORY_SCHEME}{ident}"


def _memory_id(path: str) -> str:
    ident = path[len(MEMORY_SCHEME) :].strip()
    if not ident:
        raise InvalidInputError(f"path {path!r} names no memory id")
    return ident


def _coerce_id(value: Any) -> Any:
    """Entry ids are integers in the store; a digit string from a model is the same id."""
    # ASCII digits only: str.isdigit() also accepts "²", which int() refuses
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value.strip())
    return value


def _saved_memory(ctx: ToolContext, ident: Any) -> Any:
    if isinstance(ident, bool) or not isinstance(ident, int) or not 0 <= ident < 2**63:
        raise InvalidInputError(f"no saved memory with id {ident!r} (ids are non-negative integers)")
    entry = ctx.agent().get_knowledge(ident)
    if entry is None or entry.category != MEMORY_CATEGORY:
        raise InvalidInputError(f"no saved memory with id {ident!r}")
    return entry


def _in_scope(path: str, scope: str) -> bool:
    """A file (root-relative path) is in a scope when it lies under that folder of its root."""
    return scope == "/" or ("/" + path).startswith(scope + "/")


def _files_in_scope(files: Any, query: str, limit: int, floor: float | None, scope: str | None) -> Any:
    """The files' hits of which the best ``limit`` in ``scope`` are: asked for more (x4 each
    time, up to :data:`MAX_TOP_K`) until that many are in scope or the search has no more."""
    asked = limit
    while True:
        found = files.search(query, max_results=asked, min_score=floor)
        inside = sum(1 for hit in found if scope is None or _in_scope(hit.path, scope))
        if inside >= limit or len(found) < asked or asked >= MAX_TOP_K:
            return found
        asked = min(asked * 4, MAX_TOP_K)


def _memory_search(ctx: ToolContext, args: dict[str, Any]) -> Any:
    """Files and saved memories in one ranking: each source normalises its scores to its own
    search, so the hits are fused again as the roots of a registry are (files first on a tie)."""
    from memstrata._workspace_search import fuse_hits, ranked_hits  # numpy: with a search, not the tool list

    files = ctx.files()
    config = files.config
    limit = args.get("maxResults", config.search.max_results)
    given_floor = args.get("minScore")  # files: code roots get a floor only when it is given
    min_score = config.search.min_score if given_floor is None else given_floor
    scope = None if args.get("scope") is None else check_scope(args["scope"])
    tags = tags_map(args.get("tags"))
    query = args["query"]
    file_hits: list[Any] = []
    saved: Any = []  # the store's list: its ``degraded`` says why keywords ranked alone
    complete = True
    degraded: list[str] = []  # why a part was not ranked as a hybrid search ranks it
    warnings: list[str] = []
    roots = files.roots()
    if roots and not tags:  # files carry no tags: a tag filter leaves them out
        found = _files_in_scope(files, query, limit, given_floor, scope)
        complete = bool(getattr(found, "complete", True))
        warnings.extend(str(w) for w in getattr(found, "warnings", None) or ())
        if getattr(found, "degraded", None):
            degraded.append(f"files: {found.degraded}")
        file_hits = [hit for hit in found if scope is None or _in_scope(hit.path, scope)]
    if ctx.system is not None:
        saved = _saved_hits(ctx, query, limit, min_score, scope, tags)
        if getattr(saved, "degraded", None):
            degraded.append(f"saved memories: {saved.degraded}")
    if not roots and not saved and not _has_saved_memories(ctx):
        warnings.append(NO_MEMORIES)
    pool = [*ranked_hits(file_hits, _FILES), *ranked_hits(saved, _SAVED, by_ranks=True)]
    one_model = not (file_hits and saved) or _one_model(ctx)
    merged = fuse_hits(pool, limit, query=query, search=config.search, one_model=one_model)
    return {
        "hits": [_row(ranked, score, config.search.snippet_chars) for ranked, score in merged],
        "complete": complete,
        "degraded": "; ".join(degraded) or None,
        "warnings": warnings,
    }


def _saved_hits(
    ctx: ToolContext, query: str, limit: int, min_score: float, scope: str | None, tags: Any
) -> Any:
    """The agent's saved memories that match, best first."""
    options: dict[str, Any] = {"category": MEMORY_CATEGORY, "top_k": limit, "min_score": min_score}
    if scope is not None:
        options["scope"] = scope
    if tags:
        options["tags"] = tags
    return ctx.agent().query_knowledge(query, include_shared=False, **options)


def _one_model(ctx: ToolContext) -> bool:
    """Whether the agent's saved memories embed with the system's model, which file indexes
    use, so the similarities of both sources compare (else they take turns, as stores do)."""
    system = ctx.require_system()
    mine, shared = system.embedder_for(ctx.agent_id), system.embedder
    return mine is None or shared is None or bool(mine.model_id == shared.model_id)


def _row(ranked: Ranked, score: float, snippet_chars: int) -> dict[str, Any]:
    """A file hit or a saved memory as the tool shows it, with its merged score."""
    hit = ranked.hit
    if ranked.source == _FILES:
        lines, snippet, path = (hit.start_line, hit.end_line), hit.snippet, str(hit.absolute_path)
    else:
        content = str(hit.entry.content)
        lines, snippet, path = (1, len(_lines(content))), content[:snippet_chars], _memory_path(hit.entry.id)
    return {
        "path": path,
        "startLine": lines[0],
        "endLine": lines[1],
        "score": round(score, 4),
        "snippet": snippet,
    }


def _has_saved_memories(ctx: ToolContext) -> bool:
    if ctx.system is None:
        return False
    return bool(ctx.agent().list_knowledge(category=MEMORY_CATEGORY, limit=1))


def _memory_get(ctx: ToolContext, args: dict[str, Any]) -> Any:
    path = args["path"]
    start = args.get("from", 1)
    count = args.get("lines", 50)
    if path.startswith(MEMORY_SCHEME):
        entry = _saved_memory(ctx, _coerce_id(_memory_id(path)))
        chunk = _lines(str(entry.content))[start - 1 : start - 1 + count]
        return {"path": path, "from": start, "lines": len(chunk), "text": "\n".join(chunk)}
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


def _memory_add(ctx: ToolContext, args: dict[str, Any]) -> Any:
    tags = tags_map(args.get("tags")) or {}
    source = args.get("source")
    if source is not None:
        if tags.get("source", source) != source:
            raise InvalidInputError(
                f"tag 'source' ({tags['source'][:40]!r}) and argument 'source' ({source[:40]!r}) "
                "disagree: give the source once"
            )
        tags["source"] = source
    ident = ctx.agent().store_knowledge(
        args["content"], category=MEMORY_CATEGORY, tags=tags or None, scope=args.get("scope", "/")
    )
    return {"id": ident, "path": _memory_path(ident), "saved": True}


def _memory_list(ctx: ToolContext, args: dict[str, Any]) -> Any:
    entries = ctx.agent().list_knowledge(
        category=MEMORY_CATEGORY,
        tags=tags_map(args.get("tags")),
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


def _memory_delete(ctx: ToolContext, args: dict[str, Any]) -> Any:
    raw = args["id"]
    ident = _coerce_id(_memory_id(raw) if isinstance(raw, str) and raw.startswith(MEMORY_SCHEME) else raw)
    _saved_memory(ctx, ident)
    return {"id": ident, "deleted": ctx.agent().delete_knowledge(ident)}


# -- params ------------------------------------------------------------------------------------

_QUERY = Param(
    "query",
    {"type": "string", "minLength": 1, "maxLength": 100_000, "description": "What to look for."},
    True,
)
_SCOPE = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_SCOPE_CHARS,
    "pattern": NO_CONTROL,
    "description": 'Path-like scope such as "/" (default) or "/project/auth".',
}
_CONTENT = {"type": "string", "minLength": 1, "maxLength": _TEXT_LIMIT, "pattern": NOT_BLANK}
_ADD = (
    Param("content", {**_CONTENT, "description": "The memory to save, self-contained."}, True),
    Param(
        "scope", {**_SCOPE, "description": 'Where the memory applies, e.g. "/project/auth" (default "/").'}
    ),
    Param("tags", TAGS),
    Param(
        "source",
        {
            "type": "string",
            "maxLength": MAX_TAG_VALUE_CHARS,
            "description": "Where the memory came from (stored as the tag source; a source=... tag in "
            "tags must then say the same).",
        },
    ),
)


def _ops(*names: str) -> tuple[Operation, ...]:
    found = tuple(op for op in map(operation, names) if op is not None)
    if len(found) != len(names):  # pragma: no cover - a programming error, caught by any import
        raise RuntimeError(f"memory tools need the operations {names}")
    return found


MEMORY_TOOLS: tuple[Tool, ...] = (
    Tool(
        "memory_search",
        "Search memory",
        "Search memory: indexed memory files (MEMORY.md, memory/*.md), indexed source trees and saved "
        "memories. Returns {hits, complete, degraded, warnings}; each hit has its path and line range; "
        "read more with memory_get.",
        (
            _QUERY,
            Param(
                "maxResults",
                {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 100,
                    "description": "How many hits at most (default 6).",
                },
            ),
            Param(
                "minScore",
                {
                    "type": "number",
                    "minimum": 0,
                    "maximum": 1,
                    "description": "Cosine-similarity floor for the semantic side, 0-1 (default "
                    "0.35 for memory files and saved memories; source trees get a floor only when "
                    "it is given): semantic candidates below it are left out; keyword matches are "
                    "kept whatever their similarity.",
                },
            ),
            Param(
                "scope",
                {
                    **_SCOPE,
                    "description": "Only this scope: saved memories of that scope or a parent scope, and "
                    'files under that folder of their indexed root (e.g. "/memory").',
                },
            ),
            Param(
                "tags",
                {
                    **TAGS_FILTER,
                    "description": f"{TAGS_FILTER['description']} Files have no tags: a tag filter "
                    "leaves them out.",
                },
            ),
        ),
        _memory_search,
        _ops("search_files", "query_knowledge"),
    ),
    Tool(
        "memory_get",
        "Read memory",
        "Read lines of a memory file or saved memory, by the path memory_search returned.",
        (
            Param(
                "path",
                {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_PATH_CHARS,
                    "description": "A path from memory_search: a file (absolute or relative to its root) or "
                    "memory://<id>.",
                },
                True,
            ),
            Param(
                "from",
                {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_FROM_LINE,
                    "description": "First line, 1-based (default 1).",
                },
            ),
            Param(
                "lines",
                {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 10_000,
                    "description": "How many lines (default 50).",
                },
            ),
        ),
        _memory_get,
        _ops("get_file", "get_knowledge"),
    ),
    Tool(
        "memory_add",
        "Save a memory",
        "Save a memory for later (a fact, decision or preference worth remembering).",
        _ADD,
        _memory_add,
        _ops("store_knowledge"),
    ),
    Tool(
        "memory_save",
        "Save a memory",
        "Save a memory for later (same as memory_add); source says where it came from.",
        _ADD,
        _memory_add,
        _ops("store_knowledge"),
    ),
    Tool(
        "memory_list",
        "List saved memories",
        "List saved memories, newest first; a scope lists that scope and everything below it.",
        (
            Param("scope", {**_SCOPE, "description": "That scope and everything below it."}),
            Param("tags", TAGS_FILTER),
            Param(
                "limit",
                {"type": "integer", "minimum": 0, "maximum": 200, "description": "At most (default 20)."},
            ),
            Param("offset", offset("Memories to skip (default 0).")),
        ),
        _memory_list,
        _ops("list_knowledge"),
    ),
    Tool(
        "memory_delete",
        "Delete a saved memory",
        "Delete a saved memory by its id (or its memory:// path).",
        (
            Param(
                "id",
                {
                    "anyOf": [
                        {"type": "integer", "minimum": 1, "maximum": MAX_ENTRY_ID},
                        {"type": "string", "minLength": 1},
                    ],
                    "description": "The memory's id, or its memory://<id> path.",
                },
                True,
            ),
        ),
        _memory_delete,
        _ops("delete_knowledge"),
    ),
)
