"""The item store handle: ``system.items``, keyed JSON items shared by every agent of a system.

The same store the orchestrator adapters use (``{data_dir}/items.sqlite``), reached through its
actor, so its writes are serialised and grouped and its vectors come from the system's shared
embedder.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memstrata.core.validation import show
from memstrata.errors import InvalidInputError
from memstrata.messages import (
    ClearNamespace,
    DeleteItem,
    GetItem,
    ItemsWritten,
    ListNamespaces,
    PopItem,
    PutItem,
    SearchItems,
    StoredItem,
    SweepItems,
    TailItems,
    WriteItems,
)

if TYPE_CHECKING:
    from ._system import MemorySystem

__all__ = ["Items"]


class Items:
    """Namespaced items: ``put``/``get``/``delete`` by (namespace, key), ``search`` under a
    namespace prefix (by meaning when given a query, with filters on the value), TTL sweeping."""

    def __init__(self, system: MemorySystem) -> None:
        self._system = system

    def __repr__(self) -> str:
        return f"<Items {self._system.data_dir}>"

    def _ask(self, message: Any, timeout: float | None) -> Any:
        return self._system.ask(message, timeout=timeout)

    def put(
        self,
        namespace: Sequence[str],
        key: str,
        value: Mapping[str, Any],
        *,
        index: Sequence[str] | None = None,
        ttl_minutes: float | None = None,
        vectors: Mapping[str, Sequence[float]] | None = None,
        timeout: float | None = None,
    ) -> None:
        """Upsert ``value`` (a JSON object); the ``index`` fields (dotted paths, ``"$"``: the whole
        value, or LangGraph's ``a[0]``, ``tags[*]``, ``{a,b}``) are embedded so a search by
        meaning finds it, or ``vectors`` (field name to vector) computed by the caller's own model
        are stored; ``ttl_minutes`` makes it expire."""
        fields = None if index is None else _ns(index)
        plain = dict(value) if isinstance(value, Mapping) else value
        vecs = dict(vectors) if isinstance(vectors, Mapping) else vectors
        message = PutItem(_ns(namespace), key, plain, fields, ttl_minutes, vecs)  # type: ignore[arg-type]
        self._ask(message, timeout)

    def write(
        self,
        puts: Iterable[PutItem] = (),
        deletes: Iterable[tuple[Sequence[str], str]] = (),
        *,
        timeout: float | None = None,
    ) -> ItemsWritten:
        """Delete the ``(namespace, key)`` pairs, then apply the puts, in one transaction (one
        embedding request for their ``index`` fields); ``stored`` and ``deleted`` count them."""
        pairs = _tupled(deletes)
        if not isinstance(pairs, tuple):
            raise InvalidInputError(
                f"WriteItems.deletes must be a list of (namespace, key) pairs, got {type(deletes).__name__}"
            )
        gone = tuple(DeleteItem(*_pair(pair, n)) for n, pair in enumerate(pairs))
        return self._ask(WriteItems(_tupled(puts), gone), timeout)  # type: ignore[no-any-return]

    def get(
        self, namespace: Sequence[str], key: str, *, refresh_ttl: bool = False, timeout: float | None = None
    ) -> StoredItem | None:
        """The live item at ``(namespace, key)``, or ``None``."""
        reply = self._ask(GetItem(_ns(namespace), key, refresh_ttl), timeout)
        return reply.item  # type: ignore[no-any-return]

    def search(
        self,
        prefix: Sequence[str] = (),
        *,
        query: str | None = None,
        filter: Mapping[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        query_vector: Sequence[float] | None = None,
        refresh_ttl: bool = False,
        timeout: float | None = None,
    ) -> list[StoredItem]:
        """Items under ``prefix`` (the namespace and its descendants): ranked by meaning when
        ``query`` (or the caller's ``query_vector``) is given, else most recently updated
        first; ``filter`` narrows them first, exactly; ``refresh_ttl`` restarts the lifetimes
        of the items returned."""
        flt = dict(filter) if isinstance(filter, Mapping) else filter
        message = SearchItems(_ns(prefix), query, flt, limit, offset, _tupled(query_vector), refresh_ttl)
        reply = self._ask(message, timeout)
        return list(reply.items)

    def delete(self, namespace: Sequence[str], key: str, *, timeout: float | None = None) -> bool:
        """Delete the item for good; True if it existed."""
        return bool(self._ask(DeleteItem(_ns(namespace), key), timeout).deleted)

    def tail(
        self, namespace: Sequence[str], limit: int | None = None, *, timeout: float | None = None
    ) -> list[StoredItem]:
        """The last ``limit`` live items of one namespace in insertion order (all when ``None``)."""
        return list(self._ask(TailItems(_ns(namespace), limit), timeout).items)

    def pop_last(self, namespace: Sequence[str], *, timeout: float | None = None) -> StoredItem | None:
        """Remove and return the most recently inserted live item of a namespace (``None``: empty)."""
        return self._ask(PopItem(_ns(namespace)), timeout).item  # type: ignore[no-any-return]

    def clear(self, namespace: Sequence[str], *, timeout: float | None = None) -> int:
        """Delete every item of exactly this namespace; returns how many."""
        return int(self._ask(ClearNamespace(_ns(namespace)), timeout).removed)

    def list_namespaces(
        self,
        *,
        prefix: Sequence[str] | None = None,
        suffix: Sequence[str] | None = None,
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
        timeout: float | None = None,
    ) -> list[tuple[str, ...]]:
        """The namespaces holding live items, sorted (``"*"`` in ``prefix``/``suffix`` matches any
        label; ``max_depth`` cuts deeper ones)."""
        message = ListNamespaces(
            None if prefix is None else _ns(prefix),
            None if suffix is None else _ns(suffix),
            max_depth,
            limit,
            offset,
        )
        return list(self._ask(message, timeout).namespaces)

    def sweep(self, prefix: Sequence[str] = (), *, timeout: float | None = None) -> int:
        """Delete the expired items now (only under ``prefix`` when given); returns how many."""
        return int(self._ask(SweepItems(_ns(prefix)), timeout).removed)


def _ns(value: Sequence[str]) -> tuple[str, ...]:
    """A namespace as a tuple (see :func:`_tupled`)."""
    return _tupled(value)  # type: ignore[no-any-return]


def _tupled(value: Any) -> Any:
    """``value`` as a tuple when it is a collection (any iterable but text or a mapping); anything
    else as it is (a bare string, a number, ``None``), for the message to refuse by name."""
    if isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping):
        return tuple(value)
    return value


def _pair(value: Any, n: int) -> tuple[tuple[str, ...], Any]:
    """A ``(namespace, key)`` pair of ``deletes``, its namespace as :func:`_ns` makes it."""
    if isinstance(value, list | tuple) and len(value) == 2:
        return _ns(value[0]), value[1]
    raise InvalidInputError(f"WriteItems.deletes[{n}] must be a (namespace, key) pair, got {show(value)}")
