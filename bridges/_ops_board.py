"""Operations on a session's blackboard, including subscriptions pushed to the client's connection.

``subscribe`` needs a connection that can receive notifications (``memstrata serve``, on stdio
or a socket): each matching signal is pushed as ``{"jsonrpc": "2.0", "method": "signal",
"params": {subscription_id, session_id, key, value, version, publisher, deleted}}`` -- the
current values first, then each change in order, and none once ``unsubscribe`` has answered.
A subscription belongs to the connection that made it and ends with it; a ``subscription_id``
names one subscription of the server, whatever its session or connection. A client that lets
more than ``MAX_BACKLOG`` notifications pile up unread loses the subscription, told by one
``subscription_ended`` notification. Doors without a connection refuse it with a clear error.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from memstrata.core.constants import MAX_KEY_CHARS
from memstrata.core.errors import InvalidInputError

from . import _convert
from ._operation import (
    NO_NUL,
    SESSION_ID,
    Context,
    Effect,
    OperationList,
    Param,
    key_schema,
    pattern,
    returns,
    session_lane,
    string,
)

_OPS = OperationList()
_KEY = Param("key", key_schema("The signal's key."), True)
_NEW_KEY = Param(
    "key",
    key_schema(
        "The signal's key ('*' is kept for prefix subscriptions).",
        pattern=pattern(r"^[^\x00*]*$", "not contain NUL or '*' ('*' is kept for prefix subscriptions)"),
    ),
    True,
)


@_OPS.add(
    "publish",
    "board",
    "Publish a blackboard signal (any JSON value); subscribers are notified.",
    (
        SESSION_ID,
        _NEW_KEY,
        Param("value", {"description": "Any JSON value."}, True),
        Param("publisher", key_schema("Who publishes it.")),
    ),
    returns(key="string", version="integer"),
    Effect.ADDS,
    lane=session_lane,
)
def _publish(ctx: Context, p: dict[str, Any]) -> Any:
    version = ctx.board(p).publish(p["key"], p["value"], p.get("publisher"), wait=True)
    return {"key": p["key"], "version": version}


@_OPS.add(
    "get_signal",
    "board",
    "Read a blackboard signal; value is null and found false when unset.",
    (SESSION_ID, _KEY),
    returns(found="boolean", value="any"),
    Effect.READS,
    lane=session_lane,
)
def _get_signal(ctx: Context, p: dict[str, Any]) -> Any:
    signal = ctx.board(p).signal(p["key"])
    return {
        "key": p["key"],
        "value": signal.value,
        "found": signal.found,
        "publisher": signal.publisher_id,
        "version": signal.version,
        "updated_at": _convert.plain(signal.updated_at),
    }


@_OPS.add(
    "list_signals",
    "board",
    "The sorted keys of a session's blackboard, optionally under a prefix.",
    (
        SESSION_ID,
        Param("prefix", string("Only keys starting with this.", max_length=MAX_KEY_CHARS, pattern=NO_NUL)),
    ),
    {"type": "array", "items": {"type": "string"}},
    Effect.READS,
    lane=session_lane,
)
def _list_signals(ctx: Context, p: dict[str, Any]) -> Any:
    return list(ctx.board(p).list(p.get("prefix")))


@_OPS.add(
    "delete_signal",
    "board",
    "Remove a blackboard key; subscribers get a signal with deleted true and value null.",
    (SESSION_ID, _KEY),
    returns(key="string", deleted="boolean"),
    Effect.OVERWRITES,
    lane=session_lane,
)
def _delete_signal(ctx: Context, p: dict[str, Any]) -> Any:
    return {"key": p["key"], "deleted": ctx.board(p).delete(p["key"])}


_READY_TIMEOUT_S = 30.0

_subscription_ids = itertools.count(1)
"""The ids clients see, one counter for every connection: the boards number per session, so two
sessions' first subscriptions share a board id, which a client matching signals by id confuses;
and an id never names another client's subscription, whose ``unsubscribe`` removes nothing."""


