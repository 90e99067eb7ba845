"""The per-agent store actors: long-term knowledge, episodic memory and working memory.

Each one owns one layer object, opened in its own thread (so the layer's SQLite connection is
confined to that thread), and turns messages into method calls on it: the stores waiting in its
mailbox into one ``add_many`` / ``record_many`` call (group commit, see :class:`MemoryActor`).
Nothing else: the layers hold the logic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from memstrata.layers._knowledge import EMBED_CHARS  # what a knowledge entry's vector is made of
from memstrata.storage import Embedder, embed_documents

from memstrata.config import Config
from memstrata.errors import EmbeddingError, InvalidInputError
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

FloatArray = npt.NDArray[np.float32]

__all__ = [
    "EpisodicActor",
    "KnowledgeStoreActor",
    "LayerStores",
    "StoreFactory",
    "WorkingMemoryActor",
    "WriteBackEpisode",
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
class WriteBackEpisode:
    """Internal: the episode of a write-back.

    It is embedded by its content alone, the text its knowledge entry is embedded by, so the
    embedding service computes one vector for both. ``once``: record it unless the same episode
    of the same task run already exists (a replay after a crash, so a write-back committed just
    before the crash is not recorded twice).
    """

    message: StoreMemory
    once: bool = False


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

    def batch_key(self, message: Any) -> str | None:
        return "store" if isinstance(message, StoreKnowledge) else None

    def handle_batch(self, messages: list[Any]) -> list[Any]:
        """Queued stores in one ``add_many``: one transaction, one embedding request."""
        results: list[Any] = [None] * len(messages)
        items: list[dict[str, Any]] = []
        where: list[int] = []
        for index, message in enumerate(messages):
            try:
                self._check_size(message.content, "StoreKnowledge.content")
            except InvalidInputError as exc:
                results[index] = exc
                continue
            where.append(index)
            items.append(
                {
                    "content": message.content,
                    "category": message.category,
                    "tags": message.tags,
                    "scope": message.scope,
                    "author": message.author,
                }
            )
        if items:
            ids = self.layer.add_many(items)
            for index, entry_id in zip(where, ids, strict=True):
                results[index] = KnowledgeStored(self.key, int(entry_id))
        return results

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

    def batch_key(self, message: Any) -> str | None:
        if isinstance(message, StoreMemory) or (isinstance(message, WriteBackEpisode) and not message.once):
            return "store"
        return None

    def _shared_vectors(self, messages: Sequence[StoreMemory]) -> list[FloatArray | None]:
        """Vectors of write-back episodes: their content through the shared embedding service,
        which computes each text once for the knowledge entry and the episode. ``None`` where
        the layer embeds by itself (another embedder, keyword-only, or the model failed)."""
        embedder: Embedder | None = self.runtime.embedder
        own: object = getattr(self.layer, "embedder", None)
        if not messages or embedder is None or own is not embedder:
            return [None] * len(messages)
        try:
            array = embed_documents(embedder, [m.content[:EMBED_CHARS] for m in messages])
        except EmbeddingError:
            return [None] * len(messages)  # the layer tries again and keeps the episode either way
        return list(array)

    def _item(self, message: StoreMemory, vector: FloatArray | None) -> dict[str, Any]:
        item: dict[str, Any] = {
            "content": message.content,
            "title": message.title,
            "task_run_id": message.task_run_id,
            "tags": message.tags,
            "kind": message.kind,
            "at": message.at or self.runtime.clock.now(),
        }
        if vector is not None:
            item["vector"] = vector
        return item

    def handle_batch(self, messages: list[Any]) -> list[Any]:
        """Queued episodes in one ``record_many``: one transaction, one embedding request."""
        results: list[Any] = [None] * len(messages)
        plain: list[tuple[int, StoreMemory]] = []
        shared: list[tuple[int, StoreMemory]] = []
        for index, message in enumerate(messages):
            original = message.message if isinstance(message, WriteBackEpisode) else message
            try:
                self._check_size(original.content, "StoreMemory.content")
            except InvalidInputError as exc:
                results[index] = exc
                continue
            (shared if isinstance(message, WriteBackEpisode) else plain).append((index, original))
        vectors = self._shared_vectors([m for _, m in shared])
        order = [*plain, *shared]
        items = [self._item(m, None) for _, m in plain]
        items += [self._item(m, v) for (_, m), v in zip(shared, vectors, strict=True)]
        if items:
            ids = self.layer.record_many(items)
            for (index, _), episode_id in zip(order, ids, strict=True):
                results[index] = MemoryStored(self.key, int(episode_id))
        return results

    def handle(self, message: Any) -> Any:
        layer = self.layer
        if isinstance(message, WriteBackEpisode):
            original = message.message
            if message.once:
                for episode in layer.timeline(task_run_id=original.task_run_id, limit=10_000):
                    if episode.content == original.content and episode.title == original.title:
                        return MemoryStored(self.key, int(episode.id))
            self._check_size(original.content, "StoreMemory.content")
            vector = self._shared_vectors([original])[0]
            episode_id = layer.record_many([self._item(original, vector)])[0]
            return MemoryStored(self.key, int(episode_id))
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
