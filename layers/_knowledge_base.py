"""The knowledge store's state: its connection, model and vector index, and the upkeep of
derived vectors (pending rows, model changes); writes, search and lifetime build on it."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

import numpy as np

from memstrata.core.constants import EMBED_CHARS
from memstrata.core.errors import (
    EmbedderUnavailableError,
    EmbeddingError,
    InvalidInputError,
    ReadOnlyError,
    StorageError,
)
from memstrata.storage import (
    CheckTarget,
    ConsistencyReport,
    Database,
    Embedder,
    FloatArray,
    OpenCheck,
    VectorIndex,
    apply_migrations,
    check_consistency,
    embed_documents,
    embedding_mismatch,
    get_meta,
    record_embedding,
    refresh_keyword_terms,
    text_hash,
)
from memstrata.storage._embedding import usable_rows

from ._indexed_store import IndexedStore
from ._knowledge_reads import KnowledgeReads
from ._knowledge_schema import BATCH, MIGRATIONS, TABLE, SearchTuning, _int_or_none, keyword_table


class KnowledgeBase(KnowledgeReads, IndexedStore):
    """Connection, embedder, vectors and keyword index of one store (see ``KnowledgeStore``)."""

    _noun = "knowledge store"
    _open_check: OpenCheck  # every open starts one

    def __init__(
        self,
        db: Database,
        embedder: Embedder | None,
        *,
        unavailable_reason: str | None = None,
        max_content_bytes: int = 4_000_000,
        tuning: SearchTuning | None = None,
        defer_vectors: bool = False,
    ) -> None:
        if embedder is not None and not isinstance(embedder, Embedder):
            raise InvalidInputError(
                f"embedder must implement the Embedder protocol, got {type(embedder).__name__}"
            )
        apply_migrations(db, "knowledge", MIGRATIONS)
        refresh_keyword_terms(db, table=TABLE, column="ident", source="content")
        tuning = tuning or SearchTuning()
        super().__init__(db, embedder, keyword_table(tuning.column_weights), defer_vectors=defer_vectors)
        self._unavailable = unavailable_reason
        self._max_bytes = max_content_bytes
        self._tuning = tuning
        # UNIX seconds for created_at/updated_at; a system sets it from its clock (simulations)
        self.clock: Callable[[], float] = time.time
        # the name entries carry as their ``store`` (an agent id or "shared"); a system sets it
        self.owner: str | None = None
        self._rebuild_needed = False
        self._seen_version = -1
        self._foreign_model: str | None = None  # another process rebuilt vectors with this model
        self._bm25 = self._keywords.bm25
        self._opened = False
        self._vectors = self._open_vectors()
        # examined beside the first calls on a large store (storage.OpenCheck)
        self._open_check = OpenCheck(db, self._check_args(), self._check_consistency)
        if embedder is not None:
            self._start_vectors(embedder)
        self._opened = True

    def _check_args(self) -> CheckTarget:
        """What the consistency check compares: the entries, both full-text indexes and the
        vectors of the entries whose vector is not pending."""
        return {
            "table": TABLE,
            "fts": {f"{TABLE}_fts": None, f"{TABLE}_tri": "cjk != ''"},
            "vectors": self._vectors,
            "vector_rows": "vector_pending = 0",
        }

    def _check_consistency(self) -> ConsistencyReport:
        """The repairing check (at open, or when the examination beside the first calls found a
        difference): a rebuilt full-text index drops the cached postings, and entries found
        without a vector are marked pending and, here, embedded at once."""
        report = check_consistency(self._db, **self._check_args(), repair_missing=self._mark_pending)
        if report.fts_rebuilt:
            self._bm25.reset()
        if report.missing_vectors and self._opened:  # at open, the vectors' start embeds them
            self._catch_up()
        return report

    @property
    def _consistency(self) -> ConsistencyReport:
        return self._open_check.report()

    def _mark_pending(self, entry_ids: list[int]) -> int:
        """Entries found without a vector are re-embedded by the pending-vector catch-up."""
        with self._db.transaction():
            self._db.executemany(
                f"UPDATE {TABLE} SET vector_pending = 1 WHERE id = ?", [(i,) for i in entry_ids]
            )
        return 0

    def _open_vectors(self) -> VectorIndex | None:
        """The existing vector table (any model), or ``None`` if this store never had one."""
        stored_dim = get_meta(self._db, f"vector_dim:{TABLE}")
        if stored_dim is None:
            return None
        return self._vector_index(int(stored_dim))

    def _vector_index(self, dim: int) -> VectorIndex:
        return VectorIndex(
            self._db,
            TABLE,
            dim,
            metadata={"category": "text"},
            approximate_from=self._tuning.approximate_from,
        )

    def _start_vectors(self, embedder: Embedder) -> None:
        """Set the vectors up for ``embedder`` (a read-only store writes nothing: it searches
        what it can, see :meth:`_vector_reason`)."""
        read_only = self._db.read_only
        if self._vectors is None:
            if read_only:
                return
            with self._db.transaction():
                self._vectors = self._vector_index(embedder.dim)
                record_embedding(self._db, embedder.model_id, embedder.dim)
        elif embedding_mismatch(self._db, embedder.model_id, embedder.dim) is not None:
            self._rebuild_needed = True
        elif get_meta(self._db, "embedding_model") is None and not read_only:
            record_embedding(self._db, embedder.model_id, embedder.dim)
        self._seen_version = self._db.data_version()
        self._catch_up()

    # -- state ------------------------------------------------------------------------------------

    def _vectors_writable(self) -> bool:
        """New vectors can be computed and stored with the current model."""
        return (
            not self._db.read_only
            and self._embedder is not None
            and self._vectors is not None
            and self._vectors.available
            and not self._rebuild_needed
            and self._foreign_model is None
        )

    def _refresh_foreign(self) -> None:
        """Follow another connection's model change: a rebuild with this store's model is adopted;
        one with another model leaves this store keyword-only until it is reopened."""
        version = self._db.data_version()
        if version == self._seen_version:
            return
        self._seen_version = version
        stored_dim = _int_or_none(get_meta(self._db, f"vector_dim:{TABLE}"))
        if stored_dim is not None and (self._vectors is None or self._vectors.dim != stored_dim):
            self._vectors = self._open_vectors()
        if self._embedder is None:
            return
        mismatch = embedding_mismatch(self._db, self._embedder.model_id, self._embedder.dim)
        if mismatch is None:
            self._foreign_model = None
            self._rebuild_needed = False
        elif not self._rebuild_needed:
            self._foreign_model = str(mismatch.stored_model)

    @property
    def mode(self) -> str:
        """``"hybrid"`` when vector search is usable, else ``"keyword-only"``."""
        return "hybrid" if self._vector_reason() is None else "keyword-only"

    def _vector_reason(self) -> str | None:
        if self._embedder is None:
            return self._unavailable or "no embedding model"
        if self._vectors is None:
            return "no vector index" + (
                " (the store is read-only: none is made)" if self._db.read_only else ""
            )
        if not self._vectors.available:
            return f"sqlite-vec could not be loaded: {self._db.vec_reason}"
        if self._foreign_model is not None:
            return (
                f"another process rebuilt the vectors with model {self._foreign_model!r}; "
                "reopen the store to use them"
            )
        if self._rebuild_needed and self._db.read_only:
            return (
                f"vectors were made by another model; the store is read-only, so they are not "
                f"rebuilt for {self._embedder.model_id!r}"
            )
        if self._rebuild_needed:
            return (
                f"vectors were made by another model; rebuilding them for {self._embedder.model_id!r} "
                f"failed ({self._last_error}); call reindex()"
            )
        return None

    def _embed(self, texts: Sequence[str], *, cache: bool = False) -> FloatArray | None:
        """Vectors for a write's ``texts``, or ``None``: the model failed (error recorded) or
        vectors are deferred (:attr:`defer_vectors`), so the rows are stored with them pending."""
        return None if self.defer_vectors else self._embed_now(texts, cache=cache)

    def _embed_now(self, texts: Sequence[str], *, cache: bool = False) -> FloatArray | None:
        """Vectors for ``texts``, or ``None`` (error recorded) when the model fails.

        Writes do not go through the embedding cache: the same content in the same category and
        scope is never embedded twice (dedup), the same content elsewhere reuses the stored
        vector, and a cache would store every vector a second time. Rebuilds use it (``cache``)
        so that an interrupted rebuild resumes where it stopped.
        """
        assert self._embedder is not None
        clipped = [t[:EMBED_CHARS] for t in texts]
        try:
            return embed_documents(self._embedder, clipped, self._cache if cache else None)
        except EmbeddingError as exc:
            self._last_error = str(exc)
            return None

    # -- vectors: pending rows and model changes -------------------------------------------------

    def reindex(self, *, full: bool = False) -> int:
        """Compute missing vectors (``full=True``: rebuild every vector, e.g. after changing the
        model outside memstrata). Returns how many vectors were written. Raises
        :class:`EmbeddingError` if the model fails, :class:`EmbedderUnavailableError` in
        keyword-only mode and :class:`ReadOnlyError` when a read-only store has vectors to write."""
        self._open_db()
        if self._embedder is None:
            raise EmbedderUnavailableError(
                f"knowledge store {self.path} is keyword-only: {self._vector_reason()}"
            )
        self._refresh_foreign()
        if self._foreign_model is not None:
            raise StorageError(str(self._vector_reason()))
        if self._db.read_only and (full or self._rebuild_needed or self._pending_count()):
            raise ReadOnlyError(f"knowledge store {self.path} is read-only: its vectors cannot be written")
        if full or self._rebuild_needed:
            return self._rebuild()
        written, ok = self._embed_pending()
        if not ok:
            raise EmbeddingError(f"reindex of {self.path} stopped: {self._last_error}")
        return written

    def _catch_up(self) -> None:
        """After a successful write or open: finish a model change or embed pending rows."""
        if self._embedder is None:
            return
        if self._rebuild_needed:
            self._try_rebuild()
        elif not self.defer_vectors and self._vectors_writable() and self._pending_count() > 0:
            self._embed_pending()

    def _pending_count(self) -> int:
        return int(self._db.scalar(f"SELECT count(*) FROM {TABLE} WHERE vector_pending = 1"))

    def pending_vectors(self) -> int:
        """Entries whose vector is still to be computed (found by keywords meanwhile)."""
        self._open_db()
        return self._pending_count() if self._embedder is not None else 0

    def catch_up_vectors(self) -> int:
        """Compute pending vectors now (or finish a model change); returns how many are still
        pending. A model fault leaves them pending and is recorded for :meth:`status`: the owner
        calls this again later (the actors do, with backoff, in the same process)."""
        self._open_db()
        if self._embedder is None:
            return 0
        self._refresh_foreign()
        if self._rebuild_needed:
            self._try_rebuild()
        elif self._vectors_writable():
            self._embed_pending()
        return self._pending_count()

    def pending_texts(self, limit: int = BATCH, skip: Collection[int] = ()) -> list[tuple[int, str]]:
        """Up to ``limit`` entries whose vector is pending, as ``(id, text to embed)``, oldest
        first, leaving out ``skip`` (those already being computed); none while vectors cannot
        be written (keyword-only, or a model change not finished: :meth:`catch_up_vectors`)."""
        self._open_db()
        self._refresh_foreign()
        if not self._vectors_writable() or limit <= 0:
            return []
        rows = self._db.query(
            f"SELECT id, substr(content, 1, {EMBED_CHARS}) FROM {TABLE} WHERE vector_pending = 1 "
            "ORDER BY id LIMIT ?",
            (limit + len(skip),),
        )
        return [(int(i), str(c)) for i, c in rows if int(i) not in skip][:limit]

    def store_vectors(self, ids: Sequence[int], texts: Sequence[str], vectors: Any) -> int:
        """Store vectors computed apart for :meth:`pending_texts`; returns how many were written.

        An entry deleted meanwhile, or whose text is no longer ``texts[i]`` (updated), is
        skipped: it stays pending for its current text. Unusable rows (NaN, infinite, all zero)
        are a model fault: recorded for :meth:`status`, their entries stay pending."""
        self._open_db()
        if len(ids) != len(texts):
            raise InvalidInputError(f"store_vectors got {len(ids)} ids for {len(texts)} texts")
        self._refresh_foreign()
        if not ids or not self._vectors_writable():
            return 0
        assert self._embedder is not None and self._vectors is not None
        array, usable, fault = usable_rows(self._embedder.model_id, self._embedder.dim, vectors, len(ids))
        if fault is not None:
            self._last_error = fault
        wanted = {int(i): (t, n) for n, (i, t) in enumerate(zip(ids, texts, strict=True)) if usable[n]}
        if not wanted:
            return 0
        with self._db.transaction():
            current = self._still_pending(f"substr(content, 1, {EMBED_CHARS}), category", list(wanted))
            ready = [
                (int(i), cat, wanted[int(i)][1])
                for i, content, cat in current
                if str(content) == wanted[int(i)][0]
            ]
            if ready:
                self._vectors.upsert_many(
                    [i for i, _, _ in ready],
                    np.stack([array[n] for _, _, n in ready]),
                    [{"category": c} for _, c, _ in ready],
                )
                self._db.executemany(
                    f"UPDATE {TABLE} SET vector_pending = 0 WHERE id = ?", [(i,) for i, _, _ in ready]
                )
        if fault is None and ready:
            self._last_error = None
        return len(ready)

    def note_vector_fault(self, error: str) -> None:
        """The model failed on vectors computed apart: kept for :meth:`status` until it works."""
        self._last_error = error

    def _embed_pending(self) -> tuple[int, bool]:
        """Embed rows whose vector is pending; returns (vectors written, whether the model worked)."""
        written = 0
        pages = self._pages("content", "vector_pending = 1")
        while self._vectors_writable():
            rows = next(pages, None)
            if rows is None:
                break
            array = self._embed_now([r[1] for r in rows])
            if array is None:
                return written, False
            by_id = {int(r[0]): (text_hash(r[1]), v) for r, v in zip(rows, array, strict=True)}
            with self._db.transaction():
                current = self._still_pending("content_hash, category", list(by_id))
                # rows changed meanwhile (by another process) stay pending for the next pass
                ready = [(int(i), c) for i, h, c in current if bytes(h) == by_id[int(i)][0]]
                if ready:
                    assert self._vectors is not None
                    self._vectors.upsert_many(
                        [i for i, _ in ready],
                        np.stack([by_id[i][1] for i, _ in ready]),
                        [{"category": c} for _, c in ready],
                    )
                    self._db.executemany(
                        f"UPDATE {TABLE} SET vector_pending = 0 WHERE id = ?", [(i,) for i, _ in ready]
                    )
                    written += len(ready)
        self._last_error = None
        return written, True

    def _try_rebuild(self) -> None:
        if self._db.read_only:  # searched by keywords meanwhile (see _vector_reason)
            return
        try:
            self._rebuild()
        except EmbeddingError as exc:
            self._last_error = str(exc)

    def _rows(self) -> Iterator[list[tuple[int, str, str]]]:
        for rows in self._pages("content, category"):
            yield [(int(i), str(c), str(cat)) for i, c, cat in rows]

    def _still_pending(self, columns: str, ids: list[int]) -> list[Any]:
        """``id, {columns}`` of the rows of ``ids`` whose vector is still pending (another process
        may have written or changed them since they were read)."""
        marks = ",".join("?" * len(ids))
        return self._db.query(
            f"SELECT id, {columns} FROM {TABLE} WHERE vector_pending = 1 AND id IN ({marks})", ids
        )

    def _pages(self, columns: str, where: str = "1") -> Iterator[list[tuple[Any, ...]]]:
        """``id, {columns}`` of the rows matching ``where`` in id order, ``BATCH`` rows a page, each
        page read when asked for (rows changed between pages are seen as they then are)."""
        after = 0
        while True:
            rows = self._db.query(
                f"SELECT id, {columns} FROM {TABLE} WHERE ({where}) AND id > ? ORDER BY id LIMIT ?",
                (after, BATCH),
            )
            if not rows:
                return
            after = int(rows[-1][0])
            yield rows

    def _rebuild(self) -> int:
        """Re-embed every entry with the current model, then swap the index in one transaction.

        Phase 1 fills the embedding cache batch by batch without holding the write lock (other
        connections keep searching the old index; an interruption keeps the progress). Phase 2
        resets the vector table and writes every vector from the cache in one transaction.
        """
        embedder = self._embedder
        assert embedder is not None
        for rows in self._rows():
            embed_documents(embedder, [c[:EMBED_CHARS] for _, c, _ in rows], self._cache)
        written = 0
        try:
            with self._db.transaction():
                if self._vectors is None:
                    self._vectors = self._vector_index(embedder.dim)
                else:
                    self._vectors.reset(embedder.dim)
                for rows in self._rows():
                    array = embed_documents(embedder, [c[:EMBED_CHARS] for _, c, _ in rows], self._cache)
                    self._vectors.upsert_many(
                        [i for i, _, _ in rows], array, [{"category": cat} for _, _, cat in rows]
                    )
                    written += len(rows)
                self._db.execute(f"UPDATE {TABLE} SET vector_pending = 0 WHERE vector_pending != 0")
                record_embedding(self._db, embedder.model_id, embedder.dim)
                # the cache only carried this rebuild across interruptions; the index holds it all now
                self._db.execute("DELETE FROM embedding_cache")
        except BaseException:
            self._vectors = self._open_vectors()
            raise
        self._rebuild_needed = False
        self._foreign_model = None
        self._last_error = None
        self._seen_version = self._db.data_version()
        return written
