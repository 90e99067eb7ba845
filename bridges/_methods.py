"""The methods ``memstrata serve`` offers: one per operation of the registry, plus ``rpc.discover``.

Params are named as in the Python API, plus ``agent_id`` (agent methods) and ``session_id``
(blackboard methods). Optional params that are left out (or null) take the Python API's defaults.
``rpc.discover`` answers an OpenRPC 1.x document generated from the same registry, and
:func:`method_table` renders the table docs/bridges.md shows (a test keeps them equal).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._operation import Operation
from ._operations import OPERATIONS, Context, parse_time
from ._rpc_connection import current_connection, current_request_id
from ._rpc_protocol import ErrorCode, Method

if TYPE_CHECKING:
    from memstrata._workspaces import Workspaces

__all__ = ["OPENRPC_VERSION", "build_methods", "method_table", "openrpc_document", "parse_time"]

OPENRPC_VERSION = "1.3.2"

_ERRORS = (
    (ErrorCode.PARSE_ERROR, "Parse error: the line is not JSON (or not UTF-8)."),
    (
        ErrorCode.INVALID_REQUEST,
        "Invalid request: not a request, bad id or jsonrpc, too long, too deep, empty batch.",
    ),
    (ErrorCode.METHOD_NOT_FOUND, "Method not found."),
    (ErrorCode.INVALID_PARAMS, "Invalid params: wrong, missing or unknown params, or an invalid value."),
    (ErrorCode.INTERNAL_ERROR, "Internal error: a bug (details on stderr with --debug)."),
    (ErrorCode.RUNTIME_ERROR, "memstrata failed (storage, embedding, ...)."),
    (ErrorCode.BUSY, "The database stayed locked by another process: retry later."),
    (ErrorCode.STOPPED, "The memory system is stopping or stopped."),
)


def build_methods(
    system: Any, workspaces: Workspaces, *, extra_status: Callable[[], Any] | None = None
) -> dict[str, Method]:
    """The method table for a running system and workspace registry."""
    context = Context(system, workspaces, extra_status)
    methods = {
        op.name: Method(op.name, op.params_schema(), _runner(op, context), op.lane, op.summary)
        for op in OPERATIONS
    }
    document = openrpc_document()
    methods["rpc.discover"] = Method(
        "rpc.discover",
        {"type": "object", "properties": {}, "additionalProperties": False},
        lambda _params: document,
        description="This server's OpenRPC document: every method, its params and result.",
    )
    return methods


def _runner(op: Operation, context: Context) -> Callable[[dict[str, Any]], Any]:
    """Run ``op`` with the connection and id of the request being served (for pushed
    notifications)."""

    def run(params: dict[str, Any]) -> Any:
        connection = current_connection()
        ctx = (
            context
            if connection is None
            else dataclasses.replace(context, connection=connection, request_id=current_request_id())
        )
        return op.run(ctx, params)

    return run


def openrpc_document() -> dict[str, Any]:
    """An OpenRPC 1.x document of every operation, generated from the registry."""
    from memstrata import __version__

    return {
        "openrpc": OPENRPC_VERSION,
        "info": {
            "title": "memstrata",
            "version": __version__,
            "description": "Memory for multi-agent systems, as JSON-RPC 2.0 over newline-delimited JSON "
            "(stdin/stdout or a local socket). Blackboard subscriptions push 'signal' notifications, "
            "an index asked for its progress 'index_progress' ones.",
        },
        "methods": [_method_document(op) for op in OPERATIONS],
        "components": {"errors": {code.name: {"code": int(code), "message": text} for code, text in _ERRORS}},
    }


def _method_document(op: Operation) -> dict[str, Any]:
    return {
        "name": op.name,
        "summary": op.summary,
        "tags": [{"name": op.group}],
        "paramStructure": "by-name",
        "params": [
            {
                "name": p.name,
                "description": p.description,
                "required": p.required,
                "schema": dict(p.schema),
            }
            for p in op.params
        ],
        "result": {"name": f"{op.name}_result", "schema": dict(op.result)},
        "x-memstrata": {
            "group": op.group,
            "read_only": op.read_only,
            "destructive": op.destructive,
            "idempotent": op.idempotent,
            "push": op.push,
        },
    }


def method_table() -> str:
    """The Markdown table of methods for docs/bridges.md (kept equal to it by a test)."""
    rows = [
        "| Method | Params (* required) | Effect | What it does |",
        "| --- | --- | --- | --- |",
    ]
    for op in OPERATIONS:
        params = ", ".join(f"`{p.name}`{'*' if p.required else ''}" for p in op.params) or "-"
        summary = op.summary.replace("|", "\\|")
        rows.append(f"| `{op.name}` | {params} | {op.effect.words} | {summary} |")
    rows.append("| `rpc.discover` | - | read-only | This server's OpenRPC document. |")
    return "\n".join(rows) + "\n"
