"""``serve --listen`` and clients that misbehave: one that does not read its answers is not read
either (its memory stays bounded), cannot hold up a stop, a client the process has no thread
for is refused alone, and one it has no file descriptor for waits until another leaves.

Nothing waits on time: the server's state is seen through events (the reader held for room) and
counts, answers are larger than any socket buffer so a client that does not read them stalls the
writer, and the limits and the grace period are set small by each test.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

import memstrata.bridges._rpc_connection as connection_module
import memstrata.bridges._server as server_module
from memstrata.bridges._server import Connection, JsonLinesServer, Method, open_listener

WAIT = 30.0


def _answer_size() -> int:
    """Bigger than what the sockets between a client and the server hold, so an answer that is
    not read is never written whole."""
    a, b = socket.socketpair()
    with a, b:
        buffered = sum(
            s.getsockopt(socket.SOL_SOCKET, opt)
            for s in (a, b)
            for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF)
        )
    return max(1 << 20, 2 * buffered)


SIZE = _answer_size()


class _Calls:
    """How many times the ``big`` method has run, and a way to wait for a count."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = threading.Condition()

    def add(self) -> None:
        with self._changed:
            self.count += 1
            self._changed.notify_all()

    def wait_for(self, count: int) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.count >= count, WAIT)


def _table(calls: _Calls) -> dict[str, Method]:
    def big(p: dict[str, Any]) -> Any:
        calls.add()
        return "x" * p["size"]

    def echo(p: dict[str, Any]) -> Any:
        return p

    size = {"type": "object", "properties": {"size": {"type": "integer"}}, "required": ["size"]}
    return {"big": Method("big", size, big), "echo": Method("echo", {"type": "object"}, echo)}


class _Served:
    def __init__(
        self, server: JsonLinesServer, path: str, log: io.StringIO, wrap: Callable[[Any], Any] | None
    ) -> None:
        self.server = server
        self.path = path
        self.log = log
        self.error: BaseException | None = None
        listener = open_listener(f"unix:{path}")
        if wrap is not None:
            listener.sock = wrap(listener.sock)
        self.thread = threading.Thread(target=self._run, args=(listener,), daemon=True)
        self.thread.start()

    def _run(self, listener: Any) -> None:
        try:
            self.server.serve_socket(listener)
        except BaseException as exc:
            self.error = exc

    def connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(WAIT)  # a server that hangs fails the test instead
        sock.connect(self.path)
        return sock

    def only_connection(self) -> Connection:
        assert self.server.wait_connections(lambda n: n == 1, WAIT)
        (connection,) = self.server.connections
        return connection

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "the server did not stop"
        assert self.error is None, repr(self.error)


@pytest.fixture
def serve() -> Iterator[Callable[..., tuple[_Served, _Calls]]]:
    folder = tempfile.mkdtemp(prefix="ms-")  # short: socket paths are limited to ~100 bytes
    started: list[_Served] = []

    def start(wrap: Callable[[Any], Any] | None = None, **options: Any) -> tuple[_Served, _Calls]:
        calls = _Calls()
        log = io.StringIO()
        server = JsonLinesServer(_table(calls), log=log, **options)
        served = _Served(server, os.path.join(folder, "s.sock"), log, wrap)
        started.append(served)
        return served, calls

    yield start
    for served in started:
        served.server.stop()
        served.thread.join(WAIT)
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(folder, "s.sock"))
    os.rmdir(folder)


def _requests(count: int, size: int = SIZE) -> bytes:
    return b"".join(
        orjson.dumps({"jsonrpc": "2.0", "id": i, "method": "big", "params": {"size": size}}) + b"\n"
        for i in range(count)
    )


