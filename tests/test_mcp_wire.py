"""MCP answers every line: hostile input gets exactly one JSON-RPC error and the session goes on.

In process over byte streams (fake embedder), and as the real ``memstrata mcp`` process fed raw
bytes on its stdin.
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

pytest.importorskip("mcp")

from memstrata import Config, MemorySystem
from memstrata.bridges._mcp import build_server, serve_lines
from memstrata.bridges._server import ErrorCode
from tests._support import MCP_INITIALIZE, MCP_INITIALIZED
from tests.fakes import FakeEmbedder

REPO = Path(__file__).resolve().parent.parent


# (line, expected id, expected error code); JavaScript writes a lone surrogate as "\ud800"
HOSTILE: list[tuple[bytes, Any, int]] = [
    (
        b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"memory_add",'
        b'"arguments":{"content":"a \\ud800 b"}}}',
        7,
        ErrorCode.INVALID_PARAMS,
    ),
    (b"this is not json", None, ErrorCode.PARSE_ERROR),
    (b'{"jsonrpc":"2.0","id":8,"method":"tools/list"', None, ErrorCode.PARSE_ERROR),
    (b"[" * 100_000 + b"]" * 100_000, None, ErrorCode.INVALID_REQUEST),
    (
        b'{"jsonrpc":"2.0","id":9,"method":"tools/call","params":' + b'{"a":' * 100 + b"1" + b"}" * 101,
        9,
        ErrorCode.INVALID_REQUEST,
    ),
    (b'{"jsonrpc":"2.0","id":{"x":1},"method":"tools/list"}', None, ErrorCode.INVALID_REQUEST),
    (b'{"jsonrpc":"2.0","id":10,"method":"tools/call","params":[1,2]}', 10, ErrorCode.INVALID_PARAMS),
    (b'{"jsonrpc":"2.0","id":11,"method":"tools/call","params":"x"}', 11, ErrorCode.INVALID_PARAMS),
    (b'{"jsonrpc":"2.0","id":12,"method":5}', 12, ErrorCode.INVALID_REQUEST),
    (b'{"jsonrpc":"1.0","id":13,"method":"tools/list"}', 13, ErrorCode.INVALID_REQUEST),
    (
        b'{"jsonrpc":"2.0","id":14,"method":"tools/list","params":{"x":"caf\xc3"}}',
        None,
        ErrorCode.PARSE_ERROR,
    ),
    (b"42", None, ErrorCode.INVALID_REQUEST),
    (b'{"jsonrpc":"2.0","id":true,"method":"tools/list"}', None, ErrorCode.INVALID_REQUEST),
    (  # an integer beyond 64 bits is refused, not read as a float and not handed on
        b'{"jsonrpc":"2.0","id":15,"method":"tools/call","params":{"name":"item_get",'
        b'"arguments":{"namespace":["n"],"key":"k","limit":123456789012345678901234567890}}}',
        15,
        ErrorCode.INVALID_PARAMS,
    ),
    (
        b'{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"tools/list"}',
        None,
        ErrorCode.INVALID_REQUEST,
    ),
    (  # so is a number too large for a double: with the request's id, never read as infinity
        b'{"jsonrpc":"2.0","id":16,"method":"tools/call","params":{"name":"memory_search",'
        b'"arguments":{"query":"x","maxResults":1e400}}}',
        16,
        ErrorCode.INVALID_PARAMS,
    ),
    (b'{"jsonrpc":"2.0","id":-1e400,"method":"tools/list"}', None, ErrorCode.INVALID_REQUEST),
    (  # arguments sent as a JSON string: the SDK's own error would name nothing
        b'{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"memory_list",'
        b'"arguments":"{\\"limit\\": 2}"}}',
        17,
        ErrorCode.INVALID_PARAMS,
    ),
    (
        b'{"jsonrpc":"2.0","id":18,"method":"tools/call","params":{"arguments":{}}}',
        18,
        ErrorCode.INVALID_PARAMS,
    ),
    (b'{"jsonrpc":"2.0","id":19,"method":"tools/call","params":{"name":5}}', 19, ErrorCode.INVALID_PARAMS),
]


def _lines(*messages: Any) -> bytes:
    return b"".join((m if isinstance(m, bytes) else orjson.dumps(m)) + b"\n" for m in messages)


def _check(responses: list[dict[str, Any]]) -> None:
    by_id: dict[Any, list[dict[str, Any]]] = {}
    for response in responses:
        by_id.setdefault(response.get("id"), []).append(response)
    assert "result" in by_id["init"][0]
    nulls = [r for r in by_id.get(None, [])]
    expected_nulls = [code for _, rid, code in HOSTILE if rid is None]
    assert sorted(r["error"]["code"] for r in nulls) == sorted(int(c) for c in expected_nulls), nulls
    for _, rid, code in HOSTILE:
        if rid is None:
            continue
        (answer,) = by_id[rid]
        assert answer["error"]["code"] == code, answer
        assert "\n" not in answer["error"]["message"]
    assert all(r.get("jsonrpc") == "2.0" for r in responses)
    # still serving afterwards: the last request is answered normally
    (listed,) = by_id["after"]
    assert {t["name"] for t in listed["result"]["tools"]} >= {"memory_add", "memory_search"}
    invalid_utf8 = next(r for r in nulls if "UTF-8" in r["error"]["message"])
    assert "invalid UTF-8 at byte" in invalid_utf8["error"]["message"]
    assert "surrogates not allowed" not in invalid_utf8["error"]["message"]
    named = {rid: by_id[rid][0]["error"]["message"] for rid in (17, 18, 19)}
    assert named == {
        17: "tools/call: param 'arguments' must be an object, got a string",
        18: "tools/call: param 'name' is required",
        19: "tools/call: param 'name' must be a string, got an integer",
    }
    (beyond_double,) = by_id[16]
    assert beyond_double["error"]["message"] == (
        "tools/call: number 1e400 in param 'arguments.maxResults' "
        "is outside the range of a double (magnitude up to about 1.8e308)"
    )


def test_every_hostile_line_gets_one_error_in_process(data_dir: Path) -> None:
    payload = _lines(
        MCP_INITIALIZE,
        MCP_INITIALIZED,
        *[line for line, _, _ in HOSTILE],
        {"jsonrpc": "2.0", "id": "after", "method": "tools/list"},
    )
    out = io.BytesIO()
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        server = build_server(system, None, agent_id="wire")
        anyio.run(lambda: serve_lines(server, io.BytesIO(payload), out))
    responses = [orjson.loads(line) for line in out.getvalue().splitlines()]
    _check(responses)
    assert len(responses) == 1 + len(HOSTILE) + 1


def test_an_id_with_an_escaped_lone_surrogate_is_echoed_exactly(data_dir: Path) -> None:
    payload = _lines(
        MCP_INITIALIZE, MCP_INITIALIZED, b'{"jsonrpc":"2.0","id":"\\ud800","method":"tools/list"}'
    )
    out = io.BytesIO()
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        server = build_server(system, None, agent_id="wire")
        anyio.run(lambda: serve_lines(server, io.BytesIO(payload), out))
    # the server answers requests concurrently: the two answers may come in either order
    answers = out.getvalue().splitlines()
    (echoed,) = [line for line in answers if json.loads(line)["id"] != "init"]
    assert len(answers) == 2 and b'"id":"\\ud800"' in echoed
    assert json.loads(echoed)["id"] == "\ud800"


def test_memstrata_mcp_process_answers_raw_hostile_bytes(data_dir: Path) -> None:
    """The real command: each hostile line is answered, then a normal call still works."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MEMSTRATA_DEBUG", None)
    payload = _lines(
        MCP_INITIALIZE,
        MCP_INITIALIZED,
        *[line for line, _, _ in HOSTILE],
        {"jsonrpc": "2.0", "id": "after", "method": "tools/list"},
    )
    done = subprocess.run(
        [sys.executable, "-m", "memstrata", "--data-dir", str(data_dir), "mcp", "--agent", "wire"],
        input=payload,
        capture_output=True,
        cwd=data_dir,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    responses = [orjson.loads(line) for line in done.stdout.splitlines()]
    _check(responses)
    assert len(responses) == 1 + len(HOSTILE) + 1
    assert b"Traceback" not in done.stderr


def test_sdk_client_gets_an_error_for_a_too_deep_call_and_goes_on(data_dir: Path) -> None:
    """What the SDK's own client can send: arguments nested too deeply are answered with a
    JSON-RPC error (the client raises it) instead of no answer, and the session goes on."""
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.shared.exceptions import MCPError

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "memstrata", "--data-dir", str(data_dir), "mcp", "--agent", "wire"],
        env={"PYTHONPATH": str(REPO), "HOME": os.environ.get("HOME", str(data_dir))},
        cwd=str(data_dir),
    )
    deep: Any = "leaf"
    for _ in range(200):
        deep = {"d": deep}

    async def session() -> None:
        with anyio.fail_after(120):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
                await client.initialize()
                with pytest.raises(MCPError, match="nested deeper than 64"):
                    await client.call_tool("knowledge_query", {"query": "x", "tags": deep})
                listed = await client.list_tools()
                assert "knowledge_query" in {t.name for t in listed.tools}

    anyio.run(session)


