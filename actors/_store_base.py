"""What the store actors share (factory, internal messages, persistent base), so each actor has a module.

The per-agent store actors: long-term knowledge, episodic memory and working memory.

Each store actor owns one layer object, opened in its own thread (so the layer's SQLite connection is
confined to that thread), and turns messages into method calls on it: the stores waiting in its
mailbox into one ``add_many`` / ``record_many`` call (group commit, see :class:`MemoryActor`).
Nothing else: the layers hold the logic.

Vectors never hold up a write. With the agent's shared embedding service (a
:class:`BatchingEmbedder`), a layer is opened with ``defer_vectors``: a write commits its rows
and keyword index with the vectors pending and returns; the actor then asks the service for
the pending texts without waiting (``submit_documents``) and stores the answer, in its own
thread, when a :class:`VectorsReady` comes back. A search first waits for those answers within
its own embedding deadline (read-your-writes), then searches; messages that need no model
never wait. A failed answer is retried with backoff (:class:`CatchUp`) until the model works.
With any other embedder the layer embeds inline, as a direct user of the layer does.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import queue
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from memstrata.core.config import Config
from memstrata.core.errors import InvalidInputError, StorageError
from memstrata.core.validation import check_content
from memstrata.storage import Embedder
from memstrata.storage._embedding import EmbedWatch, embed_deadline, embed_time_left

from ._base import ActorRuntime, MemoryActor
from ._embedding import BatchingEmbedder
from .messages import (
    QueryKnowledge,
    SearchMemory,
    StoreMemory,
)

FloatArray = npt.NDArray[np.float32]

__all__ = [
    "BoundedSearch",
    "CatchUp",
    "ExportRecords",
    "ImportRecords",
    "LayerStores",
    "Searched",
    "StoreFactory",
    "VectorsReady",
    "WriteBackEpisode",
]


class StoreFactory(Protocol):
    """Opens the persistent layers; tests pass their own to inject faults.

    ``embedder`` is the agent's embedding service (the shared one unless its
    ``[agents.<id>.embedding]`` names another), or ``None`` when no model could be loaded (the
    layers then run keyword-only and say so in their status).
    """

    def open_knowledge(self, path: Path, embedder: Embedder | None, config: Config) -> Any: ...

    def open_episodic(
        self, path: Path, embedder: Embedder | None, config: Config, clock: Callable[[], datetime]
    ) -> Any: ...


class LayerStores:
    """The real layers: :class:`KnowledgeStore` and :class:`EpisodicMemory`, opened with their
    vectors deferred when the embedder is the shared service (the actor computes them apart,
    so neither a write nor the open waits for the model)."""

    def open_knowledge(self, path: Path, embedder: Embedder | None, config: Config) -> Any:
        from memstrata.layers import KnowledgeStore

        defer = isinstance(embedder, BatchingEmbedder)
        return KnowledgeStore.open(path, embedder, config=config, defer_vectors=defer)

    def open_episodic(
        self, path: Path, embedder: Embedder | None, config: Config, clock: Callable[[], datetime]
    ) -> Any:
        from memstrata.layers import EpisodicMemory

        defer = isinstance(embedder, BatchingEmbedder)
        return EpisodicMemory.open(path, embedder, config=config, clock=clock, defer_vectors=defer)


@dataclass(frozen=True, slots=True)
class WriteBackEpisode:
    """Internal: the episode of a write-back.

    It is embedded by its content alone, the text its knowledge entry is embedded by, so the
    embedding service computes one vector for both (see :class:`EpisodicActor`). ``once``:
    record it unless the same episode of the same task run already exists (a replay after a
    crash, so a write-back committed just before the crash is not recorded twice).
    """

    message: StoreMemory
    once: bool = False


@dataclass(frozen=True, slots=True)
class BoundedSearch:
    """Internal: a ``QueryKnowledge`` or ``SearchMemory`` whose query embedding must answer within
    ``embed_s`` seconds (``None``: ``actors.query_embed_timeout_s``); answered with :class:`Searched`."""

    message: Any
    embed_s: float | None = None


@dataclass(frozen=True, slots=True)
class Searched:
    """Internal: a search's result and, when it ranked by keywords only because the model was
    late or faulty, why (``"keyword-only: model ... did not answer within 2 s"``)."""

    result: Any
    degraded: str | None = None


@dataclass(frozen=True, slots=True)
class ExportRecords:
    """Internal: every record the actor's store holds, as plain JSON-ready dicts (see
    ``memstrata export``), answered as a list."""


@dataclass(frozen=True, slots=True)
class ImportRecords:
    """Internal: restore records made by :class:`ExportRecords` (of this actor's kind) with
    their times and ids; answered with how many were added."""

    records: tuple[dict[str, Any], ...]


_EXPORT_PAGE = 1000


def _iso(value: datetime) -> str:
    return value.isoformat()


@dataclass(frozen=True, slots=True)
class CatchUp:
    """Internal: compute pending vectors now (posted by a timer, with backoff, while some wait)."""


@dataclass(frozen=True, slots=True)
class VectorsReady:
    """Internal: the embedding service answered (or failed) the vector request ``token``."""

    token: int


@dataclass(frozen=True, slots=True)
class _AskVectors:
    """Internal: ask for the pending vectors once the messages queued before this one are handled
    (writes arriving together share one request, one model batch and one vector transaction)."""


@dataclass(slots=True)
class _VectorRequest:
    """Pending rows whose vectors the embedding service computes now."""

    ids: list[int]
    texts: list[str]
    future: Future[FloatArray] = field(repr=False)


_CATCH_UP_FIRST_S = 0.25  # first retry of pending vectors after a write left some
_CATCH_UP_MAX_S = 30.0  # backoff cap while the model stays faulty
_VECTORS_IN_FLIGHT = 1024  # rows whose vectors one store asks for at a time
_tokens = itertools.count(1)  # vector requests, unique in the process (a reopened layer ignores old ones)


def _layer_config(runtime: ActorRuntime, key: str) -> Config:
    """The config a store of ``key`` opens with: the system's, with the agent's ``[embedding]``,
    the model a store left keyword-only (its model could not be loaded) tries again."""
    settings = runtime.embedding_settings(key)
    config = runtime.config
    return config if settings == config.embedding else replace(config, embedding=settings)


class _PersistentActor(MemoryActor):
    """A store with vectors: searches bound their query embedding, and vectors left pending by a
    late or faulty model are retried in this process with backoff until they are all computed.

    With the shared embedding service, vectors are computed apart from the writes (see the
    module's docstring): ``_requests`` holds the vector requests in flight, by token.
    """

    _catch_up_due = False
    _catch_up_misses = 0
    _ask_posted = False
    _service: BatchingEmbedder | None = None  # set when vectors are computed apart
    _requests: dict[int, _VectorRequest]
    _in_flight: set[int]

    def _open(self) -> Any:
        """Open the layer; with the shared service, vectors are deferred and those left pending
        on disk (a model fault, a stop before they were computed) are asked for at once."""
        layer = super()._open()
        self._requests, self._in_flight = {}, set()
        self._service, self._ask_posted = None, False
        embedder = self.runtime.embedder_for(self.key)
        if (
            isinstance(embedder, BatchingEmbedder)
            and getattr(layer, "embedder", None) is embedder
            and callable(getattr(layer, "pending_texts", None))
            and callable(getattr(layer, "store_vectors", None))
        ):
            self._service = embedder
            layer.defer_vectors = True
            self.layer = layer
            self._request_vectors()
        return layer

    def _search(self, message: Any, embed_s: float | None) -> Searched:
        limit = self.runtime.config.actors.query_embed_timeout_s
        if embed_s is not None:
            limit = min(limit, max(0.0, embed_s))
        with embed_deadline(limit) as watch:
            late = self._await_vectors()
            result = self.handle(message)
        return Searched(result, _degraded(watch, late))

    def _await_vectors(self) -> str | None:
        """Read-your-writes: wait for the vectors in flight within the search's own embedding
        deadline and store them; why some are still pending when the time is up (``None``: all
        stored). A stuck model is not waited for: its answers will not come in time."""
        service = self._service
        if service is None:
            return None
        self._request_vectors()  # writes just before this search may not have asked yet
        if not self._requests:
            return None
        stuck = service.model_status().get("state") == "stuck"
        while self._requests:  # storing may ask again (a row updated while its vector was computed)
            if not stuck:
                futures = [r.future for r in self._requests.values()]
                concurrent.futures.wait(futures, timeout=embed_time_left())
            done = [t for t, r in self._requests.items() if r.future.done()]
            for token in done:
                self._vectors_ready(token)
            if not done or stuck:
                break
        waiting = len(self._in_flight)
        if not waiting:
            return None
        why = "is stuck" if stuck else "did not answer in time"
        return f"vectors pending: model {service.model_id!r} {why}; {waiting} new item(s) ranked by keywords"

    def pending_vectors(self) -> int:
        counter = getattr(self.layer, "pending_vectors", None)
        try:
            return int(counter()) if callable(counter) else 0
        except Exception:  # a closed or failing layer: the next write schedules again
            return 0

    def after_write(self) -> None:
        """A write may have left vectors pending (deferred, or the model was late or faulty):
        ask for them now, or retry soon."""
        if self._service is not None:
            inbox = self.actor_inbox
            if not isinstance(inbox, queue.Queue) or inbox.empty():
                self._request_vectors()
            elif not self._ask_posted:  # more messages wait: ask once they are handled
                self._ask_posted = self.runtime.post(self.actor_ref, _AskVectors())
        elif not self._catch_up_due and self.pending_vectors() > 0:
            self._schedule_catch_up()

    def _request_vectors(self) -> None:
        """Ask the embedding service for the pending rows' vectors without waiting; the answer
        comes back as a :class:`VectorsReady` message (counted as work in flight meanwhile)."""
        service, layer = self._service, self.layer
        room = _VECTORS_IN_FLIGHT - len(self._in_flight)
        if service is None or layer is None or room <= 0:
            return
        pending = layer.pending_texts(room, self._in_flight)
        if not pending:
            if not self._in_flight and not self._catch_up_due and self.pending_vectors() > 0:
                self._schedule_catch_up()  # e.g. a model change to finish: CatchUp does it
            return
        ids = [int(i) for i, _ in pending]
        texts = [t for _, t in pending]
        token = next(_tokens)
        future = service.submit_documents(self._texts_to_embed(ids, texts))
        self._requests[token] = _VectorRequest(ids, texts, future)
        self._in_flight.update(ids)
        runtime, me = self.runtime, self.actor_ref
        runtime.activity.begin()

        def answered(_: Future[FloatArray]) -> None:
            try:
                if not runtime.stopped:
                    runtime.post(me, VectorsReady(token))
            finally:
                runtime.activity.done()

        future.add_done_callback(answered)

    def _texts_to_embed(self, ids: list[int], texts: list[str]) -> list[str]:
        """What the model is asked to embed for pending rows (by default the layer's texts)."""
        return texts

    def _vectors_stored(self, ids: list[int]) -> None:
        """A request for ``ids`` was answered and its vectors handed to the layer."""

    def _vectors_ready(self, token: int) -> None:
        """Store the vectors of request ``token`` (rows changed or deleted meanwhile are skipped
        by the layer), then ask for what is still pending; a failure is retried with backoff."""
        request = self._requests.pop(token, None)
        if request is None:  # already stored by a search, or asked for by a layer since reopened
            return
        self._in_flight.difference_update(request.ids)
        error = request.future.exception()
        if error is not None:
            note = getattr(self.layer, "note_vector_fault", None)
            if callable(note):
                note(str(error))
            self._vectors_failed()
            return
        try:
            self.layer.store_vectors(request.ids, request.texts, request.future.result())
        except StorageError:
            self._vectors_failed()  # the rows stay pending; a busy or full disk is retried
            raise
        self._vectors_stored(request.ids)
        self._catch_up_misses = 0
        self._request_vectors()

    def _vectors_failed(self) -> None:
        if not self._catch_up_due:
            self._schedule_catch_up()
            self._catch_up_misses = min(self._catch_up_misses + 1, 16)

    def _schedule_catch_up(self) -> None:
        delay = min(_CATCH_UP_MAX_S, _CATCH_UP_FIRST_S * 2**self._catch_up_misses)
        self._catch_up_due = True
        runtime, me = self.runtime, self.actor_ref

        def fire() -> None:
            if not runtime.stopped:
                runtime.post(me, CatchUp())

        runtime.scheduler.call_later(delay, fire)

    def catch_up(self) -> None:
        self._catch_up_due = False
        if self._service is not None:
            requests = len(self._requests)
            self._request_vectors()
            if len(self._requests) > requests or self._in_flight:
                return
        catch = getattr(self.layer, "catch_up_vectors", None)
        if not callable(catch):
            return
        before = self.pending_vectors()
        left = int(catch())
        if left == 0:
            self._catch_up_misses = 0
            return
        self._catch_up_misses = 0 if left < before else min(self._catch_up_misses + 1, 16)
        self._schedule_catch_up()

    def handle_internal(self, message: Any) -> tuple[bool, Any]:
        """Internal messages common to both stores, and a search's bound on its query embedding:
        ``(True, answer)``, or ``(False, None)`` for the store's own messages."""
        if isinstance(message, QueryKnowledge | SearchMemory) and embed_time_left() is None:
            return True, self._search(message, None).result
        if isinstance(message, BoundedSearch):
            return True, self._search(message.message, message.embed_s)
        if isinstance(message, VectorsReady):
            self._vectors_ready(message.token)
            return True, None
        if isinstance(message, _AskVectors):
            self._ask_posted = False
            self._request_vectors()
            return True, None
        if isinstance(message, CatchUp):
            self.catch_up()
            return True, None
        return False, None

    def refuses_when_degraded(self, message: Any) -> bool:
        """Vector upkeep goes on for a degraded owner: the rows it completes are stored already."""
        return not isinstance(message, VectorsReady | _AskVectors | CatchUp)

    def _refused(self, text: str, what: str) -> InvalidInputError | None:
        """Why the layer would refuse ``text`` (the one rule, :func:`check_content`), so one bad
        message of a batch fails alone and the others still share one transaction. Messages
        handled alone are checked by the layer only."""
        try:
            check_content(text, what, max_bytes=self.runtime.config.max_content_bytes)
        except InvalidInputError as exc:
            return exc
        return None

    def status(self) -> dict[str, Any]:
        base = super().status()
        layer = self.layer
        if layer is not None:
            base["count"] = int(layer.count())
            base["pending_vectors"] = self.pending_vectors()
            if self._service is not None:
                base["vectors_in_flight"] = len(self._in_flight)
            layer_status = getattr(layer, "status", None)
            if callable(layer_status):
                base["store"] = layer_status()
        return base


def _degraded(watch: EmbedWatch, late: str | None) -> str | None:
    """Why a search was degraded: its query embedding's fault first, else vectors not ready."""
    return watch.degraded if watch.degraded is not None else late
