"""What the adapters share: the running system they go through, and a clear missing-extra error.

An adapter given a running ``MemorySystem`` uses it (its actors, its shared batching embedder,
its durable writes). Given a path, it starts a private system whose data dir is that folder (for
a SQLite file's name, as a connection string names one, the folder beside it with ``.memstrata``
added to its name; the file is left alone: see :func:`data_dir_of`); every adapter of the process
given the same path shares that one system (counted: the last to close stops it). Given
``":memory:"`` or ``None``, it starts a private system in a new temporary folder, removed when the
adapter closes (or the process exits). The embedding model of private systems is loaded once per process.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from memstrata import MemorySystem
from memstrata.config import Config
from memstrata.core.validation import check_json_value
from memstrata.errors import ConfigError, EmbedderUnavailableError, InvalidInputError, SystemStoppedError

__all__ = [
    "InputTypeError",
    "Opened",
    "data_dir_of",
    "json_bytes",
    "missing",
    "open_system",
    "settled",
]

MEMORY = ":memory:"
FILE_SUFFIX = ".memstrata"
SQLITE_SUFFIXES = (".db", ".db3", ".sqlite", ".sqlite3")  # a SQLite file's name, in any case


class InputTypeError(InvalidInputError, TypeError):
    """An argument of the wrong type (or a value that is not JSON): memstrata's
    ``InvalidInputError`` and also the ``TypeError`` the frameworks' own backends raise there, so
    code written for either catches it."""


def json_bytes(value: Any, what: str) -> bytes:
    """``value`` as JSON, or :class:`InputTypeError` naming ``what`` and, from memstrata's one
    check, where in it the fault is (an integer beyond 64 bits, a key that is not text, NaN)."""
    try:
        return check_json_value(value, what)
    except InvalidInputError as exc:
        raise InputTypeError(f"{what} is not JSON: {str(exc).removeprefix(what + ' ')}") from None


_T = TypeVar("_T")


async def settled(write: Callable[..., _T], *args: Any) -> _T:
    """Runs ``write`` in a worker thread; a cancellation of the caller waits for the write's
    outcome (committed or failed) before it propagates, so no write lands after the caller saw
    ``CancelledError`` (the OpenAI Agents SDK's ``SQLiteSession`` does the same). A write cannot be stopped
    halfway: its thread runs it to the end either way."""
    task = asyncio.ensure_future(asyncio.to_thread(write, *args))
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:  # again and again: still wait for the outcome
            cancelled = cancelled or exc
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved, so asyncio does not report it as never retrieved
        raise cancelled
    return task.result()


def missing(module: str, extra: str, exc: ImportError) -> ImportError:
    """The error for an adapter whose framework is not installed: names the extra."""
    return ImportError(f"{module} is not installed: pip install 'memstrata[{extra}]' ({exc})")


@dataclass(slots=True)
class _Private:
    system: MemorySystem
    users: int = 0
    temporary: Path | None = None


@dataclass(slots=True)
class Opened:
    """A system an adapter uses; :meth:`release` lets a private one go (idempotent)."""

    system: MemorySystem
    _key: str | None = None
    _entry: _Private | None = None
    _released: bool = field(default=False)

    @property
    def private(self) -> bool:
        return self._key is not None

    @property
    def released(self) -> bool:
        """Whether the adapter let the system go (it was closed)."""
        return self._released

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        if self._key is not None and self._entry is not None:
            _release(self._key, self._entry)


_LOCK = threading.Lock()
_PRIVATE: dict[str, _Private] = {}
_MODEL: list[Any] = []  # the default model, loaded at most once per process


def _default_model() -> Any:
    """The configured embedding model, loaded once and shared by every private system (each
    wraps it in its own batching service); ``None`` if none can be loaded (keyword-only)."""
    if not _MODEL:
        from memstrata.storage import load_embedder

        config = Config.load()
        model = config.embedding.model
        try:
            _MODEL.append(
                load_embedder(None if model in ("", "default") else model, dim=config.embedding.dim)
            )
        except EmbedderUnavailableError:
            _MODEL.append(None)
    return _MODEL[0]


def open_system(target: Any, *, embedder: Any = None, what: str = "target") -> Opened:
    """The system behind ``target``: a running ``MemorySystem``, a data dir path (``str`` or
    ``Path``, shared by every adapter of the process given it), or ``":memory:"``/``None`` (a
    private temporary one). ``embedder``: the model a new private system uses (default: the
    configured one, loaded once per process)."""
    if isinstance(target, MemorySystem):
        if target.stopped:
            raise SystemStoppedError(f"{what}: the MemorySystem is stopped")
        return Opened(target)
    if target is not None and not isinstance(target, str | Path):
        raise ConfigError(f"{what} must be a data dir path, ':memory:' or a MemorySystem, got {target!r}")
    temporary = target is None or str(target) == MEMORY
    if target is not None and not str(target).strip():
        raise InvalidInputError(f"{what} must be a non-empty path, got {target!r}")
    with _LOCK:
        if target is None or temporary:
            folder = Path(tempfile.mkdtemp(prefix="memstrata-"))
            key = f"{MEMORY}{folder}"
        else:
            folder = data_dir_of(target, what)
            key = str(folder)
        entry = _PRIVATE.get(key)
        if entry is not None and not entry.system.stopped and embedder is not None:
            _check_same_model(embedder, entry.system.embedder, f"{what} {str(target)!r}")
        if entry is None or entry.system.stopped:
            model = embedder if embedder is not None else _default_model()
            try:
                system = MemorySystem.start(Config(data_dir=folder), model)
            except BaseException:
                if temporary:
                    shutil.rmtree(folder, ignore_errors=True)
                raise
            entry = _PRIVATE[key] = _Private(system, temporary=folder if temporary else None)
        entry.users += 1
        return Opened(entry.system, key, entry)


def data_dir_of(target: str | Path, what: str = "target") -> Path:
    """The data dir a path names, so one string names one place whichever program opened it
    first. A name ending in a SQLite suffix (``app.db``, as LangGraph's and the Agents SDK's conn
    strings name their files) gets the folder beside it with ``.memstrata`` added, whether the
    file exists or not (the file stays SQLite's: never made, read or written here). Any other
    path is the folder itself, or one ending in a separator; but a file there (a SQLite file
    named otherwise, such as a temporary file) gets the folder beside it too, and keeps it once
    the file is gone. A folder where the suffix names a file is refused, not read instead."""
    text = str(target)
    path = Path(target).expanduser().resolve()
    beside = path.with_name(path.name + FILE_SUFFIX)
    as_folder = isinstance(target, str) and text.endswith(("/", os.sep))
    if not as_folder and path.suffix.lower() in SQLITE_SUFFIXES:
        if path.is_dir():
            raise ConfigError(
                f"{what} {text!r} names a SQLite file but is a folder: its data dir is "
                f"{beside.name!r} beside it; move the folder there, or give {text + '/'!r} to use "
                "the folder itself"
            )
        return beside
    if path.exists() and not path.is_dir():
        if as_folder:
            raise ConfigError(f"{what} {text!r} ends in a separator, which names a folder, but is a file")
        return beside
    return beside if not path.exists() and beside.is_dir() and not as_folder else path


def _check_same_model(given: Any, running: Any, where: str) -> None:
    """Refuse a model other than the one the path's system already runs: the system embeds
    with its own, so the given one would be silently ignored."""
    same = running is given or (
        running is not None
        and getattr(given, "model_id", None) == running.model_id
        and getattr(given, "dim", None) == running.dim
    )
    if not same:
        name = "none (keyword-only)" if running is None else f"{running.model_id!r} ({running.dim} dims)"
        raise ConfigError(
            f"{where} is already open with the model {name}: another model "
            f"({getattr(given, 'model_id', type(given).__name__)!r}) cannot share it; give the same "
            "model, none, or another path"
        )


def _release(key: str, entry: _Private) -> None:
    with _LOCK:
        entry.users -= 1
        if entry.users > 0:
            return
        if _PRIVATE.get(key) is entry:
            del _PRIVATE[key]
    _stop(entry)


def _stop(entry: _Private) -> None:
    try:
        entry.system.stop()
    finally:
        if entry.temporary is not None:
            shutil.rmtree(entry.temporary, ignore_errors=True)


@atexit.register
def _stop_all() -> None:  # pragma: no cover - interpreter shutdown
    with _LOCK:
        entries = list(_PRIVATE.values())
        _PRIVATE.clear()
    for entry in entries:
        with contextlib.suppress(Exception):  # nothing is left to report to at exit
            _stop(entry)
