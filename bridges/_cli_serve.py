"""The long-running doors: ``memstrata serve`` (JSON-RPC 2.0) and ``memstrata mcp`` (MCP on stdio).

Both speak a protocol on stdout, so anything a library prints while they run is sent to stderr
instead (:func:`_protocol_streams`).
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any

import click

from . import _cli_shared as sh

__all__ = ["COMMANDS"]


@contextlib.contextmanager
def _protocol_streams(abandoned: Callable[[], bool]) -> Iterator[tuple[IO[bytes], IO[bytes]]]:
    """stdin/stdout for the protocol; stray writes to fd 1 (a library's print) go to stderr. Once
    ``abandoned()``, a thread is blocked writing to the protocol's stdout: it is left alone."""
    stdin = sys.stdin.buffer
    try:
        out_fd = sys.stdout.fileno()
        err_fd = sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):  # not a real process stdout (tests): use it as is
        yield stdin, sys.stdout.buffer
        return
    sys.stdout.flush()
    private = os.dup(out_fd)
    os.dup2(err_fd, out_fd)
    writer = os.fdopen(private, "wb")
    try:
        yield stdin, writer
    finally:
        if not abandoned():
            with contextlib.suppress(OSError, ValueError):
                writer.flush()
        with contextlib.suppress(OSError):
            os.dup2(private, out_fd)
        if not abandoned():
            with contextlib.suppress(OSError, ValueError):
                writer.close()


@contextlib.contextmanager
def _sigterm_during_startup() -> Iterator[_Startup]:
    """SIGTERM before the server has its own handler (the memory system starts, the model loads)
    no longer kills the process: it is noted, so the server answers what was already written and
    stops, and ends with 0 as a SIGTERM while serving does. The handler stays as the server's
    fallback (it restores it after serving) until the command ends."""
    startup = _Startup()
    if threading.current_thread() is not threading.main_thread():
        yield startup
        return
    try:
        previous = signal.signal(signal.SIGTERM, startup.stop)
    except (ValueError, OSError):
        yield startup
        return
    try:
        yield startup
    finally:
        with contextlib.suppress(ValueError, OSError, TypeError):
            signal.signal(signal.SIGTERM, previous)


class _Startup:
    """Whether SIGTERM came before serving began, and the server to stop once there is one."""

    def __init__(self) -> None:
        self.stopped = False
        self.server: Any = None

    def stop(self, signum: int, frame: Any) -> None:
        if self.stopped:  # asked twice: stop waiting
            raise KeyboardInterrupt
        self.stopped = True
        if self.server is not None:  # between startup and the server's own handler
            self.server.stop()


def _written_so_far(reader: IO[bytes], limit: int) -> IO[bytes]:
    """The lines already written to ``reader`` (stdin, not read yet), read without waiting for
    more: what a SIGTERM during startup still answers. A last line cut short is left out, unless
    the input ended there."""
    try:
        fd = reader.fileno()
    except (AttributeError, ValueError, OSError):  # not a real stream (tests): read nothing
        return io.BytesIO()
    chunks: list[bytes] = []
    size, ended = 0, False
    while size <= limit and select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            ended = True
            break
        chunks.append(chunk)
        size += len(chunk)
    data = b"".join(chunks)
    return io.BytesIO(data if ended or data.endswith(b"\n") else data[: data.rfind(b"\n") + 1])


