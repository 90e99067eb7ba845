"""Memory tools for LLM function calling, derived from the registry of operations, and a dispatcher.

Hand :func:`anthropic_tools`, :func:`openai_tools` (``strict=True`` for OpenAI's strict mode) or
:func:`openai_responses_tools` to the model, then pass each tool call to :func:`dispatch`. The
dispatcher never raises: a bad call (unknown tool, wrong types, unknown or missing arguments) or a
failure comes back as ``{"error": "..."}`` so the model can read it and correct itself. The agent
is bound by the host (``agent_id=``), never chosen by the model.

The tools: ``memory_search`` / ``memory_get`` / ``memory_add`` (alias ``memory_save``) /
``memory_list`` / ``memory_delete`` (indexed files plus saved memories, see
:mod:`memstrata.bridges._tool_memory`), and one tool per registry operation for knowledge
(``knowledge_query|store|get|update|delete|list``), episodes (``episode_remember|recall|list``),
working memory (``working_set|get|clear``) and the blackboard (``blackboard_publish|get|list``).
Tags are ``"key"`` / ``"key=value"`` strings in every tool (see :mod:`memstrata.bridges._tool_defs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from memstrata.core.errors import InvalidInputError, MemstrataError
from memstrata.core.validation import check_agent_id

from . import _tool_exports
from ._json import MAX_DEPTH, RangeError, dumps, json_depth, loads
from ._schema import check, describe_type
from ._tool_defs import Tool, ToolContext
from ._tool_exports import *  # noqa: F403 - the formats, listed once in their module
from ._tool_list import TOOL_NAMES, TOOLS
from ._tool_memory import MEMORY_CATEGORY

if TYPE_CHECKING:
    from memstrata._workspaces import Workspaces

__all__ = ["MEMORY_CATEGORY", "TOOLS", "TOOL_NAMES", "Tool", "dispatch", "dispatch_json"]
__all__.extend(_tool_exports.__all__)

_BY_NAME = {t.name: t for t in TOOLS}
_SCHEMAS = {t.name: t.schema() for t in TOOLS}


def _parse_arguments(arguments: Any) -> Any:
    if arguments is None:
        return {}
    if isinstance(arguments, bytes | bytearray | memoryview):
        arguments = bytes(arguments)  # read as UTF-8 by loads_value, which names a bad byte
    if isinstance(arguments, str | bytes):
        if not arguments.strip():
            return {}
        try:  # escaped lone surrogates read, as memstrata serve reads them
            arguments = loads(arguments, lone_surrogates=True)
        except RangeError as exc:
            raise InvalidInputError(f"arguments: {exc}") from exc
        except ValueError as exc:
            raise InvalidInputError(f"arguments are not valid JSON: {exc}") from exc
    if not isinstance(arguments, Mapping):
        raise InvalidInputError(f"arguments must be a JSON object, got {describe_type(arguments)}")
    if json_depth(arguments) > MAX_DEPTH:
        raise InvalidInputError(f"arguments are nested deeper than {MAX_DEPTH} levels")
    return arguments


def _without_nulls(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """A strict-mode model sends ``null`` for every optional argument it leaves out: drop those
    (a required one stays, and fails validation with a clear message; so does a name the tool
    does not declare, which is refused as unknown whatever its value)."""
    optional = set(schema["properties"]) - set(schema["required"])
    return {k: v for k, v in arguments.items() if v is not None or k not in optional}


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

    ``arguments`` may be a dict or the JSON string a model produced (``null`` for an optional
    argument means "left out"). ``system`` is a running :class:`memstrata.MemorySystem`;
    ``agent_id`` the agent whose memory the call uses; ``workspaces`` the file-index registry (by
    default the one in the system's data dir).
    """
    try:
        if not isinstance(name, str) or name not in _BY_NAME:
            shown = name if isinstance(name, str) else describe_type(name)
            return _error(f"unknown tool {shown!r} (available: {', '.join(TOOL_NAMES)})")
        schema = _SCHEMAS[name]
        given = _without_nulls(schema, _parse_arguments(arguments))
        if isinstance(given.get("tags"), str) and "tags" in schema["properties"]:
            raise InvalidInputError(
                'argument \'tags\' must be an array of "key" or "key=value" strings, e.g. ["area=db", '
                f'"urgent"], got a string ({given["tags"][:40]!r})'
            )
        args = check(schema, given)
        check_agent_id(agent_id)
        return _BY_NAME[name].run(ToolContext(system, agent_id, workspaces), args)
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
