"""Messages for the system's item store: JSON values addressed by (namespace path, key).

The store the orchestrator adapters build on (keyed items, namespace prefix search with filters
evaluated by SQLite, time to live), reachable like every other store: one ``ItemsActor`` per
system owns ``{data_dir}/items.sqlite`` and embeds the ``index`` fields with the shared embedder.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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
    "ItemsWritten",
    "ListNamespaces",
    "NamespaceCleared",
    "NamespaceList",
    "PopItem",
    "PutItem",
    "SearchItems",
    "StoredItem",
    "SweepItems",
    "TailItems",
    "WriteItems",
]

_SEP = "\x1f"  # the layer's separator between labels: a label may not hold it
MAX_ITEM_LIMIT = 1000
MAX_VECTOR_DIMS = 65_536
MAX_WRITE_ITEMS = 100_000
MAX_TTL_MINUTES = 100_000_000  # about 190 years: expiry times stay within every platform's range


def check_vector(value: object, name: str) -> tuple[float, ...]:
    """A vector computed by the caller: a non-empty list of finite numbers."""
    if isinstance(value, str | bytes) or not hasattr(value, "__len__") or not hasattr(value, "__iter__"):
        raise fail(name, "must be a list of numbers", value)
    if not 0 < len(value) <= MAX_VECTOR_DIMS:
        raise fail(name, f"must hold 1 to {MAX_VECTOR_DIMS} numbers", f"{len(value)} numbers")
    out: list[float] = []
    for x in value:
        if isinstance(x, bool) or (not isinstance(x, int | float) and type(x).__module__ != "numpy"):
            raise fail(name, "must hold only numbers", x)
        f = float(x)
        if not math.isfinite(f):
            raise fail(name, "must hold only finite numbers", x)
        out.append(f)
    return tuple(out)


def check_vectors(value: object, name: str) -> dict[str, tuple[float, ...]]:
    """Vectors per indexed field, all of one dimension."""
    if not isinstance(value, Mapping):
        raise fail(name, "must map field paths to vectors", value)
    out: dict[str, tuple[float, ...]] = {}
    for field, vec in value.items():
        check_text(field, f"{name} key")
        out[field] = check_vector(vec, f"{name}[{field!r}]")
    dims = {len(v) for v in out.values()}
    if len(dims) > 1:
        raise fail(name, "vectors must all have the same number of dimensions", sorted(dims))
    return out


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
    search by meaning finds the item; ``None`` or empty keeps no vector. ``vectors``: instead of
    ``index``, the vectors the caller computed with its own model, one per field name (all of
    one dimension, finite). ``ttl_minutes``: expiry.
    """

    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    index: tuple[str, ...] | None = None
    ttl_minutes: float | None = None
    vectors: dict[str, tuple[float, ...]] | None = None

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
        ttl = check_number(self.ttl_minutes, "PutItem.ttl_minutes", high=MAX_TTL_MINUTES)
        if ttl == 0:
            raise fail("PutItem.ttl_minutes", "must be a positive number of minutes", self.ttl_minutes)
        if self.vectors is not None:
            if self.index:
                raise fail("PutItem.vectors", "cannot come with index (give one or the other)", self.index)
            set_field(self, "vectors", check_vectors(self.vectors, "PutItem.vectors"))


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
    (``{"status": "open", "n": {"$gte": 2}}``). ``query_vector``: instead of ``query``, the
    query's vector computed by the caller's model. ``refresh_ttl`` restarts the found items'
    lifetimes."""

    prefix: tuple[str, ...] = ()
    query: str | None = None
    filter: dict[str, Any] | None = None
    limit: int = 10
    offset: int = 0
    query_vector: tuple[float, ...] | None = None
    refresh_ttl: bool = False

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
        if self.query_vector is not None:
            if self.query is not None:
                raise fail("SearchItems.query_vector", "cannot come with query (give one or the other)", "")
            set_field(self, "query_vector", check_vector(self.query_vector, "SearchItems.query_vector"))
        check_bool(self.refresh_ttl, "SearchItems.refresh_ttl")


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
class WriteItems(Message):
    """Deletes, then puts, applied in one transaction (a LangGraph batch, an import): the puts
    with ``index`` share one embedding request."""

    puts: tuple[PutItem, ...] = ()
    deletes: tuple[DeleteItem, ...] = ()

    def __post_init__(self) -> None:
        for name in ("puts", "deletes"):
            value = getattr(self, name)
            if isinstance(value, str | bytes | Mapping) or not isinstance(value, list | tuple):
                raise fail(f"WriteItems.{name}", "must be a list of messages", value)
            if len(value) > MAX_WRITE_ITEMS:
                raise fail(f"WriteItems.{name}", f"must hold at most {MAX_WRITE_ITEMS:,}", len(value))
            set_field(self, name, tuple(value))
        for n, put in enumerate(self.puts):
            if not isinstance(put, PutItem):
                raise fail(f"WriteItems.puts[{n}]", "must be a PutItem", type(put).__name__)
        for n, delete in enumerate(self.deletes):
            if not isinstance(delete, DeleteItem):
                raise fail(f"WriteItems.deletes[{n}]", "must be a DeleteItem", type(delete).__name__)


@dataclass(frozen=True, slots=True)
class ItemsWritten(Message):
    stored: int
    deleted: int


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
    WriteItems,
)
"""The requests the system's ``ItemsActor`` answers."""
