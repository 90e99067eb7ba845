"""The system's item store behind a mailbox: ``{data_dir}/items.sqlite``, one actor per system.

It owns the :class:`~memstrata.layers._items.ItemStore` (opened in its own thread) and embeds the
``index`` fields of the items it stores, and the queries of searches, with the shared embedder, so
the adapters of every agent in a process share one model and one batching queue.
"""

from __future__ import annotations

from typing import Any

import orjson

from memstrata.core.errors import ConfigError, InvalidInputError
from memstrata.storage import embed_documents, embed_query

from ._base import MemoryActor
from ._msg_items import (
    ClearNamespace,
    DeleteItem,
    GetItem,
    ItemDeleted,
    ItemList,
    ItemsSwept,
    ItemStored,
    ItemsWritten,
    ItemValue,
    ListNamespaces,
    NamespaceCleared,
    NamespaceList,
    PopItem,
    PutItem,
    SearchItems,
    SweepItems,
    TailItems,
    WriteItems,
)
from ._store_messages import ExportRecords, ImportRecords

__all__ = ["ITEMS_FILE", "ITEMS_KEY", "ItemsActor"]

ITEMS_FILE = "items.sqlite"
ITEMS_KEY = ":items"  # no agent id can take this name, so retiring an agent never stops it


def field_text(value: dict[str, Any], path: str) -> str | None:
    """The text at a dotted ``path`` of ``value`` (``"$"``: all of it); non-text as JSON."""
    found: Any = value
    if path != "$":
        for part in path.split("."):
            if not isinstance(found, dict) or part not in found:
                return None
            found = found[part]
    if found is None:
        return None
    return found if isinstance(found, str) else orjson.dumps(found).decode()


class ItemsActor(MemoryActor):
    """Translates item messages into calls on the item layer; queued puts share one transaction."""

    kind = "items"

    def open_layer(self) -> Any:
        from memstrata.layers._items import ItemStore

        self.runtime.data_dir.mkdir(parents=True, exist_ok=True)
        clock = self.runtime.clock
        return ItemStore(self.runtime.data_dir / ITEMS_FILE, clock=lambda: clock.now().timestamp())

    def close_layer(self, layer: Any) -> None:
        layer.close()

    def _embedder(self, what: str) -> Any:
        embedder = self.runtime.embedder
        if embedder is None:
            raise InvalidInputError(f"{what} needs an embedding model, and this system runs keyword-only")
        return embedder

    def batch_key(self, message: Any) -> str | None:
        return "put" if isinstance(message, PutItem) else None

    def _rows(self, puts: list[PutItem]) -> list[Any]:
        """Layer rows for puts: the ``index`` fields embedded in one request, or the vectors
        the caller computed."""
        texts: list[str] = []
        plan: list[list[tuple[str, int]]] = []
        for message in puts:
            fields = []
            for path in message.index or ():
                text = field_text(message.value, path)
                if text is not None:
                    fields.append((path, len(texts)))
                    texts.append(text)
            plan.append(fields)
        vectors: Any = []
        if texts:
            vectors = embed_documents(self._embedder("PutItem.index"), texts)
        rows = []
        for message, fields in zip(puts, plan, strict=True):
            vecs: Any = {path: vectors[i].tolist() for path, i in fields} if fields else None
            if message.vectors is not None:
                vecs = message.vectors
            rows.append((message.namespace, message.key, message.value, vecs, message.ttl_minutes))
        return rows

    def handle_batch(self, messages: list[Any]) -> list[Any]:
        """Queued puts in one transaction and one embedding request."""
        self.layer.put_many(self._rows(messages))
        return [ItemStored(m.namespace, m.key) for m in messages]

    def handle(self, message: Any) -> Any:
        layer = self.layer
        if isinstance(message, PutItem):
            return self.handle_batch([message])[0]
        if isinstance(message, WriteItems):
            rows = self._rows(list(message.puts))  # embedded before the transaction opens
            deleted = layer.put_many(rows, delete=[(d.namespace, d.key) for d in message.deletes])
            return ItemsWritten(len(rows), int(deleted))
        if isinstance(message, ExportRecords):
            return [{"kind": "item", **row} for row in layer.export_rows()]
        if isinstance(message, ImportRecords):
            return layer.import_rows(message.records)
        if isinstance(message, GetItem):
            record = layer.get(message.namespace, message.key, refresh_ttl=message.refresh_ttl)
            return ItemValue(message.namespace, message.key, record)
        if isinstance(message, SearchItems):
            vector: Any = message.query_vector
            if message.query is not None:
                embedder = self._embedder("SearchItems.query")
                vector = embed_query(embedder, message.query).tolist()
                held = layer.vector_dim()
                if held is not None and held != len(vector):  # the configured model is not the one stored
                    raise ConfigError(
                        f"the item store's vectors have {held} dimensions and the model "
                        f"{getattr(embedder, 'model_id', '?')!r} gives {len(vector)}: they were made by "
                        f"another model; put the items again, or search with a {held}-number query_vector"
                    )
            records = layer.search(
                message.prefix,
                query_vector=vector,
                filter=message.filter,
                limit=message.limit,
                offset=message.offset,
                refresh_ttl=message.refresh_ttl,
            )
            return ItemList(message.prefix, tuple(records))
        if isinstance(message, DeleteItem):
            gone = layer.delete_many([(message.namespace, message.key)])
            return ItemDeleted(message.namespace, message.key, gone > 0)
        if isinstance(message, ListNamespaces):
            names = layer.list_namespaces(
                prefix=message.prefix,
                suffix=message.suffix,
                max_depth=message.max_depth,
                limit=message.limit,
                offset=message.offset,
            )
            return NamespaceList(tuple(tuple(n) for n in names))
        if isinstance(message, TailItems):
            records = layer.tail(message.namespace, message.limit)
            return ItemList(message.namespace, tuple(records))
        if isinstance(message, PopItem):
            record = layer.pop_last(message.namespace)
            key = "" if record is None else record.key
            return ItemValue(message.namespace, key, record)
        if isinstance(message, ClearNamespace):
            return NamespaceCleared(message.namespace, int(layer.delete_namespace(message.namespace)))
        if isinstance(message, SweepItems):
            return ItemsSwept(int(layer.sweep(message.prefix)))
        return super().handle(message)

    def status(self) -> dict[str, Any]:
        base = super().status()
        if self.layer is not None:
            base["count"] = int(self.layer.count())
        return base
