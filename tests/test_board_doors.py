"""The blackboard through its doors: a JSON-RPC subscription id names one subscription whatever
its session or connection, `board watch --connect` leaves the server without a warning,
and the command line's text output keeps a key or value with a newline on one unambiguous line."""

from __future__ import annotations

import io
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from memstrata import Config, MemorySystem
from memstrata._workspaces import Workspaces
from memstrata.bridges._app import CliState
from memstrata.bridges._methods import build_methods
from memstrata.bridges._server import JsonLinesServer, open_listener
from memstrata.bridges.cli import cli
from tests._support import RpcClient
from tests.fakes import FakeEmbedder

WAIT = 30.0


class _Served:
    """A server on a unix socket in this process, its warnings kept in ``log``."""

    def __init__(self, server: JsonLinesServer, path: str, log: io.StringIO) -> None:
        self.server = server
        self.path = path
        self.log = log

    def address(self) -> str:
        return f"unix:{self.path}"


@pytest.fixture
def served(data_dir: Path) -> Iterator[_Served]:
    folder = tempfile.mkdtemp(prefix="ms-")  # short: socket paths are limited to ~100 bytes
    path = os.path.join(folder, "serve.sock")
    log = io.StringIO()
    with (
        MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system,
        Workspaces.open(data_dir, embedder=FakeEmbedder()) as workspaces,
    ):
        server = JsonLinesServer(build_methods(system, workspaces), workers=4, log=log)
        thread = threading.Thread(target=server.serve_socket, args=(open_listener(f"unix:{path}"),))
        thread.start()
        try:
            yield _Served(server, path, log)
        finally:
            server.stop()
            thread.join(WAIT)
    os.rmdir(folder)


def test_subscription_ids_are_unique_within_a_connection(served: _Served) -> None:
    client = RpcClient(served.path)
    everything_s1 = client.call("subscribe", session_id="s1", key_or_prefix="*")["subscription_id"]
    everything_s2 = client.call("subscribe", session_id="s2", key_or_prefix="*")["subscription_id"]
    k_s1 = client.call("subscribe", session_id="s1", key_or_prefix="k")["subscription_id"]
    assert len({everything_s1, everything_s2, k_s1}) == 3
    client.call("publish", session_id="s2", key="k", value="from s2")
    assert client.signal() == {
        "subscription_id": everything_s2,
        "session_id": "s2",
        "key": "k",
        "value": "from s2",
        "version": 1,
        "publisher": None,
        "deleted": False,
    }
    client.call("publish", session_id="s1", key="k", value="from s1")
    both = [client.signal(), client.signal()]
    assert sorted(s["subscription_id"] for s in both) == [everything_s1, k_s1]
    assert all(s["session_id"] == "s1" and s["value"] == "from s1" for s in both)
    # an id names one subscription: given with another session, it removes nothing
    assert client.call("unsubscribe", session_id="s1", subscription_id=everything_s2) == {"removed": False}
    assert client.call("unsubscribe", session_id="s2", subscription_id=everything_s2) == {"removed": True}
    assert client.call("unsubscribe", session_id="s1", subscription_id=k_s1) == {"removed": True}
    client.call("publish", session_id="s2", key="k", value="nobody listens")
    client.call("publish", session_id="s1", key="k", value="only everything")
    assert client.signal()["subscription_id"] == everything_s1
    other = RpcClient(served.path)  # ids are unique across connections too: none names another's
    others = other.call("subscribe", session_id="s1", key_or_prefix="*")["subscription_id"]
    assert others not in (everything_s1, everything_s2, k_s1)
    assert other.call("unsubscribe", session_id="s1", subscription_id=everything_s1) == {"removed": False}
    client.call("publish", session_id="s1", key="k", value="both connections")
    assert client.signal()["subscription_id"] == everything_s1
    assert other.signal()["subscription_id"] == others
    other.close()
    client.close()


def _invoke(data_dir: Path, *args: str) -> Result:
    return CliRunner().invoke(
        cli, ["--data-dir", str(data_dir), *args], obj=CliState(embedder=FakeEmbedder())
    )


def test_watch_with_count_leaves_no_warning_on_the_server(served: _Served, tmp_path: Path) -> None:
    publisher = RpcClient(served.path)
    publisher.call("publish", session_id="s1", key="k", value="v")
    for _ in range(3):
        watched = _invoke(
            tmp_path, "board", "watch", "--connect", served.address(), "-s", "s1", "k", "-n", "1"
        )
        assert watched.exit_code == 0, watched.output
        assert watched.output == 'k = "v"  (version 1)\n'
    publisher.close()
    assert served.server.wait_connections(lambda n: n == 0, WAIT)
    assert served.log.getvalue() == ""


def test_text_output_escapes_keys_and_values_holding_control_characters(tmp_path: Path) -> None:
    config = tmp_path / "memstrata.toml"  # the board outlives each command
    config.write_text("[actors]\nblackboard_snapshot = true\n", encoding="utf-8")

    def run(*args: str) -> Result:
        result = _invoke(tmp_path / "data", "--config", str(config), *args)
        assert result.exit_code == 0, result.output
        return result

    evil = "evil\nkey: injected"
    run("board", "publish", "-s", "s", "--key", evil, "--value", '"x\\ny"', "--publisher", "a\tb")
    run("board", "publish", "-s", "s", "--key", "plain", "--value", '"two  spaces"')
    run("board", "publish", "-s", "s", "--key", '"quoted"', "--value", "1")
    assert run("board", "list", "-s", "s").output.splitlines() == [
        '"\\"quoted\\""',
        '"evil\\nkey: injected"',
        "plain",
    ]
    got = run("board", "get", "-s", "s", "--key", evil).output.splitlines()
    assert 'key: "evil\\nkey: injected"' in got and 'value: "x\\ny"' in got
    assert 'publisher: "a\\tb"' in got
    assert "value: two  spaces" in run("board", "get", "-s", "s", "--key", "plain").output
    assert run("board", "watch", "-s", "s", "*", "-n", "3").output.splitlines() == [
        '"\\"quoted\\"" = 1  (version 1)',
        '"evil\\nkey: injected" = "x\\ny"  (version 1, by "a\\tb")',
        'plain = "two  spaces"  (version 1)',
    ]
