"""Write-backs held for their vectors: a store writes a write-back together with its vector.

An agent completing tasks one after another sends its stores one write-back at a time; written at
once, each would cost a transaction, and its vector one more. With the shared embedding service a
write-back is held while its vector is computed, then written with it (and with the write-backs
that arrived meanwhile) in one transaction. :class:`_HeldWriteBacks` is the part of the persistent
store actor (:mod:`._store_base`) that does it.

The actor waits for the vectors in its own thread (:meth:`.Inbox.wait`): the write-backs that
arrive meanwhile queue without waking it, one wake-up per model round rather than one per
write-back, and any other message ends the wait at once, so a search is never held up by it.
On two cores, with 8 agents completing tasks, waking the store actors for each write-back cost
about a tenth of the write-back throughput.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from memstrata.core.constants import EMBED_CHARS  # what a write-back's vector is made of
from memstrata.storage import FloatArray

from ._base import ActorRuntime, Envelope, MemoryActor, Status
from ._concurrency import TimerHandle
from ._embedding import BatchingEmbedder
from ._inbox import Inbox
from ._store_messages import (
    VectorsReady,
    WriteBackEpisode,
    WriteBackKnowledge,
    _AskVectors,
    _FlushHeld,
    _Held,
)

__all__: list[str] = []  # a base of the store actors (see _store_base)

_HOLD_S = 1.0  # longest a write-back waits for the vectors in flight before it is written alone


class _HeldWriteBacks(MemoryActor):
    """Write-backs held in ``_held`` while their vectors are computed by the shared service
    (``_service``, set by the store once its layer defers vectors).

    While the model is well, a write-back (:meth:`held_write`) is held while its vector, asked for
    on arrival, is computed; those answered are then written with their vectors, together with the
    answers to other requests, in one transaction (the write-backs arriving meanwhile share it, as
    the writes queued behind an inline model call used to). A write-back waits at most ``_HOLD_S``
    (then it is written with its vector pending: a hung model never holds it longer), and any other
    message (a search, a user's write) writes the held ones first, so the mailbox's order is kept.
    Their callers are answered once they are committed, as always.
    """

    _service: BatchingEmbedder | None = None  # set when vectors are computed apart
    _held: list[_Held] | None = None  # write-backs waiting for their vectors
    _hold_timer: TimerHandle | None = None
    _ready: dict[int, FloatArray]  # vectors of the held write-backs being written, by id(message)
    _inline: set[int]  # of those, the messages written with their vector, by id(message)

    def __init__(self, runtime: ActorRuntime, key: str, owner: str | None = None) -> None:
        super().__init__(runtime, key, owner)
        self._ready, self._inline = {}, set()

    def held_write(self, message: Any) -> bool:
        """Whether ``message`` is a write-back, which may wait for its vector (see the class). An
        episode to store once (a replay's, a retry's) is not: it is handled alone, after what is
        held, so its check for the same episode sees every one written before it."""
        if isinstance(message, WriteBackEpisode):
            return not message.once
        return isinstance(message, WriteBackKnowledge)

    def _may_hold(self, envelopes: list[Envelope]) -> bool:
        service = self._service
        if service is None or self.runtime.stopped or not all(self.held_write(e.message) for e in envelopes):
            return False
        held = sum(len(h.envelopes) for h in self._held or ())
        if held + len(envelopes) > int(self.runtime.config.actors.max_group_commit):
            return False
        # a stuck or faulty model: no waiting (checked when a wait begins; the bound covers the rest)
        return bool(held) or service.model_status().get("state") == "ok"

    def _deliver_batch(self, envelopes: list[Envelope]) -> None:
        if self._may_hold(envelopes):
            self._hold(envelopes)
            self._settle_held()
            return
        held = self._take_held()
        limit = int(self.runtime.config.actors.max_group_commit)
        if held and sum(len(h.envelopes) for h in held) + len(envelopes) <= limit:
            self._write_held(held, envelopes)
            return
        if held:
            self._write_held(held, [])
        super()._deliver_batch(envelopes)

    def _hold(self, envelopes: list[Envelope]) -> None:
        """Keep ``envelopes`` (write-backs) until their vectors are answered: asked for now, or,
        while those of earlier ones are being computed, together once they are answered (one
        request a round, as the writes queued behind an inline model call used to be)."""
        if not self._held:
            self._held = []
            self._restart_hold_timer()
        self._held.append(_Held(envelopes))
        self.runtime.activity.begin(self.owner, len(envelopes))  # work in flight until written
        if not any(h.future is not None and not h.answered() for h in self._held):
            self._ask_held()

    def _settle_held(self) -> None:
        """Write the held write-backs answered already (an earlier round's), then wait here for
        the oldest vectors in flight (see the module), at most ``_HOLD_S``; not when stopping."""
        answered = self._answered_held()
        if answered:
            self._write_held(answered, [])
        inbox = self.actor_inbox
        if not self._held or self.runtime.stopped or not isinstance(inbox, Inbox):
            return
        first = self._held[0]
        if first.future is None:
            return
        done = threading.Event()
        first.future.add_done_callback(lambda _: done.set())
        inbox.wait(done, self._ends_wait, _HOLD_S)

    def _ends_wait(self, item: Any) -> bool:
        """Whether ``item``, put in the mailbox, ends a wait for held vectors: anything but a
        write-back that would be held too or the note that an answer came (the wait sees the
        answer itself); the bound of the hold does."""
        envelope = getattr(item, "message", None)
        if not isinstance(envelope, Envelope):
            return True  # pykka's own messages (a stop)
        message = envelope.message
        if isinstance(message, _FlushHeld):
            return message.bound
        return not self.held_write(message)

    def _ask_held(self) -> None:
        """Ask for the vectors of the held write-backs not asked for yet, in one request."""
        groups = [h for h in self._held or () if h.future is None]
        if not groups or self._service is None:
            return
        texts: list[str] = []
        for group in groups:
            group.offset = len(texts)
            texts += [e.message.message.content[:EMBED_CHARS] for e in group.envelopes]
        future = self._service.submit_documents(texts)
        for group in groups:
            group.future = future
        runtime, me, owner = self.runtime, self.actor_ref, self.owner
        runtime.activity.begin(owner)  # the answer is work in flight

        def answered(_: Future[FloatArray]) -> None:
            try:
                if not runtime.stopped:
                    runtime.post(me, _FlushHeld(), owner=owner)
            finally:
                runtime.activity.done(owner)

        future.add_done_callback(answered)

    def _restart_hold_timer(self) -> None:
        if self._hold_timer is not None:
            self._hold_timer.cancel()
        runtime, me, owner = self.runtime, self.actor_ref, self.owner

        def fire() -> None:
            if not runtime.stopped:
                runtime.post(me, _FlushHeld(bound=True), owner=owner)

        self._hold_timer = runtime.scheduler.call_later(_HOLD_S, fire)

    def _deliver(self, envelope: Envelope) -> None:
        message = envelope.message
        if not self._held or isinstance(message, Status | _AskVectors | VectorsReady):
            pass  # answers to other requests wait for the held write-backs, to share their transaction
        elif self.held_write(message):
            pass  # a write-back handled alone (one of those held, or of a failed batch): in its place
        elif isinstance(message, _FlushHeld) and not message.bound:
            answered = self._answered_held()
            if answered:
                self._write_held(answered, [])
            self._ask_held()  # those that arrived meanwhile
        else:  # any other message first writes them all: the mailbox's order; a search sees them
            self._write_held(self._take_held(), [])
        super()._deliver(envelope)

    def _answered_held(self) -> list[_Held]:
        """The held write-backs whose vectors are answered, oldest first up to the first that is
        not (their order is kept), taken out of those held."""
        held = self._held or []
        n = 0
        while n < len(held) and held[n].answered():
            n += 1
        if n == len(held):
            return self._take_held()
        if n:
            self._held = held[n:]
            self._restart_hold_timer()  # the others wait their own bound
        return held[:n]

    def _take_held(self) -> list[_Held]:
        held, self._held = self._held or [], None
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        return held

    def _write_held(self, held: list[_Held], more: list[Envelope]) -> None:
        """Write the held write-backs (each with its vector if it was answered, else pending) and
        ``more``, in one transaction."""
        envelopes = [e for h in held for e in h.envelopes]
        for h in held:
            if h.future is not None and h.future.done() and h.future.exception() is None:
                rows = h.future.result()[h.offset : h.offset + len(h.envelopes)]
                for envelope, row in zip(h.envelopes, rows, strict=True):
                    if np.isfinite(row).all() and row.any():
                        self._ready[id(envelope.message)] = row
        try:
            super()._deliver_batch([*envelopes, *more])
        finally:
            self._ready.clear()
            self._inline.clear()
            self.runtime.activity.done(self.owner, len(envelopes))

    def _with_vectors(
        self, messages: list[Any], write: Callable[[list[Any], FloatArray | None], list[int]]
    ) -> list[int]:
        """``write`` the runs of ``messages`` that have a vector computed while they were held
        (``write(run, vectors)``) and those that have none (``write(run, None)``), in order.
        Each vector is used once: written alone after a failed batch, a message has none."""
        rows = [self._ready.pop(id(m), None) for m in messages]
        ids: list[int] = []
        start = 0
        while start < len(messages):
            end = start + 1
            while end < len(messages) and (rows[end] is None) == (rows[start] is None):
                end += 1
            given = None if rows[start] is None else np.stack([r for r in rows[start:end] if r is not None])
            ids += write(messages[start:end], given)
            if given is not None:
                self._inline.update(id(m) for m in messages[start:end])
            start = end
        return ids

    def on_stop(self) -> None:
        held = self._take_held()
        if held:
            self._write_held(held, [])
        super().on_stop()
