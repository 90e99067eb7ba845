"""What an operation is: its params, result, effects and lane, and the words its params are made of.

An :class:`Operation` names a capability once: its params (a JSON Schema of one type each, with a
description), the shape of its result, what it does to memory (read-only, destructive,
idempotent), the lane that orders it among concurrent requests, and how it runs on a running
system. The JSON-RPC server, the MCP server, the LLM tool exports and the CLI are translations
of this table, so a capability added here is offered by all of them, with the same names, the
same validation and the same documentation.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memstrata.core.constants import (
    AGENT_ID_PATTERN,
    CATEGORY_PATTERN,
    MAX_ENTRY_ID,
    MAX_KEY_CHARS,
    MAX_OFFSET,
    MAX_PATH_CHARS,
    MAX_SCOPE_CHARS,
    MAX_TAG_KEY_CHARS,
    MAX_TAG_VALUE_CHARS,
    MAX_TAGS,
    MAX_TASK_ID_CHARS,
    MAX_TITLE_CHARS,
    MAX_TOP_K,
)
from memstrata.core.errors import InvalidInputError
from memstrata.core.validation import read_iso_datetime

from ._schema import pattern

if TYPE_CHECKING:
    from memstrata._workspaces import Workspaces

__all__ = [
    "AGENT_ID",
    "CATEGORY",
    "ENTRY_ID",
    "HITS",
    "KIND",
    "MAX_FILE_LINES",
    "MAX_FROM_LINE",
    "NOT_BLANK",
    "NO_CONTROL",
    "NO_NUL",
    "OBJECT",
    "QUERY",
    "QUEUED",
    "SCOPE",
    "SCORE",
    "SEARCH_RESULT",
    "SESSION_ID",
    "STORE",
    "TAGS_SCHEMA",
    "TAG_KEY",
    "TEXT",
    "TIME",
    "TITLE",
    "TOP_K",
    "Context",
    "Effect",
    "Lane",
    "Operation",
    "OperationList",
    "Param",
    "Runner",
    "agent_lane",
    "files_lane",
    "id_schema",
    "key_schema",
    "object_schema",
    "offset",
    "parse_time",
    "path_string",
    "pattern",
    "pick",
    "returns",
    "row_id",
    "search_result",
    "session_lane",
    "string",
    "task_id_schema",
    "text_schema",
    "times",
]


@dataclass(frozen=True, slots=True)
class Param:
    """One named parameter: its JSON Schema (one type, with a description) and whether it is required."""

    name: str
    schema: Mapping[str, Any]
    required: bool = False

    @property
    def description(self) -> str:
        return str(self.schema.get("description", ""))


def object_schema(params: Sequence[Param]) -> dict[str, Any]:
    """``params`` as one JSON Schema object (unknown params rejected), each param's schema a
    copy of its own, which the caller may change."""
    return {
        "type": "object",
        "properties": {p.name: _copy(p.schema) for p in params},
        "required": [p.name for p in params if p.required],
        "additionalProperties": False,
    }


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(v) for v in value]
    return value


@dataclass(slots=True)
class Context:
    """What an operation runs against: the system, the indexed roots, and server extras."""

    system: Any
    workspaces: Workspaces
    extra_status: Callable[[], Any] | None = None
    connection: Any = None
    """The client connection a request came on, for operations that push to it (``subscribe``,
    ``index`` with ``progress``); ``None`` in doors without push (CLI, MCP, tools), where those
    operations say so."""
    request_id: Any = None
    """The id of that request (``None``: a notification, or a door without push), which a
    pushed progress report names."""

    def agent(self, params: Mapping[str, Any]) -> Any:
        return self.system.agent(params["agent_id"])

    def board(self, params: Mapping[str, Any]) -> Any:
        return self.system.blackboard(params["session_id"])


Runner = Callable[[Context, dict[str, Any]], Any]
Lane = Callable[[Mapping[str, Any]], str | None]


def _no_lane(params: Mapping[str, Any]) -> str | None:
    return None


def agent_lane(params: Mapping[str, Any]) -> str | None:
    """Requests for one agent run in order; different agents run concurrently."""
    return f"agent:{params['agent_id']}"


def session_lane(params: Mapping[str, Any]) -> str | None:
    return f"session:{params['session_id']}"


def files_lane(params: Mapping[str, Any]) -> str | None:
    return "files"


class Effect(enum.Enum):
    """What an operation does to memory, in the terms of MCP's tool hints: (read-only,
    destructive, idempotent). One name per combination that makes sense, so no operation can
    claim to be read-only and destructive at once."""

    READS = (True, False, True)  # changes nothing, so repeating it is harmless too
    ADDS = (False, False, False)  # each call adds something (an entry, an episode, an outcome)
    SETS = (False, False, True)  # the same call again leaves memory as the first one left it
    OVERWRITES = (False, True, True)  # removes or replaces what was there

    @property
    def words(self) -> str:
        """How the docs' method table says it."""
        if self is Effect.READS:
            return "read-only"
        return ("destructive" if self.value[1] else "writes") + (", idempotent" if self.value[2] else "")


