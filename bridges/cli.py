"""The ``memstrata`` command line.

Exit codes: 0 success, 1 runtime error (storage, embedding, a stopped system, ...), 2 usage error
(bad options or arguments, invalid values, a bad config file). Every error is one line on stderr,
``memstrata: error: ...``; ``--debug`` (or ``MEMSTRATA_DEBUG=1``) adds the traceback.
Commands import what they need when they run, so a command that only needs the file index never
starts the actor system.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn, TextIO

import click
from memstrata.core.constants import MAX_TOP_K, MODES

from memstrata.errors import InvalidInputError, MemstrataError

from ._app import CliState
from ._json import dumps

__all__ = ["cli", "main"]

_PROG = "memstrata"


def _fail_line(message: str) -> str:
    return f"{_PROG}: error: {' '.join(str(message).split()) or 'failed'}"


def _wants_debug(args: Sequence[str] | None) -> bool:
    if os.environ.get("MEMSTRATA_DEBUG", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    return bool(args) and "--debug" in list(args or [])


class _Cli(click.Group):
    """A group whose errors are one line on stderr with memstrata's exit codes."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        debug = _wants_debug(argv)
        try:
            return super().main(
                args=argv,
                prog_name=_PROG,
                complete_var=complete_var,
                standalone_mode=False,
                **extra,
            )
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help())
            sys.exit(0)
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            _exit(2, exc.format_message() + hint, exc, debug)
        except click.Abort as exc:
            _exit(1, "aborted", exc, debug)
        except click.ClickException as exc:
            _exit(exc.exit_code, exc.format_message(), exc, debug)
        except KeyboardInterrupt:
            click.echo(f"{_PROG}: interrupted", err=True)
            sys.exit(130)
        except BrokenPipeError:
            with contextlib.suppress(OSError):  # the reader went away (e.g. `| head`): not an error
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)
        except (InvalidInputError, ValueError) as exc:
            _exit(2, str(exc), exc, debug)
        except MemstrataError as exc:
            _exit(1, str(exc), exc, debug)
        except OSError as exc:
            _exit(1, str(exc), exc, debug)
        except Exception as exc:
            _exit(1, f"unexpected {type(exc).__name__}: {exc} (run with --debug for details)", exc, debug)


def _exit(code: int, message: str, exc: BaseException, debug: bool) -> NoReturn:
    if debug:
        click.echo("".join(traceback.format_exception(exc)).rstrip(), err=True)
    click.echo(_fail_line(message), err=True)
    sys.exit(code)


def _state(ctx: click.Context) -> CliState:
    state = ctx.find_object(CliState)
    assert state is not None
    return state


def _echo_json(value: Any) -> None:
    click.echo(dumps(value).decode("utf-8"))


def _one_line(text: str, width: int = 160) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def _tags(values: Sequence[str]) -> dict[str, str] | None:
    """``--tag k=v`` (or a bare ``--tag k``, value ``""``)."""
    tags: dict[str, str] = {}
    for item in values:
        key, _, value = item.partition("=")
        if not key.strip():
            raise click.BadParameter(f"tag {item!r} has an empty key (use key=value)", param_hint="'--tag'")
        tags[key.strip()] = value
    return tags or None


def _given(**options: Any) -> dict[str, Any]:
    """The options a command was given: ``None`` means not given, so the callee's default applies."""
    return {k: v for k, v in options.items() if v is not None}


def _echo_hits(
    hits: list[dict[str, Any]], as_json: bool, if_none: str, describe: Callable[[dict[str, Any]], str]
) -> None:
    """Memory hits as one JSON list, or numbered: score, ``describe(hit)`` and id, then the content."""
    if as_json:
        _echo_json(hits)
        return
    if not hits:
        click.echo(if_none)
    for rank, hit in enumerate(hits, 1):
        click.echo(f"{rank}. {hit.get('score', 0):.2f}  {describe(hit)}  #{hit.get('id')}")
        click.echo(f"   {_one_line(hit.get('content', ''))}")


def _content(value: str) -> str:
    """``-`` reads the content from stdin."""
    if value == "-":
        return sys.stdin.read()
    return value


