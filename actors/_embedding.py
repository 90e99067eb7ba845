"""The shared embedding service: one model per process, many actors, few model calls.

Every store actor embeds through one :class:`BatchingEmbedder`, which implements the ``Embedder``
protocol. Document requests arriving from different threads within ``max_batch_wait_ms`` of the
first one (or until ``batch_size`` texts are waiting) are coalesced into a single model call, and
each caller gets its own rows back through a future. Queries are never held back to fill a batch:
the worker serves them before the next document batch. A short in-process cache of recent
document vectors means the same text embedded twice in a row (a task summary that becomes both a
knowledge entry and an episode) costs one model call. A failure reaches every caller whose texts
were in the failing call; a coalesced batch that fails is retried request by request, so one
poisoned text cannot fail its neighbours.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from memstrata.storage import Embedder, text_hash

from memstrata.errors import EmbeddingError, MemstrataError

__all__ = ["BatchingEmbedder", "EmbeddingStats"]

log = logging.getLogger("memstrata.actors")
FloatArray = npt.NDArray[np.float32]


@dataclass(slots=True)
class _DocRequest:
    texts: list[str]
    future: Future[FloatArray] = field(default_factory=Future)


@dataclass(slots=True)
class _QueryRequest:
    text: str
    future: Future[FloatArray] = field(default_factory=Future)


@dataclass(frozen=True, slots=True)
class EmbeddingStats:
    """What the service did: model calls versus requests and texts it was asked for."""

    model_calls: int
    texts_embedded: int
    document_requests: int
    query_requests: int
    texts_requested: int
    cache_hits: int
    largest_batch: int

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class BatchingEmbedder:
    """An ``Embedder`` that coalesces concurrent requests into batched calls of ``inner``."""

    def __init__(
        self,
        inner: Embedder,
        *,
        batch_size: int = 64,
        max_batch_wait_ms: float = 2.0,
        cache_size: int = 4096,
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
        self._queue: queue.SimpleQueue[_DocRequest | _QueryRequest | None] = queue.SimpleQueue()
        self._cache: OrderedDict[bytes, FloatArray] = OrderedDict()
        self._cache_size = cache_size
        self._query_cache: OrderedDict[str, FloatArray] = OrderedDict()
        self._pending_queries: dict[str, _QueryRequest] = {}
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(EmbeddingStats.__slots__, 0)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memstrata-embedder", daemon=True)
        self._thread.start()

    # -- the Embedder protocol -----------------------------------------------------------------

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def dim(self) -> int:
        return self._dim

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        hashes = [text_hash(t) for t in texts]
        with self._lock:
            self._counts["document_requests"] += 1
            self._counts["texts_requested"] += len(texts)
            known = {h: self._cache[h] for h in hashes if h in self._cache}
            self._counts["cache_hits"] += sum(1 for h in hashes if h in known)
        missing: dict[bytes, str] = {}
        for h, t in zip(hashes, texts, strict=True):
            if h not in known:
                missing.setdefault(h, t)
        if missing:
            request = _DocRequest(list(missing.values()))
            vectors = self._submit(request)
            known.update(zip(missing.keys(), vectors, strict=True))
        return np.stack([known[h] for h in hashes]).astype(np.float32, copy=False)

    def embed_query(self, text: str) -> FloatArray:
        """One query vector; the same query asked again while in flight or just after is shared
        (an agent's store and the shared store are searched with the same query)."""
        with self._lock:
            self._counts["query_requests"] += 1
            cached = self._query_cache.get(text)
            if cached is not None:
                self._query_cache.move_to_end(text)
                self._counts["cache_hits"] += 1
                return cached.copy()
            pending = self._pending_queries.get(text)
            if pending is None:
                request = _QueryRequest(text)
                self._pending_queries[text] = request
        if pending is not None:
            return self._wait(pending.future).copy()
        try:
            vector = self._submit(request)
        finally:
            with self._lock:
                self._pending_queries.pop(text, None)
        with self._lock:
            self._query_cache[text] = vector
            while len(self._query_cache) > 256:
                self._query_cache.popitem(last=False)
        return vector.copy()

    def count_tokens(self, text: str) -> int:
        counter = getattr(self.inner, "count_tokens", None)
        return int(counter(text)) if callable(counter) else max(1, len(text) // 4)

    # -- plumbing ------------------------------------------------------------------------------

    def _submit(self, request: _DocRequest | _QueryRequest) -> FloatArray:
        if self._closed.is_set():
            raise EmbeddingError("the embedding service is closed")
        self._queue.put(request)
        return self._wait(request.future)

    def _wait(self, future: Future[FloatArray]) -> FloatArray:
        try:
            return future.result(timeout=self.call_timeout_s)
        except FutureTimeout as exc:
            raise EmbeddingError(
                f"the embedding model did not answer within {self.call_timeout_s:g} s"
            ) from exc

    def stats(self) -> EmbeddingStats:
        with self._lock:
            return EmbeddingStats(**self._counts)

    def close(self) -> None:
        """Stop the worker; requests still queued fail with :class:`EmbeddingError`."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._queue.put(None)
        with contextlib.suppress(RuntimeError):
            self._thread.join(timeout=10)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                _fail(item.future, EmbeddingError("the embedding service is closed"))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, _QueryRequest):
                self._answer_query(item)
                continue
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
                if isinstance(extra, _QueryRequest):
                    self._answer_query(extra)  # queries never wait for a batch to fill
                    continue
                batch.append(extra)
                size += len(extra.texts)
            self._answer_documents(batch)
            if stop:
                return

    def _answer_query(self, request: _QueryRequest) -> None:
        try:
            with self._lock:
                self._counts["model_calls"] += 1
                self._counts["texts_embedded"] += 1
            vector = np.asarray(self.inner.embed_query(request.text), dtype=np.float32)
        except BaseException as exc:
            _fail(request.future, exc)
            return
        with contextlib.suppress(Exception):
            request.future.set_result(vector)

    def _answer_documents(self, batch: list[_DocRequest]) -> None:
        unique: dict[str, int] = {}
        for request in batch:
            for text in request.texts:
                unique.setdefault(text, len(unique))
        texts = list(unique)
        try:
            vectors = self._call(texts)
        except BaseException as exc:
            if len(batch) > 1:  # retry one by one: only the request that fails should fail
                for request in batch:
                    self._answer_documents([request])
                return
            _fail(batch[0].future, exc)
            return
        with self._lock:
            for text, row in zip(texts, vectors, strict=True):
                self._cache[text_hash(text)] = row
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        for request in batch:
            rows = vectors[[unique[t] for t in request.texts]]
            with contextlib.suppress(Exception):
                request.future.set_result(rows)

    def _call(self, texts: list[str]) -> FloatArray:
        with self._lock:
            self._counts["model_calls"] += 1
            self._counts["texts_embedded"] += len(texts)
            self._counts["largest_batch"] = max(self._counts["largest_batch"], len(texts))
        vectors = np.asarray(self.inner.embed_documents(texts), dtype=np.float32)
        if vectors.shape != (len(texts), self._dim):
            raise EmbeddingError(
                f"embedder {self._model_id!r} returned shape {vectors.shape}, "
                f"expected ({len(texts)}, {self._dim})"
            )
        return vectors


def _fail(future: Future[Any], exc: BaseException) -> None:
    """Give each waiting caller its own exception object (tracebacks are per raise)."""
    if isinstance(exc, MemstrataError):
        error: BaseException = type(exc)(str(exc))
    else:
        error = EmbeddingError(f"embedding failed: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    with contextlib.suppress(Exception):
        future.set_exception(error)
