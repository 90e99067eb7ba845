"""Tool schemas are valid JSON Schema, and the dispatcher turns every bad call into a readable error."""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstrata.bridges import tools
from memstrata.bridges._schema import check
from memstrata.core.constants import MAX_TAG_KEY_CHARS
from memstrata.errors import InvalidInputError

# the tool families and their verbs, written out apart from the definitions they check
_EXPECTED = {
    *(f"memory_{verb}" for verb in ("search", "get", "add", "save", "list", "delete")),
    *(f"knowledge_{verb}" for verb in ("query", "store", "get", "update", "delete", "list")),
    *(f"episode_{verb}" for verb in ("remember", "recall", "list")),
    *(f"working_{verb}" for verb in ("set", "get", "clear")),
    *(f"blackboard_{verb}" for verb in ("publish", "get", "list")),
    *(f"item_{verb}" for verb in ("put", "get", "search", "delete", "namespaces")),
}


def test_every_documented_tool_is_offered() -> None:
    assert set(tools.TOOL_NAMES) == _EXPECTED
    assert len(tools.TOOL_NAMES) == len(_EXPECTED)


@pytest.mark.parametrize("agent_id_argument", [False, True])
def test_schemas_are_valid_draft_2020_12(agent_id_argument: bool) -> None:
    for tool in tools.tool_schemas(agent_id_argument=agent_id_argument):
        jsonschema.Draft202012Validator.check_schema(tool["parameters"])
        assert tool["parameters"]["type"] == "object"
        assert tool["parameters"]["additionalProperties"] is False
        assert tool["description"]
        for name, prop in tool["parameters"]["properties"].items():
            assert prop.get("description"), (tool["name"], name)
        assert "agent_id" not in tool["parameters"]["properties"] or agent_id_argument


def test_openai_format() -> None:
    offered = tools.openai_tools()
    assert len(offered) == len(_EXPECTED)
    for item in offered:
        assert item["type"] == "function"
        assert set(item["function"]) == {"name", "description", "parameters"}
        jsonschema.Draft202012Validator.check_schema(item["function"]["parameters"])


def test_anthropic_format() -> None:
    offered = tools.anthropic_tools()
    assert {t["name"] for t in offered} == _EXPECTED
    for item in offered:
        assert set(item) == {"name", "description", "input_schema"}
        jsonschema.Draft202012Validator.check_schema(item["input_schema"])


def test_a_subset_can_be_offered_and_unknown_names_are_refused() -> None:
    assert [t["name"] for t in tools.anthropic_tools(["memory_search"])] == ["memory_search"]
    with pytest.raises(InvalidInputError, match="unknown tool 'nope'"):
        tools.openai_tools(["nope"])


def test_published_schemas_are_copies() -> None:
    first = tools.openai_tools()
    first[0]["function"]["parameters"]["properties"].clear()
    assert tools.openai_tools()[0]["function"]["parameters"]["properties"]


def test_search_result_shape_is_documented() -> None:
    search = next(t for t in tools.tool_schemas() if t["name"] == "memory_search")
    assert set(search["parameters"]["properties"]) == {"query", "maxResults", "minScore", "scope", "tags"}
    get = next(t for t in tools.tool_schemas() if t["name"] == "memory_get")
    assert set(get["parameters"]["properties"]) == {"path", "from", "lines"}


# -- the argument checker agrees with jsonschema on what is valid -------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 300) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_keys = st.sampled_from(
    [
        *("query", "maxResults", "minScore", "path", "from", "lines", "content", "scope", "tags"),
        *("key", "category", "kind", "session_id", "task_id", "at", "since", "ttl_s"),
    ]
)


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    """``pattern`` as ECMA-262 reads it (JSON Schema's dialect): a final ``$`` is the very end,
    where Python's ``re``, which jsonschema uses, also matches before a last newline."""
    regex = pattern[:-1] + r"\Z" if pattern.endswith("$") else pattern
    if validator.is_type(instance, "string") and not re.search(regex, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_ECMA = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _ecma_pattern})
_FORMATS = jsonschema.FormatChecker(formats=())


