"""JSON-RPC 2.0 as ``memstrata serve`` speaks it: notifications, batches, the jsonrpc member,
``rpc.discover``, subscriptions, and many clients on a local socket sharing one system."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import queue
import socket
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from memstrata import AsyncMemorySystem, Config, MemorySystem
from memstrata._workspaces import Workspaces
from memstrata.bridges._methods import build_methods, method_table, openrpc_document
from memstrata.bridges._operations import OPERATIONS, Context, find
from memstrata.bridges._server import ErrorCode, JsonLinesServer, Method, open_listener
from memstrata.bridges.doc_tables import render as render_table
from memstrata.errors import InvalidInputError
from memstrata.layers import BlackboardState
from tests._support import RpcClient
from tests.fakes import FakeEmbedder

WAIT = 30.0


# -- the protocol, over a small method table --------------------------------------------------


def _table(log: list[Any]) -> dict[str, Method]:
    def append(p: dict[str, Any]) -> Any:
        log.append(p["n"])
        return p["n"]

    def boom(p: dict[str, Any]) -> Any:
        raise RuntimeError("boom")

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    return {
        "append": Method("append", schema, append, lambda p: "log"),
        "boom": Method("boom", {"type": "object"}, boom),
    }


def _serve(*lines: Any) -> tuple[list[Any], list[Any]]:
    """Serve ``lines`` (objects, or raw bytes) to the end; the output lines parsed, and the log."""
    log: list[Any] = []
    data = b"".join(x if isinstance(x, bytes) else orjson.dumps(x) + b"\n" for x in lines)
    out = io.BytesIO()
    JsonLinesServer(_table(log), workers=4).serve(io.BytesIO(data), out)
    return [orjson.loads(line) for line in out.getvalue().splitlines()], log


def _rq(request_id: Any, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def _note(method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def test_a_notification_runs_and_gets_no_response_even_when_it_fails() -> None:
    out, log = _serve(
        _note("append", n=1),
        _note("append", n="not a number"),  # invalid params: not reported
        _note("no_such_method"),  # unknown method: not reported
        _note("boom"),  # fails while running: not reported
        _rq(2, "append", n=2),
    )
    assert log == [1, 2]
    assert out == [{"jsonrpc": "2.0", "id": 2, "result": 2}]


def test_every_response_says_jsonrpc_2_0_and_a_wrong_version_is_refused() -> None:
    out, _ = _serve(
        _rq(1, "append", n=1),
        {"id": 2, "method": "append", "params": {"n": 2}},  # no jsonrpc member: accepted
        {"jsonrpc": "1.0", "id": 3, "method": "append", "params": {"n": 3}},
        _rq(4, "boom"),
        b"not json\n",
    )
    assert all(r["jsonrpc"] == "2.0" for r in out)
    by_id = {r["id"]: r for r in out}
    assert by_id[1]["result"] == 1 and by_id[2]["result"] == 2
    assert by_id[3]["error"]["code"] == ErrorCode.INVALID_REQUEST and '"2.0"' in by_id[3]["error"]["message"]
    assert by_id[4]["error"]["code"] == ErrorCode.INTERNAL_ERROR
    assert by_id[None]["error"]["code"] == ErrorCode.PARSE_ERROR


def test_a_batch_answers_its_requests_with_ids_in_one_array() -> None:
    batch = [
        _rq(1, "append", n=1),
        _note("append", n=2),
        _rq(3, "nope"),
        _rq(4, "append", n="x"),
        5,
        {"jsonrpc": "2.0", "method": 6},
        _rq(7, "append", n=7),
    ]
    out, log = _serve(orjson.dumps(batch) + b"\n", _rq("after", "append", n=8))
    array, single = out
    assert isinstance(array, list) and single == {"jsonrpc": "2.0", "id": "after", "result": 8}
    by_id: dict[Any, list[Any]] = {}
    for response in array:
        assert response["jsonrpc"] == "2.0"
        by_id.setdefault(response["id"], []).append(response)
    assert set(by_id) == {1, 3, 4, 7, None}
    assert by_id[1][0]["result"] == 1 and by_id[7][0]["result"] == 7
    assert by_id[3][0]["error"]["code"] == ErrorCode.METHOD_NOT_FOUND
    assert by_id[4][0]["error"]["code"] == ErrorCode.INVALID_PARAMS
    assert sorted(r["error"]["code"] for r in by_id[None]) == [ErrorCode.INVALID_REQUEST] * 2
    assert log == [1, 2, 7, 8]  # one lane: in order, the notification included


def test_an_empty_batch_is_invalid_and_a_batch_of_notifications_is_silent() -> None:
    out, log = _serve(b"[]\n", orjson.dumps([_note("append", n=1), _note("append", n=2)]) + b"\n")
    assert out == [
        {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32600, "message": "an empty batch is not a request"},
        }
    ]
    assert log == [1, 2]


# -- the registry as served: rpc.discover and the docs ---------------------------------------

_CONTENT_DESCRIPTOR = {"name", "schema"}


def test_an_optional_param_given_as_null_is_left_out_and_a_required_one_is_refused() -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "label": {"type": "string"}},
        "required": ["n"],
    }
    table = {"echo": Method("echo", schema, lambda p: p)}
    data = b"".join(
        orjson.dumps(r) + b"\n" for r in (_rq(1, "echo", n=1, label=None), _rq(2, "echo", n=None, label="x"))
    )
    out = io.BytesIO()
    JsonLinesServer(table, workers=1).serve(io.BytesIO(data), out)
    answers = {a["id"]: a for a in map(orjson.loads, out.getvalue().splitlines())}
    assert answers[1]["result"] == {"n": 1}  # as if left out: the Python API's default
    assert answers[2]["error"]["code"] == ErrorCode.INVALID_PARAMS
    assert "'n' must be an integer, got null" in answers[2]["error"]["message"]


def test_rpc_discover_is_an_openrpc_document_of_every_operation() -> None:
    out = io.BytesIO()
    methods = build_methods(None, None)  # type: ignore[arg-type]  # rpc.discover needs neither
    JsonLinesServer(methods).serve(io.BytesIO(orjson.dumps(_rq(1, "rpc.discover")) + b"\n"), out)
    (response,) = [orjson.loads(line) for line in out.getvalue().splitlines()]
    document = response["result"]
    assert document == orjson.loads(orjson.dumps(openrpc_document()))
    assert document["openrpc"].startswith("1.") and document["openrpc"].count(".") == 2
    assert document["info"]["title"] == "memstrata" and document["info"]["version"]
    assert [m["name"] for m in document["methods"]] == [op.name for op in OPERATIONS]
    for method, op in zip(document["methods"], OPERATIONS, strict=True):
        assert method["summary"] == op.summary and method["paramStructure"] == "by-name"
        assert set(method["result"]) >= _CONTENT_DESCRIPTOR and method["result"]["schema"] == dict(op.result)
        schema = op.params_schema()
        assert [p["name"] for p in method["params"]] == list(schema["properties"])
        for param in method["params"]:
            assert set(param) >= _CONTENT_DESCRIPTOR and param["description"]
            assert param["schema"] == schema["properties"][param["name"]]
            assert param["required"] is (param["name"] in schema["required"])
        assert method["x-memstrata"] == {
            "group": op.group,
            "read_only": op.read_only,
            "destructive": op.destructive,
            "idempotent": op.idempotent,
            "push": op.push,
        }
    names = {m["name"] for m in document["methods"]}
    assert {"subscribe", "unsubscribe", "delete_signal"} <= names
    codes = {e["code"] for e in document["components"]["errors"].values()}
    assert codes == {int(c) for c in ErrorCode}


def test_the_method_table_in_the_docs_is_generated_from_the_registry() -> None:
    docs = Path(__file__).resolve().parent.parent / "docs" / "bridges.md"
    text = docs.read_text(encoding="utf-8")
    assert render_table(text, "server-methods", method_table()) == text, (
        "docs/bridges.md is stale: run python -m memstrata.bridges.doc_tables"
    )
    table = method_table()
    assert all(f"| `{op.name}` |" in table for op in OPERATIONS)


# -- delete_signal, end to end ---------------------------------------------------------------


def test_deleting_a_signal_in_the_layer_keeps_versions_growing() -> None:
    state = BlackboardState()
    state.publish("k", 1)
    sub_id, _ = state.subscribe("k")
    gone, told = state.delete("k")
    assert gone is not None and gone.version == 2 and gone.value is None and told == [sub_id]
    assert state.get("k") is None and state.delete("k") == (None, [])
    record, _ = state.publish("k", 3)
    assert record.version == 3


@pytest.fixture
def system(data_dir: Path) -> Iterator[MemorySystem]:
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as running:
        yield running


def test_deleting_a_signal_through_the_facade_the_async_twin_and_the_operation(
    system: MemorySystem, data_dir: Path
) -> None:
    board = system.blackboard("s")
    seen: queue.Queue[Any] = queue.Queue()
    board.publish("k", "v", wait=True)
    with board.subscribe("k", seen.put):
        assert board.delete("k") is True and board.delete("k") is False
        assert board.get("k") is None and board.list() == []
        first, deleted = seen.get(timeout=WAIT), seen.get(timeout=WAIT)
    assert (first.value, first.deleted) == ("v", False)
    assert (deleted.value, deleted.version, deleted.deleted) == (None, 2, True)

    async def twin() -> bool:
        async with AsyncMemorySystem.start(
            Config(data_dir=data_dir / "async"), embedder=FakeEmbedder()
        ) as am:
            async_board = am.blackboard("s")
            await async_board.publish("x", 1, wait=True)
            return await async_board.delete("x")

    assert asyncio.run(twin()) is True
    with Workspaces.open(data_dir, embedder=FakeEmbedder()) as workspaces:
        ctx = Context(system, workspaces)
        board.publish("y", 1, wait=True)
        assert find("delete_signal").run(ctx, {"session_id": "s", "key": "y"}) == {
            "key": "y",
            "deleted": True,
        }
        with pytest.raises(InvalidInputError, match="subscribe needs a connection"):
            find("subscribe").run(ctx, {"session_id": "s", "key_or_prefix": "*"})


# -- many clients on a local socket ----------------------------------------------------------


@pytest.fixture
def socket_path() -> Iterator[str]:
    folder = tempfile.mkdtemp(prefix="ms-")  # short: socket paths are limited to ~100 bytes
    yield os.path.join(folder, "serve.sock")
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(folder, "serve.sock"))
    os.rmdir(folder)


@pytest.fixture
def served(system: MemorySystem, data_dir: Path, socket_path: str) -> Iterator[JsonLinesServer]:
    with Workspaces.open(data_dir, embedder=FakeEmbedder()) as workspaces:
        server = JsonLinesServer(build_methods(system, workspaces), workers=4, on_stop=workspaces.stop_syncs)
        listener = open_listener(f"unix:{socket_path}")
        thread = threading.Thread(target=server.serve_socket, args=(listener,), daemon=True)
        thread.start()
        yield server
        server.stop()
        thread.join(WAIT)
        assert not thread.is_alive()
    assert not os.path.exists(socket_path), "the socket file is removed on exit"


def test_two_clients_share_one_system_with_separate_subscriptions(
    served: JsonLinesServer, socket_path: str
) -> None:
    assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o600
    a, b = RpcClient(socket_path), RpcClient(socket_path)
    sub_a = a.call("subscribe", session_id="s", key_or_prefix="x:*")["subscription_id"]
    sub_b = b.call("subscribe", session_id="s", key_or_prefix="y")["subscription_id"]
    b.call("publish", session_id="s", key="x:1", value="for a", publisher="b")
    a.call("publish", session_id="s", key="y", value="for b")
    assert a.signal(sub_a)["value"] == "for a"
    assert b.signal(sub_b)["value"] == "for b"
    assert b.call("unsubscribe", session_id="s", subscription_id=sub_a) == {"removed": False}  # not b's
    a.call("publish", session_id="s", key="x:2", value="still a's")
    assert a.signal(sub_a)["key"] == "x:2"
    assert b.call("unsubscribe", session_id="s", subscription_id=sub_b) == {"removed": True}
    a.call("publish", session_id="s", key="y", value="nobody listens")
    assert b.call("get_signal", session_id="s", key="y")["version"] == 2
    assert all(m.get("method") != "signal" or m["params"]["subscription_id"] == sub_a for m in a.seen)
    assert [m["params"]["value"] for m in b.seen if m.get("method") == "signal"] == ["for b"]
    assert all(m["jsonrpc"] == "2.0" for m in a.seen + b.seen)
    a.close()
    b.close()
    assert served.wait_connections(lambda n: n == 0, WAIT)


def test_a_client_dying_mid_subscription_never_stops_the_server(
    served: JsonLinesServer, system: MemorySystem, socket_path: str
) -> None:
    doomed, survivor = RpcClient(socket_path), RpcClient(socket_path)
    doomed.call("subscribe", session_id="s", key_or_prefix="*")
    survivor_sub = survivor.call("subscribe", session_id="s", key_or_prefix="*")["subscription_id"]
    for n in range(50):  # notifications pile up for a client that never reads them again
        doomed.send(_note("publish", session_id="s", key=f"k{n}", value="x" * 1000))
    doomed.close()
    assert served.wait_connections(lambda n: n == 1, WAIT)
    assert survivor.call("publish", session_id="s", key="after", value=1)["version"] == 1
    assert survivor.next(lambda m: m.get("params", {}).get("key") == "after")["params"][
        "subscription_id"
    ] == (survivor_sub)
    assert survivor.call("status")["system"]["blackboards"]["s"]["keys"] == 51  # the system still answers
    late = RpcClient(socket_path)
    assert late.call("get_signal", session_id="s", key="after")["found"] is True
    late.close()
    survivor.close()
    assert served.wait_connections(lambda n: n == 0, WAIT)
    # every subscription of the clients that left has ended on the board
    assert system.blackboard("s").subscribe("*", lambda _s: None).id > 0
    assert _board_subscribers(system, "s") == 1


def _board_subscribers(system: MemorySystem, session: str) -> int:
    return int(system.status()["blackboards"][session]["subscribers"])


class _HeldEmbedder(FakeEmbedder):
    """A model whose document batches wait until the test lets them go."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def embed_documents(self, texts: Any) -> Any:
        self.entered.set()
        self.release.wait(WAIT)
        return super().embed_documents(texts)


