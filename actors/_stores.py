"""The per-agent store actors: long-term knowledge, episodic memory and working memory.

Each one owns one layer object, opened in its own thread (so the layer's SQLite connection is
confined to that thread), and turns messages into method calls on it. Nothing else: the layers
hold the logic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from memstrata.storage import Embedder

from memstrata.config import Config
from memstrata.errors import InvalidInputError
from memstrata.messages import (
    ClearWorkingMemory,
    CommitMemory,
    DeleteKnowledge,
    GetKnowledge,
    GetWorkingMemory,
    KnowledgeDeleted,
    KnowledgeItem,
    KnowledgeList,
    KnowledgeResult,
    KnowledgeStored,
    ListKnowledge,
    MemoryCommitted,
    MemorySearchResult,
    MemoryStored,
    QueryKnowledge,
    SearchMemory,
    SetWorkingMemory,
    StoreKnowledge,
    StoreMemory,
    WorkingMemoryCleared,
    WorkingMemoryValue,
)

from ._base import MemoryActor

__all__ = [
    "EpisodicActor",
    "KnowledgeStoreActor",
    "LayerStores",
    "StoreFactory",
    "StoreMemoryOnce",
    "WorkingMemoryActor",
]


class StoreFactory(Protocol):
    """Opens the persistent layers; tests pass their own to inject faults.

    ``embedder`` is the shared embedding service, or ``None`` when no model could be loaded (the
    layers then run keyword-only and say so in their status).
    """

    def open_knowledge(self, path: Path, embedder: Embedder | None, config: Config) -> Any: ...

    def open_episodic(
        self, path: Path, embedder: Embedder | None, config: Config, clock: Callable[[], datetime]
    ) -> Any: ...


class LayerStores:
    """The real layers: :class:`KnowledgeStore` and :class:`EpisodicMemory`."""

    def open_knowledge(self, path: Path, embedder: Embedder | None, config: Config) -> Any:
        from memstrata.layers import KnowledgeStore

        return KnowledgeStore.open(path, embedder, config=config)

    def open_episodic(
        self, path: Path, embedder: Embedder | None, config: Config, clock: Callable[[], datetime]
    ) -> Any:
        from memstrata.layers import EpisodicMemory

        return EpisodicMemory.open(path, embedder, config=config, clock=clock)


@dataclass(frozen=True, slots=True)
class StoreMemoryOnce:
    """Internal: record ``message`` unless the same episode of the same task run already exists.

    Used when an outbox entry is replayed after a crash, so a write-back that was committed just
    before the crash is not recorded twice.
    """

    message: StoreMemory


def _content_bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


class _PersistentActor(MemoryActor):
    def _check_size(self, text: str, what: str) -> None:
        limit = self.runtime.config.max_content_bytes
        if _content_bytes(text) > limit:
            raise InvalidInputError(
                f"{what} is {_content_bytes(text)} bytes, more than max_content_bytes={limit}"
            )

    def status(self) -> dict[str, Any]:
        base = super().status()
        layer = self.layer
        if layer is not None:
            base["count"] = int(layer.count())
            layer_status = getattr(layer, "status", None)
            if callable(layer_status):
                base["store"] = layer_status()
        return base


class KnowledgeStoreActor(_PersistentActor):
    """``knowledge/{agent}.sqlite`` (or ``knowledge/shared.sqlite``) behind a mailbox."""

    kind = "knowledge"

    def open_layer(self) -> Any:
        runtime = self.runtime
        return runtime.stores.open_knowledge(
            runtime.path("knowledge", self.key), runtime.embedder, runtime.config
        )

    def handle(self, message: Any) -> Any:
        layer = self.layer
        if isinstance(message, StoreKnowledge):
            self._check_size(message.content, "StoreKnowledge.content")
            entry_id = layer.add(
                message.content,
                category=message.category,
                tags=message.tags,
                scope=message.scope,
                author=message.author,
            )
            return KnowledgeStored(self.key, int(entry_id))
        if isinstance(message, QueryKnowledge):
            hits = layer.search(
                message.query,
                top_k=message.top_k,
                mode=message.mode,
                category=message.category,
                tags=message.tags,
                scope=message.scope,
                min_score=message.min_score,
            )
            return KnowledgeResult(self.key, tuple(hits))
        if isinstance(message, ListKnowledge):
            entries = layer.list(
                category=message.category,
                tags=message.tags,
                scope=message.scope,
                limit=message.limit,
                offset=message.offset,
            )
            return KnowledgeList(self.key, tuple(entries))
        if isinstance(message, GetKnowledge):
            return KnowledgeItem(self.key, layer.get(message.entry_id))
        if isinstance(message, DeleteKnowledge):
            return KnowledgeDeleted(self.key, message.entry_id, bool(layer.delete(message.entry_id)))
        return super().handle(message)


class EpisodicActor(_PersistentActor):
    """``episodic/{agent}.sqlite`` behind a mailbox; committed before it closes."""

    kind = "episodic"

    def open_layer(self) -> Any:
        runtime = self.runtime
        return runtime.stores.open_episodic(
            runtime.path("episodic", self.key), runtime.embedder, runtime.config, runtime.clock.now
        )

    def close_layer(self, layer: Any) -> None:
        try:
            layer.commit()
        finally:
            layer.close()

    def handle(self, message: Any) -> Any:
        layer = self.layer
        if isinstance(message, StoreMemoryOnce):
            original = message.message
            for episode in layer.timeline(task_run_id=original.task_run_id, limit=10_000):
                if episode.content == original.content and episode.title == original.title:
                    return MemoryStored(self.key, int(episode.id))
            message = original
        if isinstance(message, StoreMemory):
            self._check_size(message.content, "StoreMemory.content")
            episode_id = layer.record(
                message.content,
                title=message.title,
                task_run_id=message.task_run_id,
                tags=message.tags,
                kind=message.kind,
                at=message.at or self.runtime.clock.now(),
            )
            return MemoryStored(self.key, int(episode_id))
        if isinstance(message, SearchMemory):
            hits = layer.search(
                message.query,
                top_k=message.top_k,
                task_run_id=message.task_run_id,
                since=message.since,
                until=message.until,
            )
            return MemorySearchResult(self.key, message.task_run_id, tuple(hits))
        if isinstance(message, CommitMemory):
            layer.commit()
            return MemoryCommitted(self.key)
        return super().handle(message)


class WorkingMemoryActor(MemoryActor):
    """One agent's working memory (in memory only)."""

    kind = "working"

    def open_layer(self) -> Any:
        from memstrata.layers import WorkingMemory

        return WorkingMemory(
            clock=self.runtime.clock.monotonic, max_value_bytes=self.runtime.config.max_content_bytes
        )

    def close_layer(self, layer: Any) -> None:
        layer.clear()

    def handle(self, message: Any) -> Any:
        layer = self.layer
        if isinstance(message, SetWorkingMemory):
            layer.set(message.key, message.value, ttl_s=message.ttl_s)
            return WorkingMemoryValue(self.key, message.key, layer.get(message.key), True)
        if isinstance(message, GetWorkingMemory):
            found = layer.contains(message.key)
            return WorkingMemoryValue(self.key, message.key, layer.get(message.key) if found else None, found)
        if isinstance(message, ClearWorkingMemory):
            removed = layer.clear() if message.key is None else int(layer.delete(message.key))
            return WorkingMemoryCleared(self.key, removed)
        return super().handle(message)

    def status(self) -> dict[str, Any]:
        base = super().status()
        if self.layer is not None:
            base["count"] = len(self.layer)
        return base