@_FORMATS.checks("date-time")
def _date_time(value: object) -> bool:
    """ISO 8601 with a time zone (the docs' words, written here apart from the checker's)."""
    if not isinstance(value, str):
        return True
    try:
        return dt.datetime.fromisoformat(value.strip()).tzinfo is not None
    except ValueError:
        return False


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(sorted(_EXPECTED)),
    args=st.dictionaries(_keys | st.text(max_size=5), _json, max_size=4),
)
def test_checker_accepts_exactly_what_jsonschema_accepts(name: str, args: dict[str, Any]) -> None:
    schema = next(t["parameters"] for t in tools.tool_schemas() if t["name"] == name)
    valid = _ECMA(schema, format_checker=_FORMATS).is_valid(args)
    try:
        check(schema, args)
        accepted = True
    except InvalidInputError:
        accepted = False
    assert accepted == valid, (name, args)


# -- dispatcher errors (no memory system needed: they are caught before it is used) -------------


@pytest.mark.parametrize(
    ("name", "arguments", "needle"),
    [
        ("memory_search", {}, "missing required argument 'query'"),
        ("memory_search", {"query": 5}, "argument 'query' must be a string, got an integer"),
        ("memory_search", {"query": "x", "maxResults": "5"}, "'maxResults' must be an integer, got a string"),
        ("memory_search", {"query": "x", "maxResults": 0}, "'maxResults' must be at least 1"),
        ("memory_search", {"query": "x", "maxResults": True}, "'maxResults' must be an integer, got a bool"),
        ("memory_search", {"query": "x", "minScore": 2}, "'minScore' must be at most 1"),
        ("memory_search", {"query": "x", "limit": 3}, "unknown argument 'limit'"),
        ("memory_search", {"query": ""}, "argument 'query' must not be empty"),
        ("memory_get", {"path": "a.md", "from": 0}, "'from' must be at least 1"),
        ("memory_get", {"path": ["a"]}, "'path' must be a string, got an array"),
        ("memory_add", {"content": "x", "tags": "k=v"}, '\'tags\' must be an array of "key" or "key=value"'),
        ("memory_add", {"content": "x", "tags": {"k": "v"}}, "'tags' must be an array, got an object"),
        ("memory_add", {"content": "x", "tags": [1]}, "'tags[0]' must be a string"),
        ("memory_list", {"limit": 1000}, "'limit' must be at most 200"),
        ("memory_list", {"offset": -1}, "'offset' must be at least 0"),
        ("memory_delete", {}, "missing required argument 'id'"),
        ("memory_delete", {"id": None}, "'id' must be an integer or a string, got null"),
        ("knowledge_store", {"content": "x"}, "missing required argument 'category'"),
        ("knowledge_store", {"content": "x", "category": None}, "'category' must be a string, got null"),
        ("knowledge_query", {"query": "x", "top_k": 1.5}, "'top_k' must be an integer, got a number"),
        ("knowledge_query", {"query": "x", "topK": 3}, "unknown argument 'topK'"),
        ("working_set", {"key": "k"}, "missing required argument 'value'"),
        ("working_set", {"key": "k", "value": 3}, "'value' must be a string, got an integer"),
        ("blackboard_publish", {"key": "k", "value": "1"}, "missing required argument 'session_id'"),
        (
            "blackboard_publish",
            {"session_id": "s", "key": "k", "value": "1", "publisher": "x"},
            "unknown argument",
        ),
        ("knowledge_get", {"entry_id": 0}, "'entry_id' must be at least 1"),
    ],
)
def test_bad_arguments_come_back_as_error_results(name: str, arguments: Any, needle: str) -> None:
    result = tools.dispatch(name, arguments, None)
    assert set(result) == {"error"}, result
    assert needle in result["error"]
    assert result["error"].startswith(f"{name}: ")


@pytest.mark.parametrize(
    ("arguments", "needle"),
    [
        ("{not json", "arguments are not valid JSON"),
        ("[1, 2]", "arguments must be a JSON object, got an array"),
        ("42", "arguments must be a JSON object, got an integer"),
        (b"\xff\xfe", "arguments are not valid JSON"),
        ('{"query": "' + "[" * 10 + '"}', "missing"),
        ("[" * 3000 + "]" * 3000, "not valid JSON"),
        (7, "arguments must be a JSON object, got an integer"),
    ],
)
def test_bad_argument_payloads(arguments: Any, needle: str) -> None:
    result = tools.dispatch("memory_get", arguments, None)
    assert set(result) == {"error"}
    assert needle in result["error"]


