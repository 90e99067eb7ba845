"""The commands generated from the registry of operations: one per operation, grouped by noun.

``memstrata knowledge store|query|get|list|update|delete``, ``memstrata episodes ...``,
``memstrata working ...``, ``memstrata board ...``, ``memstrata tasks ...``, ``memstrata roots
...``: each command is an operation of the registry, its options the operation's params
(strings, integers and numbers with their bounds, booleans as ``--x/--no-x``, tags as repeatable
``--tag key=value``, JSON values as ``--value JSON``, times as ISO 8601 strings), its help the
params' descriptions, its result the operation's result (``--json``: as JSON). A required
``query``, ``content`` or ``path`` is an argument (``-`` reads the content from stdin). Operations that
push to a connection (``subscribe``/``unsubscribe``) become ``watch``, which subscribes and
prints signals until interrupted or ``--count`` signals came. The few operations that today's
top-level commands already serve (``index``, ``search``, ``get``, ``status``, ``export``,
``import``) keep those commands (:data:`SHORTCUTS`).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from typing import Any, cast

import click

from memstrata.core.errors import InvalidInputError

from . import _cli_shared as sh
from ._app import CliState, NoWorkspaces
from ._cli_board import watch_command
from ._cli_output import echo_result, heartbeat
from ._operation import Operation, Param, search_result
from ._operations import OPERATIONS, Context
from ._schema import check

__all__ = ["GROUPS", "LONG", "SHORTCUTS", "TIME_PARAMS", "command_path", "option_names"]

SHORTCUTS: dict[str, tuple[str, ...]] = {
    "index": ("index",),
    "search_files": ("search",),
    "get_file": ("get",),
    "status": ("status",),
    "export": ("export",),
    "import": ("import",),
}
"""Operations served by a top-level command written by hand (its options and output predate the
registry and stay as they were)."""

_NOUNS = {"files": "roots"}
"""The command noun of a group, where it differs from the group's name."""

TIME_PARAMS = frozenset({"at", "since", "until", "before"})
"""Params that are ISO 8601 date-times (checked here, so the error names the option)."""

LONG = frozenset({"archive_episodes", "restore_episodes"})
"""Operations that can take long: a "still working" line on stderr every few seconds."""

_POSITIONAL = ("query", "content", "path")
_SHORT = {"agent_id": "-a", "session_id": "-s", "top_k": "-k", "category": "-c"}
_FLAG_NAMES = {"agent_id": "agent", "session_id": "session", "tags": "tag"}
_STORE_FILES = {"knowledge": "knowledge", "episodes": "episodic"}
"""Where an agent's data of a group lives on disk (``<data_dir>/<kind>/<agent>.sqlite``)."""


def command_path(op: Operation) -> tuple[str, ...]:
    """The command words that run ``op``: ``("knowledge", "list")``, ``("board", "watch")``, ..."""
    if op.name in SHORTCUTS:
        return SHORTCUTS[op.name]
    noun = _NOUNS.get(op.group, op.group)
    if op.push:
        return (noun, "watch")
    return (noun, op.name.split("_")[0])


def _positional(op: Operation, p: Param) -> bool:
    return p.required and p.name in _POSITIONAL and p.schema.get("type") == "string"


def option_names(op: Operation) -> list[str]:
    """How each param of ``op`` is given on the command line (for the docs), in param order."""
    names = []
    for p in op.params:
        if _positional(op, p):
            names.append(p.name.upper())
        elif p.schema.get("type") == "boolean":
            names.append(f"--[no-]{_flag(p)}")
        else:
            names.append(f"--{_flag(p)}")
    return names


def _flag(p: Param) -> str:
    return _FLAG_NAMES.get(p.name, p.name.replace("_", "-"))