def _tree(root: Path, files: int) -> Path:
    (root / "memory").mkdir(parents=True)
    for n in range(files):  # more than one batch of chunks
        (root / "memory" / f"{n:03}.md").write_text(f"# step {n}\n\nthe deploy step {n} takes the lock\n")
    return root


@contextlib.contextmanager
def _serving(
    system: MemorySystem, workspaces: Workspaces, socket_path: str, **options: Any
) -> Iterator[JsonLinesServer]:
    """A socket server on ``socket_path`` for the block; stopped (and its thread joined) after it."""
    server = JsonLinesServer(build_methods(system, workspaces), **options)
    thread = threading.Thread(
        target=server.serve_socket, args=(open_listener(f"unix:{socket_path}"),), daemon=True
    )
    thread.start()
    try:
        yield server
    finally:
        server.stop()
        thread.join(WAIT)
    assert not thread.is_alive()


def test_a_stopping_server_ends_an_index_in_flight_before_its_next_file(
    system: MemorySystem, data_dir: Path, socket_path: str, tmp_path: Path
) -> None:
    """An index of a large tree could keep a stopped server for minutes: it ends after the files
    it is embedding, and the rest is indexed by the next sync."""
    tree = _tree(tmp_path / "notes", 300)
    held = _HeldEmbedder()
    with (
        Workspaces.open(data_dir, embedder=held) as workspaces,
        _serving(system, workspaces, socket_path, workers=4, on_stop=workspaces.stop_syncs) as server,
    ):
        client = RpcClient(socket_path)
        client.send(_rq(1, "index", path=str(tree), kind="memory"))
        assert held.entered.wait(WAIT)  # the index is embedding its first batch
        server.stop()
        held.release.set()
        answer = client.next(lambda m: m.get("id") == 1)
        client.close()
    stats = answer["result"]["stats"]
    assert stats["complete"] is False and stats["files_processed"] < 300, stats
    with Workspaces.open(data_dir, embedder=FakeEmbedder()) as again:
        _, rest = again.index(tree)
    assert rest.complete and stats["files_processed"] + rest.files_processed == 300


