"""Every tool through the official MCP client SDK: listed with annotations and full schemas, one
happy call and one bad call each, and the MCP Inspector's string tags answered clearly."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

pytest.importorskip("mcp")

from mcp.client.client import Client

from memstrata import Config, MemorySystem
from memstrata._workspaces import Workspaces
from memstrata.bridges import tools
from memstrata.bridges._mcp import build_server
from tests.fakes import FakeEmbedder


@pytest.fixture
def env(data_dir: Path, tmp_path: Path) -> Iterator[tuple[MemorySystem, Workspaces, Path]]:
    workspace = tmp_path / "ws"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "MEMORY.md").write_text("# Team\n\nStandup is at nine thirty.\n", encoding="utf-8")
    (workspace / "memory" / "pets.md").write_text("The ferret sleeps all afternoon.\n", encoding="utf-8")
    embedder = FakeEmbedder()
    with (
        MemorySystem.start(Config(data_dir=data_dir), embedder=embedder) as system,
        Workspaces(data_dir, config=system.config, embedder=embedder) as registry,
    ):
        registry.index(workspace)
        yield system, registry, workspace


def _payload(result: Any) -> Any:
    (content,) = result.content
    return orjson.loads(content.text)


def _connected(server: Any, session: Callable[[Client], Awaitable[None]]) -> None:
    """Runs ``session`` to its end with an MCP client connected to ``server`` in this process."""

    async def connected() -> None:
        async with Client(server) as client:
            await session(client)

    anyio.run(connected)


async def _listed(client: Client) -> dict[str, Any]:
    """The tools ``client`` is offered, by name, in the order they are listed."""
    return {t.name: t for t in (await client.list_tools()).tools}


class Calls:
    """Calls one tool after another and records which tools were driven, happily and badly."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.driven: set[str] = set()
        self.refused: set[str] = set()

    async def ok(self, name: str, arguments: dict[str, Any]) -> Any:
        result = await self.client.call_tool(name, arguments)
        payload = _payload(result)
        assert not result.is_error, (name, payload)
        self.driven.add(name)
        return payload

    async def bad(self, name: str, arguments: dict[str, Any], needle: str) -> None:
        result = await self.client.call_tool(name, arguments)
        payload = _payload(result)
        assert result.is_error, (name, payload)
        message = payload["error"]
        assert message.startswith(f"{name}: ") and needle in message, (name, message)
        assert "internal error" not in message and "\n" not in message
        self.refused.add(name)


