"""``memstrata serve`` driven by a JSON-RPC client written in JavaScript (Node, no packages):
over stdio, a unix socket and loopback TCP, through subscribe / publish / signals / unsubscribe."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parent.parent
CLIENT = REPO / "tests" / "clients" / "jsonrpc_client.mjs"
TIMEOUT = 120.0
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(
    NODE is None, reason="node is not installed: the JavaScript client cannot run"
)


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MEMSTRATA_CONFIG", None)
    return env


def _serve_command(data_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "memstrata", "--data-dir", str(data_dir), "serve", *extra]


def _node(*args: str) -> dict[str, Any]:
    assert NODE is not None
    done = subprocess.run(
        [NODE, str(CLIENT), *args], capture_output=True, timeout=TIMEOUT, env=_env(), check=False
    )
    assert done.returncode == 0, (done.returncode, done.stderr.decode(errors="replace"))
    summary: dict[str, Any] = orjson.loads(done.stdout.splitlines()[-1])
    return summary


class Listening:
    """``memstrata serve --listen ADDRESS`` in the background; ``address`` is what it printed."""

    def __init__(self, data_dir: Path, spec: str) -> None:
        self.proc = subprocess.Popen(
            _serve_command(data_dir, "--listen", spec),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=_env(),
            cwd=data_dir,
        )
        self.stderr: list[str] = []
        ready = threading.Event()
        self.address = ""

        def read() -> None:
            assert self.proc.stderr is not None
            for raw in self.proc.stderr:
                line = raw.decode(errors="replace").rstrip("\n")
                self.stderr.append(line)
                if "listening on " in line and not ready.is_set():
                    self.address = line.split("listening on ", 1)[1]
                    ready.set()
            ready.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        assert ready.wait(TIMEOUT) and self.address, self.stderr

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(TIMEOUT)
        self._reader.join(TIMEOUT)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(TIMEOUT)


@pytest.fixture
def listen(data_dir: Path) -> Iterator[Any]:
    started: list[Listening] = []

    def start(spec: str) -> Listening:
        server = Listening(data_dir, spec)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="ms-"))  # socket paths must stay short
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@needs_node
def test_node_client_over_stdio(data_dir: Path) -> None:
    summary = _node("stdio", *_serve_command(data_dir))
    assert summary == {"ok": True, "subscription": 1, "signals": 4, "notifications": 6}


@needs_node
def test_node_clients_over_a_unix_socket_and_tcp(listen: Any, data_dir: Path, short_dir: Path) -> None:
    path = short_dir / "serve.sock"
    server = listen(f"unix:{path}")
    assert server.address == f"unix:{path}"
    assert (path.stat().st_mode & 0o777) == 0o600
    results: list[dict[str, Any]] = []
    clients = [threading.Thread(target=lambda: results.append(_node(server.address))) for _ in range(2)]
    for thread in clients:  # two at once, each with its own session and subscriptions
        thread.start()
    for thread in clients:
        thread.join(TIMEOUT)
    assert [r["ok"] for r in results] == [True, True]
    assert server.stop() == 0
    assert not path.exists(), "the socket file is removed on exit"

    tcp = listen("tcp:127.0.0.1:0")
    assert tcp.address.startswith("tcp:127.0.0.1:")
    assert _node(tcp.address)["signals"] == 4
    assert tcp.stop() == 0


def test_sigterm_drains_socket_clients_and_stops(listen: Any, short_dir: Path) -> None:
    path = short_dir / "serve.sock"
    server = listen(f"unix:{path}")
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(path))
    reader = client.makefile("rb")
    request = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "subscribe",
        "params": {"session_id": "s", "key_or_prefix": "*"},
    }
    client.sendall(orjson.dumps(request) + b"\n")
    assert orjson.loads(reader.readline())["result"]["subscription_id"] == 1
    complete = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "complete_task",
        "params": {"agent_id": "a1", "task_id": "t1", "summary": "shipped it"},
    }
    client.sendall(orjson.dumps(complete) + b"\n")
    assert orjson.loads(reader.readline())["result"]["queued"] is True
    assert server.stop() == 0
    assert reader.readline() == b""  # the server closed the connection after draining it
    assert not path.exists()
    assert any("stopping" in line for line in server.stderr)
    reader.close()
    client.close()


def test_refuses_a_non_loopback_host_and_a_live_socket(listen: Any, data_dir: Path, short_dir: Path) -> None:
    refused = subprocess.run(
        _serve_command(data_dir, "--listen", "tcp:0.0.0.0:0"),
        capture_output=True,
        timeout=TIMEOUT,
        env=_env(),
    )
    assert refused.returncode == 2
    assert b"only a loopback host" in refused.stderr and len(refused.stderr.splitlines()) == 1
    path = short_dir / "serve.sock"
    server = listen(f"unix:{path}")
    second = subprocess.run(
        _serve_command(data_dir, "--listen", f"unix:{path}"), capture_output=True, timeout=TIMEOUT, env=_env()
    )
    assert second.returncode == 2 and b"another server is listening" in second.stderr
    assert server.stop() == 0
