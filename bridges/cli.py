"""The ``memstrata`` command line: the entry point, its global options and error handling.

Exit codes: 0 success, 1 runtime error (storage, embedding, a stopped system, ...), 2 usage error
(bad options or arguments, invalid values, a bad config file). Every error is one line on stderr,
``memstrata: error: ...``; ``--debug`` (or ``MEMSTRATA_DEBUG=1``) adds the traceback.
Commands import what they need when they run, so a command that only needs the file index never
starts the actor system. The commands live by concept: today's shortcuts in ``_cli_commands``,
one command per registry operation in ``_cli_generated`` (grouped by noun), ``serve``/``mcp`` in
``_cli_serve``; human output in ``_cli_output``. The generated groups are built when one of them
(or the list of commands) is asked for: a command written by hand (``query``, ``status``) does
not build a command for every operation first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Iterator, MutableMapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from memstrata.core.errors import InvalidInputError, MemstrataError

from . import _cli_commands, _cli_serve
from ._app import CliState
from ._cli_shared import PROG as _PROG
from ._cli_shared import fail_line as _fail_line

__all__ = ["cli", "command_for", "command_table", "main"]


def _wants_debug(args: Sequence[str] | None) -> bool:
    if os.environ.get("MEMSTRATA_DEBUG", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    return bool(args) and "--debug" in list(args or [])


_GENERATED = ("knowledge", "episodes", "tasks", "working", "board", "items", "roots")
"""The nouns of ``_cli_generated.GROUPS`` (a test keeps the two equal): the groups are imported
when one is named, listed or a name is not found (so the suggestions of "no such command" are
the same), not with the command line: building them imports the registry of operations and
makes a command per operation (~7 ms of a ``memstrata query`` process)."""


class _Cli(click.Group):
    """A group whose errors are one line on stderr with memstrata's exit codes."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = self.commands.get(cmd_name)
        if found is None:
            found = self.generated().get(cmd_name)
        return found

    def list_commands(self, ctx: click.Context) -> list[str]:
        self.generated()
        return super().list_commands(ctx)

    def generated(self) -> MutableMapping[str, click.Command]:
        """Every command, with the groups generated from the registry added on first use."""
        if not self.commands.keys() >= set(_GENERATED):
            from ._cli_generated import GROUPS

            for name, group in GROUPS.items():
                if name not in self.commands:
                    self.add_command(group, name)
        return self.commands

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with _reader_may_leave():  # `memstrata --help | head`
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with _reader_may_leave():
            return super().invoke(ctx)

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
            if isinstance(exc.__cause__, KeyboardInterrupt):  # click's form of Ctrl-C
                click.echo(f"{_PROG}: interrupted", err=True)
                sys.exit(130)
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


@contextlib.contextmanager
def _reader_may_leave() -> Iterator[None]:
    """The reader of stdout went away (``| head``): not an error, exit 0 quietly. Caught here,
    before click, whose own handling exits 1 without a word."""
    try:
        yield
    except BrokenPipeError:
        with contextlib.suppress(OSError):  # nothing more reaches the closed pipe, not even a flush
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise click.exceptions.Exit(0) from None


def _exit(code: int, message: str, exc: BaseException, debug: bool) -> NoReturn:
    if debug:
        click.echo("".join(traceback.format_exception(exc)).rstrip(), err=True)
    click.echo(_fail_line(message), err=True)
    sys.exit(code)


def _data_dir(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
    """An empty ``--data-dir ''`` would be the current folder: refused, not guessed."""
    if value is None:
        return None
    if not value.strip():
        raise click.BadParameter("must not be empty (leave it out for the default data dir)")
    return Path(value)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    callback=_data_dir,
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


for _command in (*_cli_commands.COMMANDS, *_cli_serve.COMMANDS):
    cli.add_command(_command)


def command_for(name: str) -> click.Command:
    """The command that runs the registry operation ``name`` (a KeyError names a missing one)."""
    from ._cli_generated import command_path
    from ._operations import find

    path = command_path(find(name))
    cli.generated()
    command: click.Command = cli
    for word in path:
        assert isinstance(command, click.Group)
        found = command.commands.get(word)
        if found is None:
            raise KeyError(f"no command 'memstrata {' '.join(path)}' for operation {name!r}")
        command = found
    return command


def _usage(command: click.Command) -> str:
    """The arguments and options of a command, as its help shows them (``--json`` left out)."""
    words = []
    for param in command.params:
        if isinstance(param, click.Argument):
            words.append(param.human_readable_name)
        elif isinstance(param, click.Option) and param.name != "as_json":
            opts = param.opts[0] + (f"/{param.secondary_opts[0]}" if param.secondary_opts else "")
            words.append(f"{opts}*" if param.required else opts)
    return " ".join(f"`{w}`" for w in words) or "-"


def command_table() -> str:
    """The Markdown table of CLI commands for docs/bridges.md, one row per registry operation."""
    from ._cli_generated import command_path
    from ._operations import OPERATIONS

    rows = [
        "| Command | Operation | Arguments and options (* required) | What it does |",
        "| --- | --- | --- | --- |",
    ]
    for op in OPERATIONS:
        path = " ".join(command_path(op))
        summary = op.summary.replace("|", "\\|")
        rows.append(f"| `memstrata {path}` | `{op.name}` | {_usage(command_for(op.name))} | {summary} |")
    return "\n".join(rows) + "\n"


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
    state = CliState()
    cli.main(args=argv, prog_name=_PROG, obj=state)
    if state.answered_in_process:
        _end_process()


def _end_process() -> NoReturn:
    """End the process as soon as the answer is flushed: a ``memstrata query`` answered in the
    process left nothing open but its model's helper process, reaped here, and the
    interpreter's teardown (freeing the model, the mapped index, every module) cost it 60-110
    ms after its answer."""
    from ._query_model import reap_all

    code = 0
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # the reader went away (e.g. `| head`): not an error
        pass
    except OSError as exc:  # the answer could not be written (a full disk, ...)
        with contextlib.suppress(OSError):
            os.write(2, (_fail_line(f"cannot write the answer: {exc}") + "\n").encode())
        code = 1
    reap_all()
    os._exit(code)
