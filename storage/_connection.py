"""SQLite connections: pragmas, transactions, busy retries, error mapping.

The driver and sqlite-vec loading are :mod:`._driver`'s. Each :class:`Database` is confined to
the thread that uses it (actors own their connection), so layers need no locks.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memstrata.core.closing import Closeable
from memstrata.core.constants import SYNCHRONOUS_MODES
from memstrata.core.errors import DatabaseBusyError, InvalidInputError, ReadOnlyError, StorageError

from ._driver import _MODULE, DriverInfo, _load_vec

if TYPE_CHECKING:
    from memstrata.core.config import StorageConfig

__all__ = [
    "Database",
    "configured",
    "connection_defaults",
    "open_database",
    "split_sql",
    "writable",
]

DEFAULT_BUSY_TIMEOUT_MS = 5_000
DEFAULT_LOCK_BOUND_S = 30.0


@dataclass(frozen=True, slots=True)
class _Defaults:
    lock_bound_s: float = DEFAULT_LOCK_BOUND_S
    synchronous: str = "normal"
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS


# what databases opened without explicit settings use, in this context (thread)
_DEFAULTS: contextvars.ContextVar[_Defaults] = contextvars.ContextVar("memstrata_connection_defaults")


def _positive(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidInputError(f"{name} must be a positive number, got {value!r}")
    return float(value)


@contextlib.contextmanager
def connection_defaults(
    *,
    lock_bound_s: float | None = None,
    synchronous: str | None = None,
    busy_timeout_ms: int | None = None,
) -> Iterator[None]:
    """Databases opened inside this block (in this thread) use these settings unless told otherwise.

    Lets a caller impose its configuration on a layer that opens its own connection, without
    changing any other thread. ``lock_bound_s``: how long a write waits for another process's
    lock before :class:`DatabaseBusyError`. ``synchronous``: ``"normal"`` (a commit survives the
    process being killed) or ``"full"`` (it also survives power loss: every commit is fsynced).
    ``busy_timeout_ms``: how long one attempt waits inside SQLite before memstrata backs off.
    """
    current = _DEFAULTS.get(_Defaults())
    if lock_bound_s is not None:
        current = dataclasses.replace(current, lock_bound_s=_positive(lock_bound_s, "lock_bound_s"))
    if synchronous is not None:
        if synchronous not in SYNCHRONOUS_MODES:
            choices = ", ".join(SYNCHRONOUS_MODES)
            raise InvalidInputError(f"synchronous must be one of {choices}, got {synchronous!r}")
        current = dataclasses.replace(current, synchronous=synchronous)
    if busy_timeout_ms is not None:
        busy = int(_positive(busy_timeout_ms, "busy_timeout_ms"))
        current = dataclasses.replace(current, busy_timeout_ms=busy)
    token = _DEFAULTS.set(current)
    try:
        yield
    finally:
        _DEFAULTS.reset(token)


def configured(storage: StorageConfig) -> contextlib.AbstractContextManager[None]:
    """:func:`connection_defaults` as the ``[storage]`` section sets them (lock bound, sync): how
    the actors, the command line's own searches and the workspace registry open their databases."""
    return connection_defaults(lock_bound_s=storage.lock_timeout_s, synchronous=storage.synchronous)


