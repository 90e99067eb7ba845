"""The system's item store behind a mailbox: ``{data_dir}/items.sqlite``, one actor per system.

It owns the :class:`~memstrata.layers._items.ItemStore` (opened in its own thread) and embeds the
``index`` paths of the items it stores (read as :mod:`._item_paths` says, one vector per text),
and the queries of searches, with the shared embedder, so the adapters of every agent in a
process share one model and one batching queue. The store records which model computed each
vector: after a change of model, the vectors the old one computed are computed again before the
first search or embedded write (a vector of another model ranks by another meaning, even at the
same length); vectors given with the items are the callers' and stay as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from memstrata.core.errors import ConfigError, InvalidInputError, MemstrataError
from memstrata.storage import embed_documents, embed_query

from ._base import MemoryActor
from ._item_paths import named_texts, texts_of_names
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
_REFRESH_BATCH = 256  # items whose vectors are computed again per embedding request

log = logging.getLogger("memstrata.actors")


class ItemsActor(MemoryActor):
    """Translates item messages into calls on the item layer; queued puts share one transaction."""

    kind = "items"
    _vectors_current = False  # the store's computed vectors are the system model's
    _refresh_failed = False  # said in the log once

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

    def _embed_fields(self, items: Sequence[Mapping[str, str]], what: str) -> list[Any]:
        """Per item's ``{vector name: text}`` (see :mod:`._item_paths`), ``{name: vector}`` (one
        embedding request for all), or ``None`` when it has no text."""
        texts = [text for named in items for text in named.values()]
        vectors: Any = iter(embed_documents(self._embedder(what), texts) if texts else [])
        return [{name: next(vectors).tolist() for name in named} if named else None for named in items]

    def _refresh_vectors(self, *, needed: bool) -> None:
        """Compute again, with the system's model, the vectors another model computed (see the
        module), before any vector is used: every one before any is stored (the store never holds
        two lengths), a batch of items per embedding request, progress in the log. Where only a
        caller's vectors take part (not ``needed``), a failure leaves the vectors as they are
        (said once in the log) and the request goes on."""
        embedder = self.runtime.embedder
        if self._vectors_current or embedder is None:
            return
        model = embedder.model_id
        try:
            stale = self.layer.stale_items(model, embedder.dim)
            computed: list[Any] = []
            for start in range(0, len(stale), _REFRESH_BATCH):
                part = stale[start : start + _REFRESH_BATCH]
                named = [texts_of_names(value, fields) for _, value, fields in part]
                computed += self._embed_fields(named, "item vectors")
                log.info("item store: vectors of %d of %d items computed again with %s",
                         start + len(part), len(stale), model)  # fmt: skip
            if stale:
                self.layer.replace_vectors(
                    [
                        (item_id, field, (found or {}).get(field))
                        for (item_id, _, fields), found in zip(stale, computed, strict=True)
                        for field in fields
                    ],
                    model,
                )
        except MemstrataError as exc:
            if needed:
                raise
            if not self._refresh_failed:
                log.warning("item store: vectors of another model kept as they are: %s", exc)
            self._refresh_failed = True
            return
        self._vectors_current = True

    def _rows(self, puts: list[PutItem]) -> list[Any]:
        """Layer rows for puts: the vectors the caller gave, or the ``index`` fields embedded in
        one request and marked with the model that computed them."""
        indexed = [m for m in puts if m.vectors is None and m.index]
        if indexed or any(m.vectors for m in puts):
            self._refresh_vectors(needed=bool(indexed))
        named = [named_texts(m.value, m.index or ()) for m in indexed]
        computed = iter(self._embed_fields(named, "PutItem.index"))
        model = None if self.runtime.embedder is None else self.runtime.embedder.model_id
        rows: list[Any] = []
        for message in puts:
            row = (message.namespace, message.key, message.value, message.vectors, message.ttl_minutes)
            vectors = next(computed) if message.vectors is None and message.index else None
            rows.append(row if vectors is None else (*row[:3], vectors, row[4], model))
        return rows

    def _imported(self, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Exported items whose vectors another model computed (or one of the same name at
        another length), with this system's model's instead (the fields their vectors were of);
        the rest as they are."""
        embedder = self.runtime.embedder
        out = list(records)
        if any(r.get("vectors") for r in records):
            self._refresh_vectors(needed=any(r.get("vectors_model") for r in records))
        if embedder is None:
            return out
        stale = [
            n
            for n, r in enumerate(records)
            if isinstance(r.get("vectors_model"), str)
            and isinstance(r.get("vectors"), dict)
            and isinstance(r.get("value"), dict)
            and (r["vectors_model"] != embedder.model_id or _other_length(r["vectors"], embedder.dim))
        ]
        named = [texts_of_names(records[n]["value"], list(records[n]["vectors"])) for n in stale]
        computed = self._embed_fields(named, "import")
        for n, vectors in zip(stale, computed, strict=True):
            out[n] = {**records[n], "vectors": vectors or {}, "vectors_model": embedder.model_id}
        return out

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
            return layer.import_rows(self._imported(message.records))
        if isinstance(message, GetItem):
            record = layer.get(message.namespace, message.key, refresh_ttl=message.refresh_ttl)
            return ItemValue(message.namespace, message.key, record)
        if isinstance(message, SearchItems):
            vector: Any = message.query_vector
            self._refresh_vectors(needed=message.query is not None)
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


def _other_length(vectors: dict[str, Any], dim: int) -> bool:
    """Whether an exported item's vectors are of another length than ``dim``."""
    return any(isinstance(v, list) and len(v) != dim for v in vectors.values())
