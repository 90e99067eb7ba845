"""The embedding cache: vectors already computed, keyed by ``(model_id, sha256(text))``, in the
store's own database (so one owner, no locks)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._array_types import FloatArray
from ._connection import Database

__all__ = ["EMBEDDING_CACHE_SQL", "EmbeddingCache"]


EMBEDDING_CACHE_SQL = (
    "CREATE TABLE IF NOT EXISTS embedding_cache ("
    "model_id TEXT NOT NULL, hash BLOB NOT NULL, vector BLOB NOT NULL, PRIMARY KEY (model_id, hash)"
    ") WITHOUT ROWID"
)


class EmbeddingCache:
    """Vectors already computed, in the store's own database (so one owner, no locks)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        db.execute(EMBEDDING_CACHE_SQL)

    def lookup(self, model_id: str, hashes: Sequence[bytes]) -> dict[bytes, FloatArray]:
        found: dict[bytes, FloatArray] = {}
        unique = list(dict.fromkeys(hashes))
        for start in range(0, len(unique), 500):
            batch = unique[start : start + 500]
            marks = ",".join("?" for _ in batch)
            for h, blob in self.db.query(
                f"SELECT hash, vector FROM embedding_cache WHERE model_id = ? AND hash IN ({marks})",
                [model_id, *batch],
            ):
                found[bytes(h)] = np.frombuffer(blob, dtype=np.float32)
        return found

    def store(self, model_id: str, items: Sequence[tuple[bytes, FloatArray]]) -> None:
        if items:
            with self.db.transaction():
                self.db.executemany(
                    "INSERT OR REPLACE INTO embedding_cache(model_id, hash, vector) VALUES (?, ?, ?)",
                    [(model_id, h, np.asarray(v, dtype=np.float32).tobytes()) for h, v in items],
                )

    def clear(self, model_id: str | None = None) -> None:
        with self.db.transaction():
            if model_id is None:
                self.db.execute("DELETE FROM embedding_cache")
            else:
                self.db.execute("DELETE FROM embedding_cache WHERE model_id = ?", (model_id,))