@pytest.mark.parametrize("leaves", ["closes", "shuts_writing"])
def test_an_index_ends_early_only_when_its_client_has_gone(
    system: MemorySystem, data_dir: Path, socket_path: str, tmp_path: Path, leaves: str
) -> None:
    """A client that closes its socket takes no answer: its index ends before its next file and
    the server says so; one that only shut its sending side still reads, and gets the full index."""
    tree = _tree(tmp_path / "notes", 300)
    held, log = _HeldEmbedder(), io.StringIO()
    with (
        Workspaces.open(data_dir, embedder=held) as workspaces,
        _serving(system, workspaces, socket_path, workers=4, log=log) as server,
    ):
        client = RpcClient(socket_path)
        client.send(_rq(1, "index", path=str(tree), kind="memory"))
        assert held.entered.wait(WAIT)  # the index is embedding its first batch
        if leaves == "closes":
            client.close()
        else:
            client.sock.shutdown(socket.SHUT_WR)
        held.release.set()
        if leaves == "shuts_writing":
            stats = client.next(lambda m: m.get("id") == 1)["result"]["stats"]
            assert stats["complete"] is True and stats["files_processed"] == 300, stats
            client.close()
        assert server.wait_connections(lambda n: n == 0, WAIT)
    with Workspaces.open(data_dir, embedder=FakeEmbedder()) as again:
        _, rest = again.index(tree)
    if leaves == "closes":
        assert 0 < rest.files_processed < 300 and rest.complete, rest
        assert "the client went away; its index of" in log.getvalue(), log.getvalue()
    else:
        assert rest.files_processed == 0 and "went away" not in log.getvalue()


