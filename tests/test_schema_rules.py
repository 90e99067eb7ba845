"""The published param schemas say the rules the code enforces, and the dispatchers keep them.

Every door validates a call against the very schema it publishes (JSON-RPC params, LLM tool
arguments, MCP tools), so a rule in a schema is a rule of the door, and a rule of the code that
JSON Schema can say is in the schema: a client that validates before sending is refused nothing
the schema allowed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from memstrata.bridges import tools
from memstrata.bridges._operation import (
    AGENT_ID,
    CATEGORY,
    MAX_FILE_LINES,
    MAX_FROM_LINE,
    SESSION_ID,
    TAG_KEY,
    TIME,
    parse_time,
)
from memstrata.bridges._operations import OPERATIONS, find
from memstrata.bridges._schema import check, unsupported
from memstrata.bridges._tool_defs import tags_map
from memstrata.core.constants import (
    MAX_ENTRY_ID,
    MAX_KEY_CHARS,
    MAX_LABEL_CHARS,
    MAX_NAMESPACE_DEPTH,
    MAX_OFFSET,
    MAX_TAG_KEY_CHARS,
)
from memstrata.core.validation import (
    check_agent_id,
    check_category,
    check_datetime,
    check_key,
    check_min_score,
    check_scope,
    check_session_id,
    check_tags,
    check_task_id,
    check_text,
)
from memstrata.errors import InvalidInputError
from memstrata.messages import GetKnowledge, ListEpisodes, ListKnowledge, PutItem, SearchItems


def _error(name: str, arguments: Any) -> str:
    result = tools.dispatch(name, arguments, None)
    assert set(result) == {"error"}, result
    assert "\n" not in result["error"]
    return str(result["error"])


def _params(op: str) -> dict[str, Any]:
    return find(op).params_schema()


# -- exclusive bounds and the other keywords -----------------------------------------------------


def test_a_ttl_of_zero_is_refused_by_every_door_as_the_schema_says() -> None:
    """``ttl_s`` is ``exclusiveMinimum: 0`` (0 would store a value that is gone at once, as
    ``put_item``'s ``ttl_minutes`` already refuses): JSON-RPC and the tools refuse 0 by name."""
    assert _params("set_working")["properties"]["ttl_s"]["exclusiveMinimum"] == 0
    with pytest.raises(InvalidInputError, match=r"^param 'ttl_s' must be greater than 0, got 0$"):
        check(_params("set_working"), {"agent_id": "a", "key": "k", "value": 1, "ttl_s": 0}, noun="param")
    message = _error("working_set", {"key": "k", "value": "1", "ttl_s": 0})
    assert message == "working_set: argument 'ttl_s' must be greater than 0, got 0"
    assert "greater than 0" in _error("working_set", {"key": "k", "value": "1", "ttl_s": -0.0})
    assert "greater than 0" in _error(
        "item_put", {"namespace": ["n"], "key": "k", "value": "{}", "ttl_minutes": 0}
    )
    # a positive ttl passes the schema (the call then fails only for want of a system)
    assert "no memory system" in _error("working_set", {"key": "k", "value": "1", "ttl_s": 0.001})


@pytest.mark.parametrize(
    ("schema", "value", "needle"),
    [
        ({"type": "number", "exclusiveMaximum": 1}, 1, "argument 'x' must be less than 1, got 1"),
        ({"type": "array", "minItems": 2}, [1], "argument 'x' has fewer than 2 items"),
        ({"type": "object", "minProperties": 1}, {}, "argument 'x' has fewer than 1 entries"),
        ({"type": "string", "format": "date-time"}, "soon", "argument 'x' must be an ISO 8601 date-time"),
        ({"type": "string", "pattern": "^a$"}, "a\n", "argument 'x' must match the pattern ^a$"),
    ],
)
def test_the_checker_enforces_every_keyword_it_knows(schema: dict[str, Any], value: Any, needle: str) -> None:
    with pytest.raises(InvalidInputError, match="^" + needle.replace("^", r"\^").replace("$", r"\$")):
        check(schema, value, path="x")


def test_no_published_schema_uses_a_keyword_the_checker_ignores() -> None:
    for op in OPERATIONS:
        schema = op.params_schema()
        assert unsupported(schema, op.name) == []
        if "tags" in schema["properties"]:
            assert schema["properties"]["tags"].get("propertyNames", TAG_KEY) == TAG_KEY
    for tool in tools.tool_schemas(agent_id_argument=True):
        assert unsupported(tool["parameters"], tool["name"]) == []
    assert unsupported({"type": "array", "uniqueItems": True}) == ["schema: 'uniqueItems'"]
    assert unsupported({"type": "string", "format": "email"}) == ["schema: format 'email'"]


# -- unknown arguments ---------------------------------------------------------------------------


def test_an_unknown_argument_is_refused_even_when_it_is_null() -> None:
    message = _error("working_set", {"key": "k", "value": "1", "bogus": None})
    assert message.startswith("working_set: unknown argument 'bogus' (expected: key, value, ttl_s, task_id)")
    assert "unknown argument 'bogus'" in _error("memory_search", '{"query": "q", "bogus": null}')


def test_declared_optional_arguments_may_still_be_null() -> None:
    """OpenAI's strict mode sends every declared optional argument, null when left out."""
    nulls = {"key": "k", "value": "1", "ttl_s": None, "task_id": None}
    assert "no memory system" in _error("working_set", nulls)
    assert "'key' must be a string, got null" in _error("working_set", {"key": None, "value": "1"})


# -- min_score says what it does -----------------------------------------------------------------


def test_min_score_is_described_as_the_floor_of_the_semantic_side() -> None:
    described = {
        op.name: op.param("min_score").description
        for op in OPERATIONS
        if "min_score" in op.params_schema()["properties"]
    }
    assert {"query_knowledge", "search_files"} <= set(described)
    tool = next(t for t in tools.tool_schemas(["memory_search"]))["parameters"]["properties"]["minScore"]
    for text in [*described.values(), tool["description"]]:
        assert "semantic" in text and "keyword matches are kept" in text, text
        assert "hits whose 0-1 score" not in text


@pytest.mark.parametrize("value", [-1.5, -1, -0.2, 0, 0.35, 1, 1.01])
@pytest.mark.parametrize("operation", ["query_knowledge", "search_files"])
def test_min_score_is_valid_for_the_operations_exactly_when_the_facade_accepts_it(
    operation: str, value: float
) -> None:
    try:
        check_min_score(value)
        accepted = True
    except InvalidInputError:
        accepted = False
    schema = _params(operation)["properties"]["min_score"]
    assert jsonschema.Draft202012Validator(schema).is_valid(value) is accepted, (operation, value)


# -- the schemas state the code's rules ------------------------------------------------------------

_SCHEMA_AND_RULE: dict[str, tuple[Any, Callable[[Any, str], Any]]] = {
    "agent_id": (AGENT_ID.schema, check_agent_id),
    "session_id": (SESSION_ID.schema, check_session_id),
    "category": (CATEGORY, check_category),
    "working key": (_params("set_working")["properties"]["key"], check_key),
    "task_id": (_params("begin_task")["properties"]["task_id"], check_task_id),
    # episodes refuse an empty task run; working memory reads "" as the agent-wide space
    "task_run_id": (_params("recall")["properties"]["task_run_id"], check_task_id),
    "working task_id": (
        _params("set_working")["properties"]["task_id"],
        lambda v, name: check_task_id(v, name, optional=True),
    ),
    "tool scope": (
        next(t for t in tools.tool_schemas(["memory_add"]))["parameters"]["properties"]["scope"],
        check_scope,
    ),
    "tool tag": (
        next(t for t in tools.tool_schemas(["memory_add"]))["parameters"]["properties"]["tags"]["items"],
        lambda v, name: check_tags(tags_map([v]), name),
    ),
    "content": (_params("store_knowledge")["properties"]["content"], check_text),
    "scope": (_params("store_knowledge")["properties"]["scope"], check_scope),
}
_SAMPLES = {
    # the ids' trailing '.' and reserved device names are left to the code (no simple pattern)
    "agent_id": ["a", "A_1.b-2", "a" * 64, "a" * 65, "", "my agent", "-a", "a/b", "é", "a\n"],
    "session_id": ["s1", "my session", "s" * 65, "s\x00"],
    "category": ["pitfall", "planning-pitfall", "a" * 64, "a" * 65, "Pitfall", "", "_x", "pit fall"],
    "working key": ["k", "a key: with spaces", "k" * 1024, "k" * 1025, "", "a\x00b"],
    "task_id": ["t1", "a task", "t" * 256, "t" * 257, "", "   ", "a\nb", "a\x7f"],
    "task_run_id": ["", "run-1", "   ", "a\tb", "r" * 257],
    "working task_id": ["", "t1", "   ", "a\tb", "r" * 257],
    "tool scope": ["/", "/a/b", "a\x00b", "\t"],
    "tool tag": ["a", "a=b", "a=", "a==b", "=b", " =b", "  x=1", "a\x01=b", "a\t=b", "x\x7f", "a=b\x01"],
    "content": ["x", " x ", "", "   ", "\n\t"],
    "scope": ["/", "/src/auth", "", "a\x01b", "/" * 1025],
}


@pytest.mark.parametrize(
    ("name", "value"), [(name, value) for name, values in _SAMPLES.items() for value in values]
)
def test_a_value_is_valid_for_the_schema_exactly_when_the_code_accepts_it(name: str, value: str) -> None:
    schema, rule = _SCHEMA_AND_RULE[name]
    try:
        rule(value, name)
        accepted = True
    except InvalidInputError:
        accepted = False
    if not value.endswith("\n"):  # jsonschema reads '$' as Python does: before a final newline too
        assert jsonschema.Draft202012Validator(schema).is_valid(value) is accepted, (name, value)
    try:
        check(schema, value, path=name)
        checked = True
    except InvalidInputError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(f"argument {name!r} ")
        checked = False
    assert checked is accepted, (name, value)


@pytest.mark.parametrize(
    ("name", "arguments", "needle"),
    [
        ("knowledge_store", {"content": "", "category": "pattern"}, "argument 'content' must not be empty"),
        ("knowledge_store", {"content": "  ", "category": "pattern"}, "argument 'content' must not be blank"),
        ("knowledge_store", {"content": "x", "category": "Pitfall"}, "argument 'category' must match"),
        ("blackboard_get", {"session_id": "my session", "key": "k"}, "argument 'session_id' must match"),
        ("blackboard_publish", {"session_id": "s", "key": "a*", "value": "1"}, "argument 'key' must not"),
        (
            "episode_remember",
            {"content": "x", "at": "yesterday"},
            "argument 'at' must be an ISO 8601 date-time",
        ),
        ("episode_remember", {"content": "x", "at": "2026-05-01T12:00:00"}, "argument 'at' must be an ISO"),
        ("episode_remember", {"content": "x", "kind": "A note"}, "argument 'kind' must match"),
        ("episode_list", {"since": "last week"}, "argument 'since' must be an ISO 8601 date-time"),
        ("working_get", {"key": ""}, "argument 'key' must not be empty"),
        ("memory_delete", {"id": 0}, "argument 'id' must be at least 1, got 0"),
        ("memory_add", {"content": "x", "tags": ["=b"]}, "argument 'tags[0]' must start with a key"),
        ("memory_list", {"scope": "a\tb"}, "argument 'scope' must not contain control characters"),
        ("episode_recall", {"query": "q", "task_run_id": ""}, "argument 'task_run_id' must not be empty"),
        ("working_set", {"key": "k", "value": "1", "task_id": "a\nb"}, "'task_id' must be empty, or not"),
    ],
)
def test_what_the_schema_refuses_the_tools_refuse_by_name(name: str, arguments: Any, needle: str) -> None:
    schema = next(t["parameters"] for t in tools.tool_schemas([name]))
    if "ISO" not in needle:  # jsonschema checks a format only when asked to (an annotation)
        assert not jsonschema.Draft202012Validator(schema).is_valid(arguments)
    assert needle in _error(name, arguments)


def test_times_are_date_times_with_a_zone_in_every_schema() -> None:
    assert TIME["format"] == "date-time"
    ok = dt.datetime(2026, 5, 1, 12, tzinfo=dt.UTC).isoformat()
    check(TIME, ok)
    check(TIME, "2026-05-01T12:00:00Z")
    with pytest.raises(InvalidInputError, match="time zone"):
        check(TIME, "2026-05-01T12:00:00", path="at")


@pytest.mark.parametrize(
    "value", ["2026-05-01T12:00:00Z\n", " 2026-05-01T12:00:00Z", "2026-05-01T12:00:00+00:00\t"]
)
def test_a_date_time_with_white_space_around_it_is_refused(value: str) -> None:
    """RFC 3339, which JSON Schema's ``date-time`` names, has no room for white space: every door
    refuses it as it refuses any other text that is not a date-time."""
    with pytest.raises(InvalidInputError, match=r"^argument 'since' must be an ISO 8601 date-time"):
        check(TIME, value, path="since")
    assert "argument 'since' must be an ISO 8601 date-time" in _error("episode_list", {"since": value})
    with pytest.raises(InvalidInputError, match=r"^until must be an ISO 8601 date-time"):
        parse_time(value, "until")


def test_the_agent_id_argument_of_the_mcp_tools_is_the_registry_agent_id() -> None:
    """One rule for an agent id wherever it is published (it was 256 characters in the OpenRPC
    document and 200 in the MCP tools, while the code allows 64)."""
    for tool in tools.tool_schemas(agent_id_argument=True):
        schema = tool["parameters"]["properties"]["agent_id"]
        assert {k: v for k, v in schema.items() if k != "description"} == {
            k: v for k, v in AGENT_ID.schema.items() if k != "description"
        }
    rpc = _params("remember")["properties"]["agent_id"]
    assert jsonschema.Draft202012Validator(rpc).is_valid("a" * 64)
    assert not jsonschema.Draft202012Validator(rpc).is_valid("a" * 65)


# -- tags ------------------------------------------------------------------------------------------


def test_a_tag_key_given_twice_with_two_values_is_refused() -> None:
    with pytest.raises(
        InvalidInputError, match=r"^tag 'a' is given twice with different values \('1' and '2'\)$"
    ):
        tags_map(["a=1", "a=2"])
    assert tags_map(["a=1", "a=1", "b", "b"]) == {"a": "1", "b": ""}
    assert "tag 'a' is given twice" in _error("memory_add", {"content": "t", "tags": ["a=1", "a=2"]})


def test_memory_add_refuses_a_source_tag_that_disagrees_with_the_source_argument() -> None:
    message = _error("memory_add", {"content": "t", "tags": ["source=x"], "source": "y"})
    assert message == (
        "memory_add: tag 'source' ('x') and argument 'source' ('y') disagree: give the source once"
    )
    # the same source twice is that source (the call then needs a system)
    assert "no memory system" in _error("memory_save", {"content": "t", "tags": ["source=y"], "source": "y"})


def _accepted(build: Callable[[], Any]) -> bool:
    try:
        build()
    except InvalidInputError:
        return False
    return True


_BOUNDED: list[tuple[str, str, Callable[[Any], Any], list[Any]]] = [
    # (operation, param, the message that carries it, samples)
    (
        "put_item",
        "namespace",
        lambda v: PutItem(v, "k", {}),
        [
            ["n"],
            [],
            ["a"] * MAX_NAMESPACE_DEPTH,
            ["a"] * (MAX_NAMESPACE_DEPTH + 1),
            ["x" * MAX_LABEL_CHARS],
            ["x" * (MAX_LABEL_CHARS + 1)],
        ],
    ),
    (
        "put_item",
        "key",
        lambda v: PutItem(("n",), v, {}),
        ["k", "a key", "", "   ", "k" * MAX_KEY_CHARS, "k" * (MAX_KEY_CHARS + 1)],
    ),
    ("get_knowledge", "entry_id", lambda v: GetKnowledge("a", v), [1, 0, MAX_ENTRY_ID, MAX_ENTRY_ID + 1]),
    ("list_knowledge", "offset", lambda v: ListKnowledge("a", offset=v), [0, MAX_OFFSET, MAX_OFFSET + 1]),
    ("list_episodes", "offset", lambda v: ListEpisodes("a", offset=v), [0, MAX_OFFSET, MAX_OFFSET + 1]),
    ("search_items", "offset", lambda v: SearchItems(offset=v), [0, MAX_OFFSET, MAX_OFFSET + 1]),
]


@pytest.mark.parametrize(
    ("op", "param", "value", "build"),
    [(op, param, value, build) for op, param, build, values in _BOUNDED for value in values],
    ids=lambda v: str(v)[:24] if not callable(v) else "",
)
def test_item_namespaces_and_keys_ids_and_offsets_have_the_code_s_bounds_in_the_schema(
    op: str, param: str, value: Any, build: Callable[[Any], Any]
) -> None:
    schema = _params(op)["properties"][param]
    accepted = _accepted(lambda: build(value))
    assert jsonschema.Draft202012Validator(schema).is_valid(value) is accepted, (op, param, value)
    try:
        check(schema, value, path=param)
        checked = True
    except InvalidInputError:
        checked = False
    assert checked is accepted, (op, param, value)


def test_a_json_object_param_sent_as_text_says_it_must_be_an_object() -> None:
    schema = next(t["parameters"] for t in tools.tool_schemas(["item_put"]))
    for text, valid in (('{"a": 1}', True), (" {} ", True), ("[1]", False), ("", False), ("null", False)):
        arguments = {"namespace": ["n"], "key": "k", "value": text}
        assert jsonschema.Draft202012Validator(schema).is_valid(arguments) is valid, text
        if not valid:
            assert "argument 'value' must be JSON object text" in _error("item_put", arguments)


# -- labels, tag keys, file lines and times: the code's bounds in the schema ----------------------


_LABEL_SAMPLES = [["a\x00b"], ["\x00"], ["a\x1fb"], ["a b"], ["é"]]


@pytest.mark.parametrize("value", _LABEL_SAMPLES, ids=repr)
@pytest.mark.parametrize(
    ("op", "param"), [("put_item", "namespace"), ("search_items", "prefix"), ("list_namespaces", "prefix")]
)
def test_a_namespace_label_is_valid_for_the_schema_exactly_when_the_code_accepts_it(
    op: str, param: str, value: list[str]
) -> None:
    schema = _params(op)["properties"][param]
    accepted = _accepted(lambda: PutItem(value, "k", {}))
    assert jsonschema.Draft202012Validator(schema).is_valid(value) is accepted, (op, value)
    assert _accepted(lambda: check(schema, value, path=param)) is accepted, (op, value)


_TAG_KEYS = ["a", "a=b", "é", "k" * MAX_TAG_KEY_CHARS, "k" * (MAX_TAG_KEY_CHARS + 1), "", " ", "a\nb"]
_TAG_KEYS += ["a\x00", "a\x7f", "\t", " a "]


@pytest.mark.parametrize("key", _TAG_KEYS, ids=repr)
@pytest.mark.parametrize("op", ["store_knowledge", "list_knowledge", "query_knowledge", "remember"])
def test_a_json_rpc_tag_key_is_valid_for_the_schema_exactly_when_the_code_accepts_it(
    op: str, key: str
) -> None:
    schema = _params(op)["properties"]["tags"]
    accepted = _accepted(lambda: check_tags({key: "v"}))
    assert jsonschema.Draft202012Validator(schema).is_valid({key: "v"}) is accepted, (op, key)
    assert jsonschema.Draft202012Validator(TAG_KEY).is_valid(key) is accepted, key
    if not accepted:
        with pytest.raises(InvalidInputError, match=r"^tags key .* must be 1-128 characters without"):
            check_tags({key: "v"})


@pytest.mark.parametrize(
    ("param", "value", "accepted"),
    [
        ("from_line", 1, True),
        ("from_line", MAX_FROM_LINE, True),
        ("from_line", MAX_FROM_LINE + 1, False),
        ("lines", MAX_FILE_LINES, True),
        ("lines", MAX_FILE_LINES + 1, False),
    ],
)
def _file_layer_accepts(**bounds: int) -> bool:
    """Whether the file layer takes these line bounds (it checks them before it needs a folder)."""
    from memstrata.layers._files import MemoryFiles

    try:
        MemoryFiles.get_lines(None, "f.md", **bounds)  # type: ignore[arg-type]
    except InvalidInputError:
        return False
    except AttributeError:  # past the checks: no folder to read
        return True
    raise AssertionError("unreachable")  # pragma: no cover


@pytest.mark.parametrize(
    ("param", "value"),
    [
        *[("from_line", n) for n in (1, MAX_FROM_LINE, MAX_FROM_LINE + 1)],
        *[("lines", n) for n in (1, MAX_FILE_LINES, MAX_FILE_LINES + 1)],
    ],
)
def test_get_file_publishes_the_line_bounds_of_the_file_layer(param: str, value: int) -> None:
    accepted = _file_layer_accepts(**{param: value})
    schema = _params("get_file")["properties"][param]
    assert jsonschema.Draft202012Validator(schema).is_valid(value) is accepted, (param, value)
    assert _accepted(lambda: check(schema, value, path=param)) is accepted, (param, value)


def test_memory_get_publishes_the_line_bounds_and_names_its_own_argument() -> None:
    schema = next(t["parameters"] for t in tools.tool_schemas(["memory_get"]))["properties"]
    assert schema["from"]["maximum"] == MAX_FROM_LINE
    assert schema["lines"]["maximum"] <= MAX_FILE_LINES
    message = _error("memory_get", {"path": "a.md", "from": MAX_FROM_LINE + 1})
    assert message == f"memory_get: argument 'from' must be at most {MAX_FROM_LINE}, got {MAX_FROM_LINE + 1}"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (1e308, "1e+308"),
        (-1e300, "-1e+300"),
        (10**400, "an integer beyond the range of a double"),
        (1001, "1001"),
    ],
)
def test_a_number_out_of_bounds_is_shown_short_in_the_refusal(value: float, shown: str) -> None:
    """An integral float is taken as an integer: 1e308 is not spelled out in 309 digits."""
    with pytest.raises(InvalidInputError) as refused:
        check({"type": "integer", "minimum": -1000, "maximum": 1000}, value, path="top_k")
    bound = "at most 1000" if value > 0 else "at least -1000"
    assert str(refused.value) == f"argument 'top_k' must be {bound}, got {shown}"


@pytest.mark.parametrize(
    "value",
    [
        "2016-12-31T23:59:60Z",
        "2016-12-31T23:59:60+01:00",
        "2016-12-31T23:59:59Z",
        "2016-12-31T23:59:59.5+01:00",
        "2025-01-01t00:00:00z",
        "2025-01-01T00:00:00-05:30",
        "2025-01-01T00:59:59.999999Z",
    ],
)
def test_a_time_is_valid_for_the_schema_exactly_when_every_door_accepts_it(value: str) -> None:
    """A leap second (``:60``) is an RFC 3339 date-time no door can hold (a datetime has no
    second 60, and reading it as :59 would be another time): the schema's pattern refuses it."""
    accepted = _accepted(lambda: parse_time(value, "at"))
    assert _accepted(lambda: check_datetime(value, "at")) is accepted, value
    assert jsonschema.Draft202012Validator(TIME).is_valid(value) is accepted, value
    assert _accepted(lambda: check(TIME, value, path="at")) is accepted, value
    if not accepted:
        assert "leap second" in _error("episode_remember", {"content": "x", "at": value})