_json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
_agent_option = click.option("--agent", "-a", "agent_id", required=True, help="Agent id.")
_tag_option = click.option("--tag", "tags", multiple=True, metavar="KEY[=VALUE]", help="A tag (repeatable).")


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="MEMSTRATA_DATA_DIR",
    help="Where memstrata keeps its databases (env MEMSTRATA_DATA_DIR; default: the per-user data dir).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    envvar="MEMSTRATA_CONFIG",
    help="A TOML config file (default: ./memstrata.toml or ~/.config/memstrata/config.toml).",
)
@click.option("--debug", is_flag=True, envvar="MEMSTRATA_DEBUG", help="Show tracebacks on errors.")
@click.version_option(package_name="memstrata", prog_name=_PROG)
@click.pass_context
def cli(ctx: click.Context, data_dir: Path | None, config_path: Path | None, debug: bool) -> None:
    """Layered memory for multi-agent orchestrators."""
    state = ctx.obj if isinstance(ctx.obj, CliState) else CliState()
    state.data_dir = data_dir if data_dir is not None else state.data_dir
    state.config_path = config_path if config_path is not None else state.config_path
    state.debug = debug or state.debug
    ctx.obj = state


# -- knowledge and episodes ----------------------------------------------------------------------


@cli.command()
@click.argument("content")
@_agent_option
@click.option("--category", "-c", required=True, help="outcome, pitfall, pattern, codebase, preference, ...")
@_tag_option
@click.option("--scope", default=None, help="Path-like scope, default '/'.")
@_json_option
@click.pass_context
def store(
    ctx: click.Context,
    content: str,
    agent_id: str,
    category: str,
    tags: tuple[str, ...],
    scope: str | None,
    as_json: bool,
) -> None:
    """Store CONTENT ('-' reads stdin) in an agent's long-term knowledge."""
    options = _given(category=category, tags=_tags(tags), scope=scope)
    with _state(ctx).system() as system:
        ident = system.agent(agent_id).store_knowledge(_content(content), **options)
    if as_json:
        _echo_json({"id": ident, "agent": agent_id, "category": category})
    else:
        click.echo(f"stored {ident} (agent {agent_id}, category {category})")


@cli.command()
@click.argument("query")
@_agent_option
@click.option("--category", "-c", default=None, help="Only this category.")
@_tag_option
@click.option("--scope", default=None, help="Entries of this scope and its ancestors.")
@click.option(
    "--top-k", "-k", type=click.IntRange(1, MAX_TOP_K), default=None, help="How many hits (default 10)."
)
@click.option("--mode", type=click.Choice(MODES), default=None)
@click.option("--min-score", type=click.FloatRange(0, 1), default=None, help="Cosine floor (semantic side).")
@_json_option
@click.pass_context
def query(
    ctx: click.Context,
    query: str,
    agent_id: str,
    category: str | None,
    tags: tuple[str, ...],
    scope: str | None,
    top_k: int | None,
    mode: str | None,
    min_score: float | None,
    as_json: bool,
) -> None:
    """Search an agent's long-term knowledge (hybrid vector + keyword by default)."""
    from . import _convert

    options = _given(
        category=category, tags=_tags(tags), scope=scope, top_k=top_k, mode=mode, min_score=min_score
    )
    state = _state(ctx)
    hits: list[dict[str, Any]] = []
    if state.store_exists("knowledge", agent_id) or state.store_exists("knowledge", "shared", shared=True):
        with state.system() as system:
            hits = [
                _convert.knowledge_hit(h) for h in system.agent(agent_id).query_knowledge(query, **options)
            ]
    _echo_hits(
        hits,
        as_json,
        "no matching knowledge",
        lambda hit: f"{hit.get('category')}  {hit.get('match_type')}",
    )


@cli.command()
@click.argument("content")
@_agent_option
@click.option("--title", default=None)
@click.option("--task-run", "task_run_id", default=None, help="The task run this episode belongs to.")
@_tag_option
@_json_option
@click.pass_context
def remember(
    ctx: click.Context,
    content: str,
    agent_id: str,
    title: str | None,
    task_run_id: str | None,
    tags: tuple[str, ...],
    as_json: bool,
) -> None:
    """Record CONTENT ('-' reads stdin) as an episode in an agent's episodic memory."""
    options = {
        k: v for k, v in {"title": title, "task_run_id": task_run_id, "tags": _tags(tags)}.items() if v
    }
    with _state(ctx).system() as system:
        ident = system.agent(agent_id).remember(_content(content), **options)
    if as_json:
        _echo_json({"id": ident, "agent": agent_id})
    else:
        click.echo(f"remembered {ident} (agent {agent_id})")


