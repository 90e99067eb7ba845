"""The MCP server: in-process with the SDK's client (fake embedder), and `memstrata mcp` over stdio."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import orjson
import pytest

pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.client import Client

from memstrata import Config, MemorySystem
from memstrata._workspaces import Workspaces
from memstrata.bridges import tools
from memstrata.bridges._mcp import build_server
from tests.fakes import FakeEmbedder

REPO = Path(__file__).resolve().parent.parent


def _payload(result: Any) -> Any:
    (content,) = result.content
    assert content.type == "text"
    return orjson.loads(content.text)


def test_in_process_tools_roundtrip(data_dir: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "MEMORY.md").write_text("# Team\n\nStandup is at nine thirty.\n", encoding="utf-8")
    embedder = FakeEmbedder()
    with (
        MemorySystem.start(Config(data_dir=data_dir), embedder=embedder) as system,
        Workspaces(data_dir, config=system.config, embedder=embedder) as registry,
    ):
        registry.index(workspace)
        server = build_server(system, registry, agent_id="helper")

        async def session() -> None:
            async with Client(server) as client:
                listed = await client.list_tools()
                names = {t.name for t in listed.tools}
                assert names == set(tools.TOOL_NAMES)
                for tool in listed.tools:
                    jsonschema.Draft202012Validator.check_schema(tool.input_schema)
                    assert "agent_id" in tool.input_schema["properties"]
                    assert tool.annotations is not None and tool.annotations.title

                saved = await client.call_tool("memory_add", {"content": "The VPN needs the hardware token"})
                assert not saved.is_error
                ident = _payload(saved)["id"]
                found = _payload(await client.call_tool("memory_search", {"query": "VPN hardware token"}))
                assert found["hits"][0]["path"] == f"memory://{ident}"
                standup = _payload(await client.call_tool("memory_search", {"query": "when is standup"}))
                assert standup["hits"][0]["path"] == str(workspace.resolve() / "MEMORY.md")
                assert set(standup["hits"][0]) == {"path", "startLine", "endLine", "score", "snippet"}
                read = _payload(await client.call_tool("memory_get", {"path": "MEMORY.md", "from": 3}))
                assert read["text"] == "Standup is at nine thirty."

                other = await client.call_tool(
                    "knowledge_store",
                    {"content": "Blue-green deploys", "category": "pattern", "agent_id": "ops"},
                )
                assert not other.is_error
                mine = _payload(await client.call_tool("knowledge_query", {"query": "blue-green deploys"}))
                assert all(
                    h["content"] != "Blue-green deploys" for h in mine["hits"]
                )  # stored for "ops", not "helper"
                theirs = _payload(
                    await client.call_tool(
                        "knowledge_query", {"query": "blue-green deploys", "agent_id": "ops"}
                    )
                )
                assert theirs["hits"][0]["content"] == "Blue-green deploys"

                bad = await client.call_tool("memory_search", {"query": 3})
                assert bad.is_error
                assert "'query' must be a string" in _payload(bad)["error"]
                bad_agent = await client.call_tool("memory_list", {"agent_id": 5})
                assert bad_agent.is_error and "agent_id" in _payload(bad_agent)["error"]
                unknown = await client.call_tool("memory_drop", {})
                assert unknown.is_error and "unknown tool" in _payload(unknown)["error"]

        anyio.run(session)


def test_memstrata_mcp_over_stdio(data_dir: Path) -> None:
    """The real command, real model: list the tools, store a fact, query it back."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "memstrata", "--data-dir", str(data_dir), "mcp", "--agent", "writer"],
        env={"PYTHONPATH": str(REPO), "HOME": os.environ.get("HOME", str(data_dir))},
        cwd=str(data_dir),
    )

    async def session() -> None:
        with anyio.fail_after(120):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
                await client.initialize()
                listed = await client.list_tools()
                assert {t.name for t in listed.tools} == set(tools.TOOL_NAMES)
                stored = await client.call_tool(
                    "knowledge_store",
                    {"content": "The billing service retries webhooks three times", "category": "codebase"},
                )
                assert not stored.is_error, stored
                found = await client.call_tool("knowledge_query", {"query": "how often are webhooks retried"})
                hits = _payload(found)["hits"]
                assert hits[0]["content"] == "The billing service retries webhooks three times"
                assert hits[0]["category"] == "codebase"
                empty = _payload(await client.call_tool("memory_search", {"query": "anything"}))
                assert empty["hits"] == [] and "no memories indexed yet" in empty["warnings"][0]

    anyio.run(session)
    from memstrata.layers import KnowledgeStore

    with KnowledgeStore.open(data_dir / "knowledge" / "writer.sqlite") as store:
        assert store.count() == 1
