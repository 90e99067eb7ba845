"""Messages for the system's item store: JSON values addressed by (namespace path, key).

The store the orchestrator adapters build on (keyed items, namespace prefix search with filters
evaluated by SQLite, time to live), reachable like every other store: one ``ItemsActor`` per
system owns ``{data_dir}/items.sqlite`` and embeds the ``index`` fields with the shared embedder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memstrata.core.validation import check_bool, check_int, check_json_value, check_number, check_text, fail

from ._codec import Message, set_field

__all__ = [
    "ClearNamespace",
    "DeleteItem",
    "GetItem",
    "ItemDeleted",
    "ItemList",
    "ItemStored",
    "ItemValue",
    "ItemsSwept",
    "ListNamespaces",
    "NamespaceCleared",
    "NamespaceList",
    "PopItem",
    "PutItem",
    "SearchItems",
    "StoredItem",
    "SweepItems",
    "TailItems",
]

_SEP = "\x1f"  # the layer's separator between labels: a label may not hold it
MAX_ITEM_LIMIT = 1000


def check_namespace(value: object, name: str, *, allow_empty: bool = False) -> tuple[str, ...]:
    """A namespace path: a list or tuple of non-empty string labels (empty only for a prefix)."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise fail(name, "must be a list of string labels", value)
    if not value and not allow_empty:
        raise fail(name, "must hold at least one label", value)
    for label in value:
        if not isinstance(label, str) or not label or _SEP in label:
            raise fail(name, "labels must be non-empty strings without \\x1f", value)
    return tuple(value)


@dataclass(frozen=True, slots=True)
class StoredItem:
    """One item; ``score`` is the best indexed field's cosine similarity when a query ranked it."""

    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    created_at: float
    updated_at: float
    score: float | None = None
    expires_at: float | None = None


@dataclass(frozen=True, slots=True)
class PutItem(Message):
    """Upsert ``value`` (a JSON object) at ``(namespace, key)``.

    ``index``: the value's fields (dotted paths) whose text is embedded, one vector each, so a
    search by meaning finds the item; ``None`` or empty keeps no vector. ``ttl_minutes``: expiry.
    """

    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    index: tuple[str, ...] | None = None
    ttl_minutes: float | None = None

    def __post_init__(self) -> None:
        set_field(self, "namespace", check_namespace(self.namespace, "PutItem.namespace"))
        check_text(self.key, "PutItem.key")
        if not isinstance(self.value, dict):
            raise fail("PutItem.value", "must be a JSON object", self.value)
        check_json_value(self.value, "PutItem.value")
        if self.index is not None:
            if isinstance(self.index, str) or not isinstance(self.index, list | tuple):
                raise fail("PutItem.index", "must be a list of field paths", self.index)
            for path in self.index:
                check_text(path, "PutItem.index[]")
            set_field(self, "index", tuple(self.index))
        if self.ttl_minutes is not None and check_number(self.ttl_minutes, "PutItem.ttl_minutes") == 0:
            raise fail("PutItem.ttl_minutes", "must be a positive number of minutes", self.ttl_minutes)


@dataclass(frozen=True, slots=True)
class ItemStored(Message):
    namespace: tuple[str, ...]
    key: str


@dataclass(frozen=True, slots=True)
class GetItem(Message):
    """Read one live item; ``refresh_ttl`` restarts its lifetime."""

    namespace: tuple[str, ...]
    key: str
    refresh_ttl: bool = False

    def __post_init__(self) -> None:
        set_field(self, "namespace", check_namespace(self.namespace, "GetItem.namespace"))
        check_text(self.key, "GetItem.key")
        check_bool(self.refresh_ttl, "GetItem.refresh_ttl")


@dataclass(frozen=True, slots=True)
class ItemValue(Message):
    namespace: tuple[str, ...]
    key: str
    item: StoredItem | None = None