def _is_busy(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def split_sql(script: str) -> list[str]:
    """Split a script into complete statements (a ``;`` inside a trigger body or string stays)."""
    statements: list[str] = []
    buffer = ""
    for piece in script.split(";"):
        buffer += piece + ";"
        if _MODULE.complete_statement(buffer):
            if buffer.strip(" \n\t\r;"):
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip(" \n\t\r;"):
        statements.append(buffer.strip())
    return statements


class _Cursor:
    """A driver cursor whose fetches translate backend errors too.

    SQLite reports a damaged page or an I/O error while stepping through rows, which happens in
    ``fetchone``/``fetchall``/iteration, after ``execute`` has returned.
    """

    __slots__ = ("_cursor", "_db")

    def __init__(self, cursor: Any, db: Database) -> None:
        self._cursor = cursor
        self._db = db

    def _fail(self, exc: BaseException) -> StorageError:
        return self._db._translate(exc)

    def fetchone(self) -> Any:
        try:
            return self._cursor.fetchone()
        except _MODULE.Error as exc:
            raise self._fail(exc) from exc

    def fetchall(self) -> list[Any]:
        try:
            return list(self._cursor.fetchall())
        except _MODULE.Error as exc:
            raise self._fail(exc) from exc

    def fetchmany(self, size: int = 1) -> list[Any]:
        try:
            return list(self._cursor.fetchmany(size))
        except _MODULE.Error as exc:
            raise self._fail(exc) from exc

    def __iter__(self) -> Iterator[Any]:
        while True:
            rows = self.fetchmany(256)
            if not rows:
                return
            yield from rows

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    @property
    def lastrowid(self) -> int | None:
        value = self._cursor.lastrowid
        return None if value is None else int(value)

    @property
    def description(self) -> Any:
        return self._cursor.description

    def close(self) -> None:
        self._cursor.close()


def writable(path: Path) -> bool:
    """Whether this process may write the database at ``path`` (and the journal files beside it).

    A missing file counts as writable when its nearest existing folder is, since opening it for
    writing creates it there. ``os.access`` also reports a read-only file system, even to root.
    """
    if str(path) == ":memory:":
        return True
    if path.exists():
        return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return os.access(folder, os.W_OK)


def _read_only_uri(path: Path, immutable: bool) -> str:
    return path.resolve().as_uri() + ("?mode=ro&immutable=1" if immutable else "?mode=ro")


class Database(Closeable):
    """One SQLite connection with memstrata's pragmas and a retrying write transaction.

    Reads run in autocommit mode; :meth:`transaction` opens ``BEGIN IMMEDIATE`` and retries a
    busy database with jittered backoff up to ``lock_bound_s`` before raising
    :class:`DatabaseBusyError`, so "database is locked" never reaches a user unexplained.

    ``read_only`` opens with ``mode=ro``; a database that cannot be written (a read-only file or
    folder, a read-only file system) is opened that way by itself, and a write then raises
    :class:`ReadOnlyError`. A missing database in a place that cannot be written is not created:
    opening it raises :class:`ReadOnlyError`.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        read_only: bool = False,
        busy_timeout_ms: int | None = None,
        lock_bound_s: float | None = None,
        load_vec: bool = True,
    ) -> None:
        self.path = Path(path) if str(path) != ":memory:" else Path(":memory:")
        self.read_only = read_only
        defaults = _DEFAULTS.get(_Defaults())
        if lock_bound_s is None:
            lock_bound_s = defaults.lock_bound_s
        if busy_timeout_ms is None:
            busy_timeout_ms = defaults.busy_timeout_ms
        self.lock_bound_s = lock_bound_s
        # SQLite's own wait happens inside one attempt: it must not outlast the whole bound
        busy_timeout_ms = max(1, min(int(busy_timeout_ms), int(lock_bound_s * 1000)))
        self._in_tx = False
        self._savepoints = 0
        self._rollback_hooks: list[Callable[[], None]] = []
        self._close_hooks: list[Callable[[], None]] = []  # see on_close
        # writes per vector table made through this connection: in-memory mirrors compare it,
        # since ``PRAGMA data_version`` only changes for other connections' commits
        self._vector_generations: dict[str, int] = {}
        self.conn: Any = None
        try:
            refused = not read_only and not writable(self.path)
        except OSError as exc:  # a name too long for the file system, a folder it cannot search
            raise StorageError(f"cannot open database {self.path}: {exc.strerror}") from exc
        if refused:
            if not self.path.exists():
                raise ReadOnlyError(f"cannot create database {self.path}: its folder is read-only")
            read_only = True
            self.read_only = True
        try:
            if read_only:
                self.conn = self._connect_read_only()
            else:
                if str(self.path) != ":memory:":
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                self.conn = _MODULE.connect(str(self.path), isolation_level=None, check_same_thread=False)
            self.conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            self._busy_timeout_ms = int(busy_timeout_ms)
            if not read_only:
                self._retry_busy(lambda: self.conn.execute("PRAGMA journal_mode = WAL"))
                self.conn.execute(f"PRAGMA synchronous = {defaults.synchronous.upper()}")
            self.conn.execute("PRAGMA foreign_keys = ON")
            self.conn.execute("PRAGMA temp_store = MEMORY")
            # touch the schema so a file that is not a database fails here, with its path
            self.conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except (_MODULE.Error, StorageError, OSError) as exc:
            if self.conn is not None:
                with contextlib.suppress(Exception):
                    self.conn.close()
            reason = exc.__cause__ if isinstance(exc, StorageError) and exc.__cause__ else exc
            if isinstance(exc, DatabaseBusyError | ReadOnlyError):
                raise
            hint = ""
            if "malformed" in str(reason) or "not a database" in str(reason):
                hint = "; the file is damaged: restore it from a backup or move it aside"
            raise StorageError(f"cannot open database {self.path}: {reason}{hint}") from exc
        self.vec_version, self.vec_reason = _load_vec(self.conn) if load_vec else (None, "not requested")
        self.native_vectors = self.vec_version is not None

    def _connect_read_only(self) -> Any:
        """``mode=ro``; in a folder that cannot be written and with no write-ahead log beside the
        file, SQLite cannot create the shared-memory file WAL readers need, and nobody can be
        writing there, so the file is read as it is (``immutable=1``)."""
        if not self.path.exists():
            raise ReadOnlyError(f"database {self.path} does not exist (opened read-only)")
        conn = _MODULE.connect(
            _read_only_uri(self.path, False), uri=True, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except _MODULE.Error:
            conn.close()
            wal = self.path.with_name(self.path.name + "-wal")
            if os.access(self.path.parent, os.W_OK) or wal.exists():
                raise
        return _MODULE.connect(
            _read_only_uri(self.path, True), uri=True, isolation_level=None, check_same_thread=False
        )

    # -- queries -------------------------------------------------------------------------------

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        """One statement. Outside a transaction a busy database is retried like :meth:`transaction`
        (an autocommit statement that failed as busy changed nothing, so running it again is safe)."""
        try:
            return _Cursor(self.conn.execute(sql, params), self)
        except _MODULE.Error as exc:
            if _is_busy(exc) and not self._in_tx and not self.conn.in_transaction:
                return _Cursor(self._retry_busy(lambda: self.conn.execute(sql, params)), self)
            raise self._translate(exc) from exc
        except UnicodeEncodeError as exc:
            raise self._bad_text(exc) from exc

    def checkpoint(self) -> bool:
        """Move the write-ahead log into the database and empty it, unless another connection
        holds a lock it would wait for: tidying never waits (a reader closing beside a writer
        would wait a whole lock bound). True when done; the commits are durable either way."""
        if self.read_only:
            return False
        self.conn.execute("PRAGMA busy_timeout = 0")
        try:
            row = self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except _MODULE.Error as exc:
            if _is_busy(exc):
                return False
            raise self._translate(exc) from exc
        finally:
            self.conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
        return row is not None and not row[0]

    def executemany(self, sql: str, rows: Any) -> Any:
        try:
            return _Cursor(self.conn.executemany(sql, rows), self)
        except _MODULE.Error as exc:
            raise self._translate(exc) from exc
        except UnicodeEncodeError as exc:
            raise self._bad_text(exc) from exc

    def executescript(self, sql: str) -> None:
        """Run every statement of ``sql``; inside :meth:`transaction` they join it.

        The driver's own ``executescript`` commits an open transaction first, which would
        silently break a migration's atomicity, so statements are run one by one instead.
        """
        if not self._in_tx and not self.conn.in_transaction:
            try:
                self.conn.executescript(sql)
            except _MODULE.Error as exc:
                raise self._translate(exc) from exc
            except UnicodeEncodeError as exc:
                raise self._bad_text(exc) from exc
            return
        for statement in split_sql(sql):
            self.execute(statement)

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        rows: list[Any] = self.execute(sql, params).fetchall()
        return rows

    def scalar(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        row = self.execute(sql, params).fetchone()
        return None if row is None else row[0]

    # -- transactions --------------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Database]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT``; rolls back on any exception.

        A nested call is a savepoint: an exception inside it undoes only its own writes (and runs
        the rollback hooks, which must be idempotent), then propagates to the outer block.
        """
        if self._in_tx:
            with self._savepoint():
                yield self
            return
        self._retry_busy(lambda: self.conn.execute("BEGIN IMMEDIATE"))
        self._in_tx = True
        try:
            yield self
        except BaseException:
            self._in_tx = False
            self._rolled_back()
            raise
        self._in_tx = False
        try:
            self._retry_busy(lambda: self.conn.execute("COMMIT"))
        except BaseException:
            self._rolled_back()
            raise
        self._rollback_hooks.clear()

    @contextlib.contextmanager
    def _savepoint(self) -> Iterator[None]:
        self._savepoints += 1
        name = f"memstrata_sp{self._savepoints}"
        try:
            self.execute(f"SAVEPOINT {name}")
            try:
                yield
            except BaseException:
                with contextlib.suppress(Exception):
                    self.conn.execute(f"ROLLBACK TO {name}")
                    self.conn.execute(f"RELEASE {name}")
                for hook in list(self._rollback_hooks):  # kept: the outer block may still roll back
                    hook()
                raise
            self.execute(f"RELEASE {name}")
        finally:
            self._savepoints -= 1

    def on_rollback(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` if the current transaction rolls back (in-memory mirrors resync)."""
        self._rollback_hooks.append(hook)

    def _rolled_back(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.execute("ROLLBACK")
        hooks, self._rollback_hooks = self._rollback_hooks, []
        for hook in hooks:
            hook()

    @property
    def in_transaction(self) -> bool:
        return self._in_tx

    def _retry_busy(self, op: Any) -> Any:
        deadline = time.monotonic() + self.lock_bound_s
        delay = 0.01
        while True:
            try:
                return op()
            except _MODULE.Error as exc:
                if not _is_busy(exc):
                    raise self._translate(exc) from exc
                if time.monotonic() >= deadline:
                    raise DatabaseBusyError(
                        f"database {self.path} stayed locked by another process for more than "
                        f"{self.lock_bound_s:g} s"
                    ) from exc
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.5)

    def _translate(self, exc: BaseException) -> StorageError:
        if _is_busy(exc):
            return DatabaseBusyError(f"database {self.path} is locked by another process: {exc}")
        text = str(exc).lower()
        if "disk is full" in text or "disk full" in text:
            return StorageError(
                f"database {self.path}: the disk is full (or the database reached its size limit): {exc}"
            )
        if "readonly" in text or "read-only" in text:
            return ReadOnlyError(f"database {self.path} is read-only: it cannot be written ({exc})")
        if "malformed" in text or "not a database" in text:
            return StorageError(
                f"database {self.path} is damaged ({exc}): restore it from a backup or move it aside"
            )
        return StorageError(f"database {self.path}: {exc}")

    def _bad_text(self, exc: UnicodeEncodeError) -> InvalidInputError:
        return InvalidInputError(
            f"database {self.path}: a text parameter is not valid UTF-8 (lone surrogate at "
            f"position {exc.start}); clean it before storing"
        )

    def data_version(self) -> int:
        """Changes whenever another connection commits (used to refresh in-memory mirrors)."""
        return int(self.scalar("PRAGMA data_version"))

    def driver_info(self) -> DriverInfo:
        """The driver of this connection and whether sqlite-vec is loaded in it (and if not, why)."""
        version = str(self.scalar("SELECT sqlite_version()"))
        return DriverInfo(_MODULE.__name__, version, self.vec_version, self.native_vectors, self.vec_reason)

    def pragmas(self) -> dict[str, Any]:
        """The settings that matter for durability and concurrency, as SQLite reports them."""
        return {
            name: self.scalar(f"PRAGMA {name}")
            for name in ("journal_mode", "synchronous", "busy_timeout", "foreign_keys")
        }

    def on_close(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` when this connection closes, before it does (caches written beside the
        database refresh themselves here); a failing hook does not stop the close."""
        self._close_hooks.append(hook)

    def close(self) -> None:
        hooks, self._close_hooks = self._close_hooks, []
        for hook in hooks:
            with contextlib.suppress(Exception):
                hook()
        with contextlib.suppress(Exception):
            self.conn.close()


def open_database(path: Path | str, **kwargs: Any) -> Database:
    return Database(path, **kwargs)
