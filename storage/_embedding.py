"""Calling an embedder: retries, a deadline and fault watch per block of work, the embedding cache
used on the way, and checks that a model's answer is usable vectors.

Layers and actors embed through these functions, never through a model directly. The protocol is
:mod:`._embedder`, the models :mod:`._fastembed` and :mod:`._default_model`, the cache
:mod:`._embed_cache`.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np

from memstrata.core.errors import EmbedderUnavailableError, EmbeddingError, ModelFaultError

from ._array_types import FloatArray
from ._embed_cache import EmbeddingCache
from ._embedder import Embedder, _normalise, text_hash

__all__ = [
    "EmbedWatch",
    "check_model_rows",
    "embed_deadline",
    "embed_documents",
    "embed_query",
    "embed_time_left",
    "prefetch_query",
    "usable_rows",
]

RETRIES = 3
_T = TypeVar("_T")


class EmbedWatch:
    """What happened to the embeddings asked for inside one :func:`embed_deadline` block: the
    first model fault, as a note a result can carry (``"keyword-only: ..."``)."""

    __slots__ = ("deadline", "degraded")

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline  # time.monotonic() value, None: no bound beyond the service's
        self.degraded: str | None = None

    def fault(self, exc: BaseException) -> None:
        if self.degraded is None:
            self.degraded = f"keyword-only: {exc}"


_WATCH: contextvars.ContextVar[EmbedWatch | None] = contextvars.ContextVar("memstrata_embed", default=None)


@contextlib.contextmanager
def embed_deadline(seconds: float | None) -> Iterator[EmbedWatch]:
    """Bound every embedding asked for in this block (this thread) to ``seconds`` from now, and
    watch for model faults: a search inside it that falls back to keywords says so through
    ``watch.degraded``. A caller's deadline must include the model's, so it is passed down
    rather than guessed by each layer."""
    watch = EmbedWatch(None if seconds is None else time.monotonic() + max(0.0, seconds))
    token = _WATCH.set(watch)
    try:
        yield watch
    finally:
        _WATCH.reset(token)


def embed_time_left() -> float | None:
    """Seconds left before the current :func:`embed_deadline`, ``None`` outside one."""
    watch = _WATCH.get()
    if watch is None or watch.deadline is None:
        return None
    return max(0.0, watch.deadline - time.monotonic())


def _note_fault(exc: BaseException) -> None:
    watch = _WATCH.get()
    if watch is not None:
        watch.fault(exc)


def _with_retries(what: str, call: Callable[[], _T], tries: int = RETRIES) -> _T:
    delay = 0.05
    for attempt in range(1, tries + 1):
        try:
            return call()
        except (EmbedderUnavailableError, ModelFaultError):
            raise  # a late or bad answer is retried later, by the pending-vector catch-up
        except Exception as exc:
            if attempt == tries:
                cause = f"{type(exc).__name__}: {exc}"
                raise EmbeddingError(f"{what} failed after {tries} tries: {cause}") from exc
            time.sleep(delay)
            delay *= 4
    raise AssertionError("unreachable")  # pragma: no cover


def embed_documents(
    embedder: Embedder, texts: Sequence[str], cache: EmbeddingCache | None = None
) -> FloatArray:
    """Embed ``texts`` with retries, computing only what ``cache`` does not already hold."""
    dim = embedder.dim
    if not texts:
        return np.zeros((0, dim), dtype=np.float32)
    safe = [_safe_text(t) for t in texts]
    try:
        return _embed_documents(embedder, safe, cache)
    except EmbeddingError as exc:
        _note_fault(exc)
        raise


def _embed_documents(embedder: Embedder, safe: list[str], cache: EmbeddingCache | None) -> FloatArray:
    dim = embedder.dim
    if cache is None:
        return _checked(
            embedder, _with_retries("embedding", lambda: embedder.embed_documents(safe)), len(safe)
        )
    hashes = [text_hash(t) for t in safe]
    known = {h: v for h, v in cache.lookup(embedder.model_id, hashes).items() if v.shape == (dim,)}
    missing: dict[bytes, str] = {}
    for h, t in zip(hashes, safe, strict=True):
        if h not in known and h not in missing:
            missing[h] = t
    if missing:
        todo = list(missing.values())
        vectors = _checked(
            embedder, _with_retries("embedding", lambda: embedder.embed_documents(todo)), len(todo)
        )
        fresh = list(zip(missing.keys(), vectors, strict=True))
        cache.store(embedder.model_id, fresh)
        known.update(fresh)
    return np.stack([known[h] for h in hashes]).astype(np.float32, copy=False)


def _safe_text(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


def prefetch_query(embedder: Embedder, text: str) -> None:
    """Start embedding ``text`` as a query where ``embedder`` can compute it in the background
    (it has ``prefetch_query``, like the actors' shared embedding service), so that the caller
    can do other work meanwhile; :func:`embed_query` of the same text then waits for that
    computation instead of starting another. Never raises: a failure surfaces in ``embed_query``."""
    prefetch = getattr(embedder, "prefetch_query", None)
    if callable(prefetch):
        with contextlib.suppress(Exception):
            prefetch(_safe_text(text))


def embed_query(embedder: Embedder, text: str) -> FloatArray:
    """A query vector; a failure is noted on the current :func:`embed_deadline` watch (the
    caller ranks by keywords and says why)."""
    safe = _safe_text(text)
    try:
        vector = _with_retries("query embedding", lambda: embedder.embed_query(safe))
        row: FloatArray = _checked(embedder, np.asarray(vector).reshape(1, -1), 1)[0]
    except EmbeddingError as exc:
        _note_fault(exc)
        raise
    return row


def check_model_rows(model_id: str, dim: int, vectors: Any, n: int) -> FloatArray:
    """``vectors`` as ``(n, dim)`` float32, or :class:`ModelFaultError`: a wrong shape, NaN or
    infinity, or an all-zero row (no direction, so no cosine) is the model's fault, not the input's."""
    try:
        array = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise ModelFaultError(f"model {model_id!r} returned something that is not numbers: {exc}") from exc
    if array.shape != (n, dim):
        raise ModelFaultError(f"model {model_id!r} returned shape {array.shape}, expected ({n}, {dim})")
    if not np.isfinite(array).all():
        raise ModelFaultError(f"model {model_id!r} returned NaN or infinite values")
    if n and not np.abs(array).max(axis=1).all():
        raise ModelFaultError(f"model {model_id!r} returned an all-zero vector")
    return array


def usable_rows(model_id: str, dim: int, vectors: Any, n: int) -> tuple[FloatArray, list[bool], str | None]:
    """A model's answer computed apart from its texts' rows (vectors stored later, by their
    owner): the rows normalised, which of them are usable, and the model fault that makes the
    others unusable (NaN, infinity or all zero; a wrong shape or no numbers: none is usable)."""
    try:
        check_model_rows(model_id, dim, vectors, n)
    except ModelFaultError as exc:
        fault: str | None = str(exc)
    else:
        return _normalise(np.asarray(vectors, dtype=np.float32)), [True] * n, None
    try:
        array = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError):
        return np.zeros((n, dim), dtype=np.float32), [False] * n, fault
    if array.shape != (n, dim):
        return np.zeros((n, dim), dtype=np.float32), [False] * n, fault
    good = np.isfinite(array).all(axis=1) & (np.abs(np.nan_to_num(array)).max(axis=1) > 0) if n else []
    clean = np.where(np.asarray(good, dtype=bool)[:, None], array, 0.0).astype(np.float32) if n else array
    return _normalise(clean), [bool(g) for g in good], fault


def _checked(embedder: Embedder, vectors: Any, n: int) -> FloatArray:
    return _normalise(check_model_rows(embedder.model_id, embedder.dim, vectors, n))