def test_an_index_asked_for_progress_reports_to_its_client(
    system: MemorySystem, data_dir: Path, socket_path: str, tmp_path: Path
) -> None:
    tree = _tree(tmp_path / "notes", 250)
    with (
        Workspaces.open(data_dir, embedder=FakeEmbedder()) as workspaces,
        _serving(system, workspaces, socket_path, workers=2),
    ):
        client = RpcClient(socket_path)
        client.send(_note("index", path=str(tree), kind="memory", progress=True))  # no id: no reports
        client.send(_rq("first", "index", path=str(tree), kind="memory", progress=True))
        first = client.next(lambda m: m.get("id") == "first")["result"]["stats"]
        (tree / "memory" / "new.md").write_text("# one more\n\nthe last step\n")
        client.send(_rq("again", "index", path=str(tree), kind="memory"))  # not asked: no reports
        client.next(lambda m: m.get("id") == "again")
        (tree / "memory" / "newer.md").write_text("# and one more\n\nafter the last step\n")
        client.send(_rq("second", "index", path=str(tree), kind="memory", progress=True))
        second = client.next(lambda m: m.get("id") == "second")["result"]["stats"]
        reports = [m["params"] for m in client.seen if m.get("method") == "index_progress"]
        client.close()
    assert first["files_unchanged"] == 250  # the notification's index ran first, on the same lane
    assert second["files_processed"] == 1 and second["files_unchanged"] == 251
    by_request: dict[str, list[tuple[int, int]]] = {}
    for report in reports:
        assert report["file"].startswith("memory/") or (report["files_done"], report["file"]) == (0, ""), (
            report
        )
        by_request.setdefault(report["request_id"], []).append((report["files_done"], report["files_total"]))
    assert set(by_request) == {"first", "second"}, by_request
    for request, total in (("first", 250), ("second", 252)):
        assert {t for _, t in by_request[request]} == {total}, by_request
        done = [d for d, _ in by_request[request]]
        assert done == sorted(done) and {0, 100, 200, total} <= set(done) and done[-1] == total, by_request


