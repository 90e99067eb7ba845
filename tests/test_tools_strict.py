"""OpenAI strict mode, the Responses format and the docs' tool table, checked against the rules.

The strict-mode checker below is written from OpenAI's published rules (Structured Outputs,
"Supported schemas"), independently of the exporter's own keyword list, so a schema the exporter
gets wrong fails here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from memstrata import MemorySystem
from memstrata._workspaces import Workspaces
from memstrata.bridges import tools
from memstrata.bridges.doc_tables import render
from tests._support import TOOL_ARGUMENTS, system_with_notes

REPO = Path(__file__).resolve().parent.parent

_TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
_ALLOWED = {
    # structure and words
    "type", "description", "properties", "required", "additionalProperties", "items", "enum", "const",
    "anyOf", "$defs", "$ref",
    # strings, numbers, arrays
    "pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minItems", "maxItems",
}  # fmt: skip


def strict_violations(schema: Mapping[str, Any]) -> list[str]:
    """Every way ``schema`` (a function's parameters) breaks OpenAI's strict mode."""
    problems: list[str] = []
    if schema.get("type") != "object" or "anyOf" in schema:
        problems.append("root: must be an object, not anyOf")
    counts = {"properties": 0, "enums": 0}

    def walk(node: Any, where: str, depth: int) -> None:
        if not isinstance(node, Mapping):
            problems.append(f"{where}: not a schema")
            return
        for key in node:
            if key not in _ALLOWED:
                problems.append(f"{where}: unsupported keyword {key!r}")
        if "anyOf" in node:
            for i, option in enumerate(node["anyOf"]):
                walk(option, f"{where}.anyOf[{i}]", depth)
            return
        kinds = node.get("type")
        listed = [kinds] if isinstance(kinds, str) else list(kinds or [])
        if not listed or not set(listed) <= _TYPES:
            problems.append(f"{where}: needs a supported type, has {kinds!r}")
        if "enum" in node:
            counts["enums"] += len(node["enum"])
            if "null" in listed and None not in node["enum"]:
                problems.append(f"{where}: nullable enum without null")
        if "object" in listed:
            if depth > 10:
                problems.append(f"{where}: nested deeper than 10 levels")
            properties = node.get("properties", {})
            counts["properties"] += len(properties)
            if node.get("additionalProperties") is not False:
                problems.append(f"{where}: additionalProperties must be false")
            if sorted(node.get("required", [])) != sorted(properties):
                problems.append(f"{where}: every property must be required")
            for name, child in properties.items():
                if not isinstance(child, Mapping) or not child.get("description"):
                    problems.append(f"{where}.{name}: no description")
                walk(child, f"{where}.{name}", depth + 1)
        if "array" in listed:
            if "items" not in node:
                problems.append(f"{where}: array without items")
            else:
                walk(node["items"], f"{where}[]", depth)

    walk(schema, "parameters", 1)
    if counts["properties"] > 5000:
        problems.append("more than 5000 properties")
    if counts["enums"] > 1000:
        problems.append("more than 1000 enum values")
    return problems


def _nullable(schema: Mapping[str, Any]) -> bool:
    if "anyOf" in schema:
        return any(_nullable(option) for option in schema["anyOf"])
    kinds = schema.get("type")
    return kinds == "null" or (isinstance(kinds, list) and "null" in kinds)


def test_the_checker_finds_the_violations_of_the_plain_schemas() -> None:
    """Without strict, the schemas have optional properties and length limits: the checker says so."""
    plain = {t["function"]["name"]: t["function"]["parameters"] for t in tools.openai_tools()}
    search = strict_violations(plain["memory_search"])
    assert any("every property must be required" in p for p in search)
    assert any("'minLength'" in p or "'maxLength'" in p for p in search)
    assert strict_violations({"type": "object", "properties": {"m": {"type": "object"}}}) != []
    assert "root: must be an object, not anyOf" in strict_violations({"anyOf": [{"type": "object"}]})


@pytest.mark.parametrize("name", tools.TOOL_NAMES)
def test_strict_schemas_obey_openai_strict_mode(name: str) -> None:
    (item,) = tools.openai_tools([name], strict=True)
    function = item["function"]
    assert item["type"] == "function" and function["strict"] is True
    assert set(function) == {"name", "description", "parameters", "strict"}
    parameters = function["parameters"]
    assert strict_violations(parameters) == []
    jsonschema.Draft202012Validator.check_schema(parameters)
    plain = next(t for t in tools.tool_schemas([name]))["parameters"]
    assert list(parameters["properties"]) == list(plain["properties"])
    for prop, schema in parameters["properties"].items():
        assert _nullable(schema) is (prop not in plain["required"]), (name, prop)


@pytest.mark.parametrize("strict", [False, True])
def test_responses_api_flat_format(strict: bool) -> None:
    offered = tools.openai_responses_tools(strict=strict)
    assert [t["name"] for t in offered] == list(tools.TOOL_NAMES)
    chat = {t["function"]["name"]: t["function"] for t in tools.openai_tools(strict=strict)}
    for item in offered:
        assert set(item) == {"type", "name", "description", "parameters", "strict"}
        assert item["type"] == "function" and item["strict"] is strict
        assert item["parameters"] == chat[item["name"]]["parameters"]
        if strict:
            assert strict_violations(item["parameters"]) == []


def test_a_subset_in_every_format() -> None:
    names = ["memory_search", "working_set"]
    assert [t["name"] for t in tools.openai_responses_tools(names, strict=True)] == names
    assert [t["function"]["name"] for t in tools.openai_tools(names, strict=True)] == names
    assert [t["name"] for t in tools.anthropic_tools(names)] == names


def test_tags_have_one_shape_everywhere() -> None:
    shapes = set()
    for tool in tools.tool_schemas():
        tags = tool["parameters"]["properties"].get("tags")
        if tags is not None:
            shapes.add((tags["type"], tags["items"]["type"]))
    assert shapes == {("array", "string")}


def test_annotations_come_from_the_registry() -> None:
    for tool in tools.TOOLS:
        hints = tools.mcp_annotations(tool)
        assert hints["readOnlyHint"] is all(op.read_only for op in tool.operations)
        assert hints["destructiveHint"] is any(op.destructive for op in tool.operations)
        assert hints["title"]
    by_name = {t.name: tools.mcp_annotations(t) for t in tools.TOOLS}
    assert by_name["knowledge_query"]["readOnlyHint"] is True
    assert by_name["memory_delete"]["destructiveHint"] is True
    assert by_name["working_clear"]["destructiveHint"] is True
    assert by_name["knowledge_store"]["idempotentHint"] is True
    assert by_name["episode_remember"]["idempotentHint"] is False


# -- what a strict-mode model sends: every argument, null for the ones it leaves out -----------


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MemorySystem, Workspaces]]:
    with system_with_notes(tmp_path_factory.mktemp("strict")) as (system, registry):
        tools.dispatch(
            "memory_add", {"content": "first saved note"}, system, agent_id="s1", workspaces=registry
        )
        yield system, registry


@pytest.mark.parametrize("name", tools.TOOL_NAMES)
def test_the_dispatcher_takes_what_a_strict_model_sends(env: Any, name: str) -> None:
    system, registry = env
    (item,) = tools.openai_tools([name], strict=True)
    parameters = item["function"]["parameters"]
    arguments = {prop: None for prop in parameters["properties"]} | TOOL_ARGUMENTS[name]
    jsonschema.validate(arguments, parameters)  # what strict decoding can produce
    result = tools.dispatch(name, arguments, system, agent_id="s1", workspaces=registry)
    assert not (isinstance(result, dict) and "error" in result), (name, result)


def test_a_required_null_is_refused(env: Any) -> None:
    system, registry = env
    result = tools.dispatch("memory_search", {"query": None}, system, workspaces=registry)
    assert result == {"error": "memory_search: argument 'query' must be a string, got null"}


# -- the docs' table is generated from the definitions ------------------------------------------


def test_docs_tool_table_is_generated() -> None:
    text = (REPO / "docs" / "bridges.md").read_text(encoding="utf-8")
    assert render(text, "llm-tools", tools.tools_markdown()) == text, (
        "docs/bridges.md's tool table is stale: run `python -m memstrata.bridges.doc_tables`"
    )
    for name in tools.TOOL_NAMES:
        assert f"| `{name}` |" in tools.tools_markdown()
