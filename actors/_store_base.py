"""What the store actors share: the persistent base, with vectors computed apart from writes.

The factory is in :mod:`._store_factory`, the internal messages in :mod:`._store_messages`, the
write-backs held for their vectors in :mod:`._store_held_writebacks`.

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
Answers are stored together, and a write-back waits (bounded) for its own vector to be written
with it, so a busy store writes about once per model batch (see :class:`_PersistentActor`).
With any other embedder the layer embeds inline, as a direct user of the layer does.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import queue
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from memstrata.core.config import Config
from memstrata.core.errors import InvalidInputError, StorageError
from memstrata.core.validation import check_content
from memstrata.storage import Embedder, FloatArray
from memstrata.storage._embedding import EmbedWatch, embed_deadline, embed_time_left

from ._embedding import BatchingEmbedder
from ._store_held_writebacks import _HeldWriteBacks
from ._store_messages import (
    BoundedSearch,
    CatchUp,
    EpisodesImported,
    ExportRecords,
    ImportRecords,
    Searched,
    VectorsReady,
    WriteBackEpisode,
    WriteBackKnowledge,
    _Answered,
    _AskVectors,
    _FlushHeld,
    _VectorRequest,
)
from .messages import (
    QueryKnowledge,
    SearchMemory,
)

__all__: list[str] = []  # the base of the store actors (their modules import its names)


_EXPORT_PAGE = 1000


def _iso(value: datetime) -> str:
    return value.isoformat()


_CATCH_UP_FIRST_S = 0.25  # first retry of pending vectors after a write left some
_CATCH_UP_MAX_S = 30.0  # backoff cap while the model stays faulty
_VECTORS_IN_FLIGHT = 1024  # rows whose vectors one store asks for at a time
_tokens = itertools.count(1)  # vector requests, unique in the process (a reopened layer ignores old ones)


def _fields(message: Any, *names: str) -> dict[str, Any]:
    """Keyword arguments of a layer call: these fields of ``message``, named as the layer names
    its parameters."""
    return {name: getattr(message, name) for name in names}


class _PersistentActor(_HeldWriteBacks):
    """A store with vectors: searches bound their query embedding, and vectors left pending by a
    late or faulty model are retried in this process with backoff until they are all computed.

    With the shared embedding service, vectors are computed apart from the writes (see the
    module's docstring): ``_requests`` holds the vector requests in flight, by token, and
    write-backs wait for their own vectors to be written with them (:class:`_HeldWriteBacks`).
    """

    _catch_up_due = False
    _catch_up_misses = 0
    _ask_posted = False
    _requests: dict[int, _VectorRequest]
    _in_flight: set[int]

    def _store_args(self) -> tuple[Path, Embedder | None, Config]:
        """What the store opens with: its file, its agent's model, and the system's config with
        the agent's ``[embedding]`` (the model a store left keyword-only, because it could not be
        loaded, is tried again)."""
        runtime = self.runtime
        settings = runtime.embedding_settings(self.key)
        config = runtime.config
        if settings != config.embedding:
            config = replace(config, embedding=settings)
        return runtime.path(self.kind, self.key), runtime.embedder_for(self.key), config

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
            result = self.handle_store(message)
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
            if not self._store_answered() or stuck:
                break
        waiting = len(self._in_flight)
        if not waiting:
            return None
        why = "is stuck" if stuck else "did not answer in time"
        return f"vectors pending: model {service.model_id!r} {why}; {waiting} new item(s) ranked by keywords"

    def settle_vectors(self) -> None:
        """Store the vectors being computed before a write that copies rows away (an archive), so
        what it copies does not depend on the model's timing; waits at most ``embed_timeout_s``
        (a later vector is stored when it comes, if its row is still there)."""
        with embed_deadline(self.runtime.config.actors.embed_timeout_s):
            self._await_vectors()

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
                self._ask_posted = self.runtime.post(self.actor_ref, _AskVectors(), owner=self.owner)
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
        runtime, me, owner = self.runtime, self.actor_ref, self.owner
        runtime.activity.begin(owner)

        def answered(_: Future[FloatArray]) -> None:
            try:
                if not runtime.stopped:
                    runtime.post(me, VectorsReady(token), owner=owner)
            finally:
                runtime.activity.done(owner)

        future.add_done_callback(answered)

    def _texts_to_embed(self, ids: list[int], texts: list[str]) -> list[str]:
        """What the model is asked to embed for pending rows (by default the layer's texts)."""
        return texts

    def _vectors_stored(self, ids: list[int]) -> None:
        """A request for ``ids`` was answered and its vectors handed to the layer."""

    def _vectors_ready(self, token: int) -> None:
        """The request ``token`` was answered: store it, with every other answered request (with
        the held write-backs when there are some: see :meth:`_writing`)."""
        if token in self._requests and not self._held:  # else already stored, or asked for by a
            self._store_answered()  # layer since reopened

    def _store_answered(self) -> int:
        """Store the vectors of every answered request in one transaction (the service answers a
        whole model batch at once), then ask for what is still pending; how many requests were
        answered."""
        answered = self._take_answered()
        if answered.ids:
            try:
                self.layer.store_vectors(answered.ids, answered.texts, answered.vectors())
            except StorageError:
                self._vectors_failed()  # the rows stay pending; a busy or full disk is retried
                raise
        self._answered_stored(answered, ask=True)
        return answered.requests

    def _take_answered(self) -> _Answered:
        """The answered requests, taken out of those in flight. A failed one leaves only its own
        rows pending (retried with backoff); rows changed or deleted meanwhile are skipped by the
        layer when the vectors are stored."""
        answered = _Answered()
        for token in [t for t, r in self._requests.items() if r.future.done()]:
            request = self._requests.pop(token)
            self._in_flight.difference_update(request.ids)
            answered.requests += 1
            error = request.future.exception()
            if error is not None:
                answered.failed = error
                continue
            answered.ids += request.ids
            answered.texts += request.texts
            answered.rows.append(request.future.result())
        return answered

    def _answered_stored(self, answered: _Answered, *, ask: bool) -> None:
        """``answered`` is stored (committed): note a failed request, or (``ask``) ask for more."""
        if answered.ids:
            self._vectors_stored(answered.ids)
        if answered.failed is not None:
            note = getattr(self.layer, "note_vector_fault", None)
            if callable(note):
                note(str(answered.failed))
            self._vectors_failed()
        elif answered.requests:
            self._catch_up_misses = 0
            if ask:
                self._request_vectors()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """One transaction for a batch of writes and the vectors answered meanwhile (the layer's
        ``batch``); a failure rolls both back, and those vectors are asked for again later."""
        together = getattr(self.layer, "batch", None)
        if self._service is None or not callable(together):
            yield
            return
        answered = self._take_answered()
        if not answered.requests:
            yield
            return
        try:
            with together():
                if answered.ids:
                    self.layer.store_vectors(answered.ids, answered.texts, answered.vectors())
                yield
        except BaseException:
            self._vectors_failed()
            raise
        self._answered_stored(answered, ask=False)  # the write asks for its own and these

    def _vectors_failed(self) -> None:
        if not self._catch_up_due:
            self._schedule_catch_up()
            self._catch_up_misses = min(self._catch_up_misses + 1, 16)

    def _schedule_catch_up(self) -> None:
        delay = min(_CATCH_UP_MAX_S, _CATCH_UP_FIRST_S * 2**self._catch_up_misses)
        self._catch_up_due = True
        runtime, me, owner = self.runtime, self.actor_ref, self.owner

        def fire() -> None:
            if not runtime.stopped:
                runtime.post(me, CatchUp(), owner=owner)

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

    def _write_batch(
        self, messages: list[Any], name: str, write: Callable[[list[Any]], list[Any]]
    ) -> list[Any]:
        """Queued writes in one layer call (``write``: an answer per message, in order), in one
        transaction with the vectors answered meanwhile; one answer per message, or the error of
        one whose text the layer would refuse (``name``), alone (a write-back's text passed the
        same rule before its outbox acknowledged it)."""
        results: list[Any] = [None] * len(messages)
        accepted: list[int] = []
        self._inline.clear()  # what a failed batch wrote was rolled back
        for index, message in enumerate(messages):
            write_back = isinstance(message, WriteBackKnowledge | WriteBackEpisode)
            refused = None if write_back else self._refused(message.content, name)
            if refused is None:
                accepted.append(index)
            else:
                results[index] = refused
        if accepted:
            written = [messages[i] for i in accepted]
            with self._writing():
                answers = write(written)
            for index, answer in zip(accepted, answers, strict=True):
                results[index] = answer
            try:
                self._committed(written, answers)
                if not all(id(m) in self._inline for m in written):  # else none is pending
                    self.after_write()
            except Exception as exc:
                # committed: the answers stand (handing the messages over again would write them
                # twice); the fault is this actor's, its layer reopens as after any crash
                self._crashed(exc, "after a committed write")
        return results

    def _committed(self, messages: list[Any], answers: list[Any]) -> None:
        """``messages`` were written (committed) with these ``answers`` (see :meth:`_write_batch`)."""

    def _export(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _import(self, records: Sequence[dict[str, Any]]) -> int | EpisodesImported:
        raise NotImplementedError

    def handle(self, message: Any) -> Any:
        """Internal messages common to both stores, and a search's bound on its query embedding;
        then the store's own messages (:meth:`handle_store`)."""
        if isinstance(message, ExportRecords):
            return self._export()
        if isinstance(message, ImportRecords):
            return self._import(message.records)
        if isinstance(message, QueryKnowledge | SearchMemory) and embed_time_left() is None:
            return self._search(message, None).result
        if isinstance(message, BoundedSearch):
            return self._search(message.message, message.embed_s)
        if isinstance(message, VectorsReady):
            self._vectors_ready(message.token)
            return None
        if isinstance(message, _AskVectors):
            self._ask_posted = False
            self._request_vectors()
            return None
        if isinstance(message, _FlushHeld):  # the held write-backs were written before it
            return None
        if isinstance(message, CatchUp):
            self.catch_up()
            return None
        return self.handle_store(message)

    def handle_store(self, message: Any) -> Any:
        """The store's own messages: a subclass answers those it knows and passes the rest here."""
        return super().handle(message)

    def background(self, message: Any) -> bool:
        """Write-backs and vector upkeep step aside for other agents' retrievals (a search
        stores the answered vectors itself first)."""
        return isinstance(
            message, WriteBackKnowledge | WriteBackEpisode | VectorsReady | _AskVectors | CatchUp | _FlushHeld
        )

    def refuses_when_degraded(self, message: Any) -> bool:
        """Vector upkeep goes on for a degraded owner: the rows it completes are stored already."""
        return not isinstance(message, VectorsReady | _AskVectors | CatchUp | _FlushHeld)

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
                base["writes_waiting"] = sum(len(h.envelopes) for h in self._held or ())
            layer_status = getattr(layer, "status", None)
            if callable(layer_status):
                base["store"] = layer_status()
        return base


def _degraded(watch: EmbedWatch, late: str | None) -> str | None:
    """Why a search was degraded: its query embedding's fault first, else vectors not ready."""
    return watch.degraded if watch.degraded is not None else late
