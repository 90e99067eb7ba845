"""Episodes whose vector is pending: recorded while the model failed, or left for the owner to
compute apart (``defer_vectors``); found by keywords meanwhile, embedded when the model works."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from memstrata.core.errors import EmbeddingError, InvalidInputError
from memstrata.storage._embedding import usable_rows

from ._episode_records import embed_text, query_in
from ._episodic_state import EpisodicState

__all__ = ["PendingVectors"]


class PendingVectors(EpisodicState):
    """The pending vectors of one store: listed, computed here or stored when computed apart."""

    _pending_ids: set[int]  # recorded here without a vector since the model failed

    def pending_vectors(self) -> int:
        """Episodes recorded without a vector since the model failed (found by keywords meanwhile)."""
        self._open_db()
        return len(self._pending_ids) if self._embedder is not None and self._vectors is not None else 0

    def catch_up_vectors(self) -> int:
        """Embed pending episodes now (a bounded batch); returns how many are still pending. The
        owner calls this again later while the model is faulty (the actors do, with backoff)."""
        self._open_db()
        if self._pending_ids:
            self._embed_missing(sorted(self._pending_ids)[:1000])
        return self.pending_vectors()

    def pending_texts(self, limit: int = 1000, skip: Collection[int] = ()) -> list[tuple[int, str]]:
        """Up to ``limit`` episodes whose vector is pending, as ``(id, text to embed)`` (the one
        rule, :func:`embed_text`), oldest first, leaving out ``skip`` (already being computed)."""
        self._open_db()
        if self._embedder is None or self._vectors is None or limit <= 0:
            return []
        ids = sorted(i for i in self._pending_ids if i not in skip)[:limit]
        if not ids:
            return []
        sql = "SELECT id, title, content, at_us FROM episodes WHERE id IN"
        rows = {int(r[0]): embed_text(r[1], r[2], r[3]) for r in query_in(self._db, sql, ids)}
        self._pending_ids.difference_update(i for i in ids if i not in rows)  # deleted meanwhile
        return [(i, rows[i]) for i in ids if i in rows]

    def store_vectors(self, ids: Sequence[int], texts: Sequence[str], vectors: Any) -> int:
        """Store vectors computed apart for :meth:`pending_texts`; returns how many were written.

        An episode deleted meanwhile, no longer pending, or whose text is no longer
        ``texts[i]`` is skipped. Unusable rows (NaN, infinite, all zero) are a model fault:
        recorded for :meth:`status`, their episodes stay pending."""
        self._open_db()
        if len(ids) != len(texts):
            raise InvalidInputError(f"store_vectors got {len(ids)} ids for {len(texts)} texts")
        embedder, vectors_index = self._embedder, self._vectors
        if not ids or embedder is None or vectors_index is None or not vectors_index.available:
            return 0
        array, usable, fault = usable_rows(embedder.model_id, embedder.dim, vectors, len(ids))
        if fault is not None:
            self._last_error = fault
        wanted = {
            int(i): (t, n)
            for n, (i, t) in enumerate(zip(ids, texts, strict=True))
            if usable[n] and int(i) in self._pending_ids
        }
        if not wanted:
            return 0
        db = self._db
        with db.transaction():
            db.on_rollback(self._drop_matrix)
            sql = "SELECT id, title, content, at_us, task_run_id FROM episodes WHERE id IN"
            ready = [
                (int(r[0]), int(r[3]), r[4], wanted[int(r[0])][1])
                for r in query_in(db, sql, list(wanted))
                if embed_text(r[1], r[2], r[3]) == wanted[int(r[0])][0]
            ]
            if ready:
                rows = np.stack([array[n] for _, _, _, n in ready])
                done = [i for i, _, _, _ in ready]
                vectors_index.upsert_many(done, rows)
                if self._matrix is not None:
                    self._matrix.add(done, rows, [a for _, a, _, _ in ready], [r for _, _, r, _ in ready])
                # inside an owner's ``batch`` that rolls back later, they are pending again
                db.on_rollback(lambda: self._pending_ids.update(done))
        self._pending_ids.difference_update(i for i, _, _, _ in ready)
        if fault is None and ready:
            self._last_error = None
        return len(ready)

    def note_vector_fault(self, error: str) -> None:
        """The model failed on vectors computed apart: kept for :meth:`status` until it works."""
        self._last_error = error

    def _defer_missing(self, ids: Sequence[int]) -> int:
        """Episodes found without a vector on open: pending, computed apart by the owner."""
        self._pending_ids.update(int(i) for i in ids)
        return 0

    def _embed_missing(self, ids: Sequence[int]) -> int:
        """Embed episodes that have no vector; returns how many got one (0 if the model fails)."""
        embedder, vectors = self._embedder, self._vectors
        if embedder is None or vectors is None or not ids:
            return 0
        done = 0
        for start in range(0, len(ids), 1000):
            batch = ids[start : start + 1000]
            rows = query_in(self._db, "SELECT id, title, content, at_us FROM episodes WHERE id IN", batch)
            if not rows:
                self._pending_ids.difference_update(batch)  # removed meanwhile: nothing to embed
                continue
            try:
                array = self._embed(embedder, [(r[1], r[2], r[3]) for r in rows])
            except EmbeddingError as exc:
                self._last_error = str(exc)
                self._pending_ids.update(int(i) for i in ids[start:])
                break
            with self._db.transaction():
                self._db.on_rollback(self._drop_matrix)
                present = {
                    int(r[0])
                    for r in query_in(self._db, "SELECT id FROM episodes WHERE id IN", [r[0] for r in rows])
                }
                keep = [n for n, r in enumerate(rows) if int(r[0]) in present]
                if keep:
                    vectors.upsert_many([int(rows[n][0]) for n in keep], array[keep])
            self._pending_ids.difference_update(batch)
            done += len(keep)
        self._matrix = None
        return done
