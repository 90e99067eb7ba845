"""What an agent-facing tool is: a registry operation (or a few) with the name and words a model sees.

A :class:`Tool` is either *derived* from one operation of the registry (:func:`derived`: its params
minus ``agent_id``, which the host binds, with the two shapes a model handles better replaced, see
below) or a *composite* that runs several operations (the ``memory_*`` tools). Its effects
(read-only, destructive, idempotent) are those of the operations it runs, so the MCP annotations
and the docs cannot claim what the registry does not.

Two param shapes differ from the registry's, for every tool and every export alike:

- ``tags`` is an array of ``"key"`` / ``"key=value"`` strings (split at the first ``=``; a bare key
  has the value ``""``). The registry's map (``{"key": "value"}``) cannot be written in OpenAI's
  strict mode (an object there must list its properties), an array of ``{"key", "value"}`` objects
  costs a model twice the tokens and forces ``"value": ""`` on bare tags, and strings are what the
  CLI takes (``--tag key=value``). A key cannot contain ``=``, nor come twice with two values.
- a JSON ``value`` (working memory, blackboard) is JSON *text*: strict mode cannot express "any JSON
  value". Text that is not valid JSON is kept as that string; an object param given as text (an
  item's value, a filter) is refused with the JSON error instead.
"""

from __future__ import annotations

import atexit
import functools
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from memstrata.core.constants import MAX_TAG_KEY_CHARS, MAX_TAG_VALUE_CHARS, MAX_TAGS
from memstrata.core.errors import InvalidInputError, MemstrataError

from ._json import loads_value, not_json
from ._operation import Context, Operation, Param, object_schema, pattern
from ._operations import OPERATIONS

if TYPE_CHECKING:
    from memstrata._workspaces import Workspaces

__all__ = [
    "JSON_TEXT",
    "TAGS",
    "TAGS_FILTER",
    "TAG_LIMITS",
    "Tool",
    "ToolContext",
    "derived",
    "json_value",
    "tags_map",
]

# what the pattern below cannot say: the bounds on each side of the "="
TAG_LIMITS = f"a key holds at most {MAX_TAG_KEY_CHARS} characters, a value {MAX_TAG_VALUE_CHARS:,}"
TAGS: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_TAG_KEY_CHARS + 1 + MAX_TAG_VALUE_CHARS,
        "pattern": pattern(
            r"^[^=\x00-\x1f\x7f]*[^=\s\x00-\x1f\x7f][^=\x00-\x1f\x7f]*(?:=[\s\S]*)?$",
            "start with a key that is not blank nor holds control characters (key or key=value)",
        ),
    },
    "maxItems": MAX_TAGS,
    "description": f'Tags as "key=value" or bare "key" strings, e.g. ["area=db", "urgent"]; the key ends at '
    f"the first '='; {TAG_LIMITS}.",
}
TAGS_FILTER: dict[str, Any] = {
    **TAGS,
    "description": 'Only entries with every one of these tags, as "key=value" or bare "key" strings '
    "(a bare key matches any value).",
}
JSON_TEXT: dict[str, Any] = {
    "type": "string",
    "maxLength": 1_000_000,
    "description": 'The value as JSON text, e.g. 42, "done" or {"step": 3}; text that is not valid JSON '
    "is stored as that string.",
}
# a JSON object param sent as text: braces around it (the parse then says what else is wrong)
JSON_OBJECT_TEXT: dict[str, Any] = {
    "type": "string",
    "maxLength": 1_000_000,
    "pattern": pattern(r"^\s*\{[\s\S]*\}\s*$", "be JSON object text, {...}"),
}


def tags_map(value: list[str] | None) -> dict[str, str] | None:
    """Tool tags (``"key"`` / ``"key=value"`` strings) as the registry's map. A key given twice
    with two values is refused (naming the tag), as no value of the two is what was meant; the
    same tag twice is that tag."""
    if value is None:
        return None
    tags: dict[str, str] = {}
    for item in value:
        key, _, val = item.partition("=")
        if not key.strip():
            raise InvalidInputError(f"tag {item[:64]!r} has an empty key (write key or key=value)")
        if tags.get(key, val) != val:
            raise InvalidInputError(
                f"tag {key[:64]!r} is given twice with different values ({tags[key][:40]!r} and {val[:40]!r})"
            )
        tags[key] = val
    return tags


