"""The default model of ``memstrata query`` loaded in a helper process, on the second core.

In one process the model's load (numpy, ONNX Runtime and tokenizer imports, the tokenizer file)
holds the interpreter lock for all but its session build, so it and the command's own work (its
config, the layers' imports, the stores' opening) took turns on one core. Forked by the
console script before the command line is imported (:func:`start_early`, when the arguments
name the query command), or else when the command starts, the helper loads the packaged default
model while the command imports, reads its config and opens its stores, and embeds the query
texts the command sends it: the same model, the same runtime settings, the same vector as a load
in the command's process.

The helper is forked only where that is safe: Linux, one thread, and neither numpy nor ONNX
Runtime loaded yet (their thread pools would not survive a fork); elsewhere :func:`start`
returns ``None`` and the command loads the model on a thread of its own. It holds none of the
command's standard streams (a caller reading the command's output to its end is not kept
waiting), it ends when the command closes its pipe, and an alarm ends it after
:data:`LIFETIME_S` whatever it is doing. It is the command's child and the command reaps it
before it exits (:meth:`QueryModel.reap`, :func:`reap_all`), also when a ``SIGTERM`` ends it:
an orphan would go to the first process of its PID namespace, and in a container whose first
process reaps no orphans (a program started without an init) each query would leave one
behind for good. A helper still loading when it is closed is stopped (``SIGTERM``: its load
unwinds, a model rewrite under way removes its temporary folder), so the command never waits
for a load.

Frames on both pipes are a 4-byte little-endian length and that many bytes. The helper's first
frame says whether the model loaded (``=``) or why not (``!`` and a message); then each text
the command sends is answered by ``=`` and its vector (little-endian float32) or ``!`` and why
not.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import signal
import sys
import threading
from collections.abc import Sequence
from typing import IO, Any

from memstrata.core.errors import EmbedderUnavailableError, ModelFaultError
from memstrata.storage._embedder_identity import ModelIdentity
from memstrata.storage._model_id import DEFAULT_DIM, DEFAULT_MODEL_ID

__all__ = [
    "LIFETIME_S",
    "QueryModel",
    "blas_threads_set",
    "reap_all",
    "start",
    "start_early",
    "take_early",
    "wanted",
]

LIFETIME_S = 60  # the helper's longest life: a load that hangs ends with it
_STOP_S = 2.0  # how long the command waits for its helper's end at its own end, then kills it
_BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
_LOADED_BEFORE = ("numpy", "onnxruntime", "tokenizers")
_OK, _FAILED = b"=", b"!"


def blas_threads_set() -> bool:
    """Whether the environment already says how many threads OpenBLAS starts with."""
    return any(name in os.environ for name in _BLAS_THREADS)


# the root command's options that take a value (kept equal to the command line's by a test)
_ROOT_VALUE_OPTIONS = ("--config", "--data-dir")
_early: QueryModel | None = None  # forked by the console script, for the command to take
_unreaped: list[QueryModel] = []  # every helper forked and not yet reaped


def wanted(argv: Sequence[str]) -> bool:
    """Whether the command-line arguments ``argv`` name the query command with a model to load
    (not ``--mode keyword``, not a request for help or the version). A guess made before the
    command line is parsed: a wrong yes costs a helper that ends unused when the process ends, a
    wrong no the helper the command forks itself."""
    args = list(argv)
    if any(arg in ("-h", "--help", "--version") for arg in args):
        return False
    at = 0
    while at < len(args) and args[at].startswith("-"):
        at += 2 if args[at] in _ROOT_VALUE_OPTIONS else 1
    if args[at : at + 1] != ["query"]:
        return False
    rest = args[at + 1 :]
    return not any(
        arg == "--mode=keyword" or (arg == "--mode" and rest[n + 1 : n + 2] == ["keyword"])
        for n, arg in enumerate(rest)
    )


def start_early(argv: Sequence[str]) -> None:
    """Fork the helper now if ``argv`` names the query command (:func:`wanted`), for the command
    to take (:func:`take_early`): called by the console script before it imports the command
    line, so that the model's load starts ~50 ms earlier, from a smaller process."""
    global _early
    if _early is None and wanted(argv):
        _early = start()


def take_early() -> QueryModel | None:
    """The helper :func:`start_early` forked, handed over once (``None``: none was)."""
    global _early
    helper, _early = _early, None
    return helper