def _when(value: str | None, name: str) -> Any:
    if value is None:
        return None
    from ._methods import parse_time

    try:
        return parse_time(value, name)
    except InvalidInputError as exc:
        raise click.BadParameter(str(exc), param_hint=f"'--{name}'") from exc


@cli.command()
@click.argument("query")
@_agent_option
@click.option("--task-run", "task_run_id", default=None, help="Only this task run.")
@click.option("--since", default=None, help="ISO 8601 date-time with a time zone.")
@click.option("--until", default=None, help="ISO 8601 date-time with a time zone.")
@click.option("--top-k", "-k", type=click.IntRange(1, MAX_TOP_K), default=None)
@_json_option
@click.pass_context
def recall(
    ctx: click.Context,
    query: str,
    agent_id: str,
    task_run_id: str | None,
    since: str | None,
    until: str | None,
    top_k: int | None,
    as_json: bool,
) -> None:
    """Search an agent's episodic memory."""
    from . import _convert

    options = _given(
        task_run_id=task_run_id, since=_when(since, "since"), until=_when(until, "until"), top_k=top_k
    )
    state = _state(ctx)
    hits: list[dict[str, Any]] = []
    if state.store_exists("episodic", agent_id):
        with state.system() as system:
            hits = [_convert.episode_hit(h) for h in system.agent(agent_id).recall(query, **options)]
    _echo_hits(
        hits,
        as_json,
        "no matching episodes",
        lambda hit: f"{hit.get('at', '')}" + (f"  {hit['title']}" if hit.get("title") else ""),
    )


# -- files ---------------------------------------------------------------------------------------


