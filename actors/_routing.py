"""Message routing: which actor (kind, key) owns each public message, and where it keeps its files."""

from __future__ import annotations

from memstrata.core.errors import InvalidInputError

from ._items_actor import ITEMS_KEY
from ._msg_items import ITEM_REQUESTS
from .messages import (
    ArchiveEpisodes,
    ClearWorkingMemory,
    CommitMemory,
    DeleteEpisode,
    DeleteKnowledge,
    DeleteSignal,
    GetEpisode,
    GetKnowledge,
    GetWorkingMemory,
    ListEpisodes,
    ListKnowledge,
    ListSignals,
    Message,
    PublishSignal,
    QueryKnowledge,
    QuerySignal,
    RestoreEpisodes,
    SearchMemory,
    SetWorkingMemory,
    StoreKnowledge,
    StoreMemory,
    SubscribeSignal,
    TaskAssigned,
    TaskCompleted,
    TaskFailed,
    UnsubscribeSignal,
    UpdateKnowledge,
)

__all__ = ["route"]

_SUPERVISOR_OF = {
    "knowledge": "knowledge",
    "episodic": "memory",
    "working": "memory",
    "items": "memory",
    "blackboard": "blackboard",
    "agent": "agent",
    "workspace": "files",
    "codebase": "files",
}
_FOLDER = {
    "knowledge": "knowledge",
    "episodic": "episodic",
    "agent": "outbox",
    "outbox": "outbox",
    "blackboard": "blackboard",
}


_KNOWLEDGE_REQUESTS = (
    StoreKnowledge,
    QueryKnowledge,
    ListKnowledge,
    GetKnowledge,
    UpdateKnowledge,
    DeleteKnowledge,
)
_EPISODIC_REQUESTS = (
    StoreMemory,
    SearchMemory,
    CommitMemory,
    ListEpisodes,
    GetEpisode,
    DeleteEpisode,
    ArchiveEpisodes,
    RestoreEpisodes,
)
_BOARD_REQUESTS = (PublishSignal, QuerySignal, SubscribeSignal, UnsubscribeSignal, ListSignals, DeleteSignal)


def route(message: Message) -> tuple[str, str]:
    """The ``(kind, key)`` of the actor that handles ``message``."""
    if isinstance(message, _KNOWLEDGE_REQUESTS):
        return "knowledge", message.agent_id
    if isinstance(message, _EPISODIC_REQUESTS):
        return "episodic", message.agent_id
    if isinstance(message, SetWorkingMemory | GetWorkingMemory | ClearWorkingMemory):
        return "working", message.agent_id
    if isinstance(message, _BOARD_REQUESTS):
        return "blackboard", message.session_id
    if isinstance(message, ITEM_REQUESTS):
        return "items", ITEMS_KEY
    if isinstance(message, TaskAssigned | TaskCompleted | TaskFailed):
        if message.agent_id is None:
            raise InvalidInputError(
                f"{type(message).__name__}.agent_id is required here (or send it through system.agent(id))"
            )
        return "agent", message.agent_id
    raise InvalidInputError(f"{type(message).__name__} is not a request a memory actor handles")
