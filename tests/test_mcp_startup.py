"""``memstrata mcp`` stopped by SIGTERM while it starts (the SDK imports, the memory system
starts): the requests already written are answered, what they store is kept, and the exit is 0,
as ``memstrata serve`` does.

The SIGTERM is sent by the process itself from a hook at a known point of its startup (as the MCP
SDK is looked for, the first step), once the test's requests are in its stdin: nothing depends on
timing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from memstrata import Config, MemorySystem
from tests._support import MCP_INITIALIZE, MCP_INITIALIZED, output_when_done
from tests.fakes import FakeEmbedder

pytest.importorskip("mcp")

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 120.0

_SIGTERM_AS_IT_STARTS = """
import os, select, signal, sys
from memstrata.bridges import _mcp
from memstrata.bridges._app import CliState
from memstrata.bridges.cli import cli
from tests.fakes import FakeEmbedder

require_sdk = _mcp.require_sdk

def sigterm_then_require_sdk():
    _mcp.require_sdk = require_sdk  # once, as the command starts
    select.select([sys.stdin], [], [])  # the requests are written ...
    os.kill(os.getpid(), signal.SIGTERM)  # ... then SIGTERM, before the SDK is imported
    require_sdk()

_mcp.require_sdk = sigterm_then_require_sdk
cli.main(args=sys.argv[1:], obj=CliState(embedder=FakeEmbedder()))
"""


def _store(request_id: int, content: str) -> dict[str, Any]:
    call = {"name": "knowledge_store", "arguments": {"content": content, "category": "pattern"}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": call}


def test_sigterm_while_mcp_starts_answers_what_was_written_and_exits_0(data_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MEMSTRATA_CONFIG", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SIGTERM_AS_IT_STARTS, "--data-dir", str(data_dir), "mcp", "--agent", "wire"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    messages = [MCP_INITIALIZE, MCP_INITIALIZED, _store(1, "first kept"), _store(2, "second kept")]
    proc.stdin.write(b"".join(orjson.dumps(m) + b"\n" for m in messages) + b'{"jsonrpc": "2.0", "id": 3')
    proc.stdin.flush()  # stdin stays open: the SIGTERM, not the end of input, stops the session
    out, err = output_when_done(proc, TIMEOUT)
    assert proc.returncode == 0, err.decode()[-2000:]
    answers = {a["id"]: a for a in (orjson.loads(line) for line in out.splitlines())}
    assert set(answers) == {"init", 1, 2}, answers  # not 3: its line was cut short
    assert all(not answers[i]["result"].get("isError") for i in (1, 2)), answers
    assert b"answering the requests written while starting" in err
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        kept = {e.content for e in system.agent("wire").list_knowledge()}
    assert kept == {"first kept", "second kept"}
