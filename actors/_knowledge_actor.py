"""KnowledgeStoreActor: the long-term knowledge store behind a mailbox; one store actor per module."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from ._store_base import (
    _EXPORT_PAGE,
    _fields,
    _PersistentActor,
)
from ._store_messages import WriteBackKnowledge
from .messages import (
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

__all__ = ["KnowledgeStoreActor"]

_ENTRY = ("category", "tags", "scope", "author")  # a StoreKnowledge's fields besides its content and time


def _seconds(at: dt.datetime | None) -> float | None:
    """A message's time as the store keeps it (UNIX seconds)."""
    return None if at is None else at.timestamp()


class KnowledgeStoreActor(_PersistentActor):
    """``knowledge/{agent}.sqlite`` (or ``knowledge/shared.sqlite``) behind a mailbox."""

    kind = "knowledge"

    def open_layer(self) -> Any:
        runtime = self.runtime
        layer = runtime.stores.open_knowledge(*self._store_args())
        if hasattr(layer, "clock"):  # entries are dated by the system's clock (simulations replay)
            clock = runtime.clock
            layer.clock = lambda: clock.now().timestamp()
        if hasattr(layer, "owner"):  # entries say which store they are in
            layer.owner = self.key
        return layer

    def batch_key(self, message: Any) -> str | None:
        return "store" if isinstance(message, StoreKnowledge | WriteBackKnowledge) else None

    def handle_batch(self, messages: list[Any]) -> list[Any]:
        """Queued stores in one ``add_many``: one transaction, one embedding request."""
        return self._write_batch(messages, "StoreKnowledge.content", self._add_many)

    def _add_many(self, messages: list[Any]) -> list[Any]:
        def add(run: list[Any], vectors: Any) -> list[int]:
            stores = [m.message if isinstance(m, WriteBackKnowledge) else m for m in run]
            items = [{"content": m.content, **_fields(m, *_ENTRY)} for m in stores]
            times = [_seconds(m.at) for m in stores]
            if any(t is not None for t in times):  # a layer of its own may know no times
                return [int(i) for i in self.layer.add_many(items, vectors=vectors, times=times)]
            return [int(i) for i in self.layer.add_many(items, vectors=vectors)]

        return [KnowledgeStored(self.key, i) for i in self._with_vectors(messages, add)]

    def handle_store(self, message: Any) -> Any:
        layer = self.layer
        if isinstance(message, WriteBackKnowledge):  # with the vectors answered meanwhile
            return self.handle_batch([message])[0]
        if isinstance(message, StoreKnowledge):
            dated = {} if message.at is None else {"at": _seconds(message.at)}
            entry_id = layer.add(message.content, **_fields(message, *_ENTRY), **dated)
            self.after_write()
            return KnowledgeStored(self.key, int(entry_id))
        if isinstance(message, QueryKnowledge):
            filters = _fields(message, "top_k", "mode", "category", "tags", "scope", "min_score")
            return KnowledgeResult(self.key, tuple(layer.search(message.query, **filters)))
        if isinstance(message, ListKnowledge):
            entries = layer.list(**_fields(message, "category", "tags", "scope", "limit", "offset"))
            return KnowledgeList(self.key, tuple(entries))
        if isinstance(message, GetKnowledge):
            return KnowledgeItem(self.key, layer.get(message.entry_id))
        if isinstance(message, UpdateKnowledge):
            return self._update(message)
        if isinstance(message, DeleteKnowledge):
            return KnowledgeDeleted(self.key, message.entry_id, bool(layer.delete(message.entry_id)))
        return super().handle_store(message)

    def _update(self, message: UpdateKnowledge) -> KnowledgeUpdated:
        """Only the given fields change (``tags``: all of them); the layer re-embeds new content
        and refuses a change that would duplicate another entry."""
        changes: dict[str, Any] = {}
        if message.content is not None:
            changes["content"] = message.content
        for name in ("category", "tags", "scope"):
            value = getattr(message, name)
            if value is not None:
                changes[name] = value
        entry = self.layer.update(message.entry_id, **changes)
        if "content" in changes:
            self.after_write()
        return KnowledgeUpdated(self.key, message.entry_id, entry)

    def _export(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        offset = 0
        while True:
            page = self.layer.list(limit=_EXPORT_PAGE, offset=offset, order_by="id", descending=False)
            for entry in page:
                out.append(
                    {
                        "kind": "knowledge",
                        "owner": self.key,
                        "id": int(entry.id),
                        "content": entry.content,
                        "category": entry.category,
                        "scope": entry.scope,
                        "tags": dict(entry.tags),
                        "author": entry.author,
                        "created_at": float(entry.created_at),
                        "updated_at": float(entry.updated_at),
                    }
                )
            if len(page) < _EXPORT_PAGE:
                return out
            offset += len(page)

    def _import(self, records: Sequence[dict[str, Any]]) -> int:
        """Entries in id order, each dated as exported: created by an ``add`` at ``created_at``,
        then (when it changed later) refreshed by the same ``add`` at ``updated_at``. Into an
        empty store they keep their ids, gaps included. An entry already there (same content,
        category and scope) is skipped and left as it is: an older export never reverts it."""
        layer = self.layer
        saved = getattr(layer, "clock", None)
        added = 0
        keep_ids = layer.count() == 0
        try:
            for record in sorted(records, key=lambda r: int(r.get("id", 0))):
                args = {
                    "category": record["category"],
                    "tags": record.get("tags") or None,
                    "scope": record.get("scope", "/"),
                    "author": record.get("author"),
                }
                if layer.find(record["content"], category=args["category"], scope=args["scope"]) is not None:
                    continue
                if keep_ids and record.get("id") is not None:
                    layer.next_id_at_least(int(record["id"]))
                before = layer.count()
                for stamp in dict.fromkeys((record.get("created_at"), record.get("updated_at"))):
                    if stamp is not None and saved is not None:
                        layer.clock = lambda stamp=float(stamp): stamp
                    layer.add(record["content"], **args)
                added += int(layer.count()) - int(before)
        finally:
            if saved is not None:
                layer.clock = saved
        self.after_write()
        return added
