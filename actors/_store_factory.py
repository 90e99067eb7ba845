"""How store actors open their layers: the real layers, or a test's own factory that injects faults."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from memstrata.core.config import Config
from memstrata.storage import Embedder

from ._embedding import BatchingEmbedder

__all__ = ["LayerStores", "StoreFactory"]


class StoreFactory(Protocol):
    """Opens the persistent layers; tests pass their own to inject faults.

    ``embedder`` is the agent's embedding service (the shared one unless its
    ``[agents.<id>.embedding]`` names another), or ``None`` when no model could be loaded (the
    layers then run keyword-only and say so in their status).
    """

    def open_knowledge(self, path: Path, embedder: Embedder | None, config: Config) -> Any: ...

    def open_episodic(
        self, path: Path, embedder: Embedder | None, config: Config, clock: Callable[[], datetime]
    ) -> Any: ...


class LayerStores:
    """The real layers: :class:`KnowledgeStore` and :class:`EpisodicMemory`, opened with their
    vectors deferred when the embedder is the shared service (the actor computes them apart,
    so neither a write nor the open waits for the model)."""

    def open_knowledge(self, path: Path, embedder: Embedder | None, config: Config) -> Any:
        from memstrata.layers import KnowledgeStore

        defer = isinstance(embedder, BatchingEmbedder)
        return KnowledgeStore.open(path, embedder, config=config, defer_vectors=defer)

    def open_episodic(
        self, path: Path, embedder: Embedder | None, config: Config, clock: Callable[[], datetime]
    ) -> Any:
        from memstrata.layers import EpisodicMemory

        defer = isinstance(embedder, BatchingEmbedder)
        return EpisodicMemory.open(path, embedder, config=config, clock=clock, defer_vectors=defer)
