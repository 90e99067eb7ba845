"""The one keyword ranker every layer uses: BM25 over words, trigram BM25 over CJK runs and a
substring match for CJK runs too short for trigrams, restricted exactly to a layer's filter.

A layer describes its table once (:class:`KeywordTable`): the FTS5 columns and their weights,
the CJK columns, and optionally a second full-text table keyed by the same ids whose BM25 adds
to a row's own with a weight (the episodes' neighbouring turns). Words are scored with numpy
over FTS5's own postings (:class:`Bm25Index`, exact against FTS5's ``bm25()``); the trigram and
substring lists are SQL. :meth:`KeywordIndex.lists` gives each sub-list with its scores (a
search over several stores merges them by score); :meth:`KeywordIndex.ranking` fuses them for
one store with textbook RRF.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

import numpy as np

from ._array_types import Bm25Floats, IntArray
from ._bm25 import Bm25Index
from ._bm25_top import top_scored
from ._connection import Database
from ._fulltext import MAX_QUERY_TERMS, KeywordQuery, build_keyword_query, keyword_terms
from ._fusion import PLAIN_RRF_K, rrf
from ._keep import Keep

__all__ = ["Filter", "KeywordIndex", "KeywordTable", "ScoredIds", "query_terms"]

ScoredIds = tuple[IntArray, Bm25Floats]  # ids best first, and their scores (higher is better)


@dataclass(frozen=True, slots=True)
class Filter:
    """Which rows may match: ``sql`` selects the allowed ids (``None``: every row). ``where``
    holds equality filters on vector metadata columns that ``sql`` also applies; with
    ``where_is_exact`` they alone are the whole filter, so the vector side needs no id list."""

    sql: str | None = None
    params: tuple[Any, ...] = ()
    where: Mapping[str, Any] = field(default_factory=dict)
    where_is_exact: bool = False

    @property
    def empty(self) -> bool:
        return self.sql is None


class Narrowing(TypedDict, total=False):
    """What a caller may add to a search's text and filter; see :meth:`KeywordIndex.lists`."""

    query: KeywordQuery | None
    allowed: Sequence[int] | IntArray | None
    keep: Keep | None


@dataclass(frozen=True, slots=True)
class KeywordTable:
    """How a layer's rows are indexed: ``{table}_fts`` over ``columns`` (BM25 ``weights``) and
    ``{trigram}`` over the CJK text. Short CJK runs are matched with ``LIKE`` on
    ``like_columns`` (rows where ``like_where`` holds), newest ``like_order`` first.
    ``context`` is ``(fts table, its columns, weight)``: a second index of the same ids whose
    BM25, times the weight, adds to each row's own."""

    table: str
    columns: tuple[str, ...]
    weights: tuple[float, ...] | None = None
    trigram: str | None = None  # default ``{table}_tri``
    like_columns: tuple[str, ...] | None = None  # default ``columns``
    like_where: str | None = None
    like_order: str = "id"  # an integer column; ties by id, newest first
    key: str = "id"
    context: tuple[str, tuple[str, ...], float] | None = None


def query_terms(text: str) -> list[str]:
    """The query words BM25 scores (stop words only when nothing else is left)."""
    terms = keyword_terms(text) or keyword_terms(text, keep_stop_words=True)
    return terms[:MAX_QUERY_TERMS]