@dataclass(frozen=True, slots=True)
class Operation:
    """A capability: name, doc, typed params, result shape, effects, lane and implementation."""

    name: str
    group: str  # the noun the CLI files it under: knowledge, episodes, working, board, tasks, files, system
    summary: str
    params: tuple[Param, ...]
    result: Mapping[str, Any]
    run: Runner
    effect: Effect
    lane: Lane = field(default=_no_lane)
    push: bool = False
    """It pushes notifications to the client's connection (``subscribe``): only doors with a
    connection (``memstrata serve``) offer it; doors without push leave it out or adapt it."""

    @property
    def read_only(self) -> bool:
        return self.effect.value[0]

    @property
    def destructive(self) -> bool:
        return self.effect.value[1]

    @property
    def idempotent(self) -> bool:
        return self.effect.value[2]

    def params_schema(self) -> dict[str, Any]:
        """The params as one JSON Schema object (unknown params rejected)."""
        return object_schema(self.params)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)


class OperationList:
    """Operations of one module, declared next to their implementation with :meth:`add`."""

    def __init__(self) -> None:
        self.items: list[Operation] = []

    def add(
        self,
        name: str,
        group: str,
        summary: str,
        params: tuple[Param, ...],
        result: Mapping[str, Any],
        effect: Effect,
        *,
        lane: Lane = _no_lane,
        push: bool = False,
    ) -> Callable[[Runner], Runner]:
        def register(run: Runner) -> Runner:
            self.items.append(Operation(name, group, summary, params, result, run, effect, lane, push))
            return run

        return register


# -- parameter and result vocabulary ----------------------------------------------------------


def string(description: str, *, max_length: int | None = None, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "description": description, **extra}
    if max_length is not None:
        schema["maxLength"] = max_length
    return schema


def path_string(description: str) -> dict[str, Any]:
    """A file or folder path param: never empty (``""`` would mean the current folder of the
    process that serves, which no caller means). What else a path must be (valid UTF-8, no
    NUL) is checked where it is used, by :func:`memstrata.core.validation.check_path`."""
    return string(description, max_length=MAX_PATH_CHARS, minLength=1)


def _whole(regex: str) -> str:
    """``regex`` (matched whole by :mod:`memstrata.core.validation`) as a JSON Schema pattern,
    which matches anywhere unless anchored."""
    return f"^{regex}$" if "|" not in regex else f"^(?:{regex})$"


