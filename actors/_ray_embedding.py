"""One embedding service per Ray node, shared by every host on that node.

A model is the largest thing a host would load; loading one per agent would multiply it by the
agents on a node. :class:`NodeEmbedder` (named ``embedder:{node id}``, pinned to its node) holds
the model behind a :class:`BatchingEmbedder`, so concurrent requests from the node's hosts are
batched together; each host reaches it through :class:`RemoteEmbedder`, an ``Embedder``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import ray
from memstrata.core.config import Config
from memstrata.core.errors import EmbedderUnavailableError, EmbeddingError
from memstrata.storage import Embedder, load_embedder

from ._embedding import BatchingEmbedder

__all__ = ["NodeEmbedder", "RemoteEmbedder"]

log = logging.getLogger("memstrata.actors")


@ray.remote
class NodeEmbedder:
    """The node's model (``model`` if given, else the configured one; none: keyword-only)."""

    def __init__(self, config: Config, model: Embedder | None) -> None:
        inner = model
        if inner is None:
            name = config.embedding.model
            try:
                inner = load_embedder(
                    None if name in ("", "default") else name,
                    dim=config.embedding.dim,
                    threads=config.embedding.threads,
                )
            except EmbedderUnavailableError as exc:
                log.warning("the node's embedder runs KEYWORD-ONLY: %s", exc)
        self.service = (
            None
            if inner is None
            else BatchingEmbedder(
                inner,
                batch_size=config.embedding.batch_size,
                max_batch_wait_ms=config.embedding.max_batch_wait_ms,
                call_timeout_s=config.actors.embed_timeout_s,
            )
        )

    def info(self) -> tuple[str, int] | None:
        return None if self.service is None else (self.service.model_id, self.service.dim)

    def embed_documents(self, texts: list[str]) -> Any:
        assert self.service is not None
        return self.service.embed_documents(texts)

    def embed_query(self, text: str) -> Any:
        assert self.service is not None
        return self.service.embed_query(text)


class RemoteEmbedder:
    """An ``Embedder`` that asks the node's :class:`NodeEmbedder`, bounded by ``timeout_s``."""

    def __init__(self, service: Any, model_id: str, dim: int, timeout_s: float) -> None:
        self._service = service
        self._model_id = model_id
        self._dim = dim
        self._timeout_s = timeout_s

    @classmethod
    def connect(cls, service: Any, timeout_s: float) -> RemoteEmbedder | None:
        info = ray.get(service.info.remote(), timeout=max(60.0, timeout_s))
        return None if info is None else cls(service, info[0], int(info[1]), timeout_s)

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def dim(self) -> int:
        return self._dim

    def _get(self, pending: Any) -> Any:
        try:
            return ray.get(pending, timeout=self._timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            raise EmbeddingError(f"the node's embedder did not answer within {self._timeout_s:g} s") from exc

    def embed_documents(self, texts: Sequence[str]) -> Any:
        return np.asarray(self._get(self._service.embed_documents.remote(list(texts))), dtype=np.float32)

    def embed_query(self, text: str) -> Any:
        return np.asarray(self._get(self._service.embed_query.remote(text)), dtype=np.float32)