class _Progress:
    """Adapts the sync progress callback to a click progress bar on stderr."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._bar: Any = None
        self._done = 0

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        done, total = _progress_numbers(args, kwargs)
        if total is None or not _isatty(self._stream):
            return
        if self._bar is None:
            self._bar = click.progressbar(length=max(total, 1), label="indexing", file=self._stream)
            self._bar.__enter__()
        elif total != self._bar.length:
            self._bar.length = max(total, 1)
        if done is not None and done > self._done:
            self._bar.update(done - self._done)
            self._done = done

    def close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _progress_numbers(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int | None, int | None]:
    """(done, total) from ``cb(done, total, ...)``, ``cb(done=, total=)`` or ``cb(obj)``."""
    if len(args) >= 2 and all(isinstance(a, int) for a in args[:2]):
        return int(args[0]), int(args[1])
    if "done" in kwargs and "total" in kwargs:
        return int(kwargs["done"]), int(kwargs["total"])
    if args:
        obj = args[0]
        done = getattr(obj, "done", getattr(obj, "files_done", None))
        total = getattr(obj, "total", getattr(obj, "files_total", None))
        if isinstance(done, int) and isinstance(total, int):
            return done, total
    return None, None


@cli.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--kind",
    type=click.Choice(["auto", "memory", "code"]),
    default="auto",
    show_default=True,
    help="auto: a memory workspace when it holds MEMORY.md or memory/, else a codebase.",
)
@_json_option
@click.pass_context
def index(ctx: click.Context, path: Path, kind: str, as_json: bool) -> None:
    """Index (or re-sync) the folder PATH; later searches cover it."""
    from . import _convert

    progress = _Progress(sys.stderr)
    with _state(ctx).workspaces() as registry:
        try:
            ws, stats = registry.index(path, kind=kind, progress=progress)  # type: ignore[arg-type]
        finally:
            progress.close()
    data = _convert.plain(stats)
    if as_json:
        _echo_json({"root": str(ws.root), "kind": ws.kind, "stats": data})
        return
    click.echo(f"indexed {ws.root} as {ws.kind}: {_sync_summary(data)}")


def _sync_summary(stats: Any) -> str:
    if not isinstance(stats, dict):
        return str(stats)
    text = (
        f"{stats.get('files_processed', 0)} files indexed, {stats.get('files_unchanged', 0)} unchanged, "
        f"{stats.get('files_deleted', 0)} deleted, {stats.get('files_skipped', 0)} skipped; "
        f"{stats.get('chunks_indexed', 0)} chunks ({stats.get('chunks_embedded', 0)} embedded)"
    )
    if isinstance(stats.get("seconds"), int | float):
        text += f" in {stats['seconds']:.2f} s"
    return text


@cli.command()
@click.argument("query")
@click.option("--root", type=click.Path(path_type=Path), default=None, help="Only this indexed root.")
@click.option("--top-k", "-k", type=click.IntRange(1, 1000), default=None, help="How many hits (default 6).")
@click.option("--min-score", type=click.FloatRange(0, 1), default=None, help="Cosine floor (semantic side).")
@_json_option
@click.pass_context
def search(
    ctx: click.Context,
    query: str,
    root: Path | None,
    top_k: int | None,
    min_score: float | None,
    as_json: bool,
) -> None:
    """Search every indexed root (memory files and source trees)."""
    if not _state(ctx).has_workspaces():
        raise MemstrataError("no memories indexed yet (run: memstrata index PATH)")
    with _state(ctx).workspaces() as registry:
        if not registry.roots():
            raise MemstrataError("no memories indexed yet (run: memstrata index PATH)")
        hits = registry.search(query, root=root, max_results=top_k, min_score=min_score)
    for warning in getattr(hits, "warnings", ()):  # e.g. a root whose folder is gone: skipped
        click.echo(f"warning: {warning}", err=True)
    if not getattr(hits, "complete", True):
        click.echo("warning: a sync was still running: some files were not searched yet", err=True)
    if as_json:
        _echo_json([h.as_dict() for h in hits])
        return
    if not hits:
        click.echo("no matches")
    for rank, hit in enumerate(hits, 1):
        where = f"{hit.absolute_path}:{hit.start_line}-{hit.end_line}"
        click.echo(f"{rank}. {hit.score:.2f}  {where}  ({hit.match_type})")
        for line in hit.snippet.strip().splitlines()[:4]:
            click.echo(f"   {_one_line(line)}")


@cli.command()
@click.argument("path")
@click.option(
    "--from", "from_line", type=click.IntRange(min=1), default=1, show_default=True, help="First line."
)
@click.option("--lines", type=click.IntRange(min=1), default=50, show_default=True, help="How many lines.")
@click.option("--root", type=click.Path(path_type=Path), default=None, help="The indexed root PATH is in.")
@_json_option
@click.pass_context
def get(ctx: click.Context, path: str, from_line: int, lines: int, root: Path | None, as_json: bool) -> None:
    """Print lines of an indexed file (absolute, relative to the current folder, or to its root)."""
    from memstrata.errors import PathOutsideRootError

    local = root is None and not os.path.isabs(os.path.expanduser(path)) and os.path.lexists(path)
    if not _state(ctx).has_workspaces():
        raise MemstrataError("no memories indexed yet (run: memstrata index PATH)")
    with _state(ctx).workspaces() as registry:
        if not registry.roots():
            raise MemstrataError("no memories indexed yet (run: memstrata index PATH)")
        try:  # a path that exists here is read from here; if no root holds it, try the roots
            text = registry.get(
                os.path.abspath(path) if local else path, root=root, from_line=from_line, lines=lines
            )
        except PathOutsideRootError:
            if not local:
                raise
            text = registry.get(path, from_line=from_line, lines=lines)
    if as_json:
        _echo_json(text.as_dict())
    else:
        click.echo(text.text, nl=not text.text.endswith("\n"))


@cli.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--kind", type=click.Choice(["auto", "memory", "code"]), default="auto", show_default=True)
@click.pass_context
def watch(ctx: click.Context, path: Path, kind: str) -> None:
    """Keep PATH's index in sync with its files until Ctrl-C."""
    from . import _convert

    stop = threading.Event()

    def synced(ws: Any, stats: Any) -> None:
        data = _convert.plain(stats)
        if isinstance(data, dict) and not (data.get("files_processed") or data.get("files_deleted")):
            return
        click.echo(f"synced {ws.root}: {_sync_summary(data)}")

    with _state(ctx).workspaces() as registry:
        roots = registry.watch(path, kind=kind, on_synced=synced)  # type: ignore[arg-type]
        for ws in roots:
            click.echo(f"watching {ws.root} ({ws.kind}); press Ctrl-C to stop")
        with _stop_on_signals(stop):
            stop.wait()
    click.echo("stopped watching", err=True)


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT/SIGTERM set ``stop`` (main thread only), so the watcher closes cleanly."""
    import signal

    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, OSError):
                previous[signum] = signal.signal(signum, lambda *_: stop.set())
    try:
        yield
    finally:
        for signum, handler in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signum, handler)


# -- status --------------------------------------------------------------------------------------


@cli.command()
@click.option("--verbose", "-v", is_flag=True, help="Also print every detail of the report.")
@_json_option
@click.pass_context
def status(ctx: click.Context, verbose: bool, as_json: bool) -> None:
    """Drivers, vectors, model, counts per store, sync state and degraded agents."""
    from . import _status

    state = _state(ctx)
    with state.system() as system, state.workspaces(system, create=False) as registry:
        report = _status.collect(system, registry, state.config)
    if as_json:
        _echo_json(report)
        return
    for line in _status.render({**report, "verbose": verbose}):
        click.echo(line)
    for warning in _status.warnings(report):
        click.echo(f"{_PROG}: warning: {warning}", err=True)


# -- bridges -------------------------------------------------------------------------------------


@contextlib.contextmanager
def _protocol_streams() -> Iterator[tuple[IO[bytes], IO[bytes]]]:
    """stdin/stdout for the protocol; stray writes to fd 1 (a library's print) go to stderr."""
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
        with contextlib.suppress(OSError, ValueError):
            writer.flush()
        with contextlib.suppress(OSError):
            os.dup2(private, out_fd)
        with contextlib.suppress(OSError, ValueError):
            writer.close()


@cli.command()
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
    from ._server import JsonLinesServer, open_listener

    state = _state(ctx)
    bridges = state.config.bridges
    listener = open_listener(listen) if listen is not None else None  # refuse a bad address first
    try:
        with state.system() as system, state.workspaces(system) as registry:
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
            )
            if listener is not None:
                click.echo(f"{_PROG} serve: listening on {listener.address}", err=True)
                server.serve_socket(listener)
                return
            with _protocol_streams() as (reader, writer):
                server.serve(reader, writer)
    finally:
        if listener is not None:
            listener.close()