_HUGE = "99999999999999999999999"
_RANGE = "is outside the 64-bit range (-2**63 to 2**63 - 1)"


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        (
            "memory_search",
            {"query": "x", "minScore": math.nan},
            "argument 'minScore' must be a finite number, got NaN",
        ),
        (
            "memory_search",
            {"query": "x", "minScore": -math.inf},
            "'minScore' must be a finite number, got -Infinity",
        ),
        (
            "item_put",
            {"namespace": ["n"], "key": "k", "value": '{"n": NaN}'},
            "argument 'value' is not JSON object text: NaN is not a JSON number (numbers must be finite): "
            "line 1 column 7 (char 6)",
        ),
        (
            "item_put",
            {"namespace": ["n"], "key": "k", "value": f'{{"n": [1, {_HUGE}]}}'},
            f"argument 'value': integer {_HUGE} at 'n[1]' {_RANGE}: line 1 column 11 (char 10)",
        ),
        (
            "item_search",
            {"filter": f'{{"n": {{"$gt": -{_HUGE}}}}}'},
            f"argument 'filter': integer -{_HUGE} at 'n.$gt' {_RANGE}: line 1 column 15 (char 14)",
        ),
        (
            "working_set",
            {"key": "k", "value": _HUGE},
            f"argument 'value': integer {_HUGE} {_RANGE}: line 1 column 1",
        ),
        (
            "item_get",
            f'{{"namespace": ["n"], "key": "k", "limit": {_HUGE}}}',
            f"arguments: integer {_HUGE} at 'limit' {_RANGE}: line 1 column 43 (char 42)",
        ),
        (  # JSON text, but no double holds it: refused as well, not kept as the string "1e400"
            "working_set",
            {"key": "k", "value": "1e400"},
            "argument 'value': number 1e400 is outside the range of a double",
        ),
        (
            "item_put",
            '{"namespace": ["n"], "key": "k", "value": {"n": -2e308}}',
            "arguments: number -2e308 at 'value.n' is outside the range of a double",
        ),
    ],
)
def test_numbers_json_cannot_carry_are_refused_by_name_never_converted(
    name: str, arguments: Any, message: str
) -> None:
    result = tools.dispatch(name, arguments, None)
    assert set(result) == {"error"}, result
    assert result["error"].startswith(f"{name}: ") and message in result["error"]


def test_deep_arguments_are_refused() -> None:
    nested: Any = "x"
    for _ in range(100):
        nested = [nested]
    result = tools.dispatch("memory_add", {"content": "x", "tags": nested}, None)
    assert "nested deeper than" in result["error"]


@pytest.mark.parametrize("name", ["", "memory_drop", None, 12, "MEMORY_SEARCH"])
def test_unknown_tools(name: Any) -> None:
    result = tools.dispatch(name, {}, None)
    assert set(result) == {"error"}
    assert "unknown tool" in result["error"]
    assert "memory_search" in result["error"]


def test_dispatch_without_a_system_reports_it() -> None:
    result = tools.dispatch("knowledge_store", {"content": "x", "category": "pattern"}, None)
    assert result == {"error": "knowledge_store: no memory system was given to the dispatcher"}


def test_dispatch_json_returns_text() -> None:
    assert tools.dispatch_json("nope", {}, None).startswith('{"error":"unknown tool')


def test_tag_limits_the_schema_cannot_express_are_stated() -> None:
    """A tag's key and value bounds live on each side of its ``=``, beyond what a schema pattern
    says: a model learns them from the description."""
    writes = [
        (tool["name"], prop)
        for tool in tools.tool_schemas()
        for name, prop in tool["parameters"]["properties"].items()
        if name == "tags" and "bare key matches" not in prop["description"]
    ]
    assert writes
    for name, prop in writes:
        assert f"at most {MAX_TAG_KEY_CHARS} characters" in prop["description"], name