def test_every_tool_over_mcp(env: Any) -> None:
    system, registry, workspace = env

    async def session(client: Client) -> None:
        listed = await _listed(client)
        assert list(listed) == list(tools.TOOL_NAMES)
        for tool in tools.TOOLS:
            offered = listed[tool.name]
            hints = offered.annotations
            assert hints is not None and hints.title == tool.title
            assert hints.read_only_hint is tool.read_only
            assert hints.destructive_hint is tool.destructive
            assert hints.idempotent_hint is tool.idempotent
            assert hints.open_world_hint is False
            schema = offered.input_schema
            assert set(schema["properties"]) == {p.name for p in tool.params} | {"agent_id"}
            assert all(prop.get("description") for prop in schema["properties"].values())
        assert listed["memory_search"].annotations.read_only_hint is True
        assert listed["knowledge_delete"].annotations.destructive_hint is True
        assert listed["working_set"].annotations.read_only_hint is False

        c = Calls(client)
        # memory: files and saved memories, with scope and tag filters
        pet = await c.ok("memory_add", {"content": "The ferret likes raisins", "scope": "/pets",
                                        "tags": ["kind=fact", "animal"]})  # fmt: skip
        other = await c.ok("memory_save", {"content": "The ferret vet is on Main Street", "source": "chat"})
        found = await c.ok("memory_search", {"query": "ferret", "minScore": 0, "maxResults": 10})
        paths = {h["path"] for h in found["hits"]}
        assert {pet["path"], other["path"], str(workspace.resolve() / "memory" / "pets.md")} <= paths
        assert found["complete"] is True and found["degraded"] is None
        tagged = await c.ok("memory_search", {"query": "ferret", "minScore": 0, "tags": ["animal"]})
        assert [h["path"] for h in tagged["hits"]] == [pet["path"]]
        scoped = await c.ok("memory_search", {"query": "ferret", "minScore": 0, "scope": "/memory"})
        assert str(workspace.resolve() / "memory" / "pets.md") in {h["path"] for h in scoped["hits"]}
        assert str(workspace.resolve() / "MEMORY.md") not in {h["path"] for h in scoped["hits"]}
        nulls = await c.ok("memory_search", {"query": "ferret", "maxResults": None, "scope": None,
                                             "tags": None, "minScore": None})  # fmt: skip
        assert isinstance(nulls["hits"], list)
        got = await c.ok("memory_get", {"path": pet["path"]})
        assert got["text"] == "The ferret likes raisins"
        listed_memories = await c.ok("memory_list", {"tags": ["kind=fact"], "agent_id": None})
        assert [m["id"] for m in listed_memories] == [pet["id"]]
        assert (await c.ok("memory_delete", {"id": other["path"]}))["deleted"] is True
        await c.bad("memory_search", {"query": "x", "tags": "animal"}, "must be an array of")
        await c.bad("memory_get", {"path": "memory://12345"}, "no saved memory")
        await c.bad("memory_add", {"content": ""}, "must not be empty")
        await c.bad("memory_save", {"content": "x", "source": 5}, "'source' must be a string")
        await c.bad("memory_list", {"limit": -1}, "'limit' must be at least 0")
        await c.bad("memory_delete", {"id": other["id"]}, "no saved memory")

        # knowledge, with the store named on every entry
        stored = await c.ok("knowledge_store", {"content": "Blue-green deploys avoid downtime",
                                                "category": "pattern", "tags": ["area=ops"]})  # fmt: skip
        assert stored["store"] == "helper"
        shared = await c.ok("knowledge_store", {"content": "Blue-green needs two pools",
                                                "category": "pattern", "shared": True})  # fmt: skip
        assert shared["store"] == "shared"
        hits = await c.ok(
            "knowledge_query",
            {
                "query": "blue-green",
                "include_shared": True,
                "category": "pattern",
                "tags": None,
                "top_k": 5,
            },
        )
        assert {h["content"] for h in hits["hits"]} == {
            "Blue-green deploys avoid downtime",
            "Blue-green needs two pools",
        }
        assert all(h["store"] in ("helper", "shared") for h in hits["hits"])
        entry = await c.ok("knowledge_get", {"entry_id": shared["id"], "store": "shared"})
        assert entry["content"] == "Blue-green needs two pools" and entry["store"] == "shared"
        updated = await c.ok("knowledge_update", {"entry_id": stored["id"], "tags": ["area=ops", "tested"]})
        assert updated["tags"] == {"area": "ops", "tested": ""}
        listed_knowledge = await c.ok("knowledge_list", {"tags": ["tested"]})
        assert [e["id"] for e in listed_knowledge] == [stored["id"]]
        assert (await c.ok("knowledge_delete", {"entry_id": shared["id"], "store": "shared"}))["deleted"]
        await c.bad("knowledge_query", {"query": "x", "top_k": 0}, "'top_k' must be at least 1")
        await c.bad("knowledge_store", {"content": "x"}, "missing required argument 'category'")
        await c.bad("knowledge_get", {"entry_id": "one"}, "'entry_id' must be an integer")
        await c.bad("knowledge_update", {"entry_id": 1, "store": "elsewhere"}, "store must be")
        await c.bad("knowledge_delete", {}, "missing required argument 'entry_id'")
        await c.bad("knowledge_list", {"category": "Not A Category"}, "category")

        # episodes
        episode = await c.ok(
            "episode_remember",
            {"content": "Deployed the billing service", "kind": "outcome", "at": "2026-05-01T12:00:00Z"},
        )
        recalled = await c.ok("episode_recall", {"query": "billing deploy"})
        assert recalled["hits"][0]["id"] == episode["id"]
        timeline = await c.ok("episode_list", {"limit": 5})
        assert [e["id"] for e in timeline] == [episode["id"]]
        await c.bad("episode_remember", {"content": "x", "at": "yesterday"}, "ISO 8601")
        await c.bad("episode_recall", {"query": ["x"]}, "'query' must be a string")
        await c.bad("episode_list", {"offset": -1}, "'offset' must be at least 0")

        # working memory, per task and agent-wide; values are JSON text
        await c.ok("working_set", {"key": "step", "value": '{"n": 3}', "task_id": "t1"})
        await c.ok("working_set", {"key": "note", "value": "plain words"})
        assert (await c.ok("working_get", {"key": "step", "task_id": "t1"}))["value"] == {"n": 3}
        assert (await c.ok("working_get", {"key": "step"}))["found"] is False
        assert (await c.ok("working_get", {"key": "note"}))["value"] == "plain words"
        assert (await c.ok("working_clear", {"task_id": "t1"}))["removed"] == 1
        assert (await c.ok("working_get", {"key": "note"}))["found"] is True
        await c.bad("working_set", {"key": "k", "value": {"n": 1}}, "'value' must be a string")
        await c.bad("working_get", {}, "missing required argument 'key'")
        await c.bad("working_clear", {"key": 7}, "'key' must be a string")

        # blackboard: the publisher is the bound agent
        published = await c.ok("blackboard_publish", {"session_id": "s1", "key": "status", "value": '"idle"'})
        assert published["version"] >= 1
        signal = await c.ok("blackboard_get", {"session_id": "s1", "key": "status"})
        assert signal["value"] == "idle" and signal["publisher"] == "helper"
        assert (await c.ok("blackboard_list", {"session_id": "s1"})) == ["status"]
        await c.bad(
            "blackboard_publish",
            {"session_id": "s1", "key": "k", "value": "1", "publisher": "x"},
            "unknown argument 'publisher'",
        )
        await c.bad("blackboard_get", {"session_id": "s1"}, "missing required argument 'key'")
        await c.bad("blackboard_list", {"session_id": 3}, "'session_id' must be a string")

        # items: JSON objects by namespace and key; values and filters are JSON text
        put = {"namespace": ["crm", "acme"], "key": "lead", "value": '{"stage": "won", "n": 3}'}
        await c.ok("item_put", {**put, "index": ["stage"]})
        got = await c.ok("item_get", {"namespace": ["crm", "acme"], "key": "lead"})
        assert got["value"] == {"stage": "won", "n": 3}
        found = await c.ok("item_search", {"prefix": ["crm"], "filter": '{"n": {"$gte": 2}}'})
        assert [i["key"] for i in found] == ["lead"]
        assert (await c.ok("item_namespaces", {"max_depth": 1})) == [["crm"]]
        assert (await c.ok("item_delete", {"namespace": ["crm", "acme"], "key": "lead"}))["deleted"]
        await c.bad("item_put", {**put, "value": "[1]"}, "value")
        await c.bad("item_get", {"namespace": "crm", "key": "k"}, "'namespace' must be an array")
        await c.bad("item_search", {"limit": 5000}, "'limit' must be at most 1000")
        await c.bad("item_delete", {"namespace": ["crm"]}, "missing required argument 'key'")
        await c.bad("item_namespaces", {"max_depth": 0}, "'max_depth' must be at least 1")

        assert c.driven == set(tools.TOOL_NAMES)
        assert c.refused == set(tools.TOOL_NAMES)

    _connected(build_server(system, registry, agent_id="helper"), session)


