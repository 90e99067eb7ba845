"""The ``Embedder`` protocol every model (and the actors' shared service) satisfies, and the
helpers every embedder uses: the text hash that keys cached vectors, L2 normalisation.

The smallest module of the embedding family, so that stores, caches and models can all name an
embedder without loading any model code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from ._array_types import FloatArray
from ._embedder_identity import ModelIdentity

__all__ = ["Embedder", "ModelIdentity", "text_hash"]


@runtime_checkable
class Embedder(Protocol):
    """Turns text into L2-normalised float32 vectors."""

    @property
    def model_id(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        """``(len(texts), dim)`` float32, rows L2-normalised."""
        ...

    def embed_query(self, text: str) -> FloatArray:
        """``(dim,)`` float32, L2-normalised."""
        ...


def text_hash(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def _normalise(array: FloatArray) -> FloatArray:
    norms = np.linalg.norm(array, axis=-1, keepdims=True)
    norms[norms == 0] = 1.0
    unit: FloatArray = (array / norms).astype(np.float32, copy=False)
    return unit
