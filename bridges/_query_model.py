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
returns ``None`` and the command loads the model on a thread of its own. It is a grandchild of
the command, so nobody waits to reap it; it holds none of the command's standard streams (a
caller reading the command's output to its end is not kept waiting), it ends when the command
closes its pipe, and an alarm ends it after :data:`LIFETIME_S` whatever it is doing.

Frames on both pipes are a 4-byte little-endian length and that many bytes. The helper's first
frame says whether the model loaded (``=`` and the helper's process id) or why not (``!`` and a
message); then each text the command sends is answered by ``=`` and its vector (little-endian
float32) or ``!`` and why not.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import IO, Any

from memstrata.core.errors import EmbedderUnavailableError, ModelFaultError
from memstrata.storage._embedder_identity import ModelIdentity
from memstrata.storage._model_id import DEFAULT_DIM, DEFAULT_MODEL_ID

__all__ = ["LIFETIME_S", "QueryModel", "blas_threads_set", "start", "start_early", "take_early", "wanted"]

LIFETIME_S = 60  # the helper's longest life: a load that hangs ends with it
_BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
_LOADED_BEFORE = ("numpy", "onnxruntime", "tokenizers")
_OK, _FAILED = b"=", b"!"


def blas_threads_set() -> bool:
    """Whether the environment already says how many threads OpenBLAS starts with."""
    return any(name in os.environ for name in _BLAS_THREADS)


# the root command's options that take a value (kept equal to the command line's by a test)
_ROOT_VALUE_OPTIONS = ("--config", "--data-dir")
_early: QueryModel | None = None  # forked by the console script, for the command to take


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
    try:
        child = os.fork()
    except OSError:  # no process to spare: the command loads the model itself
        for fd in (requests_read, requests_write, replies_read, replies_write):
            os.close(fd)
        return None
    if child == 0:  # the intermediate child: forks the helper and ends, so nobody has to reap it
        code = 1
        try:
            os.close(requests_write)
            os.close(replies_read)
            if os.fork() == 0:
                _serve(requests_read, replies_write)
            code = 0
        finally:
            os._exit(code)
    os.close(requests_read)
    os.close(replies_write)
    with contextlib.suppress(ChildProcessError):  # reaped already: SIGCHLD ignored by the starter
        os.waitpid(child, 0)
    return QueryModel(os.fdopen(requests_write, "wb"), os.fdopen(replies_read, "rb"))


class QueryModel(ModelIdentity):
    """The command's end of the helper: an :class:`~memstrata.storage.Embedder` of the default
    model whose vectors the helper computes. :meth:`load` waits for the helper's load; one reply
    is awaited at a time (the command embeds one query text)."""

    _model_id, _dim = DEFAULT_MODEL_ID, DEFAULT_DIM

    def __init__(self, requests: IO[bytes], replies: IO[bytes]) -> None:
        self._requests, self._replies = requests, replies
        self._awaiting = threading.Lock()  # held while a reply is awaited
        self._closed = False
        self.pid: int | None = None  # the helper's, once it has loaded the model

    def load(self) -> QueryModel:
        """This embedder once the helper has loaded the model; :class:`EmbedderUnavailableError`
        with the helper's reason if it could not."""
        with self._awaiting:
            reply = self._reply("load the model")
        if reply[:1] != _OK:
            raise EmbedderUnavailableError(reply[1:].decode("utf-8", "replace"))
        self.pid = int(reply[1:])
        return self

    def embed_query(self, text: str) -> Any:
        import numpy as np

        with self._awaiting:
            try:
                _send(self._requests, text.encode("utf-8", "surrogatepass"))
            except (OSError, ValueError) as exc:  # ValueError: closed by the command meanwhile
                raise ModelFaultError(f"the model's helper process is gone: {exc}") from exc
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
        """Never waits: the helper ends once it reads the end of its requests (after its load, if
        that is still under way), and a reply still awaited by another thread (a late vector the
        command no longer waits for) closes the replies' pipe when it comes."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._requests.close()
        if self._awaiting.acquire(blocking=False):
            try:
                self._close_replies()
            finally:
                self._awaiting.release()

    def _close_replies(self) -> None:
        with contextlib.suppress(OSError):
            self._replies.close()


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


def _serve(requests_fd: int, replies_fd: int) -> None:
    """The helper's whole life: load the model, answer each text, end (never returns)."""
    try:
        import fcntl
        import signal

        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # ends the process, even if its starter ignored it
        signal.alarm(LIFETIME_S)
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
        _send(replies, _OK + str(os.getpid()).encode())
        while (text := _receive(requests)) is not None:
            try:
                vector = model.embed_query(text.decode("utf-8", "surrogatepass"))
                answer = _OK + vector.astype("<f4", copy=False).tobytes()
            except Exception as exc:
                answer = _reason(exc)
            _send(replies, answer)
    finally:
        os._exit(0)
