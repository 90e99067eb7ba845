"""Requests sent to an actor that stops meanwhile are answered, never dropped.

An agent's actors stop when it is retired (``MemorySystem.retire``) while other threads may
still send them requests. A request sent once the actor has stopped goes to the actor that
replaces it (:func:`deliver`); one that reached the mailbox after the stop message, where no
one would read it (pykka answers only its own asks there), is handed back by the stopping actor
and sent on to the replacement too (:func:`redeliver`). If the system stops first, the caller
gets :class:`~memstrata.core.errors.SystemStoppedError`.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future
from typing import Any

import pykka

from memstrata.core.errors import SystemStoppedError

from ._base import Envelope, owner_of

__all__ = ["deliver", "redeliver"]

_ATTEMPTS = 3  # the replacement may be retired too


def deliver(runtime: Any, kind: str, key: str, message: Any, reply: Future[Any] | None = None) -> None:
    """Put ``message`` in the mailbox of the ``(kind, key)`` actor, counted as work in flight
    until it is handled; its answer goes to ``reply``. Errors of starting the actor (the system
    stopped, a timeout) are raised."""
    ref = runtime.ref(kind, key)
    owner = owner_of(kind, key)
    if not isinstance(ref, pykka.ActorRef):  # a remote actor (Ray): its runtime sends it
        runtime.post(ref, message, reply, owner=owner)
        return
    envelope = Envelope(message, reply)
    runtime.activity.begin(owner)
    try:
        sent = _send(runtime, kind, key, envelope, ref)
    except BaseException:
        runtime.activity.done(owner)
        raise
    if not sent:
        _refused(runtime, envelope, owner, SystemStoppedError(f"the {kind} actor for {key!r} kept stopping"))


def redeliver(runtime: Any, kind: str, key: str, envelopes: list[Envelope]) -> None:
    """Send ``envelopes`` (left in the mailbox of the stopped ``(kind, key)`` actor, each still
    counted in flight) to its replacement, in order, from a thread of their own: the stopping
    actor's supervisor waits for it to end before it can start another."""
    if not envelopes:
        return

    owner = owner_of(kind, key)

    def send_all() -> None:
        for envelope in envelopes:
            try:
                if _send(runtime, kind, key, envelope):
                    continue
                error: BaseException = SystemStoppedError(f"the {kind} actor for {key!r} kept stopping")
            except Exception as exc:  # the system stopped meanwhile, or the actor cannot start
                error = exc
            _refused(runtime, envelope, owner, error)

    threading.Thread(target=send_all, name=f"memstrata-redeliver-{kind}-{key}", daemon=True).start()


def _send(runtime: Any, kind: str, key: str, envelope: Envelope, ref: Any = None) -> bool:
    """``envelope`` in the ``(kind, key)`` actor's mailbox (``ref``, if looked up already), a
    new actor's if that one stopped after it was looked up; False if it kept stopping."""
    for _ in range(_ATTEMPTS):
        try:
            (ref or runtime.ref(kind, key)).tell(envelope)
            return True
        except pykka.ActorDeadError:
            ref = None
    return False


def _refused(runtime: Any, envelope: Envelope, owner: str, error: BaseException) -> None:
    """``envelope`` will not be handled: its caller gets ``error``, and it is no longer in flight."""
    if envelope.reply is not None and not envelope.reply.done():
        with contextlib.suppress(Exception):
            envelope.reply.set_exception(error)
    runtime.activity.done(owner)