def test_progress_is_refused_where_nothing_can_be_pushed(data_dir: Path, tmp_path: Path) -> None:
    tree = _tree(tmp_path / "notes", 1)
    with Workspaces.open(data_dir, embedder=FakeEmbedder()) as workspaces:
        index = find("index")
        with pytest.raises(InvalidInputError, match="progress notifications need a JSON-RPC connection"):
            index.run(Context(None, workspaces), {"path": str(tree), "progress": True})
        assert workspaces.roots() == []  # refused before anything was registered
        assert index.run(Context(None, workspaces), {"path": str(tree), "progress": False})["stats"]


def test_a_stdio_client_that_reads_no_more_is_gone(system: MemorySystem, data_dir: Path) -> None:
    """On stdin/stdout the client has gone when nobody reads the server's output any more."""
    with Workspaces.open(data_dir, embedder=FakeEmbedder()) as workspaces:
        server = JsonLinesServer(build_methods(system, workspaces))
        read_end, write_end = os.pipe()
        writer = os.fdopen(write_end, "wb")
        connection = server._open(writer, "stdio")
        try:
            assert connection.client_gone() is False
            os.close(read_end)
            assert connection.client_gone() is True
        finally:
            server._close(connection)
            writer.close()


def test_listen_addresses_are_checked(socket_path: str) -> None:
    for bad, needle in [
        ("tcp:0.0.0.0:0", "only a loopback host"),
        ("tcp:192.168.1.5:8000", "only a loopback host"),
        ("tcp:127.0.0.1:99999", "port 0-65535"),
        ("udp:x", "unix:PATH or tcp:127.0.0.1:PORT"),
        ("unix:", "unix:PATH or tcp:127.0.0.1:PORT"),
        (f"unix:/tmp/{'x' * 120}.sock", "too long"),
    ]:
        with pytest.raises(InvalidInputError, match=needle):
            open_listener(bad)
    Path(socket_path).write_text("not a socket")
    with pytest.raises(InvalidInputError, match="not a socket"):
        open_listener(f"unix:{socket_path}")
    os.unlink(socket_path)
    live = open_listener(f"unix:{socket_path}")
    try:
        with pytest.raises(InvalidInputError, match="another server is listening"):
            open_listener(f"unix:{socket_path}")
    finally:
        live.sock.close()  # the file stays behind: a stale socket, replaced by the next server
    assert os.path.exists(socket_path)
    replaced = open_listener(f"unix:{socket_path}")
    replaced.close()
    assert not os.path.exists(socket_path)
    tcp = open_listener("tcp:127.0.0.1:0")
    try:
        assert tcp.address.startswith("tcp:127.0.0.1:") and not tcp.address.endswith(":0")
    finally:
        tcp.close()


