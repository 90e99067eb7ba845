"""What the store actors share (factory, internal messages, persistent base), so each actor has a module.

The per-agent store actors: long-term knowledge, episodic memory and working memory.

Each store actor owns one layer object, opened in its own thread (so the layer's SQLite connection is
confined to that thread), and turns messages into method calls on it: the stores waiting in its
mailbox into one ``add_many`` / ``record_many`` call (group commit, see :class:`MemoryActor`).
Nothing else: the layers hold the logic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from memstrata.core.config import Config
from memstrata.core.errors import InvalidInputError
from memstrata.core.validation import check_content
from memstrata.storage import Embedder
from memstrata.storage._embedding import embed_deadline, embed_time_left

from ._base import ActorRuntime, MemoryActor
from .messages import (
    QueryKnowledge,
    SearchMemory,
    StoreMemory,
)

FloatArray = npt.NDArray[np.float32]

__all__ = [
    "BoundedSearch",
    "CatchUp",
    "ExportRecords",
    "ImportRecords",
    "LayerStores",
    "Searched",
    "StoreFactory",
    "WriteBackEpisode",
]


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


@dataclass(frozen=True, slots=True)
class BoundedSearch:
    """Internal: a ``QueryKnowledge`` or ``SearchMemory`` whose query embedding must answer within
    ``embed_s`` seconds (``None``: ``actors.query_embed_timeout_s``); answered with :class:`Searched`."""

    message: Any
    embed_s: float | None = None


@dataclass(frozen=True, slots=True)
class Searched:
    """Internal: a search's result and, when it ranked by keywords only because the model was
    late or faulty, why (``"keyword-only: model ... did not answer within 2 s"``)."""

    result: Any
    degraded: str | None = None


@dataclass(frozen=True, slots=True)
class ExportRecords:
    """Internal: every record the actor's store holds, as plain JSON-ready dicts (see
    ``memstrata export``), answered as a list."""


@dataclass(frozen=True, slots=True)
class ImportRecords:
    """Internal: restore records made by :class:`ExportRecords` (of this actor's kind) with
    their times and ids; answered with how many were added."""

    records: tuple[dict[str, Any], ...]


_EXPORT_PAGE = 1000


def _iso(value: datetime) -> str:
    return value.isoformat()


@dataclass(frozen=True, slots=True)
class CatchUp:
    """Internal: compute pending vectors now (posted by a timer, with backoff, while some wait)."""


_CATCH_UP_FIRST_S = 0.25  # first retry of pending vectors after a write left some
_CATCH_UP_MAX_S = 30.0  # backoff cap while the model stays faulty


def _layer_config(runtime: ActorRuntime, key: str) -> Config:
    """The config a store of ``key`` opens with: the system's, with the agent's ``[embedding]``,
    the model a store left keyword-only (its model could not be loaded) tries again."""
    settings = runtime.embedding_settings(key)
    config = runtime.config
    return config if settings == config.embedding else replace(config, embedding=settings)


class _PersistentActor(MemoryActor):
    """A store with vectors: searches bound their query embedding, and vectors left pending by a
    late or faulty model are retried in this process with backoff until they are all computed."""

    _catch_up_due = False
    _catch_up_misses = 0

    def _search(self, message: Any, embed_s: float | None) -> Searched:
        limit = self.runtime.config.actors.query_embed_timeout_s
        if embed_s is not None:
            limit = min(limit, max(0.0, embed_s))
        with embed_deadline(limit) as watch:
            result = self.handle(message)
        return Searched(result, watch.degraded)

    def pending_vectors(self) -> int:
        counter = getattr(self.layer, "pending_vectors", None)
        try:
            return int(counter()) if callable(counter) else 0
        except Exception:  # a closed or failing layer: the next write schedules again
            return 0

    def after_write(self) -> None:
        """A write may have left vectors pending (the model was late or faulty): retry soon."""
        if not self._catch_up_due and self.pending_vectors() > 0:
            self._schedule_catch_up()

    def _schedule_catch_up(self) -> None:
        delay = min(_CATCH_UP_MAX_S, _CATCH_UP_FIRST_S * 2**self._catch_up_misses)
        self._catch_up_due = True
        runtime, me = self.runtime, self.actor_ref

        def fire() -> None:
            if not runtime.stopped:
                runtime.post(me, CatchUp())

        runtime.scheduler.call_later(delay, fire)

    def catch_up(self) -> None:
        self._catch_up_due = False
        catch = getattr(self.layer, "catch_up_vectors", None)
        if not callable(catch):
            return
        before = self.pending_vectors()
        left = int(catch())
        if left == 0:
            self._catch_up_misses = 0
            return
        self._catch_up_misses = 0 if left < before else min(self._catch_up_misses + 1, 16)
        self._schedule_catch_up()

    def handle_internal(self, message: Any) -> tuple[bool, Any]:
        """Internal messages common to both stores, and a search's bound on its query embedding:
        ``(True, answer)``, or ``(False, None)`` for the store's own messages."""
        if isinstance(message, QueryKnowledge | SearchMemory) and embed_time_left() is None:
            return True, self._search(message, None).result
        if isinstance(message, BoundedSearch):
            return True, self._search(message.message, message.embed_s)
        if isinstance(message, CatchUp):
            self.catch_up()
            return True, None
        return False, None

    def _refused(self, text: str, what: str) -> InvalidInputError | None:
        """Why the layer would refuse ``text`` (the one rule, :func:`check_content`), so one bad
        message of a batch fails alone and the others still share one transaction. Messages
        handled alone are checked by the layer only."""
        try:
            check_content(text, what, max_bytes=self.runtime.config.max_content_bytes)
        except InvalidInputError as exc:
            return exc
        return None

    def status(self) -> dict[str, Any]:
        base = super().status()
        layer = self.layer
        if layer is not None:
            base["count"] = int(layer.count())
            layer_status = getattr(layer, "status", None)
            if callable(layer_status):
                base["store"] = layer_status()
        return base
