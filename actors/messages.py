"""The typed messages agents and orchestrators exchange with memory actors: the actors' protocol.

Every message is a frozen, slotted dataclass that validates its fields when it is built, with the
rules of :mod:`memstrata.core.validation` (a bad field raises
:class:`~memstrata.core.errors.InvalidInputError` naming the message and the field), so a malformed
request fails in the sender's thread instead of inside an actor. Normalised fields (tags, scopes,
times) hold their normal form. The wire format is in :mod:`._codec`. Users import these names from
:mod:`memstrata.messages`.
"""

# ruff: noqa: F403, F405 - the messages come from their modules by star import; __all__ below is their one list
from __future__ import annotations

from memstrata.core.constants import AGENT_ID_PATTERN, CATEGORY_PATTERN, MAX_TOP_K, MODES, SHARED
from memstrata.core.item_record import ItemRecord as StoredItem
from memstrata.core.validation import check_agent_id, check_json_value, check_session_id

from ._codec import Message, decode, encode, message_types
from ._msg_blackboard import *
from ._msg_episodic import *
from ._msg_items import *
from ._msg_knowledge import *
from ._msg_tasks import *
from ._msg_working import *

CategoryPattern = CATEGORY_PATTERN  # the name this pattern had before it moved to memstrata.core

__all__ = [
    "AGENT_ID_PATTERN",
    "MAX_TOP_K",
    "MODES",
    "SHARED",
    "ArchiveEpisodes",
    "CategoryPattern",
    "ClearNamespace",
    "ClearWorkingMemory",
    "CommitMemory",
    "DeleteEpisode",
    "DeleteItem",
    "DeleteKnowledge",
    "DeleteSignal",
    "EpisodeDeleted",
    "EpisodeItem",
    "EpisodeList",
    "EpisodesArchived",
    "EpisodesRestored",
    "FileContext",
    "GetEpisode",
    "GetItem",
    "GetKnowledge",
    "GetWorkingMemory",
    "ItemDeleted",
    "ItemList",
    "ItemStored",
    "ItemValue",
    "ItemsSwept",
    "ItemsWritten",
    "KnowledgeDeleted",
    "KnowledgeItem",
    "KnowledgeList",
    "KnowledgeResult",
    "KnowledgeStored",
    "KnowledgeUpdated",
    "ListEpisodes",
    "ListKnowledge",
    "ListNamespaces",
    "ListSignals",
    "MemoryCommitted",
    "MemorySearchResult",
    "MemoryStored",
    "Message",
    "NamespaceCleared",
    "NamespaceList",
    "PopItem",
    "PublishSignal",
    "PutItem",
    "QueryKnowledge",
    "QuerySignal",
    "RestoreEpisodes",
    "SearchItems",
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
    "StoredItem",
    "SubscribeSignal",
    "SweepItems",
    "TailItems",
    "TaskAssigned",
    "TaskCompleted",
    "TaskFailed",
    "TaskPrompt",
    "UnsubscribeSignal",
    "UpdateKnowledge",
    "WorkingMemoryCleared",
    "WorkingMemoryValue",
    "WriteBackQueued",
    "WriteItems",
    "check_agent_id",
    "check_json_value",
    "check_session_id",
    "decode",
    "encode",
    "message_types",
]
