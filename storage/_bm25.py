"""BM25 over an FTS5 index, scored with numpy: the word ranking of every layer's keyword search.

FTS5 ranks an ``OR`` query by visiting every document that holds any query word; for a sentence
of ordinary words ("return the list of ...") that is a third of a large store, about 100 ms at
100k entries. This module scores the postings of each query word, read once from FTS5's own index
and kept in memory (:mod:`._bm25_postings`), with the same formula as FTS5's ``bm25()``
(k1 = 1.2, b = 0.75, column weights) in a few vectorised numpy operations.

Writes made through this connection update the caches incrementally (:mod:`._bm25_writes`); a
commit by another connection (seen through ``PRAGMA data_version``) drops them. An owner that does
not report its writes opens the index with ``track_writes=True``: any change made through the
connection then drops them too. The caches are kept in an index file beside the database
(:mod:`._bm25_file`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ._bm25_file import Bm25Files
from ._bm25_postings import _PHRASE, _SCRATCH_CHANGES, FloatArray, IntArray
from ._bm25_writes import Bm25Writes

__all__ = ["Bm25Index", "top_scored"]

K1 = 1.2
B = 0.75
_MAX_CACHED_STEMS = 50_000


class Bm25Index(Bm25Files, Bm25Writes):
    """Top-k BM25 for the FTS5 table ``fts`` (external content, integer rowids)."""

    def stems(self, terms: Sequence[str]) -> list[str]:
        """Distinct FTS5 stems of query words, in order (a word of several tokens gives one
        phrase unit: its stems joined by ``_PHRASE``)."""
        unknown = [t for t in dict.fromkeys(terms) if t not in self._stems]
        if unknown:
            if len(self._stems) + len(unknown) > _MAX_CACHED_STEMS:
                self._stems.clear()
            self._stems.update(zip(unknown, self._query_units(unknown), strict=True))
        stems: dict[str, None] = {}
        for term in terms:
            for stem in self._stems.get(term, ()):
                stems.setdefault(stem, None)
        return list(stems)

    def _query_units(self, terms: Sequence[str]) -> list[tuple[str, ...]]:
        """What FTS5 matches for each quoted query word: its stem, or for a word of several
        tokens (``"don't"``, ``"Caroline's"``) the phrase of its stems in order, one unit."""
        self._ensure_tables()
        before = int(self._db.conn.total_changes)
        try:
            self._db.executemany(
                f"INSERT INTO temp.{self._tok}(rowid, {self._columns[0]}) VALUES (?, ?)",
                [(i + 1, t) for i, t in enumerate(terms)],
            )
            rows = self._db.query(f"SELECT doc, term FROM {self._tok_vocab} ORDER BY doc, col, offset")
        finally:
            self._db.execute(f"DELETE FROM temp.{self._tok}")
            scratch = int(self._db.conn.total_changes) - before
            _SCRATCH_CHANGES[self._db] = _SCRATCH_CHANGES.get(self._db, 0) + scratch
        tokens: dict[int, list[str]] = {}
        for doc, term in rows:
            tokens.setdefault(int(doc), []).append(str(term))
        out: list[tuple[str, ...]] = []
        for i in range(1, len(terms) + 1):
            parts = tokens.get(i, [])
            out.append(tuple(parts) if len(parts) <= 1 else (_PHRASE.join(parts),))
        return out

    def scores(self, terms: Sequence[str], ids: Sequence[int]) -> list[float]:
        """BM25 of the documents ``ids`` for ``terms``, as FTS5's ``bm25()`` but positive
        (0.0 for a document that matches no word or does not exist)."""
        stems = self.stems(terms)
        self._sync()
        scores = self._score_all(stems)
        if scores is None:
            return [0.0] * len(ids)
        pos = self._positions(np.asarray(ids, dtype=np.int64))
        return [float(scores[p]) if p >= 0 else 0.0 for p in pos]

    def _score_all(self, stems: Sequence[str]) -> FloatArray | None:
        """Scores of every known document (dead ones 0), or ``None`` when nothing can match."""
        if not stems:
            return None
        self._load_sizes()
        if self._live == 0:
            return None
        n = float(self._live)
        avg = self._total / n if self._total > 0 else 1.0
        scores = np.zeros(len(self._ids), dtype=np.float64)
        for stem in stems:
            pos, tf = self._postings_of(stem)
            if len(pos) == 0:
                continue
            df = float(len(pos)) if self._live == len(self._ids) else float(self._alive[pos].sum())
            idf = math.log((n - df + 0.5) / (df + 0.5))
            if idf <= 0:
                idf = 1e-6  # as FTS5: a word in most documents still counts a little
            norm = K1 * (1.0 - B + B * self._sizes[pos] / avg)
            scores[pos] += idf * tf * (K1 + 1.0) / (tf + norm)
        if self._live != len(self._ids):
            scores[~self._alive] = 0.0
        return scores

    def matches(
        self, terms: Sequence[str], allowed: Sequence[int] | IntArray | None = None
    ) -> tuple[IntArray, FloatArray]:
        """Every document matching one of ``terms`` (restricted to ``allowed``) with its score,
        in rowid order: ``(rowids, scores)``."""
        stems = self.stems(terms)
        self._sync()
        scores = self._score_all(stems) if stems else None
        if scores is None:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        if allowed is not None:
            keep = np.zeros(len(scores), dtype=bool)
            apos = self._positions(np.asarray(allowed, dtype=np.int64))
            keep[apos[apos >= 0]] = True
            scores[~keep] = 0.0
        matched = np.flatnonzero(scores > 0.0)  # usually a small share of the documents
        return self._ids[matched], scores[matched]

    def search(self, terms: Sequence[str], limit: int, allowed: Sequence[int] | None = None) -> list[int]:
        """Rowids of the ``limit`` best documents for the query words ``terms`` (OR semantics:
        a document needs one of them), best first; ``allowed`` restricts the candidates."""
        if limit <= 0:
            return []
        ids, scores = self.matches(terms, allowed)
        return [int(i) for i in top_scored(ids, scores, limit)[0]]


def top_scored(ids: IntArray, scores: FloatArray, limit: int) -> tuple[IntArray, FloatArray]:
    """The ``limit`` best ``(ids, scores)``, best first; equal scores go to the lower id."""
    if limit <= 0 or len(ids) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    k = min(limit, len(ids))
    cut = scores[np.argpartition(-scores, k - 1)[k - 1]]
    # every document tied with the last one taken competes, so ties go to the lower id
    top = np.flatnonzero(scores >= cut)
    order = top[np.lexsort((ids[top], -scores[top]))][:limit]
    return ids[order], scores[order]