def _answers(proc: subprocess.Popen[bytes], ids: set[str], limit_s: float = 120) -> dict[str, Any]:
    """Read ``proc``'s stdout lines until it has answered every id of ``ids`` (the limit only
    keeps a broken server from hanging the suite)."""
    assert proc.stdout is not None
    found: dict[str, Any] = {}
    buffer = b""
    deadline = time.monotonic() + limit_s
    while not ids <= set(found):
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"no answer for {ids - set(found)} within {limit_s:g} s"
        chunk = os.read(proc.stdout.fileno(), 1 << 16)
        assert chunk, "the server ended before answering"
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            message = orjson.loads(line)
            found[str(message.get("id"))] = message
    return found


def test_sigterm_ends_a_memstrata_mcp_session_as_closing_it_does(data_dir: Path, tmp_path: Path) -> None:
    """SIGTERM (how a host stops an MCP server that does not end when its input closes) stops the
    memory system: the command ends with 0, no traceback, and what the session did is kept (a
    blackboard is saved on stop). The client keeps stdin open: the session is still reading."""
    config = tmp_path / "memstrata.toml"
    config.write_text("[actors]\nblackboard_snapshot = true\n", encoding="utf-8")
    base = [sys.executable, "-m", "memstrata", "--data-dir", str(data_dir), "--config", str(config)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MEMSTRATA_DEBUG", None)
    publish = {
        "jsonrpc": "2.0",
        "id": "pub",
        "method": "tools/call",
        "params": {
            "name": "blackboard_publish",
            "arguments": {"session_id": "s1", "key": "k", "value": '"kept"'},
        },
    }
    proc = subprocess.Popen(
        [*base, "mcp", "--agent", "wire"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=data_dir,
        env=env,
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write(_lines(MCP_INITIALIZE, MCP_INITIALIZED, publish))
        proc.stdin.flush()
        answered = _answers(proc, {"init", "pub"})
        assert "error" not in answered["pub"] and not answered["pub"]["result"].get("isError"), answered
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, proc.stderr.read()[-2000:] if proc.stderr else ""
        err = proc.stderr.read() if proc.stderr else b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert b"Traceback" not in err, err[-2000:]
    got = subprocess.run(
        [*base, "board", "get", "-s", "s1", "--key", "k", "--json"],
        capture_output=True,
        cwd=data_dir,
        env=env,
        timeout=120,
        check=False,
    )
    assert got.returncode == 0 and orjson.loads(got.stdout)["value"] == "kept", got.stderr[-2000:]


def test_a_sigterm_while_the_system_starts_ends_mcp_before_serving() -> None:
    """The signal is kept while the system starts; once it runs, the session is not served and
    the command ends (stopping the system as it leaves)."""
    from memstrata.bridges._cli_serve import _SigtermStops

    early = _SigtermStops()
    early._received(signal.SIGTERM, None)  # no system yet: nothing to stop, only noted
    assert early.requested and not early.serving(object(), object())
    assert _SigtermStops().serving(object(), object())  # no signal: the session is served


def _store(request_id: Any, content: str) -> dict[str, Any]:
    call = {"name": "knowledge_store", "arguments": {"content": content, "category": "pattern"}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": call}


def test_requests_sharing_an_id_are_all_answered_before_the_session_ends(data_dir: Path) -> None:
    """Reusing an id is the client's mistake, but every write made is answered: the end of input
    waits for each request, not for each id."""
    payload = _lines(MCP_INITIALIZE, MCP_INITIALIZED, *[_store(7, f"entry number {n}") for n in range(10)])
    out = io.BytesIO()
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        server = build_server(system, None, agent_id="wire")
        anyio.run(lambda: serve_lines(server, io.BytesIO(payload), out))
        stored = system.agent("wire").list_knowledge(limit=100)
    answers = [orjson.loads(line) for line in out.getvalue().splitlines()]
    assert len([a for a in answers if a["id"] == 7 and "result" in a]) == 10
    assert len(stored) == 10


def test_a_cancelled_request_does_not_hold_the_end_of_input(data_dir: Path) -> None:
    """MCP answers no cancelled request, so the end of input must not wait for one (hosts cancel
    a call that timed out, then close the session)."""
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
    payload = _lines(MCP_INITIALIZE, MCP_INITIALIZED, _store(1, "cancel me"), cancel)
    out = io.BytesIO()
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        server = build_server(system, None, agent_id="wire")
        session = threading.Thread(
            target=lambda: anyio.run(
                lambda: serve_lines(server, io.BytesIO(payload), out, drain_timeout_s=3600)
            ),
            daemon=True,
        )
        session.start()
        session.join(120)  # a guard against a hang, far beyond the session's own time
        assert not session.is_alive(), "the session waited for an answer to a cancelled request"


def test_errors_the_sdk_would_leave_unnamed_name_their_cause(data_dir: Path) -> None:
    """A request before ``initialize`` and a request param of the wrong type: the SDK answers
    both with a bare "Invalid request parameters"."""
    early = _lines(_store(1, "too early"), MCP_INITIALIZE, MCP_INITIALIZED)
    late = _lines(
        MCP_INITIALIZE,
        MCP_INITIALIZED,
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"cursor": 5}},
    )
    answers: dict[Any, dict[str, Any]] = {}
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        for payload in (early, late):
            out = io.BytesIO()
            server = build_server(system, None, agent_id="wire")
            anyio.run(serve_lines, server, io.BytesIO(payload), out)
            answers.update((a["id"], a) for a in map(orjson.loads, out.getvalue().splitlines()))
        assert system.agent("wire").list_knowledge() == []  # the early call was not run
    assert answers[1]["error"] == {
        "code": ErrorCode.INVALID_REQUEST,
        "message": "tools/call: the session is not initialized yet: send 'initialize' first",
    }
    assert answers[2]["error"] == {
        "code": ErrorCode.INVALID_PARAMS,
        "message": "tools/list: param 'cursor': Input should be a valid string",
    }