def test_a_client_that_stops_reading_loses_its_subscription_not_the_others(
    served: JsonLinesServer, socket_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memstrata.bridges._rpc_connection as server_module

    monkeypatch.setattr(server_module, "MAX_BACKLOG", 3)
    slow, fast = RpcClient(socket_path), RpcClient(socket_path)
    slow_sub = slow.call("subscribe", session_id="s", key_or_prefix="*")["subscription_id"]
    fast_sub = fast.call("subscribe", session_id="s", key_or_prefix="*")["subscription_id"]
    slow.reading.clear()  # its reader stalls: the socket fills up, then the backlog
    big = "x" * 200_000
    for n in range(40):  # the reading client takes each signal before the next publish
        fast.call("publish", session_id="s", key=f"k{n}", value=big)
        assert fast.signal(fast_sub)["key"] == f"k{n}"  # and misses nothing
    slow.reading.set()  # read again: signals, then the end of the subscription
    ended = slow.next(lambda m: m.get("method") == "subscription_ended")
    assert ended["params"]["subscription_id"] == slow_sub and "too many" in ended["params"]["reason"]
    fast.call("publish", session_id="s", key="later", value=1)
    assert fast.signal(fast_sub)["key"] == "later"
    assert slow.call("list_signals", session_id="s", prefix="later") == ["later"]
    keys = [m["params"]["key"] for m in slow.seen if m.get("method") == "signal"]
    assert "later" not in keys and len(keys) < 40
    slow.close()
    fast.close()


def test_an_unserialisable_result_in_a_batch_costs_only_its_own_answer() -> None:
    def bad(_p: dict[str, Any]) -> Any:
        return {"value": object()}

    out = io.BytesIO()
    table = {**_table([]), "bad": Method("bad", {"type": "object"}, bad)}
    batch = orjson.dumps([_rq(1, "bad"), _rq(2, "append", n=2)]) + b"\n"
    JsonLinesServer(table).serve(io.BytesIO(batch), out)
    (array,) = [orjson.loads(line) for line in out.getvalue().splitlines()]
    by_id = {r["id"]: r for r in array}
    assert by_id[1]["error"]["code"] == ErrorCode.INTERNAL_ERROR and by_id[2]["result"] == 2


# -- file paths, line counts and language filters through the file methods --------------------


def _answers(system: Any, registry: Workspaces, requests: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Each request's response, in order; lone surrogates escaped as JavaScript writes them."""
    import json

    lines = b"".join(
        json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}).encode() + b"\n"
        for n, (method, params) in enumerate(requests)
    )
    out = io.BytesIO()
    JsonLinesServer(build_methods(system, registry), workers=1).serve(io.BytesIO(lines), out)
    by_id = {m["id"]: m for m in map(orjson.loads, out.getvalue().splitlines())}
    return [by_id[n] for n in range(len(requests))]


