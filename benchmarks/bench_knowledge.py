"""KnowledgeStore: retrieval quality on real text, search latency and bulk-add throughput."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from memstrata.storage import Embedder, EmbeddingCache, open_database, text_hash

FloatArray = npt.NDArray[np.float32]


def _cache_path() -> Path:
    env = os.environ.get("MEMSTRATA_BENCH_CACHE")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("memstrata")) / "bench" / "embeddings.sqlite"


class CachedEmbedder:
    """Wraps a real embedder with a persistent cache, so corpus embeddings are computed once per
    machine (the model is deterministic: cached vectors equal fresh ones)."""

    def __init__(self, inner: Embedder, path: Path | None = None) -> None:
        self.inner = inner
        self.db = open_database(path or _cache_path())
        self.cache = EmbeddingCache(self.db)

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @property
    def dim(self) -> int:
        return self.inner.dim

    def _get(self, kind: str, texts: Sequence[str], compute: object) -> FloatArray:
        key = f"{kind}:{self.inner.model_id}"
        hashes = [text_hash(t) for t in texts]
        known = self.cache.lookup(key, hashes)
        missing = [i for i, h in enumerate(hashes) if h not in known]
        if missing:
            fresh = compute([texts[i] for i in missing])  # type: ignore[operator]
            items = [(hashes[i], fresh[n]) for n, i in enumerate(missing)]
            self.cache.store(key, items)
            known.update(items)
        return np.stack([known[h] for h in hashes]).astype(np.float32)

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._get("doc", texts, self.inner.embed_documents)

    def embed_query(self, text: str) -> FloatArray:
        return self._get("query", [text], lambda ts: [self.inner.embed_query(ts[0])])[0]
