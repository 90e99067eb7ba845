"""Long-term knowledge: what an agent learnt (outcomes, pitfalls, patterns, ...), consulted before
every task with hybrid search.

One store is one SQLite file (``knowledge/{agent}.sqlite`` or ``knowledge/shared.sqlite``).
Entries are plain rows; tags live in a side table so tag filters are SQL; text is indexed by
FTS5 (content, tags, the words inside identifiers) and vectors by sqlite-vec with the category as
a vec0 metadata column, so a category filter is exact inside the KNN. Search fuses the vector and
keyword rankings with weighted Reciprocal Rank Fusion; the weights and depth are measured on real
text (``benchmarks/bench_knowledge.py``), not guessed.

Vectors are derived data: an entry is stored even when embedding fails (its vector is *pending*
and is computed on the next successful write, open or :meth:`KnowledgeStore.reindex`), and when
the embedding model changes, every vector is rebuilt from the stored text before one transaction
swaps the new index in.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Final

from memstrata.core.closing import Closeable
from memstrata.core.config import Config
from memstrata.core.constants import SHARED
from memstrata.core.errors import EmbedderUnavailableError, InvalidInputError
from memstrata.core.validation import check_path
from memstrata.storage import Embedder, get_meta, open_database

from ._knowledge_schema import (
    CATEGORIES,
    MIGRATIONS,
    KnowledgeEntry,
    KnowledgeHit,
    SearchTuning,
    _int_or_none,
)
from ._knowledge_search import KnowledgeSearch

__all__ = ["CATEGORIES", "KnowledgeEntry", "KnowledgeHit", "KnowledgeStore", "SearchTuning"]


class KnowledgeStore(KnowledgeSearch, Closeable):
    """Categorised, tagged, scoped knowledge of one agent (or the shared store), with hybrid search.

    A plain synchronous object that owns its database connection: use it from one thread at a
    time (the actors serialise access). Open it with :meth:`open`; it is a context manager.
    """

    SHARED: Final = SHARED

    @classmethod
    def open(
        cls,
        path: str | Path,
        embedder: Embedder | None = None,
        *,
        config: Config | None = None,
        defer_vectors: bool = False,
    ) -> KnowledgeStore:
        """Open (creating if needed) the store at ``path``.

        ``embedder`` ``None`` loads the configured model (the packaged default unless ``config``
        names another); when no model can be loaded the store runs keyword-only and
        :meth:`status` says why. ``defer_vectors``: writes never call the model, nor does
        opening for vectors left pending; they stay pending for the owner to compute apart
        (``pending_texts``, ``store_vectors``), as the actors do.
        """
        if not isinstance(path, str | Path):
            raise InvalidInputError(f"path must be a str or Path, got {type(path).__name__}")
        check_path(path)
        config = config or Config.load()  # memstrata.toml and MEMSTRATA_* apply
        reason: str | None = None
        if embedder is None:
            # imported here: a store opened with its embedder (a `memstrata query`) loads no model code
            from memstrata.storage import load_embedder

            try:
                settings = config.embedding  # "" or "default": the shared default model
                embedder = load_embedder(settings.model, dim=settings.dim, threads=settings.threads)
            except EmbedderUnavailableError as exc:
                reason = f"no embedding model: {exc}"
        search = config.search
        tuning = SearchTuning(
            depth=search.depth,
            rrf_k=search.rrf_k,
            vector_weight=search.vector_weight,
            keyword_weight=search.keyword_weight,
            approximate_from=search.approximate_from,
        )
        db = open_database(path)
        try:
            return cls(
                db,
                embedder,
                unavailable_reason=reason,
                max_content_bytes=config.max_content_bytes,
                tuning=tuning,
                defer_vectors=defer_vectors,
            )
        except BaseException:
            db.close()
            raise

    @staticmethod
    def path_for(data_dir: str | Path, owner: str) -> Path:
        """``{data_dir}/knowledge/{owner}.sqlite``; ``owner`` is an agent id or ``"shared"``."""
        if (
            not isinstance(owner, str)
            or not owner
            or owner in (".", "..")
            or len(owner) > 128
            or any(not (c.isalnum() or c in "-_.@") for c in owner)
        ):
            raise InvalidInputError(
                f"owner {owner!r} must be 1-128 letters, digits or '-_.@' (an agent id or 'shared')"
            )
        return Path(data_dir) / "knowledge" / f"{owner}.sqlite"

    # -- status and lifetime ----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What this store holds and how it searches; ``mode`` is ``"keyword-only"`` (with a
        ``reason``) whenever vector search cannot be used."""
        self._open_db()
        consistency = self._consistency  # first: a repair it waits for changes the counts below
        self._refresh_foreign()
        reason = self._vector_reason()
        return {
            "kind": "knowledge",
            "path": str(self.path),
            "mode": "hybrid" if reason is None else "keyword-only",
            "reason": reason,
            "entries": self.count(),
            "pending_vectors": self._pending_count(),
            "model": None if self._embedder is None else self._embedder.model_id,
            "dim": None if self._embedder is None else self._embedder.dim,
            "stored_model": get_meta(self._db, "embedding_model"),
            "stored_dim": _int_or_none(get_meta(self._db, "embedding_dim")),
            "vectors": None if self._vectors is None else self._vectors.status(),
            "keyword_index_file": self._bm25.files_status(),  # as vectors' index_file says of theirs
            "last_error": self._last_error,
            "consistency": consistency.as_dict(),
            "schema_version": len(MIGRATIONS),
            "tuning": dataclasses.asdict(self._tuning),
        }

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if not self._closed:
            self._closed = True
            self._open_check.close()
            self._db.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> KnowledgeStore:
        self._open_db()
        return self

    def __repr__(self) -> str:
        state = "closed" if self._closed else self.mode
        return f"KnowledgeStore({str(self.path)!r}, {state})"
