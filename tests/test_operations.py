"""The registry of operations: every entry is complete, and the doors derive from it."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memstrata import Agent, Config, MemorySystem
from memstrata._workspaces import Workspaces
from memstrata.bridges._methods import build_methods
from memstrata.bridges._operations import OPERATIONS, Context, find
from memstrata.errors import InvalidInputError
from tests.fakes import FakeEmbedder

_ANY_JSON = {"value"}  # params that take any JSON value, so they declare no single type


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.name)
def test_every_operation_is_fully_described(op: Any) -> None:
    assert op.summary and op.summary[0].isupper(), op.name
    assert op.group in {"knowledge", "episodes", "working", "board", "items", "tasks", "files", "system"}
    assert not (op.read_only and op.destructive), op.name
    names = [p.name for p in op.params]
    assert len(names) == len(set(names)), op.name
    for param in op.params:
        assert param.description, f"{op.name}.{param.name} has no description"
        if param.name not in _ANY_JSON:
            assert isinstance(param.schema.get("type"), str), f"{op.name}.{param.name}: one type"
    schema = op.params_schema()
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) <= set(schema["properties"])


def test_agent_operations_use_the_python_api_names() -> None:
    """A param of an agent operation is a parameter of the Agent method it calls, by the same name."""
    renamed = {"entry_id", "store", "agent_id", "shared"}
    for op in OPERATIONS:
        method = getattr(Agent, op.name, None)
        if method is None:
            continue
        accepted = set(inspect.signature(method).parameters)
        for param in op.params:
            if param.name not in renamed:
                assert param.name in accepted, f"{op.name}.{param.name} is not a parameter of Agent.{op.name}"


@pytest.fixture
def ctx(data_dir: Path) -> Iterator[Context]:
    fake = FakeEmbedder()
    with (
        MemorySystem.start(Config(data_dir=data_dir), embedder=fake) as system,
        Workspaces.open(data_dir, embedder=fake) as workspaces,
    ):
        yield Context(system, workspaces)


def test_the_server_offers_every_operation(ctx: Context) -> None:
    methods = build_methods(ctx.system, ctx.workspaces)
    assert set(methods) == {op.name for op in OPERATIONS} | {"rpc.discover"}
    for op in OPERATIONS:
        assert methods[op.name].params == op.params_schema()
        assert methods[op.name].description == op.summary


def test_knowledge_ids_name_their_store(ctx: Context) -> None:
    store, get = find("store_knowledge").run, find("get_knowledge").run
    own = store(ctx, {"agent_id": "a", "content": "own fact"})
    shared = store(ctx, {"agent_id": "a", "content": "shared fact", "shared": True})
    assert own == {"id": own["id"], "store": "a"} and shared["store"] == "shared"
    in_shared = {"agent_id": "a", "entry_id": shared["id"], "store": "shared"}
    assert get(ctx, {"agent_id": "a", "entry_id": own["id"]})["content"] == "own fact"
    assert get(ctx, in_shared)["content"] == "shared fact"
    listed = find("list_knowledge").run(ctx, {"agent_id": "a", "store": "shared"})
    assert [(e["content"], e["store"]) for e in listed] == [("shared fact", "shared")]
    with pytest.raises(InvalidInputError, match="store must be"):
        get(ctx, {"agent_id": "a", "entry_id": 1, "store": "someone-else"})
    assert find("delete_knowledge").run(ctx, in_shared) == {"deleted": True}
    assert get(ctx, in_shared) is None
    assert get(ctx, {"agent_id": "a", "entry_id": own["id"]}) is not None


def test_unknown_operation_is_a_clear_error() -> None:
    with pytest.raises(InvalidInputError, match="unknown operation 'nope'"):
        find("nope")
