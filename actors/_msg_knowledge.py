"""Messages for long-term knowledge: store, query, list, get, update and delete entries."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from memstrata.core.validation import (
    check_agent_id,
    check_author,
    check_bool,
    check_category,
    check_int,
    check_min_score,
    check_mode,
    check_scope,
    check_tags,
    check_text,
    check_top_k,
)

from ._codec import Message, set_field

if typing.TYPE_CHECKING:
    from memstrata.layers import KnowledgeEntry, KnowledgeHit


__all__ = [
    "DeleteKnowledge",
    "GetKnowledge",
    "KnowledgeDeleted",
    "KnowledgeItem",
    "KnowledgeList",
    "KnowledgeResult",
    "KnowledgeStored",
    "KnowledgeUpdated",
    "ListKnowledge",
    "QueryKnowledge",
    "StoreKnowledge",
    "UpdateKnowledge",
]


@dataclass(frozen=True, slots=True)
class StoreKnowledge(Message):
    """Add an entry to ``agent_id``'s knowledge store (``"shared"`` targets the shared store)."""

    agent_id: str
    content: str
    category: str
    tags: dict[str, str] | None = None
    scope: str = "/"
    author: str | None = None

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "StoreKnowledge.agent_id", allow_shared=True)
        check_text(self.content, "StoreKnowledge.content")
        check_category(self.category, "StoreKnowledge.category")
        set_field(self, "tags", None if self.tags is None else check_tags(self.tags, "StoreKnowledge.tags"))
        set_field(self, "scope", check_scope(self.scope, "StoreKnowledge.scope"))
        check_author(self.author, "StoreKnowledge.author")


@dataclass(frozen=True, slots=True)
class KnowledgeStored(Message):
    agent_id: str
    entry_id: int


@dataclass(frozen=True, slots=True)
class QueryKnowledge(Message):
    """Hybrid search of ``agent_id``'s store; ``include_shared`` adds the shared store's hits."""

    agent_id: str
    query: str
    category: str | None = None
    top_k: int = 10
    tags: dict[str, str] | None = None
    scope: str | None = None
    include_shared: bool = False
    mode: str = "hybrid"
    min_score: float | None = None

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "QueryKnowledge.agent_id", allow_shared=True)
        check_text(self.query, "QueryKnowledge.query", allow_empty=True)
        if self.category is not None:
            check_category(self.category, "QueryKnowledge.category")
        check_top_k(self.top_k, "QueryKnowledge.top_k")
        set_field(self, "tags", None if self.tags is None else check_tags(self.tags, "QueryKnowledge.tags"))
        if self.scope is not None:
            set_field(self, "scope", check_scope(self.scope, "QueryKnowledge.scope"))
        check_bool(self.include_shared, "QueryKnowledge.include_shared")
        check_mode(self.mode, "QueryKnowledge.mode")
        check_min_score(self.min_score, "QueryKnowledge.min_score")


@dataclass(frozen=True, slots=True)
class KnowledgeResult(Message):
    """The hits of a :class:`QueryKnowledge`, best first (``KnowledgeStore.search`` objects)."""

    agent_id: str
    hits: tuple[KnowledgeHit, ...] = ()

    def __post_init__(self) -> None:
        set_field(self, "hits", tuple(self.hits))


@dataclass(frozen=True, slots=True)
class ListKnowledge(Message):
    """Entries of ``agent_id``'s store, newest first; ``scope`` selects that scope and below."""

    agent_id: str
    category: str | None = None
    tags: dict[str, str] | None = None
    scope: str | None = None
    limit: int = 50
    offset: int = 0

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "ListKnowledge.agent_id", allow_shared=True)
        if self.category is not None:
            check_category(self.category, "ListKnowledge.category")
        set_field(self, "tags", None if self.tags is None else check_tags(self.tags, "ListKnowledge.tags"))
        if self.scope is not None:
            set_field(self, "scope", check_scope(self.scope, "ListKnowledge.scope"))
        check_int(self.limit, "ListKnowledge.limit", 0, 10_000)
        check_int(self.offset, "ListKnowledge.offset", 0, 2**62)


@dataclass(frozen=True, slots=True)
class KnowledgeList(Message):
    agent_id: str
    entries: tuple[KnowledgeEntry, ...] = ()

    def __post_init__(self) -> None:
        set_field(self, "entries", tuple(self.entries))


@dataclass(frozen=True, slots=True)
class GetKnowledge(Message):
    agent_id: str
    entry_id: int

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "GetKnowledge.agent_id", allow_shared=True)
        check_int(self.entry_id, "GetKnowledge.entry_id", 1, 2**62)


@dataclass(frozen=True, slots=True)
class KnowledgeItem(Message):
    """The answer to :class:`GetKnowledge`: the entry, or ``None`` when there is no such id."""

    agent_id: str
    entry: KnowledgeEntry | None = None


@dataclass(frozen=True, slots=True)
class DeleteKnowledge(Message):
    agent_id: str
    entry_id: int

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "DeleteKnowledge.agent_id", allow_shared=True)
        check_int(self.entry_id, "DeleteKnowledge.entry_id", 1, 2**62)


@dataclass(frozen=True, slots=True)
class KnowledgeDeleted(Message):
    agent_id: str
    entry_id: int
    deleted: bool


@dataclass(frozen=True, slots=True)
class UpdateKnowledge(Message):
    """Change fields of one entry of ``agent_id``'s store (``"shared"``: the shared store), keeping
    its id. ``None`` leaves a field as it is; ``tags`` replaces every tag (``{}`` clears them). A
    new content is embedded again. A change that would make the entry a duplicate of another
    (same content, category and scope) is refused and changes nothing."""

    agent_id: str
    entry_id: int
    content: str | None = None
    category: str | None = None
    tags: dict[str, str] | None = None
    scope: str | None = None

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "UpdateKnowledge.agent_id", allow_shared=True)
        check_int(self.entry_id, "UpdateKnowledge.entry_id", 1, 2**62)
        if self.content is not None:
            check_text(self.content, "UpdateKnowledge.content")
        if self.category is not None:
            check_category(self.category, "UpdateKnowledge.category")
        set_field(self, "tags", None if self.tags is None else check_tags(self.tags, "UpdateKnowledge.tags"))
        if self.scope is not None:
            set_field(self, "scope", check_scope(self.scope, "UpdateKnowledge.scope"))


@dataclass(frozen=True, slots=True)
class KnowledgeUpdated(Message):
    """The answer to :class:`UpdateKnowledge`: the entry as it now is, ``None`` when there is no
    such id."""

    agent_id: str
    entry_id: int
    entry: KnowledgeEntry | None = None