@cli.command()
@click.option(
    "--agent", "-a", "agent_id", default=None, help="Default agent for tool calls (config: bridges.agent_id)."
)
@click.pass_context
def mcp(ctx: click.Context, agent_id: str | None) -> None:
    """Serve the memory tools over MCP on stdio (needs the 'mcp' extra)."""
    from ._mcp import require_sdk, run_stdio

    require_sdk()
    state = _state(ctx)
    with state.system() as system, state.workspaces(system) as registry:
        run_stdio(system, registry, agent_id=agent_id or state.config.bridges.agent_id)


@cli.command()
@click.pass_context
def demo(ctx: click.Context) -> None:
    """Run the multi-agent simulation (real model, real storage) and print a summary."""
    from memstrata._demo import run_demo

    state = _state(ctx)
    run_demo(state.config.data_dir, out=click.echo, config=state.config, embedder=state.embedder)


@cli.command("export")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@_json_option
@click.pass_context
def export_cmd(ctx: click.Context, path: Path, as_json: bool) -> None:
    """Write every memory (knowledge, episodes, working memory, blackboards) to PATH as sorted JSON lines."""
    with _state(ctx).system() as system:
        lines = system.export(path)
    if as_json:
        _echo_json({"path": str(path), "lines": lines})
    else:
        click.echo(f"exported {lines} lines to {path}")


@cli.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_json_option
@click.pass_context
def import_cmd(ctx: click.Context, path: Path, as_json: bool) -> None:
    """Restore a file written by 'memstrata export' into the data dir."""
    with _state(ctx).system() as system:
        counts = system.import_(path)
    if as_json:
        _echo_json(counts)
    else:
        click.echo("imported " + ", ".join(f"{n} {kind}" for kind, n in counts.items()))


class _OneLineLog(logging.Handler):
    """memstrata's log records as one line each on stderr, each distinct line once per process.

    Problems met while starting (a damaged store, write-backs that cannot be replayed) are logged
    by the actors with their traceback; a command line shows what went wrong, not where, unless
    ``--debug`` asks for the details.
    """

    def __init__(self, debug: bool) -> None:
        super().__init__(logging.DEBUG if debug else logging.WARNING)
        self.debug = debug
        self._seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = f"{_PROG}: {record.levelname.lower()}: {' '.join(record.getMessage().split())}"
            if self.debug and record.exc_info:
                line += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
            elif line in self._seen:
                return
            self._seen.add(line)
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def _log_one_line(debug: bool) -> None:
    """Route memstrata's log records through :class:`_OneLineLog` (this process only)."""
    logger = logging.getLogger("memstrata")
    logger.addHandler(_OneLineLog(debug))
    logger.setLevel(logging.DEBUG if debug else logging.WARNING)
    logger.propagate = False


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    _log_one_line(_wants_debug(list(sys.argv[1:] if argv is None else argv)))
    cli.main(args=argv, prog_name=_PROG)