def test_inspector_string_tags_get_a_clear_error(env: Any) -> None:
    """The MCP Inspector sent tags as a string when the schema allowed an object or an array."""
    system, registry, _ = env

    async def session(client: Client) -> None:
        listed = await _listed(client)
        for name, tool in listed.items():
            tags = tool.input_schema["properties"].get("tags")
            if tags is not None:
                assert tags["type"] == "array" and tags["items"]["type"] == "string", name
        result = await client.call_tool("memory_add", {"content": "x", "tags": "kind=fact"})
        assert result.is_error
        message = _payload(result)["error"]
        assert message.startswith('memory_add: argument \'tags\' must be an array of "key" or "key=value"')
        assert "got a string ('kind=fact')" in message

    _connected(build_server(system, registry, agent_id="helper"), session)


def test_the_host_can_bind_the_agent(env: Any) -> None:
    system, registry, _ = env

    async def session(client: Client) -> None:
        listed = (await client.list_tools()).tools
        assert all("agent_id" not in t.input_schema["properties"] for t in listed)
        refused = await client.call_tool("knowledge_list", {"agent_id": "other"})
        assert refused.is_error and "unknown argument 'agent_id'" in _payload(refused)["error"]
        await client.call_tool("knowledge_store", {"content": "Bound fact", "category": "pattern"})

    _connected(build_server(system, registry, agent_id="bound", agent_id_argument=False), session)
    assert [e.content for e in system.agent("bound").list_knowledge()] == ["Bound fact"]
