"""Operations on indexed memory files and codebases, and the status of it all."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memstrata.core.errors import InvalidInputError

from . import _convert
from ._operation import (
    KIND,
    MAX_FILE_LINES,
    MAX_FROM_LINE,
    OBJECT,
    QUERY,
    SCORE,
    SEARCH_RESULT,
    TOP_K,
    Context,
    Effect,
    OperationList,
    Param,
    files_lane,
    path_string,
    pick,
    returns,
    search_result,
    string,
)
from ._progress import Progress

_OPS = OperationList()


@_OPS.add(
    "index",
    "files",
    "Index (or re-sync) a folder of memory files or code; returns its root, kind and sync stats.",
    (
        Param("path", path_string("The folder."), True),
        Param("kind", KIND),
        Param(
            "progress",
            {
                "type": "boolean",
                "description": "Push 'index_progress' notifications (request_id, files_done, files_total, "
                "file) every 100 files, after a 2 s pause and for the last file (JSON-RPC only; "
                "default false).",
            },
        ),
    ),
    returns(root="string", kind="string"),
    Effect.SETS,
    lane=files_lane,
)
def _index(ctx: Context, p: dict[str, Any]) -> Any:
    connection = ctx.connection
    progress = None
    if p.get("progress"):
        if connection is None:
            raise InvalidInputError("progress notifications need a JSON-RPC connection (memstrata serve)")
        if ctx.request_id is not None:  # a notification takes no answer, nor reports on it
            progress = Progress(_reporter(connection, ctx.request_id))
    # a client that has gone takes no answer: the index ends before its next file (the next
    # sync does the rest)
    gone = connection.client_gone if connection is not None else None
    ws, stats = ctx.workspaces.index(p["path"], **pick(p, "kind"), progress=progress, should_stop=gone)
    if gone is not None and not stats.complete and gone():
        connection.server.warn(
            f"{connection.name}: the client went away; its index of {ws.root} stopped after "
            f"{stats.files_processed} file(s), the next sync indexes the rest"
        )
    return {"root": str(ws.root), "kind": ws.kind, "stats": _convert.plain(stats)}


def _reporter(connection: Any, request_id: Any) -> Callable[[int, int, str], None]:
    """Each report as an ``index_progress`` notification to ``connection`` (dropped, as a
    subscription's signals are, while the client leaves too many unread)."""

    def report(done: int, total: int, path: str) -> None:
        params = {"request_id": request_id, "files_done": done, "files_total": total, "file": path}
        connection.notify("index_progress", params)

    return report


@_OPS.add(
    "list_roots",
    "files",
    "The indexed folders with their kind and last sync.",
    (),
    {"type": "array", "items": OBJECT},
    Effect.READS,
    lane=files_lane,
)
def _list_roots(ctx: Context, p: dict[str, Any]) -> Any:
    return [ws.as_dict() for ws in ctx.workspaces.roots()]


@_OPS.add(
    "forget_root",
    "files",
    "Unregister an indexed folder and delete its index (the folder itself is untouched).",
    (Param("path", path_string("The folder."), True), Param("kind", KIND)),
    returns(removed="integer"),
    Effect.OVERWRITES,
    lane=files_lane,
)
def _forget_root(ctx: Context, p: dict[str, Any]) -> Any:
    return {"removed": ctx.workspaces.forget(p["path"], **pick(p, "kind"))}


@_OPS.add(
    "search_files",
    "files",
    "Search every indexed folder (or one); hits with root, path and line range.",
    (
        QUERY,
        Param("root", path_string("Only this indexed folder.")),
        Param("max_results", {**TOP_K, "description": "How many hits at most."}),
        Param("min_score", SCORE),
        Param("language", string("Only files in this language (e.g. python, markdown).", max_length=64)),
    ),
    SEARCH_RESULT,
    Effect.READS,
    lane=files_lane,
)
def _search_files(ctx: Context, p: dict[str, Any]) -> Any:
    found = ctx.workspaces.search(p["query"], **pick(p, "root", "max_results", "min_score", "language"))
    return search_result(found, [h.as_dict() for h in found])


_LINE_NUMBER = {
    "type": "integer",
    "minimum": 1,
    "maximum": MAX_FROM_LINE,
    "description": "First line (1-based).",
}


@_OPS.add(
    "get_file",
    "files",
    "Read lines of an indexed file (the path stays inside its root).",
    (
        Param("path", path_string("The file, relative to its root."), True),
        Param("root", path_string("The indexed folder it is in.")),
        Param("from_line", _LINE_NUMBER),
        Param(
            "lines",
            {"type": "integer", "minimum": 1, "maximum": MAX_FILE_LINES, "description": "How many lines."},
        ),
    ),
    OBJECT,
    Effect.READS,
    lane=files_lane,
)
def _get_file(ctx: Context, p: dict[str, Any]) -> Any:
    return ctx.workspaces.get(p["path"], **pick(p, "root", "from_line", "lines")).as_dict()


@_OPS.add(
    "status",
    "system",
    "Drivers, model state, per-agent counts, sync state and degraded agents.",
    (),
    OBJECT,
    Effect.READS,
)
def _status(ctx: Context, p: dict[str, Any]) -> Any:
    out = {"system": _convert.plain(ctx.system.status()), "workspaces": ctx.workspaces.status()}
    if ctx.extra_status is not None:
        out["server"] = ctx.extra_status()
    return out


OPERATIONS = tuple(_OPS.items)
