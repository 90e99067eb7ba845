"""The shared embedding service: one model per process, many actors, few model calls.

Every store actor embeds through one :class:`BatchingEmbedder`, which implements the ``Embedder``
protocol. Document requests arriving from different threads within ``max_batch_wait_ms`` of the
first one (or until ``batch_size`` texts are waiting) are coalesced into a single model call, and
each caller gets its own rows back through a future. A text is computed once however many callers
want it: recent vectors are kept in a small in-process cache, and a text already on its way to
the model is waited for rather than embedded again (a task summary that becomes both a knowledge
entry and an episode costs one model call even when both stores ask at the same moment).

Queries have their own thread and are never queued behind a document batch: with a thread-safe
model (``inner.thread_safe``, true for fastembed's ONNX sessions) a query is computed while a
batch is; otherwise one lock serialises the model's calls. The same query asked again while in
flight, or shortly after, is shared. Every caller waits at most ``call_timeout_s``.

A failure reaches every caller whose texts were in the failing call; a coalesced batch that fails
is retried request by request, so one poisoned text cannot fail its neighbours.

Store actors do not wait at all: :meth:`BatchingEmbedder.submit_documents` returns a future at
once (the same cache, in-flight sharing and batches), and a watchdog (:mod:`._embedding_watchdog`)
fails the futures still waiting once a call outlives its bound (the model is stuck).

Model faults: a caller waits at most ``call_timeout_s``, or less inside an
:func:`~memstrata.storage._embedding.embed_deadline` block (a search's own deadline). A call that
runs longer than ``call_timeout_s`` makes the model *stuck*: until it returns, new requests that
would queue behind it fail at once with :class:`ModelFaultError` instead of waiting (a store
keeps the text with its vector pending, a search ranks by keywords). Vectors that are all zero,
NaN or of the wrong shape are a :class:`ModelFaultError` too and are never cached, so the same
text is computed again once the model works. :meth:`BatchingEmbedder.model_status` says which.
The timing of model calls and these states are in :mod:`._embedding_health`.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memstrata.core.errors import EmbeddingError, ModelFaultError
from memstrata.storage import Embedder, FloatArray, text_hash
from memstrata.storage._embedder_identity import ModelIdentity
from memstrata.storage._embedding import check_model_rows

from ._embedding_health import _Call, _fail
from ._embedding_watchdog import FutureWatchdog

__all__ = ["BatchingEmbedder", "EmbeddingStats"]


@dataclass(slots=True)
class _DocRequest:
    texts: list[str]
    hashes: list[bytes]
    future: Future[FloatArray] = field(default_factory=Future)


@dataclass(frozen=True, slots=True)
class EmbeddingStats:
    """What the service did: model calls versus requests and texts it was asked for.

    ``cache_hits`` counts texts and queries answered from the cache, ``shared_in_flight`` texts
    that another caller had already sent to the model; ``model_seconds`` is the time spent inside
    the model (compare it with the wall time to see whether the model is the bottleneck).
    """

    model_calls: int
    texts_embedded: int
    document_requests: int
    query_requests: int
    texts_requested: int
    cache_hits: int
    shared_in_flight: int
    largest_batch: int
    model_seconds: float

    def as_dict(self) -> dict[str, int | float]:
        return {name: getattr(self, name) for name in self.__slots__}


_COUNTS = ("model_calls", "texts_embedded", "document_requests", "query_requests", "texts_requested")


class BatchingEmbedder(ModelIdentity, FutureWatchdog):
    """An ``Embedder`` that coalesces concurrent requests into batched calls of ``inner``."""

    def __init__(
        self,
        inner: Embedder,
        *,
        batch_size: int = 64,
        max_batch_wait_ms: float = 2.0,
        cache_size: int = 4096,
        query_cache_size: int = 256,
        call_timeout_s: float = 120.0,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.inner = inner
        self.batch_size = batch_size
        self.max_wait_s = max(0.0, max_batch_wait_ms) / 1000.0
        self.call_timeout_s = call_timeout_s
        self._model_id = inner.model_id
        self._dim = inner.dim
        self._thread_safe = bool(getattr(inner, "thread_safe", False))
        self._model_lock = threading.Lock()  # taken around every model call unless thread-safe
        self._queue: queue.SimpleQueue[_DocRequest | None] = queue.SimpleQueue()
        self._cache: OrderedDict[bytes, FloatArray] = OrderedDict()
        self._cache_size = max(0, cache_size)
        self._inflight: dict[bytes, tuple[_DocRequest, int]] = {}
        self._query_cache: OrderedDict[str, FloatArray] = OrderedDict()
        self._query_cache_size = max(0, query_cache_size)
        self._pending_queries: dict[str, Future[FloatArray]] = {}
        self._query_queue: queue.SimpleQueue[tuple[str, Future[FloatArray]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._counts: dict[str, Any] = dict.fromkeys(EmbeddingStats.__slots__, 0)
        self._counts["model_seconds"] = 0.0
        self._closed = False
        self._calls: dict[int, _Call] = {}  # running model calls, by a counter
        self._call_ids = 0
        self._last_fault: tuple[float, str] | None = None  # (wall time, error) since the last success
        # submit_documents' futures by due time: a watchdog fails those a stuck model leaves unanswered
        self._watched: list[tuple[float, int, Future[FloatArray]]] = []
        self._watch_seq = itertools.count()
        self._watch_cond = threading.Condition()
        self._watch_thread: threading.Thread | None = None
        self._watch_stop = False
        self._thread = threading.Thread(target=self._run, name="memstrata-embedder", daemon=True)
        self._thread.start()
        self._query_thread = threading.Thread(
            target=self._run_queries, name="memstrata-embedder-queries", daemon=True
        )
        self._query_thread.start()

    # -- the Embedder protocol -----------------------------------------------------------------

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        hashes, rows, waits = self._lookup(texts)
        answers: dict[int, FloatArray] = {}
        for request, _ in waits.values():
            if id(request) not in answers:
                answers[id(request)] = self._wait(request.future, "documents", len(texts))
        for h, (request, i) in waits.items():
            rows[h] = answers[id(request)][i]
        return np.stack([rows[h] for h in hashes]).astype(np.float32, copy=False)

    def submit_documents(self, texts: Sequence[str]) -> Future[FloatArray]:
        """Vectors of ``texts`` without waiting: a future, answered from the cache, from a call
        already on its way, or by the next batch (shared with :meth:`embed_documents`).

        A closed service or a stuck model gives a failed future at once; a future still
        unanswered when a call runs longer than ``call_timeout_s`` (per ``batch_size`` texts)
        fails with :class:`ModelFaultError` (the model is stuck); a backlog is waited for.
        Texts are made valid UTF-8 as :func:`~memstrata.storage.embed_documents` does, so both
        share cached vectors.
        """
        outer: Future[FloatArray] = Future()
        safe = [t.encode("utf-8", "replace").decode("utf-8") for t in texts]
        if not safe:
            outer.set_result(np.zeros((0, self._dim), dtype=np.float32))
            return outer
        try:
            hashes, rows, waits = self._lookup(safe)
        except BaseException as exc:
            _fail(outer, exc)
            return outer
        requests = list({id(r): r for r, _ in waits.values()}.values())
        if not requests:
            outer.set_result(np.stack([rows[h] for h in hashes]).astype(np.float32, copy=False))
            return outer
        left = [len(requests)]
        guard = threading.Lock()

        def answered(done: Future[FloatArray]) -> None:
            error = done.exception()
            if error is not None:
                _fail(outer, error)
                return
            with guard:
                left[0] -= 1
                if left[0]:
                    return
            got = dict(rows)
            for h, (request, i) in waits.items():
                got[h] = request.future.result()[i]
            with contextlib.suppress(Exception):
                outer.set_result(np.stack([got[h] for h in hashes]).astype(np.float32, copy=False))

        self._watch(outer, len(safe))
        for request in requests:
            request.future.add_done_callback(answered)
        return outer

    def _lookup(
        self, texts: list[str]
    ) -> tuple[list[bytes], dict[bytes, FloatArray], dict[bytes, tuple[_DocRequest, int]]]:
        """Each distinct text's vector from the cache, or the request computing it (queued now
        unless already in flight); raises when the service is closed or the model is stuck."""
        hashes = [text_hash(t) for t in texts]
        rows: dict[bytes, FloatArray] = {}
        waits: dict[bytes, tuple[_DocRequest, int]] = {}
        new_texts: list[str] = []
        new_hashes: list[bytes] = []
        with self._lock:
            if self._closed:
                raise EmbeddingError("the embedding service is closed")
            stuck = self._stuck_call("documents")
            counts = self._counts
            counts["document_requests"] += 1
            counts["texts_requested"] += len(texts)
            for h, t in zip(hashes, texts, strict=True):
                if h in rows or h in waits:
                    continue
                cached = self._cache.get(h)
                if cached is not None:
                    self._cache.move_to_end(h)
                    rows[h] = cached
                    counts["cache_hits"] += 1
                    continue
                pending = self._inflight.get(h)
                if pending is not None:
                    waits[h] = pending
                    counts["shared_in_flight"] += 1
                    continue
                new_texts.append(t)
                new_hashes.append(h)
            if stuck is not None and (new_texts or waits):  # it would wait for a call that does not return
                raise ModelFaultError(self._stuck_text(stuck))
            if new_texts:
                request = _DocRequest(new_texts, new_hashes)
                for i, h in enumerate(new_hashes):
                    self._inflight[h] = waits[h] = (request, i)
                self._queue.put(request)
        return hashes, rows, waits

    def embed_query(self, text: str) -> FloatArray:
        """One query vector (an agent's store, the shared store and its episodes are searched
        with the same query at once: they share one computation)."""
        with self._lock:
            if self._closed:
                raise EmbeddingError("the embedding service is closed")
            self._counts["query_requests"] += 1
            cached = self._query_cache.get(text)
            if cached is not None:
                self._query_cache.move_to_end(text)
                self._counts["cache_hits"] += 1
                return cached.copy()
            stuck = self._stuck_call("query")
            if stuck is not None:
                raise ModelFaultError(self._stuck_text(stuck))
            future = self._start_query(text)
        return self._wait(future, "query").copy()

    def prefetch_query(self, text: str) -> None:
        """Start computing ``text``'s query vector and return at once: a retrieval starts it
        before its keyword searches, and the stores' ``embed_query`` then wait for it."""
        with self._lock:
            if not self._closed and text not in self._query_cache and self._stuck_call("query") is None:
                self._start_query(text)

    def _start_query(self, text: str) -> Future[FloatArray]:
        """The future of ``text``'s query vector, queued now unless already on its way (lock held)."""
        future = self._pending_queries.get(text)
        if future is None:
            future = self._pending_queries[text] = Future()
            self._query_queue.put((text, future))
        return future

    def count_tokens(self, text: str) -> int:
        counter = getattr(self.inner, "count_tokens", None)
        return int(counter(text)) if callable(counter) else max(1, len(text) // 4)

    # -- the workers ------------------------------------------------------------------------------

    def stats(self) -> EmbeddingStats:
        with self._lock:
            return EmbeddingStats(**self._counts)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the workers, waiting at most ``timeout`` in all (a stuck model call is left to
        its daemon thread); requests still queued fail with :class:`EmbeddingError`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
            self._query_queue.put(None)
        deadline = time.monotonic() + max(0.0, timeout)
        for thread in (self._thread, self._query_thread):
            with contextlib.suppress(RuntimeError):
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        closed = EmbeddingError("the embedding service is closed")
        for item in _drained(self._queue):
            self._forget(item)
            _fail(item.future, closed)
        for _, future in _drained(self._query_queue):
            _fail(future, closed)
        with self._watch_cond:  # a future waiting behind a stuck call is answered too
            self._watch_stop = True
            watched, self._watched = self._watched, []
            self._watch_cond.notify()
        for _, _, future in watched:
            _fail(future, closed)

    def _run_queries(self) -> None:
        """Queries have a thread of their own: never queued behind a document batch, and with a
        thread-safe model computed while a batch is."""
        for text, future in iter(self._query_queue.get, None):  # None: the service stops
            try:
                raw = self._model_call(functools.partial(self.inner.embed_query, text), 1, "query")
                vector = check_model_rows(self._model_id, self._dim, np.asarray(raw).reshape(1, -1), 1)[0]
            except BaseException as exc:
                self._record(exc)
                with self._lock:
                    self._pending_queries.pop(text, None)
                _fail(future, exc)
                continue
            self._record(None)
            with self._lock:
                self._pending_queries.pop(text, None)
                if self._query_cache_size:
                    self._query_cache[text] = vector
                    while len(self._query_cache) > self._query_cache_size:
                        self._query_cache.popitem(last=False)
            with contextlib.suppress(Exception):
                future.set_result(vector)

    def _run(self) -> None:
        for item in iter(self._queue.get, None):  # None: the service stops
            batch = [item]
            size = len(item.texts)
            deadline = time.monotonic() + self.max_wait_s
            stop = False
            while size < self.batch_size:
                remaining = deadline - time.monotonic()
                try:
                    extra = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if extra is None:
                    stop = True
                    break
                batch.append(extra)
                size += len(extra.texts)
            self._answer_documents(batch)
            if stop:
                return

    def _forget(self, request: _DocRequest) -> None:
        """Drop ``request``'s texts from the in-flight map (it is answered or failed)."""
        with self._lock:
            for h in request.hashes:
                if self._inflight.get(h, (None,))[0] is request:
                    del self._inflight[h]

    def _answer_documents(self, batch: list[_DocRequest]) -> None:
        texts = [t for request in batch for t in request.texts]  # distinct: see embed_documents
        try:
            vectors = self._call(texts)
        except BaseException as exc:
            if len(batch) > 1:  # retry one by one: only the request that fails should fail
                for request in batch:
                    self._answer_documents([request])
                return
            self._forget(batch[0])
            _fail(batch[0].future, exc)
            return
        start = 0
        answers = []
        with self._lock:
            for request in batch:
                rows = vectors[start : start + len(request.texts)]
                start += len(request.texts)
                answers.append((request, rows))
                if self._cache_size:
                    for h, row in zip(request.hashes, rows, strict=True):
                        self._cache[h] = row
                for h in request.hashes:
                    if self._inflight.get(h, (None,))[0] is request:
                        del self._inflight[h]
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        for request, rows in answers:
            with contextlib.suppress(Exception):
                request.future.set_result(rows)

    def _call(self, texts: list[str]) -> FloatArray:
        with self._lock:
            self._counts["largest_batch"] = max(self._counts["largest_batch"], len(texts))
        try:
            raw = self._model_call(functools.partial(self.inner.embed_documents, texts), len(texts))
            vectors = check_model_rows(self._model_id, self._dim, raw, len(texts))  # bad rows: never cached
        except BaseException as exc:
            self._record(exc)
            raise
        self._record(None)
        return vectors


def _drained(waiting: queue.SimpleQueue[Any]) -> list[Any]:
    """What is left in ``waiting``, taken out (the ``None`` that stops a worker left aside)."""
    items: list[Any] = []
    while True:
        try:
            item = waiting.get_nowait()
        except queue.Empty:
            return items
        if item is not None:
            items.append(item)
