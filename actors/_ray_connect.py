"""Joining the Ray cluster that ``[cluster] address`` names, from a driver or a command.

A head that does not answer is a clear error at once; a process already connected stays as it is.
``address = "local"`` is handed to Ray as it is: it starts a private Ray, where no address would
join whatever ``RAY_ADDRESS`` or the machine's last ``ray start`` names.
Joining is serialised within the process: two starts at once (a retry of a start that timed out
while the first still runs in its thread) join once, never race two ``ray.init`` calls, which
Ray answers with a failed start and processes of a half-started local Ray left behind. And
``ray.init`` runs on a thread that lasts as long as the process (the main thread, or one kept for
it): Ray binds the life of the processes a private Ray starts (``address = "local"``) to the
*thread* that started them (Linux's parent-death signal), so a start from a worker thread that
ends (``AsyncMemorySystem.start`` runs in one) killed the local Ray's raylet under the running
system and left its agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) orphaned.

Ray's errors become memstrata's here too (:func:`carried`, :func:`one_line`): Ray wraps an
exception raised in a remote call in ``RayTaskError`` (its ``cause`` is the original) and
describes a dead actor in many lines, with the remote traceback and terminal colour codes, while
memstrata's errors and warnings are one line each, as the local engine's are.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import re
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import ray

from memstrata.core.config import Config
from memstrata.core.errors import MemstrataError, SystemStoppedError

__all__ = ["carried", "connect", "joined", "one_line"]

_PROBE_S = 5.0  # how long a head's address may take to accept a connection
_JOINING = threading.Lock()  # one join at a time in this process (see the module's docstring)
_KEEPER: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] | None = None
_KEEPER_LOCK = threading.Lock()
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def connect(config: Config) -> bool:
    """Join the cluster ``[cluster] address`` names, unless this process is connected already;
    whether this call made the connection."""
    with _JOINING:
        if ray.is_initialized():
            return False
        address = config.cluster.address
        _probe(address)
        try:
            _on_a_lasting_thread(
                lambda: ray.init(
                    address=address,
                    namespace=config.cluster.namespace,
                    logging_level=logging.WARNING,
                    log_to_driver=False,
                )
            )
        except Exception as exc:
            with contextlib.suppress(Exception):
                ray.shutdown()  # what a failed start began (a local Ray's processes) ends with it
            raise SystemStoppedError(f"cannot join the Ray cluster at {address!r}: {one_line(exc)}") from exc
        return True


def _on_a_lasting_thread(call: Callable[[], Any]) -> Any:
    """``call()`` on the main thread, or on a daemon thread kept for it until the process ends
    (never on a thread that may end first: see the module's docstring)."""
    global _KEEPER
    if threading.current_thread() is threading.main_thread():
        return call()
    done: Future[Any] = Future()
    with _KEEPER_LOCK:
        if _KEEPER is None:
            _KEEPER = queue.SimpleQueue()
            threading.Thread(target=_keep, args=(_KEEPER,), name="memstrata-ray-init", daemon=True).start()
        _KEEPER.put((call, done))
    return done.result()


def _keep(jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]]) -> None:
    while True:
        call, done = jobs.get()
        try:
            done.set_result(call())
        except BaseException as exc:
            done.set_exception(exc)


def _probe(address: str) -> None:
    """A head that does not answer is a clear error at once (Ray itself retries for minutes)."""
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_PROBE_S):
            pass
    except OSError as exc:
        raise SystemStoppedError(
            f"cannot join the Ray cluster at {address!r}: nothing answers at {host}:{port} "
            f"within {_PROBE_S:g} s ({exc})"
        ) from exc


@contextlib.contextmanager
def joined(config: Config) -> Iterator[None]:
    """This process connected to the configured cluster for the block; a connection it made
    is closed after it (one it had before is kept)."""
    made = connect(config)
    try:
        yield
    finally:
        if made:
            ray.shutdown()


def carried(exc: BaseException) -> BaseException | None:
    """The memstrata error (or ``ValueError``) a Ray error carries from the remote side, if any."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, MemstrataError | ValueError):
        return cause
    return None


def one_line(exc: BaseException) -> str:
    """``exc`` as one line without colour codes: the error a Ray error carries (its type and
    message), else Ray's first line and, when it has more, its last (where Ray puts the reason)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and cause is not exc:
        exc = cause
    lines = [line.strip() for line in _ANSI.sub("", str(exc)).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return f"{type(exc).__name__}: {text}"
