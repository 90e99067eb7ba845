"""Operations on the whole system: export and import of every memory as JSON lines."""

from __future__ import annotations

from pathlib import Path
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
    "blackboards and items to a file as sorted JSON lines, for diffs, backups and moves; "
    "answers the file's absolute path.",
    (_PATH,),
    returns(path="string", lines="integer"),
    Effect.READS,
)
def _export(ctx: Context, p: dict[str, Any]) -> Any:
    lines = ctx.system.export(p["path"])
    # where the file is: a relative path is the server's folder's, which its client cannot know
    return {"path": str(Path(p["path"]).expanduser().absolute()), "lines": lines}


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
