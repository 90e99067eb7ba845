"""The tools in each format a model or host reads: neutral, Anthropic, OpenAI Chat Completions, OpenAI
Responses (optionally in OpenAI's strict mode), MCP annotations, and the docs' table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._operation import AGENT_ID
from ._tool_defs import Tool
from ._tool_list import TOOLS, find_tool

__all__ = [
    "STRICT_KEYWORDS",
    "anthropic_tools",
    "mcp_annotations",
    "openai_responses_tools",
    "openai_tools",
    "strict_schema",
    "tool_schemas",
    "tools_markdown",
]

# OpenAI strict mode (Structured Outputs "Supported schemas", checked 2026-11; also the rules of
# `strict: true` function calling), what `strict_schema` produces and the tests check:
# - types: string, number, integer, boolean, object, array, null (in a type list), enum, anyOf
#   (nested only: the root is an object, never anyOf);
# - every object lists every property in `required` (optional ones are nullable instead, e.g.
#   "type": ["string", "null"], with null added to an enum) and has "additionalProperties": false;
# - supported keywords: strings `pattern`, `format`; numbers `minimum`, `maximum`,
#   `exclusiveMinimum`, `exclusiveMaximum`, `multipleOf`; arrays `items`, `minItems`, `maxItems`;
#   plus `description`, `enum`, `const`, `$defs`/`$ref`;
# - not supported (left out here; the dispatcher still enforces them, as it validates against the
#   full schema): strings `minLength`, `maxLength`; objects `patternProperties`,
#   `unevaluatedProperties`, `propertyNames`, `minProperties`, `maxProperties`; arrays
#   `unevaluatedItems`, `contains`, `minContains`, `maxContains`, `uniqueItems`; composition
#   `allOf`, `not`, `if`/`then`/`else`, `dependentRequired`, `dependentSchemas`; and `default`,
#   `title`, `examples`; (fine-tuned models also refuse `pattern`, `format`, `minimum`, `maximum`,
#   `multipleOf`: none of the schemas here depends on them for meaning, each says its limits in its
#   description or is checked by the dispatcher);
# - limits: at most 5000 properties in all, 10 levels of nesting, 1000 enum values.
STRICT_KEYWORDS = frozenset(
    {
        "type",
        "description",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "const",
        "anyOf",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
        "$defs",
        "$ref",
    }
)

_AGENT_ID_ARGUMENT = {
    **AGENT_ID.schema,
    "description": "Which agent's memory to use (default: the server's agent).",
}


def _chosen(names: Sequence[str] | None) -> list[Tool]:
    return list(TOOLS) if names is None else [find_tool(n) for n in names]


def tool_schemas(
    names: Sequence[str] | None = None, *, agent_id_argument: bool = False
) -> list[dict[str, Any]]:
    """``[{name, description, parameters}]``: the neutral form the other formats are built from.

    ``agent_id_argument`` adds an optional ``agent_id`` argument (the MCP server's option, where
    one server serves several agents); by default the host binds the agent.
    """
    out = []
    for tool in _chosen(names):
        schema = tool.schema()
        if agent_id_argument:
            schema["properties"]["agent_id"] = dict(_AGENT_ID_ARGUMENT)
        out.append({"name": tool.name, "description": tool.description, "parameters": schema})
    return out


def strict_schema(schema: Mapping[str, Any], *, required: bool = True) -> dict[str, Any]:
    """``schema`` in OpenAI's strict mode: unsupported keywords dropped, every property required,
    the optional ones nullable, ``additionalProperties: false`` on every object."""
    out: dict[str, Any] = {k: v for k, v in schema.items() if k in STRICT_KEYWORDS}
    if "anyOf" in schema:
        options = [strict_schema(o) for o in schema["anyOf"]]
        if not required:
            options.append({"type": "null"})
        out["anyOf"] = options
        return out
    kinds = schema.get("type")
    if kinds is None:
        raise ValueError(f"a strict schema needs a type: {dict(schema)!r:.120}")
    if not required:
        listed = [kinds] if isinstance(kinds, str) else list(kinds)
        out["type"] = listed if "null" in listed else [*listed, "null"]
        if "enum" in out and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
    if "object" in ([kinds] if isinstance(kinds, str) else kinds):
        properties: Mapping[str, Any] = schema.get("properties", {})
        needed = set(schema.get("required", ()))
        out["properties"] = {k: strict_schema(v, required=k in needed) for k, v in properties.items()}
        out["required"] = list(properties)
        out["additionalProperties"] = False
    if "items" in schema:
        out["items"] = strict_schema(schema["items"])
    return out


def _parameters(tool: Mapping[str, Any], strict: bool) -> dict[str, Any]:
    return strict_schema(tool["parameters"]) if strict else dict(tool["parameters"])


def openai_tools(names: Sequence[str] | None = None, *, strict: bool = False) -> list[dict[str, Any]]:
    """Tools for OpenAI Chat Completions: ``{"type": "function", "function": {...}}``.

    ``strict=True`` gives schemas that obey OpenAI's strict mode, with ``"strict": true``: the model
    then sends every argument, ``null`` for the ones it leaves out, which :func:`dispatch` accepts.
    """
    out = []
    for tool in tool_schemas(names):
        function = {**tool, "parameters": _parameters(tool, strict)}
        if strict:
            function["strict"] = True
        out.append({"type": "function", "function": function})
    return out


def openai_responses_tools(
    names: Sequence[str] | None = None, *, strict: bool = False
) -> list[dict[str, Any]]:
    """Tools for the OpenAI Responses API, in its flat format:
    ``{"type": "function", "name", "description", "parameters", "strict"}``."""
    return [
        {
            "type": "function",
            "name": tool["name"],
            "description": tool["description"],
            "parameters": _parameters(tool, strict),
            "strict": strict,
        }
        for tool in tool_schemas(names)
    ]


def anthropic_tools(names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Tools in the Anthropic format (``{"name", "description", "input_schema"}``)."""
    return [
        {"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
        for t in tool_schemas(names)
    ]


def mcp_annotations(tool: Tool) -> dict[str, Any]:
    """MCP tool annotations from the registry's flags (memory is a closed world)."""
    return {
        "title": tool.title,
        "readOnlyHint": tool.read_only,
        "destructiveHint": tool.destructive,
        "idempotentHint": tool.idempotent,
        "openWorldHint": False,
    }


def _yes(flag: bool) -> str:
    return "yes" if flag else ""


def tools_markdown() -> str:
    """The docs' table of tools, generated here so that docs and code cannot drift apart."""
    lines = [
        "| Tool | Runs | Read-only | Destructive | Idempotent | Arguments (* required) | What it does |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for tool in TOOLS:
        args = ", ".join(f"`{p.name}`{'*' if p.required else ''}" for p in tool.params)
        runs = ", ".join(f"`{op.name}`" for op in tool.operations)
        text = tool.description.replace("|", "\\|")
        lines.append(
            f"| `{tool.name}` | {runs} | {_yes(tool.read_only)} | {_yes(tool.destructive)} | "
            f"{_yes(tool.idempotent)} | {args} | {text} |"
        )
    return "\n".join(lines) + "\n"