@dataclass(frozen=True, slots=True)
class SearchItems(Message):
    """Items under a namespace prefix (empty: all), ranked by meaning when ``query`` is given
    (else most recently updated first); ``filter`` compares value fields inside SQLite
    (``{"status": "open", "n": {"$gte": 2}}``)."""

    prefix: tuple[str, ...] = ()
    query: str | None = None
    filter: dict[str, Any] | None = None
    limit: int = 10
    offset: int = 0

    def __post_init__(self) -> None:
        set_field(self, "prefix", check_namespace(self.prefix, "SearchItems.prefix", allow_empty=True))
        if self.query is not None:
            check_text(self.query, "SearchItems.query", allow_empty=True)
        if self.filter is not None:
            if not isinstance(self.filter, dict):
                raise fail("SearchItems.filter", "must be a JSON object", self.filter)
            check_json_value(self.filter, "SearchItems.filter")
        check_int(self.limit, "SearchItems.limit", 0, MAX_ITEM_LIMIT)
        check_int(self.offset, "SearchItems.offset", 0, 2**31)


@dataclass(frozen=True, slots=True)
class ItemList(Message):
    prefix: tuple[str, ...]
    items: tuple[StoredItem, ...]


@dataclass(frozen=True, slots=True)
class DeleteItem(Message):
    """Really delete one item (its vectors go with it)."""

    namespace: tuple[str, ...]
    key: str

    def __post_init__(self) -> None:
        set_field(self, "namespace", check_namespace(self.namespace, "DeleteItem.namespace"))
        check_text(self.key, "DeleteItem.key")


@dataclass(frozen=True, slots=True)
class ItemDeleted(Message):
    namespace: tuple[str, ...]
    key: str
    deleted: bool


@dataclass(frozen=True, slots=True)
class TailItems(Message):
    """The last ``limit`` live items of one namespace in insertion order (all when ``None``): a
    conversation's history read from its end."""

    namespace: tuple[str, ...]
    limit: int | None = None

    def __post_init__(self) -> None:
        set_field(self, "namespace", check_namespace(self.namespace, "TailItems.namespace"))
        if self.limit is not None:
            check_int(self.limit, "TailItems.limit", 0, 2**31)


@dataclass(frozen=True, slots=True)
class PopItem(Message):
    """Remove and return the most recently inserted live item of a namespace."""

    namespace: tuple[str, ...]

    def __post_init__(self) -> None:
        set_field(self, "namespace", check_namespace(self.namespace, "PopItem.namespace"))


@dataclass(frozen=True, slots=True)
class ClearNamespace(Message):
    """Delete every item of exactly this namespace (its descendants keep theirs)."""

    namespace: tuple[str, ...]

    def __post_init__(self) -> None:
        set_field(self, "namespace", check_namespace(self.namespace, "ClearNamespace.namespace"))


@dataclass(frozen=True, slots=True)
class NamespaceCleared(Message):
    namespace: tuple[str, ...]
    removed: int


@dataclass(frozen=True, slots=True)
class ListNamespaces(Message):
    """The distinct namespaces holding live items, sorted; ``prefix``/``suffix`` labels ``"*"``
    match any label; ``max_depth`` cuts longer namespaces to that depth."""

    prefix: tuple[str, ...] | None = None
    suffix: tuple[str, ...] | None = None
    max_depth: int | None = None
    limit: int = 100
    offset: int = 0

    def __post_init__(self) -> None:
        if self.prefix is not None:
            set_field(self, "prefix", check_namespace(self.prefix, "ListNamespaces.prefix", allow_empty=True))
        if self.suffix is not None:
            set_field(self, "suffix", check_namespace(self.suffix, "ListNamespaces.suffix", allow_empty=True))
        if self.max_depth is not None:
            check_int(self.max_depth, "ListNamespaces.max_depth", 1, 1000)
        check_int(self.limit, "ListNamespaces.limit", 0, MAX_ITEM_LIMIT)
        check_int(self.offset, "ListNamespaces.offset", 0, 2**31)


@dataclass(frozen=True, slots=True)
class NamespaceList(Message):
    namespaces: tuple[tuple[str, ...], ...]


@dataclass(frozen=True, slots=True)
class SweepItems(Message):
    """Delete the expired items now, only those under the namespace ``prefix`` when given."""

    prefix: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        set_field(self, "prefix", check_namespace(self.prefix, "SweepItems.prefix", allow_empty=True))


@dataclass(frozen=True, slots=True)
class ItemsSwept(Message):
    removed: int


ITEM_REQUESTS = (
    PutItem,
    GetItem,
    SearchItems,
    DeleteItem,
    TailItems,
    PopItem,
    ClearNamespace,
    ListNamespaces,
    SweepItems,
)
"""The requests the system's ``ItemsActor`` answers."""