# The param schemas state the rules of memstrata.core.validation that JSON Schema can say (so a
# client that validates before sending is refused what the code refuses), built from its
# constants. What JSON Schema cannot say simply (an id ending with '.', a reserved device name,
# lone surrogates, a content size in UTF-8 bytes) is still refused by the code, in one line.
ID_RULE = pattern(
    _whole(AGENT_ID_PATTERN),
    f"match {AGENT_ID_PATTERN} (letters, digits, '_', '-' or '.', starting with a letter or digit)",
)
CATEGORY_RULE = pattern(
    _whole(CATEGORY_PATTERN),
    f"match {CATEGORY_PATTERN} (lowercase letters, digits, '_' and '-', e.g. 'pitfall')",
)
# the line bounds a file read keeps (the file layer's own checks)
MAX_FROM_LINE = 2**31
MAX_FILE_LINES = 100_000
NOT_BLANK = pattern(r"\S", "not be blank")
_NO_CONTROL = r"[^\x00-\x1f\x7f]"
NO_CONTROL = pattern(f"^{_NO_CONTROL}*$", "not contain control characters")
NO_NUL = pattern(r"^[^\x00]*$", "not contain NUL characters")
_TASK_TEXT = rf"{_NO_CONTROL}*[^\s\x00-\x1f\x7f]{_NO_CONTROL}*"
TASK_RULE = pattern(f"^{_TASK_TEXT}$", "not be blank nor contain control characters")
OPT_TASK_RULE = pattern(f"^(?:{_TASK_TEXT})?$", "be empty, or not blank and without control characters")


def id_schema(description: str) -> dict[str, Any]:
    """An agent or session id (a file name): the pattern of :data:`AGENT_ID_PATTERN`."""
    return string(description, pattern=ID_RULE)


def task_id_schema(description: str, *, optional: bool = False) -> dict[str, Any]:
    """A task or task-run id; ``optional``: ``""`` is accepted too and means none."""
    if optional:
        return string(description, max_length=MAX_TASK_ID_CHARS, pattern=OPT_TASK_RULE)
    return string(description, max_length=MAX_TASK_ID_CHARS, minLength=1, pattern=TASK_RULE)


def key_schema(description: str, **extra: Any) -> dict[str, Any]:
    """A working-memory or blackboard key: 1 to :data:`MAX_KEY_CHARS` characters, no NUL."""
    return string(description, max_length=MAX_KEY_CHARS, **{"minLength": 1, "pattern": NO_NUL, **extra})


def text_schema(description: str) -> dict[str, Any]:
    """Free text that must say something (not empty, not only whitespace)."""
    return string(description, minLength=1, pattern=NOT_BLANK)


AGENT_ID = Param("agent_id", id_schema("The agent whose memory this is."), True)
SESSION_ID = Param("session_id", id_schema("The session whose blackboard this is."), True)
QUERY = Param("query", string("What to look for."), True)
# a tag key as check_tags takes it: 1-128 characters, not blank, no control characters
TAG_KEY: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_TAG_KEY_CHARS,
    "pattern": pattern(
        rf"^{_NO_CONTROL}*[^\s\x00-\x1f\x7f]{_NO_CONTROL}*$", "not be blank nor contain control characters"
    ),
}
TAGS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "propertyNames": TAG_KEY,
    "additionalProperties": {"type": "string", "maxLength": MAX_TAG_VALUE_CHARS},
    "maxProperties": MAX_TAGS,
    "description": 'Tags as {"key": "value"}; a bare tag has the value "". A filter matches entries '
    'that have every given key with the given value ("" matches any value). A key may hold "=": the '
    "tools' and the CLI's key=value strings end a key at the first '=', so they cannot name it.",
}
TOP_K = {"type": "integer", "minimum": 1, "maximum": MAX_TOP_K, "description": "How many hits at most."}
SCORE = {
    "type": "number",
    "minimum": -1,
    "maximum": 1,
    "description": "Cosine-similarity floor for the semantic side, -1 to 1: semantic candidates below "
    "it are left out; keyword matches are kept whatever their similarity.",
}
# RFC 3339 allows a leap second (23:59:60Z), which no datetime holds: minutes and seconds (and an
# offset's minutes) are 00-59, the one digit after each ':' at most 5
TIME = string(
    "An ISO 8601 date-time with a time zone, e.g. 2026-05-01T12:00:00Z (no leap second :60).",
    max_length=64,
    format="date-time",
    pattern=pattern(
        "^(?:[^:]|:[0-5])*$", "be a date-time with minutes and seconds 00-59 (a leap second :60 is not taken)"
    ),
)
CATEGORY = string(
    "Category: outcome, pitfall, pattern, codebase, preference, or any [a-z0-9][a-z0-9_-]* name.",
    pattern=CATEGORY_RULE,
)
SCOPE = string(
    "A path-like scope such as /src/auth ('/' is everything).", max_length=MAX_SCOPE_CHARS, pattern=NO_CONTROL
)
STORE = id_schema("Which store the entry is in: the agent's id (the default) or 'shared'.")
TITLE = string("A short title.", max_length=MAX_TITLE_CHARS)


