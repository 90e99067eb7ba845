"""The runtime's embedding services, one per distinct agent [embedding] setting: apart from actor plumbing."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from memstrata.core.config import Config, EmbeddingConfig
from memstrata.core.errors import SystemStoppedError
from memstrata.storage import Embedder, load_embedder

from ._embedding import BatchingEmbedder
from .messages import SHARED

__all__ = ["EmbeddingServices", "ModelLoader", "load_model"]

# loads the model an ``[embedding]`` section names (an agent's override); tests pass their own
ModelLoader = Callable[[EmbeddingConfig], Embedder]

log = logging.getLogger("memstrata.actors")


def load_model(settings: EmbeddingConfig) -> Embedder:
    """The model an ``[embedding]`` section names (``default``: the packaged one)."""
    model = settings.model
    return load_embedder(
        None if model in ("", "default") else model, dim=settings.dim, threads=settings.threads
    )


def _model_key(settings: EmbeddingConfig) -> tuple[Any, ...]:
    """What makes two ``[embedding]`` sections the same model."""
    model = "default" if settings.model in ("", "default") else settings.model
    return (model, settings.dim, settings.threads)


def _service_key(settings: EmbeddingConfig) -> tuple[Any, ...]:
    """What makes two ``[embedding]`` sections the same embedding service (model and batching)."""
    return (*_model_key(settings), settings.batch_size, settings.max_batch_wait_ms)


class EmbeddingServices:
    """The embedding part of :class:`Runtime`: which service each agent's stores and queries use."""

    config: Config
    embedder: Embedder | None
    embedder_note: str | None
    _model_loader: ModelLoader
    _services: dict[tuple[Any, ...], tuple[BatchingEmbedder | None, str | None]]
    _services_lock: threading.Lock
    _stopped: threading.Event

    def embedding_of(self, agent_id: str) -> tuple[Embedder | None, str | None]:
        """The embedding service of an agent's stores, workspace and queries, and why it is
        ``None`` (keyword-only). The shared service unless ``[agents.<id>.embedding]`` names
        another setting; then one service per distinct setting, shared by every agent with it,
        made on first use. The shared store always uses the shared one, and so does an agent
        whose setting names the shared model when that could not be loaded."""
        shared = self.embedder, None if self.embedder is not None else (self.embedder_note or "keyword-only")
        settings = self.embedding_settings(agent_id)
        key = _service_key(settings)
        if key == _service_key(self.config.embedding):
            return shared
        if self.embedder is None and _model_key(settings) == _model_key(self.config.embedding):
            return shared
        with self._services_lock:
            made = self._services.get(key)
            if made is None:
                if self._stopped.is_set():
                    raise SystemStoppedError("the memory system is stopped")
                made = self._services[key] = self._new_service(settings)
        return made

    def embedding_settings(self, agent_id: str) -> EmbeddingConfig:
        """The ``[embedding]`` section an agent's stores use: its own, else the system's (always
        the system's for the shared store)."""
        settings = self.config.agent_sections.get(agent_id, {}).get("embedding")
        if agent_id == SHARED or not isinstance(settings, EmbeddingConfig):
            return self.config.embedding
        return settings

    def embedder_for(self, agent_id: str) -> Embedder | None:
        """:meth:`embedding_of` without the reason."""
        return self.embedding_of(agent_id)[0]

    def one_model(self, first: str, second: str) -> bool:
        """Whether the two agents' (or ``shared``'s) stores embed with one model, so that the
        similarities of their hits compare (also when either runs keyword-only)."""
        a, b = self.embedder_for(first), self.embedder_for(second)
        return a is None or b is None or a.model_id == b.model_id

    def _new_service(self, settings: EmbeddingConfig) -> tuple[BatchingEmbedder | None, str | None]:
        """A batching service for ``settings``: around the shared model when only the batching
        differs, else around the model loaded for it (none: keyword-only, with the reason)."""
        inner: Embedder | None = None
        if _model_key(settings) == _model_key(self.config.embedding):
            shared = self.embedder
            inner = shared.inner if isinstance(shared, BatchingEmbedder) else shared
        if inner is None:
            try:
                inner = self._model_loader(settings)
            except Exception as exc:  # EmbedderUnavailableError, or a loader's own fault
                log.warning("embedding model %r could not be loaded: %s", settings.model, exc)
                return None, f"keyword-only: embedding model {settings.model!r} could not be loaded ({exc})"
        service = BatchingEmbedder(
            inner,
            batch_size=settings.batch_size,
            max_batch_wait_ms=settings.max_batch_wait_ms,
            call_timeout_s=self.config.actors.embed_timeout_s,
        )
        return service, None

    def embedding_services(self) -> list[tuple[tuple[str, ...], Embedder | None, str | None]]:
        """Each embedding service with the agents configured to use it (the shared one first,
        its agents not listed) and, for one that could not be made, why."""
        found: list[tuple[tuple[str, ...], Embedder | None, str | None]] = [
            ((), self.embedder, self.embedder_note)
        ]
        with self._services_lock:
            services = dict(self._services)
        for key, (service, note) in services.items():
            agents = tuple(
                sorted(
                    agent_id
                    for agent_id, sections in self.config.agent_sections.items()
                    if isinstance(sections.get("embedding"), EmbeddingConfig)
                    and _service_key(sections["embedding"]) == key
                )
            )
            found.append((agents, service, note))
        return found