def json_value(text: str, name: str = "value", *, object_text: bool = False) -> Any:
    """JSON text as its value; text that is not JSON is the string itself, unless ``object_text``
    (the param is an object, which a string never is: the JSON error says what is wrong). An
    integer beyond 64 bits or a number beyond a double is refused: neither a float nor the text
    is what the model wrote; so is JSON nested deeper than the doors read."""
    try:
        return loads_value(text)
    except ValueError as exc:
        if not not_json(exc):  # JSON, but refused: storing the text would not be what was meant
            raise InvalidInputError(f"argument {name!r}: {exc}") from None
        if object_text:
            raise InvalidInputError(f"argument {name!r} is not JSON object text: {exc}") from None
        return text


@dataclass(slots=True)
class ToolContext:
    """What a tool call runs against: the system, the agent the host bound, the file registry."""

    system: Any
    agent_id: str
    workspaces: Workspaces | None

    def agent(self) -> Any:
        return self.require_system().agent(self.agent_id)

    def require_system(self) -> Any:
        if self.system is None:
            raise MemstrataError("no memory system was given to the dispatcher")
        return self.system

    def files(self) -> Workspaces:
        if self.workspaces is None:
            self.workspaces = default_workspaces(self.require_system())
        return self.workspaces

    def operation_context(self, op: Operation) -> Context:
        system = self.require_system()
        workspaces = self.files() if op.group in ("files", "system") else cast("Workspaces", None)
        return Context(system, workspaces)


Runner = Callable[[ToolContext, dict[str, Any]], Any]


@dataclass(frozen=True, slots=True)
class Tool:
    """One agent-facing tool: its name, words, params and the operations it runs."""

    name: str
    title: str
    description: str
    params: tuple[Param, ...]
    run: Runner
    operations: tuple[Operation, ...] = field(default=())

    @property
    def read_only(self) -> bool:
        return all(op.read_only for op in self.operations)

    @property
    def destructive(self) -> bool:
        return any(op.destructive for op in self.operations)

    @property
    def idempotent(self) -> bool:
        return all(op.idempotent or op.read_only for op in self.operations)

    def schema(self) -> dict[str, Any]:
        """The params as one JSON Schema object (unknown params rejected)."""
        return object_schema(self.params)


_BY_NAME = {op.name: op for op in OPERATIONS}


def operation(name: str) -> Operation | None:
    """The registry operation ``name``, or ``None`` when this build does not have it."""
    return _BY_NAME.get(name)


def derived(
    name: str,
    op_name: str,
    title: str,
    description: str | None = None,
    *,
    require: tuple[str, ...] = (),
    bind_agent: tuple[str, ...] = (),
    describe: Mapping[str, str] | None = None,
    shape: Callable[[Any], Any] | None = None,
    json_text: tuple[str, ...] = (),
) -> Tool | None:
    """A tool that runs one operation: its params minus ``agent_id`` (bound by the host) and the
    params in ``bind_agent`` (set to the agent's id too, e.g. a signal's publisher), with tags and
    JSON values in their tool shapes; ``require`` makes optional params required, ``describe``
    words a param for the tool, ``json_text`` passes JSON object params as JSON text (strict
    mode cannot say "any object"). ``None`` when the registry has no such operation."""
    op = operation(op_name)
    if op is None:
        return None
    params: list[Param] = []
    converters: dict[str, Callable[[Any], Any]] = {}
    for p in op.params:
        if p.name == "agent_id" or p.name in bind_agent:
            continue
        schema: Mapping[str, Any] = p.schema
        if p.name == "tags":
            schema, converters[p.name] = (TAGS_FILTER if op.read_only else TAGS), tags_map
        elif ("type" not in schema and "anyOf" not in schema) or p.name in json_text:  # any JSON
            schema = JSON_OBJECT_TEXT if p.name in json_text else JSON_TEXT
            converters[p.name] = functools.partial(json_value, name=p.name, object_text=p.name in json_text)
        if describe and p.name in describe:
            schema = {**schema, "description": describe[p.name]}
        params.append(Param(p.name, schema, p.required or p.name in require))
    agent_param = any(p.name == "agent_id" for p in op.params)

    def run(ctx: ToolContext, args: dict[str, Any]) -> Any:
        call = {key: converters[key](v) if key in converters else v for key, v in args.items()}
        if agent_param:
            call["agent_id"] = ctx.agent_id
        for bound in bind_agent:
            call[bound] = ctx.agent_id
        result = op.run(ctx.operation_context(op), call)
        return result if shape is None else shape(result)

    return Tool(name, title, description or op.summary, tuple(params), run, (op,))


# -- the default file-index registry -------------------------------------------------------------

_REGISTRIES: weakref.WeakKeyDictionary[Any, Workspaces] = weakref.WeakKeyDictionary()
_REGISTRY_LOCK = threading.Lock()


def default_workspaces(system: Any) -> Workspaces:
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