class KeywordIndex:
    """Keyword search over one table of one database (see the module docstring).

    ``track_writes``: the owner does not report writes to :attr:`bm25` (``added``/``removed``/
    ``changed``), so any change through the connection drops the cached postings.
    """

    def __init__(self, db: Database, spec: KeywordTable, *, track_writes: bool = False) -> None:
        self.db = db
        self.spec = spec
        weights = spec.weights or tuple(1.0 for _ in spec.columns)
        self.bm25 = Bm25Index(db, f"{spec.table}_fts", spec.columns, weights, track_writes=track_writes)
        self._context: Bm25Index | None = None
        self._context_weight = 0.0
        if spec.context is not None:
            name, columns, weight = spec.context
            if db.scalar("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)) is not None:
                self._context = Bm25Index(db, name, columns, [1.0] * len(columns), track_writes=True)
                self._context_weight = float(weight)

    def reset(self) -> None:
        """Forget cached postings (after a rollback of this connection's writes)."""
        self.bm25.reset()
        if self._context is not None:
            self._context.reset()

    def allowed(self, flt: Filter) -> list[int] | None:
        """The ids ``flt`` allows, ``None`` for every row."""
        if flt.sql is None:
            return None
        return [int(r[0]) for r in self.db.query(flt.sql, flt.params)]

    def lists(
        self,
        text: str,
        limit: int,
        flt: Filter,
        *,
        query: KeywordQuery | None = None,
        allowed: Sequence[int] | IntArray | None = None,
        keep: Keep | None = None,
    ) -> list[ScoredIds]:
        """Ranked sub-lists for ``text``: words (BM25, plus the weighted context), CJK trigrams
        (BM25), short CJK runs (``like_order``); each best first, at most ``limit`` long.
        ``allowed`` (the ids of ``flt``, when the caller has them) saves querying them again;
        ``keep`` (the same filter as a mask over the word matches, e.g. read from a vector
        mirror) saves listing them at all."""
        query = build_keyword_query(text) if query is None else query
        if query.empty or limit <= 0:
            return []
        spec = self.spec
        out: list[ScoredIds] = []
        if query.words:
            if allowed is None and keep is None and flt.sql is not None:
                allowed = self.allowed(flt)
            out.append(self._words(query_terms(text), limit, allowed, keep))
        restrict = f" AND +rowid IN ({flt.sql})" if flt.sql else ""
        if query.cjk:
            tri = spec.trigram or f"{spec.table}_tri"
            sql = (
                f"SELECT rowid, bm25({tri}) AS s FROM {tri} WHERE {tri} MATCH ?{restrict} "
                f"ORDER BY s, rowid LIMIT ?"
            )
            rows = self.db.query(sql, (query.cjk, *flt.params, limit))
            out.append(_scored([(r[0], -float(r[1])) for r in rows]))
        if query.cjk_short:
            columns = spec.like_columns or spec.columns
            likes = " OR ".join(f"{c} LIKE ?" for c in columns for _ in query.cjk_short)
            like_params = [f"%{run}%" for _ in columns for run in query.cjk_short]
            conds = [f"({likes})"]
            if spec.like_where:
                conds.append(spec.like_where)
            if flt.sql:
                conds.append(f"{spec.key} IN ({flt.sql})")
            order = spec.like_order
            tail = f", {spec.key} DESC" if order != spec.key else ""
            sql = (
                f"SELECT {spec.key}, {order} FROM {spec.table} WHERE {' AND '.join(conds)} "
                f"ORDER BY {order} DESC{tail} LIMIT ?"
            )
            rows = self.db.query(sql, (*like_params, *flt.params, limit))
            out.append(_scored([(r[0], float(r[1])) for r in rows]))
        return out

    def ranking(self, text: str, limit: int, flt: Filter, **narrowing: Unpack[Narrowing]) -> list[int]:
        """Ids best first: the sub-lists of :meth:`lists`, fused by textbook RRF when several."""
        found = self.lists(text, limit, flt, **narrowing)
        lists = [ids.tolist() for ids, _ in found]
        if not lists:
            return []
        if len(lists) == 1:
            return [int(i) for i in lists[0]]
        return [int(f.key) for f in rrf(lists, k=PLAIN_RRF_K, limit=limit)]

    def _words(
        self,
        terms: Sequence[str],
        limit: int,
        allowed: Sequence[int] | IntArray | None,
        keep: Keep | None = None,
    ) -> ScoredIds:
        """BM25 of the rows' own text; with a context, the ``limit`` best by context add their
        weighted score to the ``limit`` best by own text (a row found by its context alone
        still enters). Summing over every row instead ranks rows whose neighbours match above
        rows that match themselves, and lost 0.01 of evidence recall@5 on conversations."""
        ids, scores = self.bm25.top(terms, limit, allowed, keep)
        if self._context is None:
            return ids, scores
        more_ids, more = self._context.top(terms, limit, allowed, keep)
        if len(more_ids) == 0:
            return ids, scores
        every = np.concatenate([ids, more_ids])
        weighted = np.concatenate([scores, self._context_weight * more])
        ids, inverse = np.unique(every, return_inverse=True)
        summed = np.bincount(inverse.reshape(-1), weights=weighted, minlength=len(ids))
        return top_scored(ids, summed.astype(np.float64), limit)


def _scored(rows: Sequence[tuple[Any, float]]) -> ScoredIds:
    ids = np.fromiter((int(r[0]) for r in rows), dtype=np.int64, count=len(rows))
    scores = np.fromiter((r[1] for r in rows), dtype=np.float64, count=len(rows))
    return ids, scores