def _call(sock: socket.socket, reader: Any, request_id: int) -> Any:
    sock.sendall(orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": "echo", "params": {}}) + b"\n")
    return orjson.loads(reader.readline())


# -- a client that does not read its answers -----------------------------------------------------


def test_answers_not_written_count_as_in_flight_and_hold_the_reader(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection_module, "MAX_IN_FLIGHT", 4)
    served, calls = serve(workers=2)
    slow = served.connect()
    slow.sendall(_requests(20))  # small lines: all of them fit in the socket at once
    connection = served.only_connection()
    assert connection.reading_held.wait(WAIT), "the server never stopped reading the client"
    assert calls.wait_for(4)
    # held: 4 requests answered (the answers wait, the first one stuck half written), no more run
    assert calls.count == 4 and connection.reading_held.is_set()
    other = served.connect()  # the others are still served meanwhile
    with other.makefile("rb") as reader:
        assert _call(other, reader, 1)["result"] == {}
    other.close()
    with slow.makefile("rb") as reader:  # reading the answers lets the server read on
        answers = [orjson.loads(reader.readline()) for _ in range(20)]
    assert sorted(a["id"] for a in answers) == list(range(20))
    assert all(len(a["result"]) == SIZE for a in answers) and calls.count == 20
    slow.close()
    served.stop()


def test_a_request_starts_only_once_the_answers_before_it_are_written(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection_module, "MAX_UNWRITTEN_BYTES", 1)  # any answer waiting is too much
    served, calls = serve(workers=1)
    client = served.connect()
    client.sendall(_requests(8))  # far below 1,024 requests: only the bytes hold them back
    with client.makefile("rb") as reader:
        for taken in range(8):
            # answer `taken` is not read whole, so it is not written whole: nothing after it ran
            assert calls.count <= taken + 1, f"{calls.count} requests ran, {taken} answers read"
            answer = orjson.loads(reader.readline())
            assert answer["id"] == taken and len(answer["result"]) == SIZE
    assert calls.count == 8
    client.close()
    served.stop()


def _stalled(serve: Any, monkeypatch: pytest.MonkeyPatch, stop_grace: float) -> tuple[Any, socket.socket]:
    """A server whose one client has sent 20 requests and reads nothing: 4 are read and run, and
    the writer is stuck on their answers (too big for the socket's buffers)."""
    monkeypatch.setattr(connection_module, "MAX_IN_FLIGHT", 4)
    served, _calls = serve(workers=2, stop_grace=stop_grace)
    slow = served.connect()
    slow.sendall(_requests(20))
    assert served.only_connection().reading_held.wait(WAIT)
    return served, slow


def test_stop_disconnects_a_client_that_does_not_take_its_answers_within_the_grace(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    served, slow = _stalled(serve, monkeypatch, stop_grace=0.0)
    served.stop()  # returns although the client never reads
    assert "client-1: did not take its answers within 0 s of stopping; disconnected" in served.log.getvalue()
    slow.close()


def test_stop_lets_a_client_take_its_answers_within_the_grace(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    served, slow = _stalled(serve, monkeypatch, stop_grace=3600.0)
    served.server.stop()  # stops reading: the 4 requests read are answered, the rest are not
    with slow.makefile("rb") as reader:
        answers = [orjson.loads(line) for line in reader]  # to the end: the server closes it
    assert sorted(a["id"] for a in answers) == [0, 1, 2, 3]
    served.stop()
    assert "did not take" not in served.log.getvalue()
    slow.close()


# -- a client the process has no thread for ------------------------------------------------------


@pytest.mark.parametrize("thread", ["memstrata-client-2", "memstrata-out-client-2"])
def test_a_client_without_a_thread_is_refused_and_the_others_are_served(
    serve: Any, monkeypatch: pytest.MonkeyPatch, thread: str
) -> None:
    served, _calls = serve(workers=2)
    first = served.connect()
    first_reader = first.makefile("rb")
    assert _call(first, first_reader, 1)["result"] == {}
    start = threading.Thread.start

    def start_or_fail(self: threading.Thread) -> None:
        if self.name == thread:  # as at a pids limit: this one thread cannot be started
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", start_or_fail)
    refused = served.connect()
    assert refused.recv(1) == b"", "the refused client is disconnected"
    refused.close()
    assert "client-2: refused, cannot start a thread for it (can't start new thread)" in served.log.getvalue()
    assert _call(first, first_reader, 2)["result"] == {}  # still served
    late = served.connect()
    with late.makefile("rb") as reader:
        assert _call(late, reader, 3)["result"] == {}
    late.close()
    first_reader.close()
    first.close()
    assert served.server.wait_connections(lambda n: n == 0, WAIT)
    served.stop()  # no error: the server kept serving


# -- no file descriptor left to accept a client --------------------------------------------------


class _FullAt:
    """A listening socket whose ``at``-th accept fails as at the process's file limit (EMFILE)."""

    def __init__(self, sock: socket.socket, at: int) -> None:
        self._sock = sock
        self._at = at
        self._calls = 0
        self.failed = threading.Event()

    def accept(self) -> tuple[socket.socket, Any]:
        self._calls += 1
        if self._calls == self._at:
            self.failed.set()
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return self._sock.accept()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def test_out_of_descriptors_a_new_client_waits_until_one_leaves(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "ACCEPT_RETRY_S", 10 * WAIT)  # only a client leaving wakes it
    full: list[_FullAt] = []
    served, _calls = serve(wrap=lambda sock: full.append(_FullAt(sock, at=2)) or full[0], workers=2)
    first = served.connect()
    first_reader = first.makefile("rb")
    assert _call(first, first_reader, 1)["result"] == {}
    assert full[0].failed.wait(WAIT)  # the accept after the first client's failed
    second = served.connect()  # waits in the backlog
    assert _call(first, first_reader, 2)["result"] == {}  # the connected client is still served
    first_reader.close()
    first.close()
    with second.makefile("rb") as reader:
        assert _call(second, reader, 3)["result"] == {}
    assert "cannot accept a client (Too many open files): new clients wait" in served.log.getvalue()
    assert served.log.getvalue().count("cannot accept a client") == 1
    assert "accepting clients again" in served.log.getvalue()
    second.close()
    served.stop()  # no error: the server kept serving


def test_stop_ends_a_wait_for_room_to_accept(serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "ACCEPT_RETRY_S", 10 * WAIT)
    full: list[_FullAt] = []
    served, _calls = serve(wrap=lambda sock: full.append(_FullAt(sock, at=1)) or full[0])
    assert full[0].failed.wait(WAIT)
    served.stop()  # within WAIT, though the retry is ten times as far
    assert served.server.stats.connections == 0
