"""Messages for long-term knowledge: store, query, list, get, update and delete entries."""

from __future__ import annotations

import typing

from ._codec import Message
from ._msg_fields import (
    Author,
    Category,
    Flag,
    Many,
    MinScore,
    Mode,
    OptCategory,
    OptScope,
    OptText,
    PageSize,
    PageStart,
    Query,
    RowId,
    Scope,
    Tags,
    TargetId,
    Text,
    Time,
    TopK,
)

if typing.TYPE_CHECKING:
    from memstrata.layers import KnowledgeEntry, KnowledgeHit


class StoreKnowledge(Message):
    """Add an entry to ``agent_id``'s knowledge store (``"shared"`` targets the shared store).

    ``at``: when the write was made (``None``: the system clock when the store writes it); a
    write-back's entry carries the time its outbox acknowledged it, as its episode does."""

    agent_id: TargetId
    content: Text
    category: Category
    tags: Tags = None
    scope: Scope = "/"
    author: Author = None
    at: Time = None


class KnowledgeStored(Message):
    agent_id: str
    entry_id: int


class QueryKnowledge(Message):
    """Hybrid search of ``agent_id``'s store; ``include_shared`` adds the shared store's hits."""

    agent_id: TargetId
    query: Query
    category: OptCategory = None
    top_k: TopK = 10
    tags: Tags = None
    scope: OptScope = None
    include_shared: Flag = False
    mode: Mode = "hybrid"
    min_score: MinScore = None


class KnowledgeResult(Message):
    """The hits of a :class:`QueryKnowledge`, best first (``KnowledgeStore.search`` objects)."""

    agent_id: str
    hits: Many[KnowledgeHit] = ()


class ListKnowledge(Message):
    """Entries of ``agent_id``'s store, newest first; ``scope`` selects that scope and below."""

    agent_id: TargetId
    category: OptCategory = None
    tags: Tags = None
    scope: OptScope = None
    limit: PageSize = 50
    offset: PageStart = 0


class KnowledgeList(Message):
    agent_id: str
    entries: Many[KnowledgeEntry] = ()


class GetKnowledge(Message):
    agent_id: TargetId
    entry_id: RowId


class KnowledgeItem(Message):
    """The answer to :class:`GetKnowledge`: the entry, or ``None`` when there is no such id."""

    agent_id: str
    entry: KnowledgeEntry | None = None


class DeleteKnowledge(Message):
    agent_id: TargetId
    entry_id: RowId


class KnowledgeDeleted(Message):
    agent_id: str
    entry_id: int
    deleted: bool


class UpdateKnowledge(Message):
    """Change fields of one entry of ``agent_id``'s store (``"shared"``: the shared store), keeping
    its id. ``None`` leaves a field as it is; ``tags`` replaces every tag (``{}`` clears them). A
    new content is embedded again. A change that would make the entry a duplicate of another
    (same content, category and scope) is refused and changes nothing."""

    agent_id: TargetId
    entry_id: RowId
    content: OptText = None
    category: OptCategory = None
    tags: Tags = None
    scope: OptScope = None


class KnowledgeUpdated(Message):
    """The answer to :class:`UpdateKnowledge`: the entry as it now is, ``None`` when there is no
    such id."""

    agent_id: str
    entry_id: int
    entry: KnowledgeEntry | None = None
