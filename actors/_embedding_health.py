"""Whether the embedding model answers: timed model calls, stuck and faulty states, bounded waits.

A caller waits at most ``call_timeout_s`` (per ``batch_size`` texts), or less inside an
:func:`~memstrata.storage._embedding.embed_deadline` block. A call that runs longer makes the model
*stuck*: until it returns, new requests that would queue behind it fail at once with
:class:`ModelFaultError`. Apart from the batching of :mod:`._embedding`, which builds on it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from memstrata.core.errors import EmbeddingError, MemstrataError, ModelFaultError
from memstrata.storage import FloatArray
from memstrata.storage._embedding import embed_time_left

__all__ = ["ModelHealth"]


@dataclass(slots=True)
class _Call:
    """A model call in progress: what and since when (monotonic for ages, wall clock for people)."""

    kind: str  # "documents" | "query"
    texts: int
    started: float
    started_at: float
    bound: float  # how long it may run before it counts as stuck
    abandoned: bool = False  # a caller stopped waiting for it: stuck until it returns


_SPENT = "its caller's bound was used up before it asked"


class ModelHealth:
    """The model calls of :class:`~._embedding.BatchingEmbedder` (its base): timing, faults, waits."""

    batch_size: int
    call_timeout_s: float
    _model_id: str
    _thread_safe: bool
    _model_lock: threading.Lock
    _lock: threading.Lock
    _counts: dict[str, Any]
    _closed: bool
    _calls: dict[int, _Call]  # running model calls, by a counter
    _call_ids: int
    _last_fault: tuple[float, str] | None  # (wall time, error) since the last success

    def _model_call(self, call: Any, texts: int, kind: str = "documents") -> Any:
        """Run one call of the model, timed and counted (under the model lock unless thread-safe)."""
        lock = contextlib.nullcontext() if self._thread_safe else self._model_lock
        with self._lock:
            self._call_ids += 1
            ident = self._call_ids
            bound = self._bound(texts)
            self._calls[ident] = _Call(kind, texts, time.monotonic(), time.time(), bound)
        try:
            with lock:
                started = time.perf_counter()
                try:
                    return call()
                finally:
                    elapsed = time.perf_counter() - started
                    with self._lock:
                        counts = self._counts
                        counts["model_calls"] += 1
                        counts["texts_embedded"] += texts
                        counts["model_seconds"] += elapsed
        finally:
            with self._lock:
                self._calls.pop(ident, None)

    def _stuck_call(self, kind: str) -> _Call | None:
        """The oldest call running longer than ``call_timeout_s`` that a new ``kind`` request
        would wait behind (its own worker's, or any with a model that is not thread-safe); lock held."""
        now = time.monotonic()
        stuck = [
            c
            for c in self._calls.values()
            if (c.abandoned or now - c.started >= c.bound) and (c.kind == kind or not self._thread_safe)
        ]
        return min(stuck, key=lambda c: c.started) if stuck else None

    def _stuck_text(self, call: _Call) -> str:
        return (
            f"model {self._model_id!r} is stuck since {_stamp(call.started_at)} on a call of "
            f"{call.texts} text(s) (no answer for {time.monotonic() - call.started:.1f} s)"
        )

    def model_status(self) -> dict[str, Any]:
        """``state``: ``"ok"``; ``"stuck"`` (a call has run longer than ``call_timeout_s``:
        ``since``, ``texts``); or ``"faulty"`` (its last call failed or returned unusable
        vectors: ``since``, ``last_error``); ``"closed"`` once stopped."""
        with self._lock:
            status: dict[str, Any] = {"model": self._model_id, "state": "ok"}
            if self._closed:
                status["state"] = "closed"
                return status
            now = time.monotonic()
            running = [c for c in self._calls.values() if c.abandoned or now - c.started >= c.bound]
            if running:
                oldest = min(running, key=lambda c: c.started)
                status.update(
                    state="stuck",
                    since=_stamp(oldest.started_at),
                    texts=oldest.texts,
                    reason=self._stuck_text(oldest),
                )
            elif self._last_fault is not None:
                status.update(
                    state="faulty", since=_stamp(self._last_fault[0]), last_error=self._last_fault[1]
                )
            return status

    def _record(self, error: BaseException | None) -> None:
        """The outcome of a model call: a fault is kept until the next success."""
        with self._lock:
            if error is None:
                self._last_fault = None
            elif self._last_fault is None:
                self._last_fault = (time.time(), f"{type(error).__name__}: {error}")
            else:
                self._last_fault = (self._last_fault[0], f"{type(error).__name__}: {error}")

    def _bound(self, texts: int) -> float:
        """``call_timeout_s`` per ``batch_size`` texts: a large request (a file sync) may take
        longer than a store's few texts before it counts as stuck."""
        return self.call_timeout_s * max(1.0, texts / self.batch_size)

    def _wait(self, future: Future[FloatArray], kind: str, texts: int = 1) -> FloatArray:
        """The answer, within ``call_timeout_s`` (per ``batch_size`` texts) or the caller's shorter
        deadline. A caller that gives up marks the call it waited behind as stuck, so the next
        ones do not wait too."""
        limit = self._bound(texts)
        left = embed_time_left()
        if left is not None and left < limit:
            limit = left
        try:
            return future.result(timeout=limit)
        except FutureTimeout as exc:
            self._give_up(kind)
            waited = round(limit, 2)
            if waited <= 0:  # the caller's bound went to what it waited for first (a search: new vectors)
                raise ModelFaultError(f"model {self._model_id!r} got no time to answer: {_SPENT}") from exc
            raise ModelFaultError(f"model {self._model_id!r} did not answer within {waited:g} s") from exc

    def _give_up(self, kind: str) -> None:
        """A caller stopped waiting: the call it waited behind counts as stuck from now on."""
        with self._lock:
            behind = [c for c in self._calls.values() if c.kind == kind or not self._thread_safe]
            if behind:
                min(behind, key=lambda c: c.started).abandoned = True


def _stamp(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def _wrap(exc: BaseException) -> BaseException:
    """A fresh error for one caller (tracebacks are per raise): memstrata errors keep their type,
    anything else becomes :class:`EmbeddingError`."""
    if isinstance(exc, MemstrataError):
        error: BaseException = type(exc)(str(exc))
    else:
        error = EmbeddingError(f"embedding failed: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


def _fail(future: Future[Any], exc: BaseException) -> None:
    with contextlib.suppress(Exception):
        future.set_exception(_wrap(exc))
