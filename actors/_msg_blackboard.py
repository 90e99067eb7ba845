"""Messages for a session's blackboard: publish, read, list and subscribe to signals."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any

from memstrata.core.constants import DEFAULT_SESSION
from memstrata.core.validation import (
    check_int,
    check_json_value,
    check_key,
    check_session_id,
    check_signal_key,
    check_signal_pattern,
)

from ._codec import Message, set_field

__all__ = [
    "DeleteSignal",
    "ListSignals",
    "PublishSignal",
    "QuerySignal",
    "Signal",
    "SignalDeleted",
    "SignalList",
    "SignalPublished",
    "SignalSubscribed",
    "SignalUnsubscribed",
    "SignalValue",
    "SubscribeSignal",
    "UnsubscribeSignal",
]


@dataclass(frozen=True, slots=True)
class PublishSignal(Message):
    """Set ``key`` on a session's blackboard and notify its subscribers."""

    key: str
    value: Any
    publisher_id: str | None = None
    session_id: str = DEFAULT_SESSION

    def __post_init__(self) -> None:
        check_signal_key(self.key, "PublishSignal.key")
        check_json_value(self.value, f"PublishSignal.value for key {self.key!r}")
        if self.publisher_id is not None:
            check_key(self.publisher_id, "PublishSignal.publisher_id")
        check_session_id(self.session_id, "PublishSignal.session_id")


@dataclass(frozen=True, slots=True)
class SignalPublished(Message):
    session_id: str
    key: str
    version: int


@dataclass(frozen=True, slots=True)
class QuerySignal(Message):
    key: str
    session_id: str = DEFAULT_SESSION

    def __post_init__(self) -> None:
        check_signal_key(self.key, "QuerySignal.key")
        check_session_id(self.session_id, "QuerySignal.session_id")


@dataclass(frozen=True, slots=True)
class SignalValue(Message):
    session_id: str
    key: str
    value: Any = None
    found: bool = False
    publisher_id: str | None = None
    version: int = 0
    updated_at: _dt.datetime | None = None


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class DeleteSignal(Message):
    """Remove ``key`` from a session's blackboard and tell its subscribers."""

    key: str
    session_id: str = DEFAULT_SESSION

    def __post_init__(self) -> None:
        check_signal_key(self.key, "DeleteSignal.key")
        check_session_id(self.session_id, "DeleteSignal.session_id")


@dataclass(frozen=True, slots=True)
class SignalDeleted(Message):
    session_id: str
    key: str
    deleted: bool
    version: int = 0


@dataclass(frozen=True, slots=True)
class SubscribeSignal(Message):
    """Subscribe to a key, or to a prefix ending in ``*``; the callback is given separately."""

    key_or_prefix: str
    session_id: str = DEFAULT_SESSION

    def __post_init__(self) -> None:
        check_signal_pattern(self.key_or_prefix, "SubscribeSignal.key_or_prefix")
        check_session_id(self.session_id, "SubscribeSignal.session_id")


@dataclass(frozen=True, slots=True)
class SignalSubscribed(Message):
    session_id: str
    subscription_id: int
    key_or_prefix: str


@dataclass(frozen=True, slots=True)
class UnsubscribeSignal(Message):
    subscription_id: int
    session_id: str = DEFAULT_SESSION

    def __post_init__(self) -> None:
        check_int(self.subscription_id, "UnsubscribeSignal.subscription_id", 1, 2**62)
        check_session_id(self.session_id, "UnsubscribeSignal.session_id")


@dataclass(frozen=True, slots=True)
class SignalUnsubscribed(Message):
    session_id: str
    subscription_id: int
    removed: bool


@dataclass(frozen=True, slots=True)
class ListSignals(Message):
    prefix: str | None = None
    session_id: str = DEFAULT_SESSION

    def __post_init__(self) -> None:
        if self.prefix is not None and self.prefix != "":
            check_key(self.prefix, "ListSignals.prefix")
        check_session_id(self.session_id, "ListSignals.session_id")


@dataclass(frozen=True, slots=True)
class SignalList(Message):
    """The keys on the blackboard (sorted), optionally only those starting with ``prefix``."""

    session_id: str
    prefix: str | None
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        set_field(self, "keys", tuple(self.keys))
