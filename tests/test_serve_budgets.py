"""``serve`` keeps what one client costs within its budgets: a batch is at most as long as the
requests a client may have in flight, its answers count against the client's bytes of unwritten
answers while they are collected, and a subscriber's unread notifications are bounded in bytes
as well as in number.

Nothing waits on time: one worker runs a batch's members one after another, and a writer that
never returns stands for a client that does not read.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import memstrata.bridges._rpc_connection as connection_module
from memstrata import Config, MemorySystem
from memstrata._workspaces import Workspaces
from memstrata.bridges._methods import build_methods
from memstrata.bridges._server import Connection, ErrorCode, JsonLinesServer, Method, open_listener
from tests._support import RpcClient
from tests.fakes import FakeEmbedder

WAIT = 30.0
ANSWER = 4_000  # characters of each answer of ``big``


class _Table:
    """A method table whose ``big`` answers ``ANSWER`` characters; counts what ran."""

    def __init__(self) -> None:
        self.big_runs = 0
        self.notes: list[int] = []

    def methods(self) -> dict[str, Method]:
        def big(_p: dict[str, Any]) -> Any:
            self.big_runs += 1
            return "x" * ANSWER

        def note(p: dict[str, Any]) -> Any:
            self.notes.append(p["n"])
            return p["n"]

        return {
            "big": Method("big", {"type": "object"}, big),
            "note": Method("note", {"type": "object", "properties": {"n": {"type": "integer"}}}, note),
        }


def _rq(request_id: Any, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def _serve(table: _Table, *lines: Any) -> list[Any]:
    data = b"".join(orjson.dumps(line) + b"\n" for line in lines)
    out = io.BytesIO()
    JsonLinesServer(table.methods(), workers=1).serve(io.BytesIO(data), out)
    return [orjson.loads(line) for line in out.getvalue().splitlines()]


# -- batches -------------------------------------------------------------------------------------


def test_a_batch_longer_than_the_in_flight_limit_is_refused_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection_module, "MAX_IN_FLIGHT", 4)
    table = _Table()
    too_long = [_rq(n, "note", n=n) for n in range(5)]
    out = _serve(table, too_long, [_rq(n, "note", n=n) for n in range(10, 14)])
    refused, answered = out
    assert refused == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": ErrorCode.INVALID_REQUEST,
            "message": "a batch holds at most 4 requests, got 5: send them in smaller batches",
        },
    }
    assert sorted(r["result"] for r in answered) == [10, 11, 12, 13]
    assert table.notes == [10, 11, 12, 13], "nothing of the refused batch ran"


def test_a_batch_stops_running_members_once_its_answers_reach_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connection_module, "MAX_UNWRITTEN_BYTES", 10_000)
    table = _Table()
    batch = [_rq(n, "big") for n in range(5)]
    batch.insert(4, {"jsonrpc": "2.0", "method": "note", "params": {"n": 7}})  # a notification
    out = _serve(table, batch, _rq("after", "note", n=8))
    array, after = out
    # one worker: members run in order; the third answer takes the batch past 10,000 bytes
    assert table.big_runs == 3 and table.notes == [7, 8]
    by_id = {r["id"]: r for r in array}
    assert sorted(by_id) == [0, 1, 2, 3, 4]
    assert all(len(by_id[n]["result"]) == ANSWER for n in range(3))
    for n in (3, 4):
        error = by_id[n]["error"]
        assert error["code"] == ErrorCode.RUNTIME_ERROR
        assert error["message"] == (
            "big: not run: the answers waiting to be written to this client (this batch's included) "
            "reached its budget of 10000 bytes; send fewer requests per batch"
        )
    assert after == {"jsonrpc": "2.0", "id": "after", "result": 8}, "the budget is free again after it"


def test_an_ordinary_batch_is_answered_whole_in_one_array() -> None:
    table = _Table()
    out = _serve(
        table, [_rq(n, "big") for n in range(3)] + [{"jsonrpc": "2.0", "method": "note", "params": {"n": 1}}]
    )
    (array,) = out
    assert sorted(r["id"] for r in array) == [0, 1, 2] and table.big_runs == 3 and table.notes == [1]


# -- notifications to a client that does not read ------------------------------------------------


class _StuckWriter(io.RawIOBase):
    """A client that does not read: the first write waits until :attr:`release` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.written = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.release.wait(WAIT)
        self.written += len(data)
        return len(data)


class _Server:
    def __init__(self) -> None:
        self.stats = connection_module.ServeStats()
        self.workers = 1
        self._stats_lock = threading.Lock()
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def _submit(self, job: Any) -> None:
        job()


def test_notifications_waiting_for_a_client_are_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection_module, "MAX_BACKLOG_BYTES", 1_000_000, raising=False)
    writer = _StuckWriter()
    connection = Connection(_Server(), writer, "slow")  # type: ignore[arg-type]
    value = "x" * 100_000
    queued = 0
    while connection.notify("signal", {"value": value}) and queued < 100:
        queued += 1
    # each line is a little over 100,000 bytes: nine fit in 1,000,000, the tenth does not
    assert queued == 9
    assert connection.notify("subscription_ended", {"reason": "x"}, limited=False)
    writer.release.set()
    connection.close()
    assert connection.notify("signal", {"value": 1}) is False


@pytest.fixture
def served(data_dir: Path) -> Iterator[str]:
    folder = tempfile.mkdtemp(prefix="ms-")  # short: socket paths are limited to ~100 bytes
    path = os.path.join(folder, "serve.sock")
    with (
        MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system,
        Workspaces.open(data_dir, embedder=FakeEmbedder()) as workspaces,
    ):
        server = JsonLinesServer(build_methods(system, workspaces), workers=4)
        thread = threading.Thread(
            target=server.serve_socket, args=(open_listener(f"unix:{path}"),), daemon=True
        )
        thread.start()
        yield path
        server.stop()
        thread.join(WAIT)
        assert not thread.is_alive()
    with contextlib.suppress(OSError):
        os.rmdir(folder)


def test_a_subscriber_that_does_not_read_loses_its_subscription_past_the_byte_budget(
    served: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # room for two notifications of 200 KB: the one a reader has just received still counts
    # until the server's writer, which sent it, takes the lock again (on a busy machine, after
    # the reader has already asked for the next one), and that next one
    monkeypatch.setattr(connection_module, "MAX_BACKLOG_BYTES", 500_000, raising=False)
    slow, fast = RpcClient(served), RpcClient(served)
    slow_sub = slow.call("subscribe", session_id="s", key_or_prefix="*")["subscription_id"]
    fast_sub = fast.call("subscribe", session_id="s", key_or_prefix="*")["subscription_id"]
    slow.reading.clear()  # far fewer than 10,000 notifications, but far more bytes than allowed
    big = "x" * 200_000
    for n in range(40):
        fast.call("publish", session_id="s", key=f"k{n}", value=big)
        assert fast.signal(fast_sub)["key"] == f"k{n}"
    slow.reading.set()
    ended = slow.next(lambda m: m.get("method") == "subscription_ended")
    assert ended["params"]["subscription_id"] == slow_sub
    keys = [m["params"]["key"] for m in slow.seen if m.get("method") == "signal"]
    assert len(keys) < 40
    fast.call("publish", session_id="s", key="later", value=1)
    assert fast.signal(fast_sub)["key"] == "later"
    slow.close()
    fast.close()
