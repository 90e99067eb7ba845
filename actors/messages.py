"""The typed messages agents and orchestrators exchange with memory actors: the actors' protocol.

Every message is a frozen, slotted dataclass that validates its fields when it is built, with the
rules of :mod:`memstrata.core.validation` (a bad field raises
:class:`~memstrata.core.errors.InvalidInputError` naming the message and the field), so a malformed
request fails in the sender's thread instead of inside an actor. Normalised fields (tags, scopes,
times) hold their normal form. The wire format is in :mod:`._codec`. Users import these names from
:mod:`memstrata.messages`.
"""

from __future__ import annotations

from memstrata.core.constants import AGENT_ID_PATTERN, CATEGORY_PATTERN, MAX_TOP_K, MODES, SHARED
from memstrata.core.validation import check_agent_id, check_json_value, check_session_id

from ._codec import Message, decode, encode, message_types
from ._msg_blackboard import (
    DeleteSignal,
    ListSignals,
    PublishSignal,
    QuerySignal,
    Signal,
    SignalDeleted,
    SignalList,
    SignalPublished,
    SignalSubscribed,
    SignalUnsubscribed,
    SignalValue,
    SubscribeSignal,
    UnsubscribeSignal,
)
from ._msg_episodic import (
    ArchiveEpisodes,
    CommitMemory,
    DeleteEpisode,
    EpisodeDeleted,
    EpisodeItem,
    EpisodeList,
    EpisodesArchived,
    EpisodesRestored,
    GetEpisode,
    ListEpisodes,
    MemoryCommitted,
    MemorySearchResult,
    MemoryStored,
    RestoreEpisodes,
    SearchMemory,
    StoreMemory,
)
from ._msg_knowledge import (
    DeleteKnowledge,
    GetKnowledge,
    KnowledgeDeleted,
    KnowledgeItem,
    KnowledgeList,
    KnowledgeResult,
    KnowledgeStored,
    KnowledgeUpdated,
    ListKnowledge,
    QueryKnowledge,
    StoreKnowledge,
    UpdateKnowledge,
)
from ._msg_tasks import FileContext, TaskAssigned, TaskCompleted, TaskFailed, TaskPrompt, WriteBackQueued
from ._msg_working import (
    ClearWorkingMemory,
    GetWorkingMemory,
    SetWorkingMemory,
    WorkingMemoryCleared,
    WorkingMemoryValue,
)

CategoryPattern = CATEGORY_PATTERN  # the name this pattern had before it moved to memstrata.core

__all__ = [
    "AGENT_ID_PATTERN",
    "MAX_TOP_K",
    "MODES",
    "SHARED",
    "ArchiveEpisodes",
    "CategoryPattern",
    "ClearWorkingMemory",
    "CommitMemory",
    "DeleteEpisode",
    "DeleteKnowledge",
    "DeleteSignal",
    "EpisodeDeleted",
    "EpisodeItem",
    "EpisodeList",
    "EpisodesArchived",
    "EpisodesRestored",
    "FileContext",
    "GetEpisode",
    "GetKnowledge",
    "GetWorkingMemory",
    "KnowledgeDeleted",
    "KnowledgeItem",
    "KnowledgeList",
    "KnowledgeResult",
    "KnowledgeStored",
    "KnowledgeUpdated",
    "ListEpisodes",
    "ListKnowledge",
    "ListSignals",
    "MemoryCommitted",
    "MemorySearchResult",
    "MemoryStored",
    "Message",
    "PublishSignal",
    "QueryKnowledge",
    "QuerySignal",
    "RestoreEpisodes",
    "SearchMemory",
    "SetWorkingMemory",
    "Signal",
    "SignalDeleted",
    "SignalList",
    "SignalPublished",
    "SignalSubscribed",
    "SignalUnsubscribed",
    "SignalValue",
    "StoreKnowledge",
    "StoreMemory",
    "SubscribeSignal",
    "TaskAssigned",
    "TaskCompleted",
    "TaskFailed",
    "TaskPrompt",
    "UnsubscribeSignal",
    "UpdateKnowledge",
    "WorkingMemoryCleared",
    "WorkingMemoryValue",
    "WriteBackQueued",
    "check_agent_id",
    "check_json_value",
    "check_session_id",
    "decode",
    "encode",
    "message_types",
]
