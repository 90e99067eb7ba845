"""Test doubles. Production code never uses these: a fake embedder only makes unit tests fast."""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from memstrata.storage._embedder_identity import ModelIdentity

_WORDS = re.compile(r"\w+")


class FakeEmbedder(ModelIdentity):
    """Deterministic bag-of-words embedder: texts sharing words have similar vectors.

    Counts calls and texts so tests can prove what was (not) embedded.
    """

    def __init__(self, dim: int = 64, model_id: str = "fake-bow") -> None:
        self._dim = dim
        self._model_id = model_id
        self.calls = 0
        self.texts_embedded = 0
        self._lock = threading.Lock()

    def _vector(self, text: str) -> npt.NDArray[np.float32]:
        vec = np.zeros(self._dim, dtype=np.float32)
        for word in _WORDS.findall(text.lower()):
            digest = hashlib.blake2b(word.encode("utf-8", "replace"), digest_size=8).digest()
            index = int.from_bytes(digest[:4], "little") % self._dim
            sign = 1.0 if digest[4] & 1 else -1.0
            vec[index] += sign
        if not vec.any():
            vec[0] = 1.0
        return vec / np.linalg.norm(vec)

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        with self._lock:
            self.calls += 1
            self.texts_embedded += len(texts)
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        return np.stack([self._vector(t) for t in texts])

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        with self._lock:
            self.calls += 1
        return self._vector(text)


class BreakableEmbedder(FakeEmbedder):
    """A fake model that fails with "model crashed" while ``broken``: its document calls, and its
    query calls too with ``queries``."""

    def __init__(self, *, broken: bool = False, queries: bool = False) -> None:
        super().__init__()
        self.broken = broken
        self._queries = queries

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if self.broken:
            raise RuntimeError("model crashed")
        return super().embed_documents(texts)

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        if self.broken and self._queries:
            raise RuntimeError("model crashed")
        return super().embed_query(text)