def _click_param(op: Operation, p: Param) -> click.Parameter:
    """The click argument or option for one param, typed and bounded by its JSON Schema."""
    schema = p.schema
    help_text = p.description
    if _positional(op, p):
        return click.Argument([p.name], required=True, metavar=p.name.upper())
    decls = [f"--{_flag(p)}", *([_SHORT[p.name]] if p.name in _SHORT else []), p.name]
    kind = schema.get("type")
    extra: dict[str, Any] = {}
    if kind == "boolean":
        decls = [f"--{_flag(p)}/--no-{_flag(p)}", p.name]
        extra = {"default": None}
    elif kind == "integer":
        extra = {"type": click.IntRange(schema.get("minimum"), schema.get("maximum"))}
    elif kind == "number":
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        extra = {"type": sh.FiniteRange(low, schema.get("maximum"), min_open="exclusiveMinimum" in schema)}
    elif "enum" in schema:
        extra = {"type": click.Choice([str(v) for v in schema["enum"]])}
    elif kind == "object" and p.name == "tags":
        extra = {"multiple": True, "metavar": "KEY[=VALUE]"}
        help_text += (
            " Give --tag key=value once per tag (a bare --tag key has the value ''; --tag '{}' alone, none)."
        )
    elif kind == "array":  # a list of strings (a namespace path): the option once per element
        extra = {"multiple": True, "metavar": "TEXT"}
        help_text += " Give the option once per element, in order."
    elif kind is None or kind == "object":
        extra = {"metavar": "JSON"}
        help_text += ' Written as JSON: 42, true, "text" (with the quotes), {"a": 1}, [1, 2].'
    elif p.name in TIME_PARAMS:
        extra = {"metavar": "TIME"}
        help_text += " ISO 8601 with a time zone, e.g. 2026-05-01T12:00:00Z."
    return click.Option(decls, required=p.required, help=help_text, **extra)


def _json_text(p: Param) -> bool:
    """Whether the option is written as JSON (any value, or an object other than tags)."""
    kind = p.schema.get("type")
    return (kind is None or (kind == "object" and p.name != "tags")) and p.schema.get("enum") is None


def _value(op: Operation, p: Param, raw: Any) -> Any:
    """A click value as the operation's param value, validated by the param's schema."""
    option = p.name.upper() if _positional(op, p) else f"--{_flag(p)}"
    if _json_text(p) and isinstance(raw, str):
        raw = sh.json_text(raw, option)
    elif p.schema.get("type") == "array":
        raw = list(raw)
    elif p.schema.get("type") == "object":
        raw = sh.parse_tags(raw, option)
        if raw is None:
            return None
    elif p.name in TIME_PARAMS:
        sh.when(raw, p.name)  # the operation parses it again; this names the option on an error
    elif _positional(op, p) and p.name == "content":
        raw = sh.content(raw)
    try:
        return check(p.schema, raw, path=option, noun="option")
    except InvalidInputError as exc:
        raise click.BadParameter(str(exc), param_hint=f"'{option}'") from exc


def params_of(op: Operation, given: Mapping[str, Any]) -> dict[str, Any]:
    """The operation's params from a command's click values (left-out options are left out)."""
    params = {}
    for p in op.params:
        raw = given.get(p.name)
        if raw is None or raw == ():
            continue
        value = _value(op, p, raw)
        if value is not None or _json_text(p):  # JSON null, given, is a value
            params[p.name] = value
    return params


_RUN = object()


def _check_as_a_read(op: Operation, params: Mapping[str, Any]) -> None:
    """Refuse what the read's message would refuse (a scope with ``..``, a range that ends before
    it starts, ...), as the running system does, though no system is started to answer it."""
    from memstrata.messages import ListEpisodes, ListKnowledge, Message, QueryKnowledge, SearchMemory

    from ._operation import parse_time

    reads: dict[str, type[Message]] = {
        "query_knowledge": QueryKnowledge,
        "list_knowledge": ListKnowledge,
        "recall": SearchMemory,
        "list_episodes": ListEpisodes,
    }
    message = reads.get(op.name)
    if message is None:
        return
    fields = {f.name for f in dataclasses.fields(message)}
    given = {k: v for k, v in params.items() if k in fields}
    for name in ("since", "until"):
        if isinstance(given.get(name), str):
            given[name] = parse_time(given[name], name)
    message(**given)


def _empty_answer(state: CliState, op: Operation, params: Mapping[str, Any]) -> Any:
    """What a read of an agent with no store on disk answers, without starting the system.

    Starting it would create the agent's stores (and cannot, in a read-only data dir); a read
    of nothing finds nothing. ``_RUN`` when the operation must run.
    """
    kind = _STORE_FILES.get(op.group)
    if not op.read_only or kind is None or "agent_id" not in params:
        return _RUN
    agent, store = params["agent_id"], params.get("store")
    if store not in (None, agent, "shared"):
        return _RUN  # the operation words the error
    state.store_exists(kind, agent)  # a bad agent id is a usage error, whichever store is read
    shared = store == "shared"
    if state.store_exists(kind, "shared" if shared else agent, shared=shared):
        return _RUN
    if params.get("include_shared") and state.store_exists(kind, "shared", shared=True):
        return _RUN
    _check_as_a_read(op, params)
    result = op.result
    if "hits" in result.get("properties", {}):
        return search_result([], [])
    kinds = result.get("type")
    if kinds == "array":
        return []
    if isinstance(kinds, list) and "null" in kinds:
        return None
    return _RUN


