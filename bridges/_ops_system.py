"""Operations on the whole system: export and import of every memory as JSON lines."""

from __future__ import annotations

from typing import Any

from ._operation import Context, Effect, OperationList, Param, path_string, returns

_OPS = OperationList()

_PATH = Param(
    "path",
    path_string("A file on the machine that runs memstrata (JSON lines, one object per line)."),
    True,
)


@_OPS.add(
    "export",
    "system",
    "Write every agent's knowledge, the shared store, episodes (archives too), working memory, "
    "blackboards and items to a file as sorted JSON lines, for diffs, backups and moves.",
    (_PATH,),
    returns(path="string", lines="integer"),
    Effect.READS,
)
def _export(ctx: Context, p: dict[str, Any]) -> Any:
    return {"path": p["path"], "lines": ctx.system.export(p["path"])}


@_OPS.add(
    "import",
    "system",
    "Restore a file written by export into this system (episodes already present are skipped).",
    (_PATH,),
    {
        "type": "object",
        "properties": {
            "knowledge": {"type": "integer"},
            "episode": {"type": "integer"},
            "working": {"type": "integer"},
            "signal": {"type": "integer"},
            "skipped": {"type": "integer"},
        },
    },
    Effect.ADDS,
)
def _import(ctx: Context, p: dict[str, Any]) -> Any:
    return ctx.system.import_(p["path"])


OPERATIONS = tuple(_OPS.items)
