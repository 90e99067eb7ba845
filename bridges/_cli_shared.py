"""What every command of the ``memstrata`` command line shares: its state, options and input parsing.

Kept apart from the command modules so each of them (today's shortcuts, the commands generated
from the registry, ``serve``/``mcp``) reads its options and prints JSON the same way.
"""

from __future__ import annotations

import contextlib
import math
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import click

from memstrata.core.errors import InvalidInputError

from ._app import CliState
from ._json import NumberError, dumps, loads_value, not_json

__all__ = [
    "PROG",
    "FiniteRange",
    "agent_option",
    "content",
    "echo_json",
    "echo_result",
    "fail_line",
    "given",
    "json_option",
    "json_text",
    "one_line",
    "parse_tags",
    "shown",
    "state",
    "stop_on_signals",
    "tag_option",
    "warning_line",
    "when",
]

PROG = "memstrata"


def fail_line(message: str) -> str:
    """An error as the one line the command line prints for it."""
    return f"{PROG}: error: {shown(' '.join(str(message).split())) or 'failed'}"


def warning_line(message: str) -> str:
    """A problem met on the way, as the one line the command line prints for it."""
    return f"{PROG}: warning: {shown(' '.join(str(message).split()))}"


class FiniteRange(click.FloatRange):
    """click's :class:`~click.FloatRange` that also refuses NaN, which compares false with both
    bounds and so passes click's own check."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if isinstance(number, float) and math.isnan(number):
            self.fail(f"{value!r} is not a number in the range {self._describe_range()}.", param, ctx)
        return number


def state(ctx: click.Context) -> CliState:
    found = ctx.find_object(CliState)
    assert found is not None
    return found


def echo_json(value: Any) -> None:
    """One JSON document on stdout."""
    click.echo(dumps(value).decode("utf-8"))


def echo_result(as_json: bool, value: Any, line: str) -> None:
    """A command's result: ``value`` as one JSON document with ``--json``, else ``line`` for people."""
    if as_json:
        echo_json(value)
    else:
        click.echo(line)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def shown(text: object) -> str:
    """``text`` safe to print to a terminal: control characters (an escape sequence in a file name
    could recolour the terminal or move its cursor; a newline would forge a line) as ``\\x1b``."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found[0]):02x}", str(text))


def one_line(text: str, width: int = 160) -> str:
    """``text`` on one line of at most ``width`` characters, whitespace runs as one space and
    other control characters shown as escapes (:func:`shown`)."""
    flat = shown(" ".join(str(text).split()))
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def parse_tags(values: Sequence[str], option: str = "--tag") -> dict[str, str] | None:
    """``--tag k=v`` (or a bare ``--tag k``, value ``""``) as a tags mapping, read as the tools
    read their tag strings (:func:`._tool_defs.tags_map`); ``None`` if none. ``--tag '{}'``
    alone is the empty mapping, as the operations write it (an update clears the tags)."""
    if not values:  # most commands give none: the tools' module is not imported for nothing
        return None
    if list(values) == ["{}"]:
        return {}
    from ._tool_defs import tags_map

    try:
        return tags_map(list(values)) or None
    except InvalidInputError as exc:
        raise click.BadParameter(str(exc), param_hint=f"'{option}'") from exc


class PathParam(click.Path):
    """click's ``Path``, refusing an empty value, which ``Path("")`` would read as the current
    folder (``search --root ''`` would search wherever the command runs)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value == "":
            self.fail("must not be empty", param, ctx)
        return super().convert(value, param, ctx)


def json_text(raw: str, option: str) -> Any:
    """A JSON option's value, read as ``memstrata serve`` reads one (escaped lone surrogates read);
    text that is not JSON, or that holds NaN or an integer beyond 64 bits (which would be read as
    a float), or is nested too deep, is a usage error naming the option and why."""
    try:
        return loads_value(raw)
    except ValueError as exc:
        raise click.BadParameter(
            str(exc)
            if isinstance(exc, NumberError) or not not_json(exc)
            else f"must be JSON (a string needs its quotes: '\"text\"'), got {raw[:64]!r}",
            param_hint=f"'{option}'",
        ) from exc


def given(**options: Any) -> dict[str, Any]:
    """The options a command was given: ``None`` means not given, so the callee's default applies."""
    return {k: v for k, v in options.items() if v is not None}


def content(value: str) -> str:
    """``-`` reads the content from stdin."""
    if value == "-":
        return sys.stdin.read()
    return value


def when(value: str | None, name: str) -> Any:
    """An ISO 8601 option as a datetime; a bad one is a usage error naming ``--name``."""
    if value is None:
        return None
    from ._operation import parse_time

    try:
        return parse_time(value, name)
    except InvalidInputError as exc:
        raise click.BadParameter(str(exc), param_hint=f"'--{name.replace('_', '-')}'") from exc


@contextlib.contextmanager
def stop_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    """SIGINT/SIGTERM call ``stop`` (main thread only), so a command that waits ends cleanly."""
    import signal

    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, OSError):
                previous[signum] = signal.signal(signum, lambda *_: stop())
    try:
        yield
    finally:
        for signum, handler in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signum, handler)


json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
agent_option = click.option("--agent", "-a", "agent_id", required=True, help="Agent id.")
tag_option = click.option("--tag", "tags", multiple=True, metavar="KEY[=VALUE]", help="A tag (repeatable).")
