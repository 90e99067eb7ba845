"""The actor base: envelopes with reply futures, failure handling and the restart budget.

Every request travels as an :class:`Envelope` holding the message and, for an ask, a
``concurrent.futures.Future`` for the reply. Futures (rather than pykka's blocking ask) let an
actor ask another actor without blocking its own mailbox: it attaches a callback that posts the
reply back to itself as a new message.

Failure contract, for every memory actor:

- invalid input (:class:`InvalidInputError`, or any ``ValueError`` from a layer) goes back to the
  caller as an error; the actor carries on, nothing is restarted;
- a :class:`StorageError` (the database is busy beyond its bound, the disk is full, the file is
  damaged) goes back to the caller as is: the layer's transaction rolled back and it keeps serving
  (reads still work on a full disk), so it is counted in ``status()`` but is not a crash; a layer
  that could not be opened for such a reason is not a crash either: the requests that waited for
  that open get its error, and the next one opens it again;
- any other exception is a *crash*: the caller's future fails at once with
  :class:`ActorCrashedError` (so no ask hangs), the actor drops its layer object and reports to
  its supervisor's :class:`Supervision`, which either restarts it (the layer is reopened from
  storage, in the actor's own thread, and its mailbox is kept so queued messages are not lost) or,
  past the restart budget, marks the owner (agent or session) degraded; a degraded owner's actors
  answer :class:`AgentDegradedError` until it is revived.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import pykka

from memstrata.core.errors import (
    ActorCrashedError,
    AgentDegradedError,
    DatabaseBusyError,
    InvalidInputError,
    MemstrataError,
    ReadOnlyError,
    StorageError,
    SystemStoppedError,
)
from memstrata.storage import configured

from ._inbox import Inbox

if TYPE_CHECKING:
    from memstrata.core.config import Config, EmbeddingConfig
    from memstrata.storage import Embedder

    from ._clock import Clock, IdSource
    from ._concurrency import Activity, Scheduler
    from ._foreground import Foreground
    from ._supervision import Supervision

__all__ = ["DEFERRED", "ActorRuntime", "Envelope", "MemoryActor", "owner_of"]

log = logging.getLogger("memstrata.actors")


class _Deferred:
    """Returned by a handler that will complete the reply future itself, later."""

    __repr__ = lambda self: "DEFERRED"  # noqa: E731


DEFERRED: Any = _Deferred()


@dataclass(slots=True)
class Envelope:
    message: Any
    reply: Future[Any] | None = None
    # when it was sent (``time.monotonic``): a request that waited for a failed open gets its error
    posted: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class _Status:
    """Internal: ask an actor for a status dict."""


def owner_of(kind: str, key: str) -> str:
    """Whom the ``(kind, key)`` actor belongs to, what ``retire`` stops together: an agent,
    ``session:{id}`` (a blackboard) or ``codebase:{name}``."""
    if kind == "blackboard":
        return f"session:{key}"
    return f"codebase:{key}" if kind == "codebase" else key


class ActorRuntime(Protocol):
    """What an actor uses of the runtime that created it (``Runtime`` is the implementation).

    A protocol rather than the class itself: the runtime imports every actor module, so an actor
    module naming ``Runtime`` would close an import cycle through all of them.
    """

    @property
    def config(self) -> Config: ...
    @property
    def data_dir(self) -> Path: ...
    @property
    def embedder(self) -> Embedder | None: ...
    @property
    def embedder_note(self) -> str | None: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def activity(self) -> Activity: ...
    @property
    def supervision(self) -> Supervision: ...
    @property
    def scheduler(self) -> Scheduler: ...
    @property
    def instance(self) -> str: ...
    @property
    def ids(self) -> IdSource: ...
    @property
    def stopped(self) -> bool: ...
    @property
    def stores(self) -> Any: ...  # a ``_store_factory.StoreFactory`` (naming it here would close the cycle)
    @property
    def foreground(self) -> Foreground: ...

    def config_actors(self, name: str) -> Any: ...
    def embedding_of(self, agent_id: str) -> tuple[Embedder | None, str | None]: ...
    def embedder_for(self, agent_id: str) -> Embedder | None: ...
    def one_model(self, first: str, second: str) -> bool: ...
    def embedding_settings(self, agent_id: str) -> EmbeddingConfig: ...
    def path(self, kind: str, key: str) -> Path: ...
    def workspace_of(self, agent_id: str, *, key: str | None = None) -> Path | None: ...
    def codebase_root(self, name: str) -> Path: ...
    def codebases_of(self, agent_id: str) -> list[str]: ...
    def existing(self, kind: str, key: str) -> pykka.ActorRef[Any] | None: ...
    def hosted_here(self, kind: str, key: str) -> bool: ...
    def ref(self, kind: str, key: str) -> pykka.ActorRef[Any]: ...
    def post(
        self, ref: pykka.ActorRef[Any], message: Any, reply: Future[Any] | None = None, *, owner: str
    ) -> bool: ...
    def request(self, kind: str, key: str, message: Any) -> Future[Any]: ...
    def redeliver(self, kind: str, key: str, envelopes: list[Envelope]) -> None: ...


class MemoryActor(pykka.ThreadingActor):
    """A thread with a mailbox of :class:`Envelope` s that owns one layer object.

    Subclasses set ``kind``, implement :meth:`open_layer` / :meth:`close_layer` (run in the
    actor's thread, so the layer's connection is confined to it) and :meth:`handle`.

    Group commit: messages for which :meth:`batch_key` gives the same key and that wait next to
    each other in the mailbox are taken together (up to ``actors.max_group_commit``) and passed
    to :meth:`handle_batch`, which writes them in one transaction. The order of messages is kept,
    and a batch that fails as a whole is handled again message by message, so every caller gets
    the answer (or the error) it would have got alone.
    """

    use_daemon_thread = True
    kind: ClassVar[str] = "actor"

    @staticmethod
    def _create_actor_inbox() -> Inbox:
        return Inbox()

    def __init__(self, runtime: ActorRuntime, key: str, owner: str | None = None) -> None:
        super().__init__()
        self.runtime = runtime
        self.key = key
        self.owner = owner if owner is not None else owner_of(self.kind, key)
        self.layer: Any = None
        self.handled = 0
        self.storage_errors = 0
        self.last_storage_error: str | None = None
        self._open_failure: tuple[float, StorageError] | None = None  # when the last open failed, why
        self.started_at = time.monotonic()
        runtime.activity.begin(self.owner)  # starting up is work in flight until on_start has run

    def __str__(self) -> str:
        return f"{type(self).__name__}({self.key})"

    # -- lifecycle -----------------------------------------------------------------------------

    def open_layer(self) -> Any:
        return None

    def close_layer(self, layer: Any) -> None:
        close = getattr(layer, "close", None)
        if callable(close):
            close()

    def _open(self) -> Any:
        """Open the layer; its databases use the configured lock bound and commit durability."""
        with configured(self.runtime.config.storage):
            return self.open_layer()

    def on_start(self) -> None:
        try:
            self.layer = self._try_open()
        except (DatabaseBusyError, ReadOnlyError) as exc:  # not a crash (see ensure_layer), and expected
            log.debug("%s cannot open its store yet: %s", self, exc)
        except StorageError as exc:  # full, damaged: not a crash either, but said, in one line
            log.warning("%s cannot open its store: %s", self, exc, exc_info=log.isEnabledFor(logging.DEBUG))
        except Exception as exc:  # reopened on the next message; counted like a crash
            self._crashed(exc, "opening")
        finally:
            self.runtime.activity.done(self.owner)

    def on_stop(self) -> None:
        """Close the layer; messages that came after the stop (callers racing with ``retire``)
        go to the actor that replaces this one, never nowhere."""
        left = self.actor_inbox.close() if isinstance(self.actor_inbox, Inbox) else []
        try:
            self._drop_layer()
        finally:
            ours = [e.message for e in left if isinstance(getattr(e, "message", None), Envelope)]
            for envelope in left:  # pykka's own asks (a second stop, a status): answered as pykka does
                reply_to = getattr(envelope, "reply_to", None)
                if reply_to is not None and not isinstance(envelope.message, Envelope):
                    dead = pykka.ActorDeadError(f"{self} stopped before handling the message")
                    reply_to.set_exception(exc_info=(pykka.ActorDeadError, dead, None))
            self.runtime.redeliver(self.kind, self.key, ours)

    def _drop_layer(self) -> None:
        layer, self.layer = self.layer, None
        if layer is not None:
            try:
                self.close_layer(layer)
            except Exception:
                log.exception("%s: closing its layer failed", self)

    def ensure_layer(self, posted: float | None = None) -> Any:
        """The layer, opened if it is not. A request ``posted`` before the last open failed with a
        storage error has waited for that open already: it gets that error as is, rather than
        waiting as long again (a lock held past the bound would double the caller's wait)."""
        if self.layer is None:
            failure = self._open_failure
            if failure is not None and posted is not None and posted <= failure[0]:
                raise failure[1]
            self.layer = self._try_open()
        return self.layer

    def _try_open(self) -> Any:
        """:meth:`_open`, remembering when and why it failed with a storage error."""
        try:
            layer = self._open()
        except StorageError as exc:
            self._open_failure = (time.monotonic(), exc)
            raise
        self._open_failure = None
        return layer

    # -- messages ------------------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        if not isinstance(message, Envelope):
            log.warning("%s ignored a message that is not an envelope: %r", self, message)
            return None
        if self.background(message.message):
            self._step_aside(message)
        key = self.batch_key(message.message)
        limit = int(self.runtime.config.actors.max_group_commit)
        if key is None or limit < 2:
            try:
                self._deliver(message)
            finally:
                self.runtime.activity.done(self.owner)
            return None

        def accept(item: Any) -> bool:
            inner = getattr(item, "message", None)
            return (
                getattr(item, "reply_to", None) is None
                and isinstance(inner, Envelope)
                and self.batch_key(inner.message) == key
            )

        more = self.actor_inbox.take_while(accept, limit - 1) if isinstance(self.actor_inbox, Inbox) else []
        envelopes = [message, *(item.message for item in more)]
        try:
            self._deliver_batch(envelopes)
        finally:
            self.runtime.activity.done(self.owner, len(envelopes))
        return None

    def background(self, message: Any) -> bool:
        """Whether ``message`` is a write-back step, which nobody waits on at once: it steps
        aside while pre-task retrievals that do not need this actor are in flight."""
        return False

    def _step_aside(self, envelope: Envelope) -> None:
        """Wait while retrievals that do not need this actor are in flight (see
        :mod:`._foreground`), until ``actors.writeback_yield_s`` after ``envelope`` was posted or
        a message that is not a write-back step arrives."""
        limit = self.runtime.config.actors.writeback_yield_s - (time.monotonic() - envelope.posted)
        inbox = self.actor_inbox
        if limit <= 0 or not isinstance(inbox, Inbox):
            return
        if inbox.arrived is None:
            inbox.arrived = self.runtime.foreground.poke

        def urgent(item: Any) -> bool:
            inner = getattr(item, "message", None)
            return not isinstance(inner, Envelope) or not self.background(inner.message)

        self.runtime.foreground.yield_to((self.kind, self.key), limit, lambda: inbox.holds(urgent))

    def batch_key(self, message: Any) -> Hashable | None:
        """Messages with equal keys waiting next to each other are handled together by
        :meth:`handle_batch`; ``None`` (the default): handled one at a time."""
        return None

    def handle_batch(self, messages: list[Any]) -> list[Any]:
        """Handle several messages at once, in order; one result per message (an exception
        instance for a message that failed alone). Raising hands each message to :meth:`handle`."""
        raise NotImplementedError

    def _deliver_batch(self, envelopes: list[Envelope]) -> None:
        live = [e for e in envelopes if e.reply is None or not e.reply.done()]
        if len(live) < 2:
            for envelope in live:
                self._deliver(envelope)
            return
        try:
            results = self._guarded_batch([e.message for e in live], min(e.posted for e in live))
        except Exception as exc:  # each message again, alone: its caller gets its own answer
            log.debug("%s: a batch of %d failed (%s); handling them one by one", self, len(live), exc)
            for envelope in live:
                self._deliver(envelope)
            return
        for envelope, result in zip(live, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, ValueError) and not isinstance(result, InvalidInputError):
                    result = InvalidInputError(str(result))
                if envelope.reply is not None:
                    _set_exception(envelope.reply, result)
                elif not isinstance(result, InvalidInputError | SystemStoppedError | AgentDegradedError):
                    log.warning("%s: %s", self, result)
            elif result is not DEFERRED and envelope.reply is not None:
                _set_result(envelope.reply, result)

    def _guarded_batch(self, messages: list[Any], posted: float | None = None) -> list[Any]:
        reason = self.runtime.supervision.degraded_reason(self.owner)
        if reason is not None and any(self.refuses_when_degraded(m) for m in messages):
            raise AgentDegradedError(f"{self.owner} is degraded: {reason}")
        self.ensure_layer(posted)
        results = self.handle_batch(messages)
        if len(results) != len(messages):
            raise RuntimeError(f"{self}: handle_batch returned {len(results)} results for {len(messages)}")
        if any(not isinstance(r, BaseException) for r in results):
            self._writes_recovered()
        self.handled += len(messages)
        return results

    def _deliver(self, envelope: Envelope) -> None:
        reply = envelope.reply
        if reply is not None and reply.done():  # the caller gave up (timeout): skip the work
            return
        try:
            result = self._guarded(envelope.message, envelope.posted)
        except BaseException as exc:
            if reply is not None:
                _set_exception(reply, exc)
            elif not isinstance(exc, InvalidInputError | SystemStoppedError | AgentDegradedError):
                log.warning("%s: %s", self, exc)
            return
        if result is DEFERRED:
            return
        if reply is not None:
            _set_result(reply, result)

    def _guarded(self, message: Any, posted: float | None = None) -> Any:
        if isinstance(message, _Status):
            return self.status()
        reason = self.runtime.supervision.degraded_reason(self.owner)
        if reason is not None and self.refuses_when_degraded(message):
            raise AgentDegradedError(f"{self.owner} is degraded: {reason}")
        try:
            self.ensure_layer(posted)
            result = self.handle(message)
            if self.batch_key(message) is not None:
                self._writes_recovered()
        except (InvalidInputError, SystemStoppedError, ActorCrashedError):
            raise
        except StorageError as exc:
            self.storage_errors += 1
            self.last_storage_error = str(exc)
            raise
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from exc
        except Exception as exc:
            restarted = self._crashed(exc, type(message).__name__)
            after = (
                "was restarted" if restarted else f"exhausted its restart budget ({self.owner} is degraded)"
            )
            raise ActorCrashedError(
                f"{self} crashed handling {type(message).__name__} and {after}: {type(exc).__name__}: {exc}"
            ) from exc
        self.handled += 1
        return result

    def refuses_when_degraded(self, message: Any) -> bool:
        return True

    def _writes_recovered(self) -> None:
        """A write went through: earlier storage errors (a full disk) are no longer a warning."""
        self.storage_errors = 0
        self.last_storage_error = None

    def _crashed(self, exc: BaseException, what: str) -> bool:
        """Drop the layer and ask the supervision policy; True when restarted (layer reopened)."""
        log.error("%s crashed while %s: %s: %s", self, what, type(exc).__name__, exc, exc_info=exc)
        self._drop_layer()
        restart = self.runtime.supervision.child_failed(self.kind, self.key, self.owner, exc)
        if restart:
            with contextlib.suppress(Exception):  # a failing reopen is retried on the next message
                self.layer = self._try_open()
        return restart

    def handle(self, message: Any) -> Any:
        raise InvalidInputError(f"{self} does not handle {type(message).__name__}")

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = {"handled": self.handled, "open": self.layer is not None}
        if self.storage_errors:
            status["storage_errors"] = self.storage_errors
            status["last_storage_error"] = self.last_storage_error
        return status


def _set_result(future: Future[Any], value: Any) -> None:
    with contextlib.suppress(Exception):  # already cancelled or timed out by the caller
        future.set_result(value)


def _set_exception(future: Future[Any], exc: BaseException) -> None:
    if not isinstance(exc, MemstrataError | ValueError):
        wrapped = ActorCrashedError(f"{type(exc).__name__}: {exc}")
        wrapped.__cause__ = exc
        exc = wrapped
    with contextlib.suppress(Exception):
        future.set_exception(exc)


set_result = _set_result
set_exception = _set_exception
Status = _Status