def run_operation(state: CliState, op: Operation, params: dict[str, Any]) -> Any:
    """Run ``op`` against the data dir: file operations without the actor system, the rest with it."""
    if op.group == "files":
        with state.workspaces(create=not op.read_only) as registry:
            return op.run(Context(None, registry), params)
    empty = _empty_answer(state, op, params)
    if empty is not _RUN:
        return empty
    with state.system() as system:
        if op.name in LONG:
            with heartbeat(" ".join(command_path(op)), sys.stderr):
                return op.run(Context(system, cast(Any, NoWorkspaces())), params)
        return op.run(Context(system, cast(Any, NoWorkspaces())), params)


class NotFound(click.ClickException):
    """Nothing has the id or key asked for: exit 1, as a search that finds nothing elsewhere."""

    exit_code = 1


_NOT_FOUND = {"knowledge": "knowledge entry", "episodes": "episode", "items": "item"}


def _missing(op: Operation, params: Mapping[str, Any]) -> str:
    """The one-line error of a get that answered null: no such id."""
    asked = ", ".join(
        f"{p.name} {params[p.name]!r}"
        for p in op.params
        if p.name in params and p.name not in ("agent_id", "session_id")
    )
    owner = params.get("agent_id") or params.get("session_id")
    noun = _NOT_FOUND.get(op.group, op.group)
    return f"no {noun} with {asked}" + (f" ({owner})" if owner else "")


def _short_help(summary: str, width: int = 80) -> str:
    """The summary's first clause for a group's command list, cut at a word, not inside one."""
    first = summary.split(";")[0].split(". ")[0]
    if len(first) <= width:
        return first
    return first[: width - 3].rsplit(" ", 1)[0].rstrip(" ,(") + "..."


def _command(op: Operation) -> click.Command:
    def run(**given: Any) -> None:
        ctx = click.get_current_context()
        as_json = bool(given.pop("as_json", False))
        params = params_of(op, given)
        result = run_operation(sh.state(ctx), op, params)
        if result is None:  # a get of an id that does not exist (a key's absence says found: false)
            if as_json:
                sh.echo_json(result)
            raise NotFound(_missing(op, params))
        echo_result(result, as_json)

    params: list[click.Parameter] = [_click_param(op, p) for p in op.params]
    params.append(click.Option(["--json", "as_json"], is_flag=True, help="Print the result as JSON."))
    effect = "Read-only." if op.read_only else ("Destructive." if op.destructive else "Writes.")
    return click.Command(
        command_path(op)[-1],
        callback=run,
        params=params,
        help=f"{op.summary}\n\n{effect} Operation: {op.name}.",
        short_help=_short_help(op.summary),
    )


# -- the groups -----------------------------------------------------------------------------------

_GROUP_HELP = {
    "knowledge": "Long-term knowledge of an agent (and the shared store).",
    "episodes": "An agent's episodes: record, search, list, archive, restore, promote.",
    "working": "Working memory: short-lived keys of an agent or one of its tasks.",
    "board": "A session's blackboard: signals that agents publish and watch.",
    "tasks": "The task lifecycle: retrieval before a task, write-back after it.",
    "roots": "The indexed folders (index, search and get are top-level commands).",
}


def _groups() -> dict[str, click.Group]:
    groups: dict[str, click.Group] = {}
    watched: set[str] = set()
    for op in OPERATIONS:
        if op.name in SHORTCUTS:
            continue
        noun, verb = command_path(op)
        group = groups.get(noun)
        if group is None:
            group = groups[noun] = click.Group(noun, help=_GROUP_HELP.get(noun, f"{noun.capitalize()}."))
        if op.push:
            if noun not in watched and op.name == "subscribe":
                group.add_command(watch_command(op))
                watched.add(noun)
            continue
        if verb in group.commands:  # pragma: no cover - a naming clash, caught by any import
            raise RuntimeError(f"two operations map to 'memstrata {noun} {verb}'")
        group.add_command(_command(op))
    return groups


GROUPS: dict[str, click.Group] = _groups()
"""The command groups, by noun."""