def test_a_path_with_a_lone_surrogate_or_an_empty_path_is_refused_naming_the_param(tmp_path: Path) -> None:
    from tests._support import system_with_notes

    with system_with_notes(tmp_path) as (system, registry):
        bad = str(tmp_path / "x\ud800")
        requests = [
            ("index", {"path": bad}),
            ("forget_root", {"path": bad}),
            ("search_files", {"query": "notes", "root": bad}),
            ("get_file", {"path": bad}),
            ("get_file", {"path": "MEMORY.md", "root": bad}),
            ("export", {"path": bad}),
            ("import", {"path": bad}),
            ("archive_episodes", {"agent_id": "a", "path": bad}),
            ("restore_episodes", {"agent_id": "a", "path": bad}),
        ]
        empty = [(method, {**params, "path": ""}) for method, params in requests if "path" in params]
        answers = _answers(system, registry, requests + empty)
        assert not list(tmp_path.glob("x*")), "nothing written at a mangled path"
    for (method, params), answer in zip(requests + empty, answers, strict=True):
        error = answer.get("error")
        assert error is not None and error["code"] == ErrorCode.INVALID_PARAMS, (method, answer)
        message = error["message"]
        assert "codec" not in message and "Error:" not in message and "\n" not in message, message
        if params.get("path") == "":
            assert message == f"{method}: param 'path' must not be empty", message
        else:
            name = "root" if "root" in params else "path"
            assert f"{name} must be valid UTF-8 text (no lone surrogates), got '" in message, message
            assert message.endswith("/x\\ud800'"), message


def test_get_file_counts_blank_lines_and_says_zero_past_the_end(tmp_path: Path) -> None:
    from tests._support import system_with_notes

    with system_with_notes(tmp_path) as (system, registry):  # MEMORY.md: "# Notes", "", "some ..."
        blank, past, two = _answers(
            system,
            registry,
            [
                ("get_file", {"path": "MEMORY.md", "from_line": 2, "lines": 1}),
                ("get_file", {"path": "MEMORY.md", "from_line": 4, "lines": 1}),
                ("get_file", {"path": "MEMORY.md", "from_line": 1, "lines": 2}),
            ],
        )
    assert (blank["result"]["lines"], blank["result"]["text"]) == (1, "")
    assert (past["result"]["lines"], past["result"]["text"]) == (0, "")
    assert (two["result"]["lines"], two["result"]["text"]) == (2, "# Notes\n")


def test_search_files_filters_memory_roots_by_language_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    from tests._support import system_with_notes

    with system_with_notes(tmp_path) as (system, registry):
        markdown, python, unknown = _answers(
            system,
            registry,
            [
                ("search_files", {"query": "notes", "language": "markdown", "min_score": 0}),
                ("search_files", {"query": "notes", "language": "py", "min_score": 0}),
                ("search_files", {"query": "notes", "language": "cobol"}),
            ],
        )
    assert [h["path"] for h in markdown["result"]["hits"]] == ["MEMORY.md"]
    assert python["result"]["hits"] == []  # a memory file is markdown, never python
    message = unknown["error"]["message"]
    assert unknown["error"]["code"] == ErrorCode.INVALID_PARAMS and "\n" not in message
    assert message.startswith("search_files: language 'cobol' is not a known language: use one of c, ")
    assert "markdown" in message and "python" in message


def test_an_export_to_a_relative_path_answers_where_the_file_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's folder is not its client's: the answer names the file absolutely."""
    from tests._support import system_with_notes

    here = tmp_path / "server-folder"
    here.mkdir()
    monkeypatch.chdir(here)
    with system_with_notes(tmp_path) as (system, registry):
        (answer,) = _answers(system, registry, [("export", {"path": "backup.jsonl"})])
    assert answer["result"]["path"] == str(here / "backup.jsonl")
    assert (here / "backup.jsonl").is_file() and answer["result"]["lines"] > 0
