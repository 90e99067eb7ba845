"""``memstrata board watch``: subscribe to a blackboard and print its signals as they change.

On its own, the command starts a memory system of its own: it shows the session's current
values (saved ones, with ``[actors] blackboard_snapshot``) and the changes made while it runs in
that process. With ``--connect ADDRESS`` it watches the live blackboard of a running
``memstrata serve --listen ADDRESS`` instead, through the server's ``subscribe`` and
``unsubscribe`` methods, so it sees what the server's other clients publish. Either way it
stops after ``--count`` signals or on Ctrl-C/SIGTERM, and unsubscribes on the way out.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import time
from collections.abc import Iterator, Mapping
from typing import Any

import click
import orjson

from memstrata.core.errors import InvalidInputError, MemstrataError

from . import _cli_shared as sh
from ._cli_output import clipped, json_shown, text_shown
from ._operation import Operation

__all__ = ["watch_command"]

_STOP = object()
_LEAVE_TIMEOUT_S = 5.0
"""How long a watch that ends waits for the server to answer its ``unsubscribe`` and close."""


def watch_command(subscribe: Operation) -> click.Command:
    """The ``watch`` command of the board group, described by the ``subscribe`` operation."""
    session, key = subscribe.param("session_id"), subscribe.param("key_or_prefix")

    def run(
        session_id: str, key_or_prefix: str, count: int | None, connect: str | None, as_json: bool
    ) -> None:
        if connect is not None:
            _watch_server(connect, session_id, key_or_prefix, count, as_json)
        else:
            _watch_here(session_id, key_or_prefix, count, as_json)

    return click.Command(
        "watch",
        callback=run,
        params=[
            click.Option(["--session", "-s", "session_id"], required=True, help=session.description),
            click.Argument(["key_or_prefix"], metavar="KEY_OR_PREFIX"),
            click.Option(
                ["--count", "-n"],
                type=click.IntRange(min=1),
                default=None,
                help="Stop after this many signals (default: until Ctrl-C).",
            ),
            click.Option(
                ["--connect"],
                metavar="ADDRESS",
                default=None,
                help="Watch the live blackboard of a running 'memstrata serve --listen ADDRESS' "
                "(unix:PATH or tcp:127.0.0.1:PORT) instead of starting a system here.",
            ),
            click.Option(["--json", "as_json"], is_flag=True, help="Print each signal as one JSON line."),
        ],
        help=f"Subscribe to KEY_OR_PREFIX ({key.description}) and print the current values, then "
        "every change, until Ctrl-C or --count signals. Read-only. Operations: subscribe, "
        "unsubscribe.",
        short_help="Print a key's (or prefix's) signals as they change",
    )


def _watch_here(session_id: str, key_or_prefix: str, count: int | None, as_json: bool) -> None:
    signals: queue.Queue[Any] = queue.Queue()
    seen = 0
    with sh.state(click.get_current_context()).system() as system:
        subscription = system.blackboard(session_id).subscribe(key_or_prefix, signals.put)
        try:
            with sh.stop_on_signals(lambda: signals.put(_STOP)):
                while count is None or seen < count:
                    signal = signals.get()
                    if signal is _STOP:
                        break
                    _echo_signal(
                        {
                            "session_id": session_id,
                            "key": signal.key,
                            "value": signal.value,
                            "version": signal.version,
                            "publisher": signal.publisher_id,
                            "deleted": bool(getattr(signal, "deleted", False)),
                        },
                        as_json,
                    )
                    seen += 1
        finally:
            subscription.unsubscribe()


def _connect(address: str) -> socket.socket:
    kind, _, rest = address.partition(":")
    try:
        if kind == "unix" and rest:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(rest)
            except OSError:
                sock.close()
                raise
            return sock
        host, sep, port = rest.rpartition(":")
        if kind == "tcp" and sep and port.isdigit():
            return socket.create_connection((host.strip("[]"), int(port)))
    except OSError as exc:
        raise MemstrataError(f"--connect {address}: cannot connect: {exc.strerror or exc}") from exc
    raise click.BadParameter(f"must be unix:PATH or tcp:HOST:PORT, got {address!r}", param_hint="'--connect'")


def _send(sock: socket.socket, request_id: int, method: str, params: Mapping[str, Any]) -> None:
    request = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": dict(params)}
    sock.sendall(orjson.dumps(request) + b"\n")


def _watch_server(
    address: str, session_id: str, key_or_prefix: str, count: int | None, as_json: bool
) -> None:
    """Subscribe through a running server; print its ``signal`` notifications."""
    sock = _connect(address)
    stopped = False

    def stop() -> None:
        nonlocal stopped
        stopped = True
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RD)  # the reading loop below sees the end and returns

    subscription: int | None = None
    try:
        _send(sock, 1, "subscribe", {"session_id": session_id, "key_or_prefix": key_or_prefix})
        seen = 0
        with sh.stop_on_signals(stop), sock.makefile("rb") as reader:
            for message in _messages(reader):
                if message.get("id") == 1:
                    if "error" in message:
                        raise InvalidInputError(str(message["error"].get("message", "subscribe failed")))
                    subscription = int(message["result"]["subscription_id"])
                elif message.get("method") == "signal":
                    params = dict(message.get("params") or {})
                    params.pop("subscription_id", None)
                    _echo_signal(params, as_json)
                    seen += 1
                    if count is not None and seen >= count:
                        return
                elif message.get("method") == "subscription_ended":
                    raise MemstrataError(
                        f"the server ended the subscription: {message['params'].get('reason')}"
                    )
            if not stopped:
                raise MemstrataError(f"--connect {address}: the server closed the connection")
    finally:
        if subscription is not None:  # best effort: the server also ends it with the connection
            with contextlib.suppress(OSError):
                _send(sock, 2, "unsubscribe", {"session_id": session_id, "subscription_id": subscription})
        _leave(sock, drain=not stopped)


def _leave(sock: socket.socket, *, drain: bool) -> None:
    """Close after the server has answered: a client that closes with answers still on their way
    makes the server warn that it cannot write. Ending our input makes the server finish what it
    was sent and close its side; reading until then is bounded by ``_LEAVE_TIMEOUT_S``."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
        if drain:  # (a Ctrl-C has shut our reading side already: nothing more can be read)
            deadline = time.monotonic() + _LEAVE_TIMEOUT_S
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                if not sock.recv(1 << 16):
                    break
    sock.close()


def _messages(reader: Any) -> Iterator[dict[str, Any]]:
    for line in reader:
        with contextlib.suppress(orjson.JSONDecodeError):
            message = orjson.loads(line)
            if isinstance(message, dict):
                yield message


def _echo_signal(data: Mapping[str, Any], as_json: bool) -> None:
    if as_json:
        sh.echo_json(data)
        return
    value = "(deleted)" if data.get("deleted") else clipped(json_shown(data.get("value")), 400)
    by = f", by {text_shown(str(data['publisher']))}" if data.get("publisher") else ""
    click.echo(f"{text_shown(str(data.get('key')))} = {value}  (version {data.get('version')}{by})")