class _Pushed:
    """One subscription of one connection: turns the board's callbacks into notifications."""

    def __init__(self, connection: Any, session_id: str) -> None:
        self.connection = connection
        self.session_id = session_id
        self.id = next(_subscription_ids)  # what the client sees; the board has its own id
        self.active = True
        self.sync: Any = None
        self.ready = threading.Event()  # set once the subscribe response is queued

    def still_active(self) -> bool:
        return self.active

    def deliver(self, signal: Any) -> None:
        self.ready.wait(_READY_TIMEOUT_S)  # the client learns the id before the first signal
        params = {
            "subscription_id": self.id,
            "session_id": self.session_id,
            "key": signal.key,
            "value": signal.value,
            "version": signal.version,
            "publisher": signal.publisher_id,
            "deleted": bool(getattr(signal, "deleted", False)),
        }
        if self.connection.notify("signal", params, when=self.still_active) or not self.active:
            return
        if not self.connection.open:  # the client is going away: its close ends this subscription
            return
        with self.connection.output_lock:
            self.active = False
            self.connection.subscriptions.pop((self.session_id, self.id), None)
            self.connection.notify(
                "subscription_ended",
                {
                    "subscription_id": self.id,
                    "session_id": self.session_id,
                    "reason": "the client did not read its notifications (too many or too large waiting)",
                },
                limited=False,
            )
        raise _Gone("the client fell too far behind")  # the board drops a callback that raises

    def end(self) -> None:
        """Stop, with no notification after this returns (the flag is read under the output lock)."""
        with self.connection.output_lock:
            self.active = False
        if self.sync is not None:
            self.sync.unsubscribe()


class _Gone(Exception):
    """Raised by a subscription callback whose client cannot take more notifications."""


def _connection(ctx: Context, name: str) -> Any:
    if ctx.connection is None:
        raise InvalidInputError(
            f"{name} needs a connection that receives notifications (JSON-RPC: memstrata serve); "
            "in Python use Blackboard.subscribe"
        )
    return ctx.connection


@_OPS.add(
    "subscribe",
    "board",
    "Subscribe this connection to a key or a prefix* of a session's blackboard; the current values "
    "and then every change are pushed as 'signal' notifications.",
    (
        SESSION_ID,
        Param(
            "key_or_prefix",
            key_schema(
                "A key, or a prefix ending in * ('agent:*'; '*' is every key).",
                pattern=pattern(r"^[^\x00*]*\*?$", "not contain NUL, nor '*' but at its end (a prefix)"),
            ),
            True,
        ),
    ),
    {
        "type": "object",
        "properties": {"subscription_id": {"type": "integer"}},
        "required": ["subscription_id"],
    },
    Effect.READS,
    lane=session_lane,
    push=True,
)
def _subscribe(ctx: Context, p: dict[str, Any]) -> Any:
    connection = _connection(ctx, "subscribe")
    pushed = _Pushed(connection, p["session_id"])
    connection.after_reply(pushed.ready.set)
    try:
        pushed.sync = ctx.board(p).subscribe(p["key_or_prefix"], pushed.deliver)
    except BaseException:
        pushed.ready.set()
        raise
    connection.subscriptions[(pushed.session_id, pushed.id)] = pushed
    return {"subscription_id": pushed.id}


@_OPS.add(
    "unsubscribe",
    "board",
    "End a subscription of this connection; no notification for it follows the answer.",
    (
        SESSION_ID,
        Param("subscription_id", {"type": "integer", "minimum": 1, "description": "From subscribe."}, True),
    ),
    returns(removed="boolean"),
    Effect.READS,
    lane=session_lane,
    push=True,
)
def _unsubscribe(ctx: Context, p: dict[str, Any]) -> Any:
    connection = _connection(ctx, "unsubscribe")
    pushed = connection.subscriptions.pop((p["session_id"], p["subscription_id"]), None)
    if pushed is None:
        return {"removed": False}
    pushed.end()
    return {"removed": True}


OPERATIONS = tuple(_OPS.items)
