"""Messages for the system's item store: JSON values addressed by (namespace path, key).

The store the orchestrator adapters build on (keyed items, namespace prefix search with filters
evaluated by SQLite, time to live), reachable like every other store: one ``ItemsActor`` per
system owns ``{data_dir}/items.sqlite`` and embeds the ``index`` fields with the shared embedder.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from memstrata.core.constants import (
    MAX_KEY_CHARS,
    MAX_LABEL_CHARS,
    MAX_NAMESPACE_DEPTH,
    MAX_OFFSET,
    MAX_TTL_MINUTES,
)
from memstrata.core.item_record import ItemRecord as StoredItem
from memstrata.core.validation import (
    check_text,
    check_ttl,
    fail,
    has_lone_surrogate,
    json_copy,
)

from ._codec import Message, Rule
from ._msg_fields import Flag, OptQuery, between

_SEP = "\x1f"  # the layer's separator between labels: a label may not hold it
MAX_ITEM_LIMIT = 1000
MAX_VECTOR_DIMS = 65_536
MAX_WRITE_ITEMS = 100_000


_FLOAT32_MAX = 3.4028234663852886e38  # numpy.finfo(numpy.float32).max: vectors are stored as float32


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
        if not math.isfinite(f) or abs(f) > _FLOAT32_MAX:  # stored as float32
            raise fail(name, "must hold only finite numbers within float32 (|x| <= 3.4e38)", x)
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
    if len(value) > MAX_NAMESPACE_DEPTH:
        raise fail(name, f"must hold at most {MAX_NAMESPACE_DEPTH} labels", len(value))
    for label in value:
        if not isinstance(label, str) or not label or _SEP in label or "\x00" in label:
            # \x1f joins the stored labels; SQLite's substr() miscounts text holding \x00
            raise fail(name, "labels must be non-empty strings without \\x00 or \\x1f", value)
        if len(label) > MAX_LABEL_CHARS:
            raise fail(name, f"labels must be at most {MAX_LABEL_CHARS} characters", len(label))
        if has_lone_surrogate(label):
            raise fail(name, _NO_SURROGATES, value)
    return tuple(value)


_NO_SURROGATES = "must not contain lone surrogates (UTF-8 cannot store them)"


def _check_item_key(value: object, name: str) -> str:
    """An item's key: a name, so a lone surrogate is refused rather than replaced."""
    key = check_text(value, name)
    if len(key) > MAX_KEY_CHARS:
        raise fail(name, f"must be at most {MAX_KEY_CHARS} characters", len(key))
    if has_lone_surrogate(key):
        raise fail(name, _NO_SURROGATES, value)
    return key


def _check_prefix(value: object, name: str) -> tuple[str, ...]:
    return check_namespace(value, name, allow_empty=True)


def _check_object(value: object, name: str) -> dict[str, Any]:
    """A JSON object (an item's value, a filter), as the message's own copy."""
    if not isinstance(value, dict):
        raise fail(name, "must be a JSON object", value)
    copy: dict[str, Any] = json_copy(value, name)
    return copy