def row_id(description: str) -> dict[str, Any]:
    """An entry's or episode's id: what :data:`MAX_ENTRY_ID` allows."""
    return {"type": "integer", "minimum": 1, "maximum": MAX_ENTRY_ID, "description": description}


def offset(description: str) -> dict[str, Any]:
    """How many rows of a listing to skip: what :data:`MAX_OFFSET` allows."""
    return {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET, "description": description}


ENTRY_ID = row_id("The entry's id within its store.")

OBJECT: dict[str, Any] = {"type": "object"}
HITS = {"type": "array", "items": OBJECT, "description": "Hits, best first."}
SEARCH_RESULT: dict[str, Any] = {
    "type": "object",
    "description": "Hits best first; complete is false when part of the data was not searched yet "
    "(a sync still running), degraded says why ranking fell back to keywords (else null), "
    "warnings name what was skipped (e.g. a missing folder).",
    "properties": {
        "hits": {"type": "array", "items": OBJECT},
        "complete": {"type": "boolean"},
        "degraded": {"type": ["string", "null"]},
        "warnings": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["hits", "complete", "degraded", "warnings"],
}


def search_result(found: Any, hits: list[Any]) -> dict[str, Any]:
    """The one shape of every search result: ``hits`` plus what ``found`` (the search's own
    result list) reports about completeness, degradation and skipped parts."""
    degraded = getattr(found, "degraded", None)
    return {
        "hits": hits,
        "complete": bool(getattr(found, "complete", True)),
        "degraded": None if degraded is None else str(degraded),
        "warnings": [str(w) for w in getattr(found, "warnings", None) or ()],
    }


def returns(**fields: str) -> dict[str, Any]:
    """The schema of a result object: each field's JSON type (``"any"``: any value)."""
    properties = {name: {} if kind == "any" else {"type": kind} for name, kind in fields.items()}
    return {"type": "object", "properties": properties}


QUEUED = returns(task_id="string", queued="boolean", outbox_id="any")


def parse_time(value: str, name: str) -> dt.datetime:
    """An ISO 8601 date-time that must carry a time zone (``Z`` accepted)."""
    try:
        parsed = read_iso_datetime(value)
    except ValueError as exc:
        raise InvalidInputError(f"{name} must be an ISO 8601 date-time, got {value[:64]!r}") from exc
    if parsed.tzinfo is None:
        raise InvalidInputError(f"{name} must include a time zone (e.g. 2024-05-01T12:00:00Z), got {value!r}")
    return parsed


def pick(params: Mapping[str, Any], *names: str) -> dict[str, Any]:
    """The optional params that were given (the rest keep the Python API's defaults)."""
    return {name: params[name] for name in names if name in params and params[name] is not None}


def times(params: Mapping[str, Any], *names: str) -> dict[str, Any]:
    return {name: parse_time(params[name], name) for name in names if params.get(name) is not None}


TEXT = "The text."
KIND = {"type": "string", "enum": ["auto", "memory", "code"], "description": "What the folder holds."}
