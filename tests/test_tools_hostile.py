"""Hostile input through every bridge: the tool dispatcher, `serve`'s methods, MCP and the CLI.

Every case must end in a result or a clear one-line error; none may raise, crash the process,
surface as an internal error or leak a traceback.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from click.testing import CliRunner

from memstrata import MemorySystem
from memstrata._workspaces import Workspaces
from memstrata.bridges import tools
from memstrata.bridges._app import CliState
from memstrata.bridges._methods import build_methods
from memstrata.bridges._server import ErrorCode, JsonLinesServer
from memstrata.bridges.cli import cli
from tests._support import TOOL_ARGUMENTS, system_with_notes
from tests.fakes import FakeEmbedder

HOSTILE_STRINGS = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfff\ud800y",
    '"',
    "'",
    "\\",
    "' OR 1=1; --",
    "NEAR(a b) AND title:* OR ^x",
    "(((",
    "*",
    '"unbalanced',
    "中文内容检索",
    "🚀" * 50,
    "\u202eevil",
    "\r\n\t\x0b\x0c",
    "\x1b[2J\x07",
    "x" * 100_000,
    "../../etc/passwd",
    "/etc/passwd",
    "~/.ssh/id_rsa",
    "memory://",
    "memory://../1",
    "memory://99999999999999999999",
    "C:\\Windows\\system32",
    "%s%n{0}",
    "{{7*7}}",
    "<script>alert(1)</script>",
    "Bad Category",
    "/scope/../up",
]
HOSTILE_OTHERS: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    2**63,
    1e308,
    -0.5,
    [],
    {},
    [[[[]]]],
    {"a": {"b": {}}},
    ["k=v"],
]
HOSTILE = HOSTILE_STRINGS + HOSTILE_OTHERS


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MemorySystem, Workspaces]]:
    with system_with_notes(tmp_path_factory.mktemp("hostile")) as env:
        yield env


def _check_tool_result(result: Any, where: str) -> None:
    dumps = orjson.dumps  # the result must be writable as JSON (after surrogate repair)
    from memstrata.bridges._json import dumps as repairing_dumps

    try:
        dumps(result)
    except TypeError:
        repairing_dumps(result)
    if isinstance(result, dict) and "error" in result:
        message = result["error"]
        assert isinstance(message, str) and "\n" not in message, where
        assert "internal error" not in message and "Traceback" not in message, (where, message)


def test_every_tool_is_tried() -> None:
    assert set(TOOL_ARGUMENTS) == set(tools.TOOL_NAMES)


@pytest.mark.parametrize("name", sorted(TOOL_ARGUMENTS))
def test_dispatcher_survives_hostile_arguments(env: Any, name: str) -> None:
    system, registry = env
    schema = next(t["parameters"] for t in tools.tool_schemas() if t["name"] == name)
    cases = 0
    for key in [*schema["properties"], "unexpected"]:
        for value in HOSTILE:
            arguments = {**TOOL_ARGUMENTS[name], key: value}
            result = tools.dispatch(name, arguments, system, agent_id="hostile", workspaces=registry)
            _check_tool_result(result, f"{name}({key}={value!r:.40})")
            cases += 1
    for raw in ["", "null", "[]", '{"query": ', "\x00", '{"a":' * 200, b"\xff\xfe"]:
        _check_tool_result(tools.dispatch(name, raw, system, workspaces=registry), f"{name}(raw {raw!r:.20})")
        cases += 1
    assert cases >= 60


def test_dispatcher_survives_hostile_agent_ids(env: Any) -> None:
    system, registry = env
    for agent_id in [s for s in HOSTILE_STRINGS if len(s) < 1000] + ["shared", "con", "a" * 65]:
        result = tools.dispatch(
            "memory_add", {"content": "x"}, system, agent_id=agent_id, workspaces=registry
        )
        _check_tool_result(result, f"agent {agent_id!r}")


_METHOD_ARGUMENTS: dict[str, dict[str, Any]] = {
    "store_knowledge": {"agent_id": "hostile", "content": "a fact"},
    "query_knowledge": {"agent_id": "hostile", "query": "fact"},
    "remember": {"agent_id": "hostile", "content": "an episode"},
    "recall": {"agent_id": "hostile", "query": "episode"},
    "get_knowledge": {"agent_id": "hostile", "entry_id": 1},
    "list_knowledge": {"agent_id": "hostile"},
    "delete_knowledge": {"agent_id": "hostile", "entry_id": 1, "store": "shared"},
    "set_working": {"agent_id": "hostile", "key": "k", "value": [1, "two"]},
    "get_working": {"agent_id": "hostile", "key": "k"},
    "clear_working": {"agent_id": "hostile", "key": "k"},
    "begin_task": {"agent_id": "hostile", "task_id": "t1", "description": "do it"},
    "complete_task": {"agent_id": "hostile", "task_id": "t1", "summary": "done"},
    "fail_task": {"agent_id": "hostile", "task_id": "t2", "reason": "broke"},
    "publish": {"session_id": "s", "key": "k", "value": 1},
    "get_signal": {"session_id": "s", "key": "k"},
    "list_signals": {"session_id": "s"},
    "search_files": {"query": "notes"},
    "get_file": {"path": "MEMORY.md"},
    "list_roots": {},
    "status": {},
    "update_knowledge": {"agent_id": "hostile", "entry_id": 1, "content": "changed"},
    "list_episodes": {"agent_id": "hostile"},
    "get_episode": {"agent_id": "hostile", "episode_id": 1},
    "delete_episode": {"agent_id": "hostile", "episode_id": 1},
    "promote_episode": {"agent_id": "hostile", "episode_id": 1},
    "delete_signal": {"session_id": "s", "key": "k"},
    "subscribe": {"session_id": "s", "key_or_prefix": "k"},
    "unsubscribe": {"session_id": "s", "subscription_id": 1},
    "put_item": {"namespace": ["n"], "key": "k", "value": {"text": "t"}, "index": ["text"]},
    "get_item": {"namespace": ["n"], "key": "k"},
    "search_items": {"prefix": ["n"], "query": "t"},
    "delete_item": {"namespace": ["n"], "key": "k"},
    "list_namespaces": {},
    "rpc.discover": {},
}
# methods that write or read files at a given path: hostile paths are tried with index/forget_root
# below, never as files to write (the tests may run as root)
_PATH_METHODS = {"index", "forget_root", "export", "import", "archive_episodes", "restore_episodes"}


def test_serve_methods_survive_hostile_params(env: Any, data_dir: Path) -> None:
    system, registry = env
    methods = build_methods(system, registry)
    assert set(methods) - _PATH_METHODS == set(_METHOD_ARGUMENTS)
    lines: list[bytes] = []
    for name, base in _METHOD_ARGUMENTS.items():
        for key in [*methods[name].params["properties"], "unexpected"]:
            for value in HOSTILE_STRINGS[::2] + HOSTILE_OTHERS:
                params = {**base, key: value}
                request = {"id": len(lines), "method": name, "params": params}
                try:
                    lines.append(orjson.dumps(request) + b"\n")
                except TypeError:  # lone surrogates: escaped the way JavaScript's JSON.stringify does
                    lines.append(json.dumps(request).encode() + b"\n")
    for path in ("../x", str(data_dir / "nope"), "/dev/null", "\x00"):
        for name in ("index", "forget_root"):
            request = {"id": len(lines), "method": name, "params": {"path": path}}
            lines.append(orjson.dumps(request) + b"\n")
    out = io.BytesIO()
    server = JsonLinesServer(methods, workers=4)
    server.serve(io.BytesIO(b"".join(lines)), out)
    messages = [orjson.loads(line) for line in out.getvalue().splitlines()]
    responses = [m for m in messages if "id" in m]  # not the signals pushed to a subscription
    assert all(m.get("method") == "signal" for m in messages if "id" not in m)
    assert len(responses) == len(lines) >= 200
    assert sorted(r["id"] for r in responses) == list(range(len(lines)))
    internal = [r for r in responses if r.get("error", {}).get("code") == ErrorCode.INTERNAL_ERROR]
    assert internal == []
    assert all("\n" not in r["error"]["message"] for r in responses if "error" in r)


def test_mcp_survives_hostile_calls(env: Any) -> None:
    pytest.importorskip("mcp")
    from mcp.client.client import Client

    from memstrata.bridges._mcp import build_server

    system, registry = env
    server = build_server(system, registry, agent_id="hostile")
    values = [v for v in HOSTILE if not (isinstance(v, str) and len(v) > 1000)]

    async def session() -> int:
        count = 0
        async with Client(server) as client:
            for name, base in TOOL_ARGUMENTS.items():
                key = next(iter(base), "limit")
                for value in values:
                    if isinstance(value, str) and not _encodable(value):
                        continue  # the MCP wire is UTF-8: lone surrogates cannot be sent
                    result = await client.call_tool(name, {**base, key: value})
                    payload = orjson.loads(result.content[0].text)
                    if result.is_error:
                        assert "internal error" not in payload["error"], payload
                    count += 1
                bad_agent = await client.call_tool(name, {**base, "agent_id": "../../x"})
                assert bad_agent.is_error
        return count

    assert anyio.run(session) >= 200


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def test_cli_survives_hostile_arguments(env: Any, data_dir: Path) -> None:
    runner = CliRunner()
    commands = [
        ["store", "{v}", "--agent", "a1", "-c", "pattern"],
        ["store", "ok", "--agent", "{v}", "-c", "pattern"],
        ["store", "ok", "--agent", "a1", "-c", "{v}"],
        ["store", "ok", "--agent", "a1", "-c", "pattern", "--scope", "{v}", "--tag", "{v}"],
        ["query", "{v}", "--agent", "a1"],
        ["remember", "{v}", "--agent", "a1"],
        ["recall", "{v}", "--agent", "a1", "--since", "{v}"],
        ["search", "{v}"],
        ["get", "{v}"],
    ]
    embedder = FakeEmbedder()
    for template in commands:
        for value in [s for s in HOSTILE_STRINGS if len(s) < 1000 and s != ""]:
            args = ["--data-dir", str(data_dir), *[value if part == "{v}" else part for part in template]]
            result = runner.invoke(cli, args, obj=CliState(embedder=embedder))
            assert result.exit_code in (0, 1, 2), (args, result.exception)
            if result.exit_code:
                lines = result.stderr.splitlines()
                assert len(lines) == 1 and lines[0].startswith("memstrata: error: "), (args, result.stderr)
                assert "unexpected" not in lines[0], (args, lines[0])