def start() -> QueryModel | None:
    """A helper loading the default model, or ``None`` where forking one is not safe."""
    safe = (
        sys.platform.startswith("linux")
        and threading.active_count() == 1
        and not any(name in sys.modules for name in _LOADED_BEFORE)
    )
    if not safe:
        return None
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    # a stop sent before the helper can handle it waits for it (and then unwinds its load)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        child = os.fork()
    except OSError:  # no process to spare: the command loads the model itself
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for fd in (requests_read, requests_write, replies_read, replies_write):
            os.close(fd)
        return None
    if child == 0:
        try:
            os.close(requests_write)
            os.close(replies_read)
            _serve(requests_read, replies_write)
        finally:
            os._exit(1)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:  # ended by it, the command still reaps
        signal.signal(signal.SIGTERM, _terminated)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.close(requests_read)
    os.close(replies_write)
    helper = QueryModel(os.fdopen(requests_write, "wb"), os.fdopen(replies_read, "rb"), child)
    _unreaped.append(helper)
    return helper


@atexit.register
def reap_all() -> None:
    """:meth:`QueryModel.reap` every helper not reaped yet: when the interpreter exits, and
    before a command ends its process without the interpreter's teardown."""
    while _unreaped:
        _unreaped[-1].reap()


class QueryModel(ModelIdentity):
    """The command's end of the helper: an :class:`~memstrata.storage.Embedder` of the default
    model whose vectors the helper computes. :meth:`load` waits for the helper's load; one reply
    is awaited at a time (the command embeds one query text)."""

    _model_id, _dim = DEFAULT_MODEL_ID, DEFAULT_DIM

    def __init__(self, requests: IO[bytes], replies: IO[bytes], pid: int) -> None:
        self._requests, self._replies = requests, replies
        self._awaiting = threading.Lock()  # held while a reply is awaited
        self._closed = self._answered = self._reaped = False
        self._last: str | None = None  # the last text to embed (:meth:`last`)
        self.pid = pid  # the helper's process
        try:  # signalled and awaited through it: never another process that got the number
            self._pidfd: int | None = os.pidfd_open(pid)
        except OSError:  # ended and reaped already (SIGCHLD ignored), or a kernel without pidfds
            self._pidfd = None

    def load(self) -> QueryModel:
        """This embedder once the helper has loaded the model; :class:`EmbedderUnavailableError`
        with the helper's reason if it could not."""
        with self._awaiting:
            reply = self._reply("load the model")
            self._answered = True
        if reply[:1] != _OK:
            raise EmbedderUnavailableError(reply[1:].decode("utf-8", "replace"))
        return self

    def last(self, text: str) -> None:
        """Say that ``text`` is the last text to embed: the requests' pipe is closed as soon as it
        is sent, so that the helper ends (and its memory is freed) while the command still
        searches, and :meth:`reap` at the command's end seldom waits."""
        self._last = text

    def embed_query(self, text: str) -> Any:
        import numpy as np

        with self._awaiting:
            try:
                _send(self._requests, text.encode("utf-8", "surrogatepass"))
            except (OSError, ValueError) as exc:  # ValueError: closed by the command meanwhile
                raise ModelFaultError(f"the model's helper process is gone: {exc}") from exc
            if text == self._last:
                with contextlib.suppress(OSError):
                    self._requests.close()
            reply = self._reply("embed a query")
        if reply[:1] != _OK:
            raise ModelFaultError(reply[1:].decode("utf-8", "replace"))
        return np.frombuffer(reply[1:], dtype="<f4").copy()

    def embed_documents(self, texts: Sequence[str]) -> Any:
        """The default model runs each text alone: a document's vector is its query vector."""
        import numpy as np

        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        return np.stack([self.embed_query(text) for text in texts])

    def _reply(self, doing: str) -> bytes:
        """The next reply (the caller holds ``_awaiting``): a request sent before :meth:`close`
        is still answered, since the helper reads its requests in order before their end."""
        try:
            reply = _receive(self._replies)
        except (OSError, ValueError):  # ValueError: the pipe was closed before this call
            reply = None
        finally:
            if self._closed:  # closed while this reply was awaited: the pipe is this thread's to close
                self._close_replies()
        if reply is None:
            raise ModelFaultError(f"the model's helper process ended before it could {doing}")
        return reply

    def close(self) -> None:
        """Never waits: the helper ends once it reads the end of its requests, or at once if it is
        still loading the model or computing a vector nobody waits for any more (a reply awaited
        by another thread, after the command's bound: that thread then closes the replies' pipe).
        :meth:`reap` waits for its end, at the latest when the interpreter exits."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._requests.close()
        idle = self._awaiting.acquire(blocking=False)
        if idle:
            try:
                self._close_replies()
            finally:
                self._awaiting.release()
        if not (idle and self._answered):
            self._signal(signal.SIGTERM)

    def reap(self) -> None:
        """Close, wait for the helper's end (killed after :data:`_STOP_S`) and reap it, once.
        Left to :func:`reap_all` by the command, after its output: by then the helper, closed
        when the search ended, has usually ended too."""
        if self._reaped:
            return
        self._reaped = True
        with contextlib.suppress(ValueError):
            _unreaped.remove(self)
        if not self._closed:
            self.close()
        if self._pidfd is not None:
            try:
                if not _ended(self._pidfd, _STOP_S):
                    self._signal(signal.SIGKILL)
                    _ended(self._pidfd, _STOP_S)
            finally:
                os.close(self._pidfd)
                self._pidfd = None
        with contextlib.suppress(ChildProcessError):  # reaped already: SIGCHLD ignored by the starter
            os.waitpid(self.pid, os.WNOHANG)
        _restore_sigterm()

    def _signal(self, number: int) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(OSError):  # ended already
                signal.pidfd_send_signal(self._pidfd, number)

    def _close_replies(self) -> None:
        with contextlib.suppress(OSError):
            self._replies.close()


def _ended(pidfd: int, seconds: float) -> bool:
    """Whether the process of ``pidfd`` ends within ``seconds`` (``poll``: any descriptor number)."""
    waiting = select.poll()
    waiting.register(pidfd, select.POLLIN)
    return bool(waiting.poll(seconds * 1000))


def _send(pipe: IO[bytes], payload: bytes) -> None:
    pipe.write(len(payload).to_bytes(4, "little") + payload)
    pipe.flush()


def _receive(pipe: IO[bytes]) -> bytes | None:
    head = pipe.read(4)
    if len(head) < 4:
        return None
    payload = pipe.read(int.from_bytes(head, "little"))
    return payload if len(payload) == int.from_bytes(head, "little") else None


def _reason(exc: BaseException) -> bytes:
    return _FAILED + f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")


def _restore_sigterm() -> None:
    """``SIGTERM`` back to its default once no helper is left to reap, if the handler is still
    :func:`_terminated` (a program running the command line in its own process keeps none of
    the command's handlers)."""
    if (
        not _unreaped
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is _terminated
    ):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _terminated(number: int, frame: Any) -> None:
    """The command's ``SIGTERM`` once it has a helper (a ``timeout``, a container stopped): it
    ends with the status a shell gives that signal (143), through the interpreter's exit, which
    reaps the helper (:func:`reap_all`)."""
    raise SystemExit(128 + number)


def _stopped(number: int, frame: Any) -> None:
    """The helper's ``SIGTERM``: the work under way unwinds (a model rewrite removes its
    temporary folder) and the process ends."""
    raise SystemExit(0)


def _serve(requests_fd: int, replies_fd: int) -> None:
    """The helper's whole life: load the model, answer each text, end (never returns)."""
    try:
        import fcntl

        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # ends the process, even if its starter ignored it
        signal.alarm(LIFETIME_S)
        signal.signal(signal.SIGTERM, _stopped)  # stopped by the command: the load unwinds
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # blocked since the fork
        # a command started with a standard stream closed got that number for a pipe: moved away
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3) for fd in (requests_fd, replies_fd)]
        for fd in (requests_fd, replies_fd):
            os.close(fd)
        requests_fd, replies_fd = moved
        quiet = os.open(os.devnull, os.O_RDWR)
        for stream in (0, 1, 2):
            os.dup2(quiet, stream)
        if not blas_threads_set():  # as the command's own process would load numpy (_cli_query)
            os.environ["OPENBLAS_NUM_THREADS"] = "1"
        requests, replies = os.fdopen(requests_fd, "rb"), os.fdopen(replies_fd, "wb")
        try:
            from memstrata.storage import default_embedder

            model = default_embedder()
        except Exception as exc:
            _send(replies, _reason(exc))
            return
        _send(replies, _OK)
        while (text := _receive(requests)) is not None:
            try:
                vector = model.embed_query(text.decode("utf-8", "surrogatepass"))
                answer = _OK + vector.astype("<f4", copy=False).tobytes()
            except Exception as exc:
                answer = _reason(exc)
            _send(replies, answer)
    finally:
        os._exit(0)