@click.command()
@click.option("--workers", type=click.IntRange(1, 64), default=None, help="Thread pool size (default 4).")
@click.option("--max-line-bytes", type=click.IntRange(min=1024), default=None, help="Longest request line.")
@click.option(
    "--listen",
    metavar="ADDRESS",
    default=None,
    help="Serve many clients on a local socket instead of stdin/stdout: unix:PATH (created 0600) "
    "or tcp:127.0.0.1:PORT (loopback only; port 0 picks one). The address is printed on stderr.",
)
@click.pass_context
def serve(ctx: click.Context, workers: int | None, max_line_bytes: int | None, listen: str | None) -> None:
    """Serve JSON-RPC 2.0, one message per line, on stdin/stdout or a local socket."""
    from ._methods import build_methods
    from ._rpc_listen import open_listener
    from ._server import JsonLinesServer

    state = sh.state(ctx)
    bridges = state.config.bridges
    listener = open_listener(listen) if listen is not None else None  # refuse a bad address first
    abandoned = False
    try:
        with (
            _sigterm_during_startup() as startup,
            state.system() as system,
            state.workspaces(system) as registry,
        ):
            server: JsonLinesServer | None = None

            def server_status() -> dict[str, Any]:
                assert server is not None
                connections = server.connections
                return {
                    "workers": server.workers,
                    "max_line_bytes": server.max_line_bytes,
                    "requests": server.stats.requests,
                    "errors": server.stats.errors,
                    "notifications": server.stats.notifications,
                    "listen": listener.address if listener is not None else "stdio",
                    "connections": len(connections),
                    "subscriptions": sum(len(c.subscriptions) for c in connections),
                }

            server = JsonLinesServer(
                build_methods(system, registry, extra_status=server_status),
                workers=workers or bridges.workers,
                max_line_bytes=max_line_bytes or bridges.max_line_bytes,
                debug=state.debug,
                on_stop=registry.stop_syncs,  # an index in flight ends before its next file
            )
            startup.server = server
            if listener is not None:
                if startup.stopped:  # SIGTERM while starting: no client is served
                    return
                click.echo(f"{sh.PROG} serve: listening on {listener.address}", err=True)
                server.serve_socket(listener)
                return
            serving = server
            with _protocol_streams(lambda: serving.output_abandoned) as (reader, writer):
                if startup.stopped:  # SIGTERM while starting: answer what was written, then stop
                    server.warn("stopping: answering the requests written while starting")
                    reader = _written_so_far(reader, server.max_line_bytes)
                server.serve(reader, writer)
            abandoned = server.output_abandoned
    finally:
        if listener is not None:
            listener.close()
    if abandoned:  # the system has stopped; only the exit could wait for the blocked writer
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(0)


@click.command()
@click.option(
    "--agent", "-a", "agent_id", default=None, help="Default agent for tool calls (config: bridges.agent_id)."
)
@click.pass_context
def mcp(ctx: click.Context, agent_id: str | None) -> None:
    """Serve the memory tools over MCP on stdio (needs the 'mcp' extra)."""
    from memstrata.core.validation import check_agent_id

    from . import _mcp
    from ._rpc_protocol import DEFAULT_MAX_LINE_BYTES

    with _SigtermStops() as sigterm:  # first: a SIGTERM while the SDK imports is kept too
        _mcp.require_sdk()
        state = sh.state(ctx)
        # refused here, before the session starts, rather than by every tool call that would use it
        if agent_id is not None:
            agent = check_agent_id(agent_id, "--agent")
        else:
            agent = check_agent_id(state.config.bridges.agent_id, "config key 'bridges.agent_id'")
        with state.system() as system, state.workspaces(system) as registry:
            if sigterm.serving(system, registry):
                _mcp.run_stdio(system, registry, agent_id=agent)
                return
            # SIGTERM while starting: answer the complete lines already written, then stop
            sys.stderr.write(f"{sh.PROG} mcp: stopping: answering the requests written while starting\n")
            written = _written_so_far(sys.stdin.buffer, DEFAULT_MAX_LINE_BYTES)
            _mcp.run_stdio(system, registry, agent_id=agent, reader=written)


class _SigtermStops:
    """SIGTERM ends ``memstrata mcp`` as a closed session does, with 0: the registry closes and
    the memory system stops (a blackboard is saved), then the process exits. The stop runs on a
    thread of its own, so it never waits for a lock the interrupted main thread holds; a SIGTERM
    while the system starts is kept until it has started. The session reads stdin on a thread
    that cannot be interrupted, hence the exit once stopped. A SIGTERM before that (the SDK
    imports, the system starts) is kept: the complete request lines already written are answered,
    as ``serve`` does, and the command ends with 0."""

    def __init__(self) -> None:
        self.requested = False
        self._running: tuple[Any, Any] | None = None
        self._stopping = False
        self._lock = threading.Lock()
        self._previous: Any = None

    def __enter__(self) -> _SigtermStops:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._received)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signal.SIGTERM, self._previous)

    def serving(self, system: Any, registry: Any) -> bool:
        """Whether to serve: not when SIGTERM came while the system started (it stops as the
        command ends)."""
        with self._lock:
            self._running = (system, registry)
            return not self.requested

    def _received(self, signum: int, frame: Any) -> None:
        """Stop the running system; before it runs, only note the signal (a second SIGTERM, while
        the requests written during startup are answered, stops at once)."""
        with self._lock:
            if self._stopping:
                return
            self.requested = True
            running = self._running
            self._stopping = running is not None
        if running is not None:
            threading.Thread(target=self._stop, args=running, name="memstrata-mcp-stop", daemon=True).start()

    def _stop(self, system: Any, registry: Any) -> None:
        code = 0
        try:
            registry.close()
            system.stop()
        except BaseException as exc:  # the stop failed: say so, and end as a failed command does
            sys.stderr.write(sh.fail_line(f"stopping after SIGTERM failed: {exc}") + "\n")
            code = 1
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os._exit(code)


COMMANDS: tuple[click.Command, ...] = (serve, mcp)
