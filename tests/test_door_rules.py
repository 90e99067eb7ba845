"""One rule behind every door: JSON-RPC, the LLM tools (and MCP) and the Python facade take and
refuse the same times, listing limits and tag keys, and word the same refusal the same way."""

from __future__ import annotations

import datetime as dt
from typing import Any

import orjson
import pytest

from memstrata import MemorySystem
from memstrata._workspaces import Workspaces
from memstrata.bridges import tools
from memstrata.bridges._operation import Context, parse_time
from memstrata.bridges._operations import find
from memstrata.bridges._schema import check
from memstrata.bridges._tool_defs import tags_map
from memstrata.core.validation import check_tags
from memstrata.errors import InvalidInputError

_LOWERCASE = "2025-01-01t00:00:00z"
_MIDNIGHT = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def _rpc(system: MemorySystem, registry: Workspaces, name: str, params: dict[str, Any]) -> Any:
    """A JSON-RPC call as ``serve`` makes it: the params checked against the published schema,
    then the operation run."""
    op = find(name)
    return op.run(Context(system, registry, None), check(op.params_schema(), params, noun="param"))


def test_lowercase_t_and_z_are_read_alike_by_every_door(
    system_and_files: tuple[MemorySystem, Workspaces],
) -> None:
    """RFC 3339 allows ``t`` and ``z`` in lowercase: the facade reads them as JSON-RPC does."""
    system, registry = system_and_files
    assert parse_time(_LOWERCASE, "at") == _MIDNIGHT
    agent = system.agent("a")
    first = agent.remember("by the facade", at=_LOWERCASE)  # type: ignore[arg-type]
    second = _rpc(system, registry, "remember", {"agent_id": "a", "content": "by rpc", "at": _LOWERCASE})
    by_tool = tools.dispatch(
        "episode_remember", {"content": "by a tool", "at": _LOWERCASE}, system, agent_id="a"
    )
    assert "error" not in by_tool, by_tool
    episodes = agent.list_episodes(limit=10)
    assert {e.id for e in episodes} >= {first, second["id"]}
    assert {e.at for e in episodes} == {_MIDNIGHT}


def test_a_listing_limit_of_0_is_an_empty_list_at_every_door(
    system_and_files: tuple[MemorySystem, Workspaces],
) -> None:
    """``list_knowledge`` takes ``limit: 0`` as the facade and the other listings do."""
    system, registry = system_and_files
    agent = system.agent("a")
    agent.store_knowledge("an entry", category="memory")
    assert agent.list_knowledge(limit=0) == []
    assert _rpc(system, registry, "list_knowledge", {"agent_id": "a", "limit": 0}) == []
    assert tools.dispatch("memory_list", {"limit": 0}, system, agent_id="a") == []
    assert _rpc(system, registry, "list_episodes", {"agent_id": "a", "limit": 0}) == []
    assert len(_rpc(system, registry, "list_knowledge", {"agent_id": "a", "limit": 1})) == 1


def test_a_tag_key_may_hold_an_equals_sign_which_the_key_value_strings_cannot_name() -> None:
    """The one rule of a tag key (``check_tags``) lets ``=`` through, so every tag a store holds
    stays readable, filterable and importable; the tools' and the CLI's ``key=value`` strings end
    the key at the first ``=``, and say so."""
    assert check_tags({"a=b": "c"}) == {"a=b": "c"}
    assert tags_map(["a=b=c"]) == {"a": "b=c"}
    schema = find("store_knowledge").params_schema()["properties"]["tags"]
    check(schema, {"a=b": "c"})
    assert "=" in schema["description"] and "first" in schema["description"]
    tool = next(t for t in tools.tool_schemas(["memory_add"]))["parameters"]["properties"]["tags"]
    assert "first '='" in tool["description"]


@pytest.mark.parametrize(("params", "kind"), [('"x"', "a string"), ("[1]", "an array"), ("3", "an integer")])
def test_mcp_words_params_that_are_not_an_object_as_serve_does(params: str, kind: str) -> None:
    pytest.importorskip("mcp")
    from memstrata.bridges._mcp import judge_line

    with pytest.raises(InvalidInputError) as refused:  # serve's words
        check(find("status").params_schema(), orjson.loads(params), noun="param")
    assert str(refused.value) == f"params must be an object, got {kind}"
    line = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": ' + params.encode() + b"}"
    message, error = judge_line(line)
    assert message is None and error is not None
    assert error["error"]["message"] == f"tools/call: {refused.value}"
