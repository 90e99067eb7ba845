"""How the command line shows results to a person, and progress on long work.

``--json`` prints the result as one JSON document; without it, results are rendered here: hits
numbered best first, entries one per line, objects as ``key: value`` lines. A key or value that
holds a control character (a newline) is shown as a JSON string, so it stays on one line and reads
back exactly; a preview of long content is folded onto one line instead. Progress on long work
goes to stderr as plain lines (a terminal and a pipe get the same), so a script that logs stderr
sees that the work goes on and how it ended.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TextIO

import click

from ._cli_shared import PROG, echo_json, one_line, shown
from ._json import dumps
from ._progress import PROGRESS_SECONDS, Progress

__all__ = [
    "PROGRESS_SECONDS",
    "IndexProgress",
    "clipped",
    "echo_hits",
    "echo_result",
    "heartbeat",
    "json_shown",
    "sync_summary",
    "text_shown",
]


def echo_hits(
    hits: list[dict[str, Any]], as_json: bool, if_none: str, describe: Callable[[dict[str, Any]], str]
) -> None:
    """Memory hits as one JSON list, or numbered: score, ``describe(hit)`` and id, then the content."""
    if as_json:
        echo_json(hits)
        return
    if not hits:
        click.echo(if_none)
    for rank, hit in enumerate(hits, 1):
        click.echo(f"{rank}. {hit.get('score', 0):.2f}  {describe(hit)}  #{hit.get('id')}")
        click.echo(f"   {one_line(hit.get('content', ''))}")


def sync_summary(stats: Any) -> str:
    """One line for the stats of an index run."""
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


# -- results of registry operations ---------------------------------------------------------------


def _describe(item: Mapping[str, Any]) -> str:
    """The short label of an entry, episode or hit: id, store and its kind of subject."""
    parts = []
    if "id" in item:
        parts.append(f"#{item['id']}")
    for key in ("store", "category", "kind", "at", "title", "match_type"):
        value = item.get(key)
        if value not in (None, ""):
            parts.append(str(value))
    return shown("  ".join(parts))


_JSON_LEAVES_RAW = re.compile(r"[\x7f-\x9f\u2028\u2029]")


def json_shown(value: Any) -> str:
    """``value`` as JSON on one line, the control characters JSON leaves raw escaped as well."""
    text = dumps(value).decode("utf-8")
    return _JSON_LEAVES_RAW.sub(lambda found: f"\\u{ord(found[0]):04x}", text)


def text_shown(text: str) -> str:
    """``text`` as is, or as a JSON string when it holds a control character or starts with a
    quote: a newline then neither forges a line nor folds into a space, and the quotes tell the
    escaped form from a plain text."""
    if text.startswith('"') or shown(text) != text or _JSON_LEAVES_RAW.search(text):
        return json_shown(text)
    return text


def _scalar(value: Any) -> str:
    return text_shown(value) if isinstance(value, str) else json_shown(value)


def clipped(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters (``...`` at the end when cut), nothing folded."""
    return text if len(text) <= width else text[: width - 3] + "..."


def echo_result(result: Any, as_json: bool, *, if_none: str = "nothing found") -> None:
    """A registry operation's result: JSON, or a readable rendering of its shape."""
    if as_json:
        echo_json(result)
        return
    if isinstance(result, Mapping) and isinstance(result.get("hits"), list) and "complete" in result:
        _echo_search(result, if_none)
    elif isinstance(result, list):
        if not result:
            click.echo(if_none)
        for item in result:
            if isinstance(item, Mapping) and ("content" in item or "id" in item):
                click.echo(f"{_describe(item)}  {one_line(str(item.get('content', '')))}".strip())
            elif isinstance(item, Mapping):
                click.echo("  ".join(f"{k}={_scalar(v)}" for k, v in item.items()))
            else:
                click.echo(_scalar(item))
    elif isinstance(result, Mapping):
        for key, value in result.items():
            if key == "hits" and isinstance(value, list):
                click.echo(f"hits: {len(value)}")
                for hit in value:
                    click.echo(f"  {_describe(hit)}  {one_line(str(hit.get('content', '')), 120)}")
            else:
                click.echo(f"{key}: {clipped(_scalar(value), 400)}")
    else:
        click.echo(_scalar(result))


def _echo_search(result: Mapping[str, Any], if_none: str) -> None:
    hits = result["hits"]
    for warning in result.get("warnings") or ():
        click.echo(f"{PROG}: warning: {warning}", err=True)
    if result.get("degraded"):
        click.echo(f"{PROG}: warning: ranking degraded: {result['degraded']}", err=True)
    if not result.get("complete", True):
        click.echo(f"{PROG}: warning: a sync was still running: some data was not searched yet", err=True)
    if not hits:
        click.echo(if_none)
    for rank, hit in enumerate(hits, 1):
        click.echo(f"{rank}. {float(hit.get('score', 0)):.2f}  {_describe(hit)}")
        click.echo(f"   {one_line(str(hit.get('content', hit.get('snippet', ''))))}")


# -- progress on long work ------------------------------------------------------------------------


class IndexProgress(Progress):
    """The sync's ``progress(done, total, path)`` as lines on stderr, when :class:`Progress` says."""

    def __init__(
        self,
        stream: TextIO,
        *,
        every: int = 100,
        seconds: float = PROGRESS_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(self._line, every=every, seconds=seconds, clock=clock)
        self._stream = stream

    def _line(self, done: int, total: int, path: str) -> None:
        where = f"  {one_line(path, 120)}" if path else ""
        self._stream.write(f"{PROG}: indexing: {done}/{total} files{where}\n")
        self._stream.flush()


@contextmanager
def heartbeat(what: str, stream: TextIO, *, seconds: float = PROGRESS_SECONDS) -> Iterator[None]:
    """``what`` runs; every ``seconds`` while it does, one "still working" line on stderr.

    For long work that reports no progress of its own (export, import, archives): a line only
    appears when the work outlasts ``seconds``, so quick runs print nothing extra.
    """
    done = threading.Event()
    started = time.monotonic()

    def beat() -> None:
        while not done.wait(seconds):
            stream.write(f"{PROG}: {what}: still working ({time.monotonic() - started:.0f} s)\n")
            stream.flush()

    thread = threading.Thread(target=beat, name=f"{PROG}-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
