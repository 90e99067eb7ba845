"""What the knowledge and episodic stores share: one SQLite connection with what is derived from
its rows and kept in step with them (the model's vectors, the keyword index, the embedding
cache), the open's consistency check, and the transaction that batches writes. Each store sets
up its vectors and starts its check its own way."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from memstrata.core.errors import StorageError
from memstrata.storage import (
    Database,
    Embedder,
    EmbeddingCache,
    KeywordIndex,
    KeywordTable,
    OpenCheck,
    VectorIndex,
)

__all__ = ["IndexedStore"]


class IndexedStore:
    """A store's connection, model and derived indexes (a base of ``KnowledgeStore`` and
    ``EpisodicMemory``)."""

    _noun: ClassVar[str]  # how errors name the store ("knowledge store", "episodic memory")
    _open_check: OpenCheck | None = None  # the open's consistency check (storage.OpenCheck)

    def __init__(
        self, db: Database, embedder: Embedder | None, keywords: KeywordTable, *, defer_vectors: bool
    ) -> None:
        self._db = db
        self._embedder = embedder
        # writes leave new vectors pending for the owner to compute apart (see pending_texts)
        self.defer_vectors = defer_vectors
        self._vectors: VectorIndex | None = None  # set up by each store for its model
        self._cache = EmbeddingCache(db)
        # the store's keyword ranker (storage.KeywordIndex), told of every write made here
        self._keywords = KeywordIndex(db, keywords)
        self._last_error: str | None = None  # the model's last failure, kept for status()
        self._closed = False

    @property
    def path(self) -> Path:
        return self._db.path

    @property
    def embedder(self) -> Embedder | None:
        return self._embedder

    def _open_db(self) -> Database:
        """The connection, once the open's check is settled; a closed store raises."""
        if self._closed:
            raise StorageError(f"{self._noun} {self.path} is closed")
        if self._open_check is not None:
            self._open_check.settle()
        return self._db

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """One transaction around several writes (``add_many`` or ``record_many``,
        ``store_vectors``, ...): all of them are committed together, or none is (each still
        fails alone inside it)."""
        with self._open_db().transaction():
            yield
