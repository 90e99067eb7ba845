"""Messages for a session's blackboard: publish, read, list and subscribe to signals."""

from __future__ import annotations

import datetime as _dt
from typing import Any

from memstrata.core.constants import DEFAULT_SESSION
from memstrata.core.validation import json_copy

from ._codec import Message
from ._msg_fields import Many, OptKey, OptKeyPrefix, RowId, SessionId, SignalKey, SignalPattern, Time


class PublishSignal(Message):
    """Set ``key`` on a session's blackboard and notify its subscribers.

    ``at``: when it was published, the value's ``updated_at`` (``None``: the system clock when
    the board handles it); ``Blackboard.publish`` gives the time of its call."""

    key: SignalKey
    value: Any
    publisher_id: OptKey = None
    session_id: SessionId = DEFAULT_SESSION
    at: Time = None

    def _check(self) -> None:  # the message's own copy: the sender may go on changing its object
        object.__setattr__(self, "value", json_copy(self.value, f"PublishSignal.value for key {self.key!r}"))


class SignalPublished(Message):
    session_id: str
    key: str
    version: int


class QuerySignal(Message):
    key: SignalKey
    session_id: SessionId = DEFAULT_SESSION


class SignalValue(Message):
    session_id: str
    key: str
    value: Any = None
    found: bool = False
    publisher_id: str | None = None
    version: int = 0
    updated_at: _dt.datetime | None = None


class Signal(Message):
    """What a subscriber receives: one value of one key (``version`` grows per key);
    ``deleted`` marks the key's removal (``value`` is then null)."""

    session_id: str
    key: str
    value: Any
    publisher_id: str | None = None
    version: int = 0
    updated_at: _dt.datetime | None = None
    deleted: bool = False


class DeleteSignal(Message):
    """Remove ``key`` from a session's blackboard and tell its subscribers."""

    key: SignalKey
    session_id: SessionId = DEFAULT_SESSION


class SignalDeleted(Message):
    session_id: str
    key: str
    deleted: bool
    version: int = 0


class SubscribeSignal(Message):
    """Subscribe to a key, or to a prefix ending in ``*``; the callback is given separately."""

    key_or_prefix: SignalPattern
    session_id: SessionId = DEFAULT_SESSION


class SignalSubscribed(Message):
    session_id: str
    subscription_id: int
    key_or_prefix: str


class UnsubscribeSignal(Message):
    subscription_id: RowId
    session_id: SessionId = DEFAULT_SESSION


class SignalUnsubscribed(Message):
    session_id: str
    subscription_id: int
    removed: bool


class ListSignals(Message):
    prefix: OptKeyPrefix = None
    session_id: SessionId = DEFAULT_SESSION


class SignalList(Message):
    """The keys on the blackboard (sorted), optionally only those starting with ``prefix``."""

    session_id: str
    prefix: str | None
    keys: Many[str] = ()