def _check_paths(value: object, name: str) -> tuple[str, ...]:
    """The paths of the fields to embed (dotted, or LangGraph's grammar: ``actors/_item_paths.py``)."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise fail(name, "must be a list of field paths", value)
    for path in value:
        check_text(path, f"{name}[]")
    return tuple(value)


def _check_ttl(value: object, name: str) -> float | None:
    return check_ttl(value, name, unit="minutes", high=MAX_TTL_MINUTES)


def _messages(kind: type[Message]) -> Callable[[object, str], tuple[Any, ...]]:
    """The rule of a list of ``kind`` messages (a batch), held as a tuple."""

    def check(value: object, name: str) -> tuple[Any, ...]:
        if isinstance(value, str | bytes | Mapping) or not isinstance(value, list | tuple):
            raise fail(name, "must be a list of messages", value)
        if len(value) > MAX_WRITE_ITEMS:
            raise fail(name, f"must hold at most {MAX_WRITE_ITEMS:,}", len(value))
        for n, message in enumerate(value):
            if not isinstance(message, kind):
                raise fail(f"{name}[{n}]", f"must be a {kind.__name__}", type(message).__name__)
        return tuple(value)

    return check


Namespace = Annotated[tuple[str, ...], Rule(check_namespace, normalise=True)]
ItemKey = Annotated[str, Rule(_check_item_key)]
Prefix = Annotated[tuple[str, ...], Rule(_check_prefix, normalise=True)]  # () is every namespace
OptPrefix = Annotated[tuple[str, ...] | None, Rule(_check_prefix, normalise=True, optional=True)]
JsonObject = Annotated[dict[str, Any], Rule(_check_object, normalise=True)]
FieldPaths = Annotated[tuple[str, ...] | None, Rule(_check_paths, normalise=True, optional=True)]
OptVector = Annotated[tuple[float, ...] | None, Rule(check_vector, normalise=True, optional=True)]
Vectors = Annotated[dict[str, tuple[float, ...]] | None, Rule(check_vectors, normalise=True, optional=True)]
Limit = Annotated[int, between(0, MAX_ITEM_LIMIT)]
Offset = Annotated[int, between(0, MAX_OFFSET)]


class PutItem(Message):
    """Upsert ``value`` (a JSON object) at ``(namespace, key)``.

    ``index``: the value's fields (dotted paths, ``"$"``, or LangGraph's ``a[0]``, ``tags[*]``,
    ``{a,b}``) whose text is embedded, one vector per text, so a search by meaning finds the
    item; ``None`` or empty keeps no vector. ``vectors``: instead of ``index``, the vectors the
    caller computed with its own model, one per field name (all of one dimension, finite).
    ``ttl_minutes``: expiry.
    """

    namespace: Namespace
    key: ItemKey
    value: JsonObject
    index: FieldPaths = None
    ttl_minutes: Annotated[float | None, Rule(_check_ttl)] = None
    vectors: Vectors = None

    def _check(self) -> None:
        if self.vectors is not None and self.index:
            raise fail("PutItem.vectors", "cannot come with index (give one or the other)", self.index)


class ItemStored(Message):
    namespace: tuple[str, ...]
    key: str


class GetItem(Message):
    """Read one live item; ``refresh_ttl`` restarts its lifetime."""

    namespace: Namespace
    key: ItemKey
    refresh_ttl: Flag = False


class ItemValue(Message):
    namespace: tuple[str, ...]
    key: str
    item: StoredItem | None = None


class SearchItems(Message):
    """Items under a namespace prefix (empty: all), ranked by meaning when ``query`` is given
    (else most recently updated first); ``filter`` compares value fields inside SQLite
    (``{"status": "open", "n": {"$gte": 2}}``). ``query_vector``: instead of ``query``, the
    query's vector computed by the caller's model. ``refresh_ttl`` restarts the found items'
    lifetimes."""

    prefix: Prefix = ()
    query: OptQuery = None
    filter: Annotated[dict[str, Any] | None, Rule(_check_object, normalise=True, optional=True)] = None
    limit: Limit = 10
    offset: Offset = 0
    query_vector: OptVector = None
    refresh_ttl: Flag = False

    def _check(self) -> None:
        if self.query_vector is not None and self.query is not None:
            raise fail("SearchItems.query_vector", "cannot come with query (give one or the other)", "")


class ItemList(Message):
    prefix: tuple[str, ...]
    items: tuple[StoredItem, ...]


class DeleteItem(Message):
    """Really delete one item (its vectors go with it)."""

    namespace: Namespace
    key: ItemKey


class ItemDeleted(Message):
    namespace: tuple[str, ...]
    key: str
    deleted: bool


class WriteItems(Message):
    """Deletes, then puts, applied in one transaction (a LangGraph batch, an import): the puts
    with ``index`` share one embedding request."""

    puts: Annotated[tuple[PutItem, ...], Rule(_messages(PutItem), normalise=True)] = ()
    deletes: Annotated[tuple[DeleteItem, ...], Rule(_messages(DeleteItem), normalise=True)] = ()


class ItemsWritten(Message):
    stored: int
    deleted: int


class TailItems(Message):
    """The last ``limit`` live items of one namespace in insertion order (all when ``None``): a
    conversation's history read from its end."""

    namespace: Namespace
    limit: Annotated[int | None, between(0, 2**31, optional=True)] = None


class PopItem(Message):
    """Remove and return the most recently inserted live item of a namespace."""

    namespace: Namespace


class ClearNamespace(Message):
    """Delete every item of exactly this namespace (its descendants keep theirs)."""

    namespace: Namespace


class NamespaceCleared(Message):
    namespace: tuple[str, ...]
    removed: int


class ListNamespaces(Message):
    """The distinct namespaces holding live items, sorted; ``prefix``/``suffix`` labels ``"*"``
    match any label; ``max_depth`` cuts longer namespaces to that depth."""

    prefix: OptPrefix = None
    suffix: OptPrefix = None
    max_depth: Annotated[int | None, between(1, 1000, optional=True)] = None
    limit: Limit = 100
    offset: Offset = 0


class NamespaceList(Message):
    namespaces: tuple[tuple[str, ...], ...]


class SweepItems(Message):
    """Delete the expired items now, only those under the namespace ``prefix`` when given."""

    prefix: Prefix = ()


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
