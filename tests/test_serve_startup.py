"""``memstrata serve`` stopped by SIGTERM while it starts: the requests already written are
answered and the exit is 0, as for a SIGTERM while serving.

The SIGTERM is sent by the process itself from a hook at a known point of its startup (as the
memory system starts, before the model loads), once the test's request is in its stdin: nothing
depends on timing. And SIGTERM ends a server whose client stopped reading its answers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import orjson

from tests._support import output_when_done

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 120.0

_SIGTERM_AS_IT_STARTS = """
import os, select, signal, sys
from memstrata import MemorySystem
from memstrata.bridges._app import CliState
from memstrata.bridges.cli import cli
from tests.fakes import FakeEmbedder

start = MemorySystem.start.__func__

def sigterm_then_start(cls, *args, **kwargs):
    select.select([sys.stdin], [], [])  # the request is written ...
    os.kill(os.getpid(), signal.SIGTERM)  # ... then SIGTERM, before the memory system is up
    return start(cls, *args, **kwargs)

MemorySystem.start = classmethod(sigterm_then_start)
cli.main(args=sys.argv[1:], obj=CliState(embedder=FakeEmbedder()))
"""


def _serve_with_sigterm_at_start(data_dir: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MEMSTRATA_CONFIG", None)
    return subprocess.Popen(
        [sys.executable, "-c", _SIGTERM_AS_IT_STARTS, "--data-dir", str(data_dir), "serve", *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=env,
    )


def test_sigterm_while_starting_answers_what_was_written_and_exits_0(data_dir: Path) -> None:
    proc = _serve_with_sigterm_at_start(data_dir)
    assert proc.stdin is not None
    requests = [{"jsonrpc": "2.0", "id": i, "method": "list_roots"} for i in (1, 2)]
    proc.stdin.write(b"".join(orjson.dumps(r) + b"\n" for r in requests) + b'{"id": 3, "meth')
    proc.stdin.flush()  # stdin stays open: the SIGTERM, not the end of input, stops the server
    out, err = output_when_done(proc, TIMEOUT)
    assert proc.returncode == 0, err.decode()
    answers = [orjson.loads(line) for line in out.splitlines()]
    assert sorted(a["id"] for a in answers) == [1, 2] and all("result" in a for a in answers)  # not 3
    assert b"answering the requests written while starting" in err


def test_sigterm_while_starting_a_socket_server_exits_0(data_dir: Path, tmp_path: Path) -> None:
    proc = _serve_with_sigterm_at_start(data_dir, "--listen", f"unix:{tmp_path / 's.sock'}")
    assert proc.stdin is not None
    proc.stdin.write(b"\n")  # lets the hook go on
    proc.stdin.flush()
    out, err = output_when_done(proc, TIMEOUT)
    assert proc.returncode == 0, err.decode()
    assert out == b"" and b"listening on" not in err


# -- SIGTERM while a stdio client does not read its answers --------------------------------------

_NO_GRACE = """
import sys
import memstrata.bridges._server as server_module
from memstrata.bridges._app import CliState
from memstrata.bridges.cli import cli
from tests.fakes import FakeEmbedder

class NoGrace(server_module.JsonLinesServer):  # the client gets no time to take its answers
    def __init__(self, *args, **kwargs):
        super().__init__(*args, stop_grace=0.0, **kwargs)

server_module.JsonLinesServer = NoGrace
cli.main(args=sys.argv[1:], obj=CliState(embedder=FakeEmbedder()))
"""


def test_sigterm_ends_serve_when_its_client_stops_reading_stdout(data_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MEMSTRATA_CONFIG", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", _NO_GRACE, "--data-dir", str(data_dir), "serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    content = "memory " * 300_000  # 2.1 MB: an answer no pipe holds

    def send(request_id: int, method: str, **params: Any) -> None:
        assert proc.stdin is not None
        request = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        proc.stdin.write(orjson.dumps(request) + b"\n")
        proc.stdin.flush()

    send(1, "store_knowledge", agent_id="a", content=content)
    entry_id = orjson.loads(proc.stdout.readline())["result"]["id"]
    send(2, "get_knowledge", agent_id="a", entry_id=entry_id)
    assert proc.stdout.read(1) == b"{"  # the answer is being written; the rest is never read
    proc.send_signal(signal.SIGTERM)
    guard = threading.Timer(TIMEOUT, proc.kill)
    guard.start()
    try:
        err = proc.stderr.read() if proc.stderr is not None else b""
        proc.wait()
    finally:
        guard.cancel()
        proc.stdin.close()
        proc.stdout.close()
    assert proc.returncode == 0, err.decode()
    assert b"stdio: did not take its answers within 0 s of stopping; they are dropped" in err
