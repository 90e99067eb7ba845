"""A blackboard that writes each change to disk before answering: what a restarted Ray host reloads.

In the local engine a board lives as long as its process and is saved on stop when
``actors.blackboard_snapshot`` is set. A Ray host is detached and Ray restarts it after a crash,
when no stop ran, so on Ray the board writes every change to ``blackboard/{session}.sqlite`` (the
snapshot's file and format) before the change is acknowledged, together with the last version of
deleted keys and the subscriptions of subscribers in other processes (*relays*). A restarted host
reloads the values, continues each key's version count and registers the relays again under the
ids their subscribers hold, so an unsubscribe sent before the crash still finds its subscription.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

from memstrata.storage import Database, open_database

from ._base import MemoryActor
from ._blackboard import BlackboardActor, SubscriberFailed, SubscribeWithCallback
from ._supervisors import Supervisor
from .messages import (
    DeleteSignal,
    PublishSignal,
    SignalDeleted,
    SignalSubscribed,
    SignalUnsubscribed,
    UnsubscribeSignal,
)

__all__ = ["JournaledBoardSupervisor", "RelayFailed", "RelaySubscribe", "SavedRelays"]

log = logging.getLogger("memstrata.actors")

_TABLES = (
    "CREATE TABLE IF NOT EXISTS ray_relays ("
    " client_id INTEGER PRIMARY KEY, relay TEXT NOT NULL, pattern TEXT NOT NULL)",
)


@dataclass(frozen=True, slots=True)
class RelaySubscribe(SubscribeWithCallback):
    """Internal: a subscription for a subscriber in another process, whose signals wait in
    ``relay``; ``client_id`` re-registers one the subscriber already holds (after a restart)."""

    relay: str = ""
    client_id: int | None = None


@dataclass(frozen=True, slots=True)
class RelayFailed:
    """Internal: the callback of a subscriber in another process raised (its relay thread is
    ending); counted in the board's status as the local engine counts a callback that raised."""

    subscription_id: int | None
    error: str


@dataclass(frozen=True, slots=True)
class SavedRelays:
    """Internal: the relays saved before the host restarted, as ``(relay, client id, pattern)``."""


class JournaledBoardActor(BlackboardActor):
    """A :class:`BlackboardActor` whose changes are on disk when they are acknowledged."""

    def __init__(self, runtime: Any, key: str, owner: str | None = None) -> None:
        super().__init__(runtime, key, owner)
        self._journal: Database | None = None
        self._saved: list[tuple[str, int, str]] = []
        self._internal: dict[int, int] = {}  # the id a subscriber holds -> the board's own id
        self._floor = 0  # ids given out before a restart are at most this

    def open_layer(self) -> Any:
        # the values and the deleted keys' versions (the host's runtime always restores them)
        state = super().open_layer()
        path = self.runtime.path("blackboard", self.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file():
            state.snapshot(path)  # creates the file with the snapshot's schema
        journal = open_database(path, load_vec=False)
        try:
            with journal.transaction():
                for sql in _TABLES:
                    journal.execute(sql)
            self._saved = [
                (str(relay), int(client), str(pattern))
                for client, relay, pattern in journal.query(
                    "SELECT client_id, relay, pattern FROM ray_relays ORDER BY client_id"
                )
            ]
        except BaseException:
            journal.close()
            raise
        self._journal = journal
        self._internal = {}
        self._floor = max((client for _, client, _ in self._saved), default=0)
        return state

    def close_layer(self, layer: Any) -> None:
        journal, self._journal = self._journal, None
        try:
            super().close_layer(layer)
        finally:
            if journal is not None:
                journal.close()

    def _write(self, sql: str, params: tuple[Any, ...]) -> None:
        journal = self._journal
        if journal is not None:
            with journal.transaction():
                journal.execute(sql, params)

    def handle(self, message: Any) -> Any:
        if isinstance(message, SavedRelays):
            return list(self._saved)
        if isinstance(message, RelaySubscribe):
            return self._subscribe(message)
        if isinstance(message, UnsubscribeSignal):
            client = message.subscription_id
            internal = self._internal.pop(client, client)
            answer = super().handle(dataclasses.replace(message, subscription_id=internal))
            self._write("DELETE FROM ray_relays WHERE client_id = ?", (client,))
            if isinstance(answer, SignalUnsubscribed):
                return dataclasses.replace(answer, subscription_id=client)
            return answer
        if isinstance(message, RelayFailed):
            self._relay_failed(message)
            return None
        if isinstance(message, SubscriberFailed):
            held = next((c for c, i in self._internal.items() if i == message.subscription_id), None)
            if held is not None:
                del self._internal[held]
                self._write("DELETE FROM ray_relays WHERE client_id = ?", (held,))
            return super().handle(message)
        answer = super().handle(message)
        if isinstance(message, PublishSignal):
            record = self.layer.get(message.key)
            if record is not None:
                self._write(
                    "INSERT OR REPLACE INTO signals(key, value, publisher_id, version, updated_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (
                        record.key,
                        record.data,
                        record.publisher_id,
                        record.version,
                        record.updated_at.isoformat(),
                    ),
                )
        elif isinstance(message, DeleteSignal) and isinstance(answer, SignalDeleted) and answer.deleted:
            journal = self._journal
            if journal is not None:
                with journal.transaction():
                    journal.execute("DELETE FROM signals WHERE key = ?", (message.key,))
                    journal.execute(
                        "INSERT OR REPLACE INTO deleted(key, version) VALUES (?, ?)",
                        (message.key, answer.version),
                    )
        return answer

    def _relay_failed(self, message: RelayFailed) -> None:
        delivery = self._delivery
        with delivery._lock:
            delivery.errors += 1
            delivery.last_error = f"subscription {message.subscription_id}: {message.error}"
        log.warning(
            "blackboard subscriber %s raised and was removed: %s", message.subscription_id, message.error
        )

    def _subscribe(self, message: RelaySubscribe) -> Any:
        answer = super().handle(message)
        if not isinstance(answer, SignalSubscribed):
            return answer
        internal = answer.subscription_id
        client = message.client_id if message.client_id is not None else internal + self._floor
        self._internal[client] = internal
        self._write(
            "INSERT OR REPLACE INTO ray_relays(client_id, relay, pattern) VALUES (?, ?, ?)",
            (client, message.relay, message.request.key_or_prefix),
        )
        return dataclasses.replace(answer, subscription_id=client)


class JournaledBoardSupervisor(Supervisor):
    """Parent of the :class:`JournaledBoardActor` of a Ray host's session."""

    child_kinds: ClassVar[dict[str, type[MemoryActor]]] = {"blackboard": JournaledBoardActor}
