"""One embedding service per Ray node, shared by every host on that node.

A model is the largest thing a host would load; loading one per agent would multiply it by the
agents on a node. :class:`NodeEmbedder` (named ``embedder:{node id}``, pinned to its node) holds
the model behind a :class:`BatchingEmbedder`, so concurrent requests from the node's hosts are
batched together; each host reaches it through :class:`RemoteEmbedder`, an ``Embedder``. An
agent whose ``[agents.<id>.embedding]`` names another model uses that model's embedder on its
node (``embedder:{node id}:{digest}``): one per node per distinct model, never one per agent.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from memstrata.core.config import Config, EmbeddingConfig
from memstrata.core.errors import EmbeddingError, MemstrataError
from memstrata.storage import Embedder
from memstrata.storage._embedder_identity import ModelIdentity

from ._embedding import BatchingEmbedder
from ._embedding_services import ModelLoader, load_model
from ._ray_connect import carried, one_line

__all__ = ["NodeEmbedder", "RemoteEmbedder", "embedder_name", "node_embedder"]

_EMBEDDER_CONCURRENCY = 32  # threads of a node's embedder (its batching service merges their texts)

log = logging.getLogger("memstrata.actors")


@ray.remote
class NodeEmbedder:
    """One model of the node: ``model`` if given, else the one ``settings`` names, loaded by
    ``loader`` (none loadable: keyword-only, and :meth:`info` says why)."""

    def __init__(
        self,
        settings: EmbeddingConfig,
        embed_timeout_s: float,
        model: Embedder | None,
        loader: ModelLoader | None = None,
    ) -> None:
        inner = model
        self.note: str | None = None
        if inner is None:
            try:
                inner = (loader or load_model)(settings)
            except Exception as exc:  # EmbedderUnavailableError, or a loader's own fault
                self.note = str(exc)
                log.warning("the node's embedder for %r runs KEYWORD-ONLY: %s", settings.model, exc)
        self.service = (
            None
            if inner is None
            else BatchingEmbedder(
                inner,
                batch_size=settings.batch_size,
                max_batch_wait_ms=settings.max_batch_wait_ms,
                call_timeout_s=embed_timeout_s,
            )
        )

    def info(self) -> tuple[str, int] | str:
        """The model's id and dimension, or why there is none."""
        if self.service is None:
            return self.note or "no embedding model"
        return self.service.model_id, self.service.dim

    def where(self) -> tuple[str, int]:
        """The node id and process id of this embedder."""
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def embed_documents(self, texts: list[str]) -> Any:
        assert self.service is not None
        return self.service.embed_documents(texts)

    def embed_query(self, text: str) -> Any:
        assert self.service is not None
        return self.service.embed_query(text)


def embedder_name(node: str, settings: EmbeddingConfig, system: EmbeddingConfig) -> str:
    """``embedder:{node}`` for the system's model, ``embedder:{node}:{digest}`` for another one:
    one actor per node per distinct model (model, dimension, threads)."""
    key = (settings.model or "default", settings.dim, settings.threads)
    if key == (system.model or "default", system.dim, system.threads):
        return f"embedder:{node}"
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:12]
    return f"embedder:{node}:{digest}"


class RemoteEmbedder(ModelIdentity):
    """An ``Embedder`` that asks the node's :class:`NodeEmbedder`, bounded by ``timeout_s``."""

    def __init__(self, service: Any, model_id: str, dim: int, timeout_s: float) -> None:
        self._service = service
        self._model_id = model_id
        self._dim = dim
        self._timeout_s = timeout_s

    @classmethod
    def connect(cls, service: Any, timeout_s: float) -> tuple[RemoteEmbedder | None, str | None]:
        """The embedder for ``service``, or ``None`` and why (the node has no such model)."""
        info = ray.get(service.info.remote(), timeout=max(60.0, timeout_s))
        if isinstance(info, str):
            return None, info
        return cls(service, info[0], int(info[1]), timeout_s), None

    def _get(self, pending: Any) -> Any:
        """The node embedder's answer; its failure as the error the model raised there (a
        memstrata error crosses as it is), never Ray's wrapper with the remote traceback."""
        try:
            return ray.get(pending, timeout=self._timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            raise EmbeddingError(f"the node's embedder did not answer within {self._timeout_s:g} s") from exc
        except ray.exceptions.RayError as exc:
            cause = carried(exc)
            if isinstance(cause, MemstrataError):
                raise cause from None
            raise EmbeddingError(f"the node's embedder failed: {one_line(exc)}") from None

    def embed_documents(self, texts: Sequence[str]) -> Any:
        return np.asarray(self._get(self._service.embed_documents.remote(list(texts))), dtype=np.float32)

    def embed_query(self, text: str) -> Any:
        return np.asarray(self._get(self._service.embed_query.remote(text)), dtype=np.float32)


def node_embedder(
    config: Config,
    node: str,
    settings: EmbeddingConfig,
    model: Embedder | None,
    loader: ModelLoader | None,
) -> tuple[BatchingEmbedder | None, str | None]:
    """The node's embedding service for ``settings``' model (one per node per distinct model,
    shared by the node's hosts), batched in this process too; ``None`` and why without a model."""
    service = NodeEmbedder.options(  # type: ignore[attr-defined]
        name=embedder_name(node, settings, config.embedding),
        namespace=config.cluster.namespace,
        get_if_exists=True,
        lifetime="detached",
        max_restarts=-1,
        max_concurrency=_EMBEDDER_CONCURRENCY,
        num_cpus=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
    ).remote(settings, config.actors.embed_timeout_s, model, loader)
    remote, note = RemoteEmbedder.connect(service, config.actors.embed_timeout_s)
    if remote is None:
        return None, note
    return BatchingEmbedder(
        remote,
        batch_size=settings.batch_size,
        max_batch_wait_ms=settings.max_batch_wait_ms,
        call_timeout_s=config.actors.embed_timeout_s,
    ), None
