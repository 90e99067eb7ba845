"""The one registry of operations that every door serves.

An :class:`Operation` names a capability once: its params (a JSON Schema of one type each, with a
description), the shape of its result, what it does to memory (read-only, destructive,
idempotent), the lane that orders it among concurrent requests, and how it runs on a running
system. The JSON-RPC server, the MCP server, the LLM tool exports and the CLI are translations
of this table, so a capability added here is offered by all of them, with the same names, the
same validation and the same documentation. Operations are declared by concept in the
``_ops_*`` modules.
"""

from __future__ import annotations

from collections.abc import Iterator

from memstrata.core.errors import InvalidInputError

from . import _ops_agent, _ops_board, _ops_files, _ops_items, _ops_knowledge, _ops_system
from ._operation import Context, Operation, Param, parse_time

__all__ = ["OPERATIONS", "Context", "Operation", "Param", "by_group", "find", "parse_time"]

OPERATIONS: tuple[Operation, ...] = (
    *_ops_knowledge.OPERATIONS,
    *_ops_agent.OPERATIONS,
    *_ops_board.OPERATIONS,
    *_ops_items.OPERATIONS,
    *_ops_files.OPERATIONS,
    *_ops_system.OPERATIONS,
)

_BY_NAME = {op.name: op for op in OPERATIONS}
if len(_BY_NAME) != len(OPERATIONS):  # pragma: no cover - a programming error, caught by any import
    raise RuntimeError("two operations share a name")


def find(name: str) -> Operation:
    """The operation called ``name``; a clear error naming it otherwise."""
    op = _BY_NAME.get(name)
    if op is None:
        raise InvalidInputError(f"unknown operation {name[:64]!r}")
    return op


def by_group() -> Iterator[tuple[str, list[Operation]]]:
    """Operations grouped by noun, in registry order (for the CLI and the docs)."""
    groups: dict[str, list[Operation]] = {}
    for op in OPERATIONS:
        groups.setdefault(op.group, []).append(op)
    yield from groups.items()
