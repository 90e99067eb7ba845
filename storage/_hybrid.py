"""Hybrid retrieval shared by every layer: vector KNN + FTS5 keyword search, fused by
:func:`storage.fuse` (weighted RRF, see ``_fusion``).

A layer owns a content table (integer primary key ``id``) indexed by :func:`fts_schema` and a
:class:`VectorIndex` keyed by the same ids. It describes its filters once, as SQL that selects
the allowed ids plus equality filters on vector metadata columns, and this module runs both
searches on exactly that set, so filtered results are exact, never over-fetched and post-filtered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt
from memstrata.core.validation import check_mode

from ._connection import Database
from ._fulltext import KeywordQuery, build_keyword_query
from ._fusion import (
    DEFAULT_KEYWORD_WEIGHT,
    DEFAULT_RRF_K,
    DEFAULT_VECTOR_WEIGHT,
    PLAIN_RRF_K,
    fusion_weights,
    match_type,
    rrf,
)
from ._vectors import VectorHit, VectorIndex

__all__ = ["Filter", "Mode", "RankedId", "SearchParams", "hybrid_search", "keyword_search", "validate_mode"]

Mode = Literal["hybrid", "vector", "keyword"]


def validate_mode(mode: object) -> Mode:
    """``mode`` as a :data:`Mode` (the one rule: :func:`memstrata.core.validation.check_mode`)."""
    return cast(Mode, check_mode(mode))


@dataclass(frozen=True, slots=True)
class Filter:
    """Which rows may match: ``sql`` selects allowed ids (or ``None`` for all rows),
    ``where`` holds equality filters on vector metadata columns that ``sql`` also applies."""

    sql: str | None = None
    params: tuple[Any, ...] = ()
    where: Mapping[str, Any] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.sql is None


@dataclass(frozen=True, slots=True)
class SearchParams:
    top_k: int = 10
    mode: Mode = "hybrid"
    depth: int = 50  # candidates taken from each list before fusion (independent of top_k)
    rrf_k: int = DEFAULT_RRF_K  # PLAIN_RRF_K with equal weights: textbook RRF
    vector_weight: float = DEFAULT_VECTOR_WEIGHT
    keyword_weight: float = DEFAULT_KEYWORD_WEIGHT
    min_similarity: float | None = None  # drops semantic candidates below it; never keyword hits


@dataclass(frozen=True, slots=True)
class RankedId:
    id: int
    score: float  # 0..1
    match_type: str
    vector_rank: int | None
    keyword_rank: int | None
    similarity: float | None


def keyword_search(
    db: Database,
    table: str,
    columns: Sequence[str],
    query: KeywordQuery,
    limit: int,
    flt: Filter,
    *,
    column_weights: Sequence[float] | None = None,
) -> list[int]:
    """Ids ranked by BM25 (words), trigram match (CJK) and LIKE (short CJK), fused by RRF."""
    if query.empty or limit <= 0:
        return []
    # ``+rowid``: the filter is checked on the rows the MATCH finds (its subquery is evaluated
    # once). A plain ``rowid IN`` is handed to FTS5, which then runs the MATCH once per allowed id.
    restrict = f" AND +rowid IN ({flt.sql})" if flt.sql else ""
    params = tuple(flt.params)
    weights = ", ".join(str(float(w)) for w in (column_weights or [1.0] * len(columns)))
    lists: list[list[int]] = []
    if query.words:
        sql = (
            f"SELECT rowid FROM {table}_fts WHERE {table}_fts MATCH ?{restrict} "
            f"ORDER BY bm25({table}_fts, {weights}) LIMIT ?"
        )
        lists.append([r[0] for r in db.query(sql, (query.words, *params, limit))])
    if query.cjk:
        sql = (
            f"SELECT rowid FROM {table}_tri WHERE {table}_tri MATCH ?{restrict} "
            f"ORDER BY bm25({table}_tri) LIMIT ?"
        )
        lists.append([r[0] for r in db.query(sql, (query.cjk, *params, limit))])
    if query.cjk_short:
        likes = " OR ".join(f"{c} LIKE ?" for c in columns for _ in query.cjk_short)
        like_params = [f"%{run}%" for _ in columns for run in query.cjk_short]
        restrict_id = f" AND id IN ({flt.sql})" if flt.sql else ""
        sql = f"SELECT id FROM {table} WHERE ({likes}){restrict_id} ORDER BY id DESC LIMIT ?"
        lists.append([r[0] for r in db.query(sql, (*like_params, *params, limit))])
    if len(lists) == 1:
        return lists[0]
    return [f.key for f in rrf(lists, k=PLAIN_RRF_K)][:limit]


def hybrid_search(
    db: Database,
    *,
    table: str,
    columns: Sequence[str],
    vectors: VectorIndex | None,
    query_vector: npt.NDArray[np.float32] | None,
    query_text: str,
    params: SearchParams,
    flt: Filter,
    column_weights: Sequence[float] | None = None,
) -> list[RankedId]:
    """Top ``params.top_k`` ids for a query, best first.

    ``vectors``/``query_vector`` may be ``None``, and a vector index that cannot be used
    (sqlite-vec missing) is skipped: keyword-only mode. The keyword side is
    skipped in ``"vector"`` mode and when ``query_text`` holds no searchable term. Each list is
    cut at ``max(depth, top_k)`` before fusion, so for any ``top_k <= depth`` the ranking is the
    same and a smaller ``top_k`` returns a prefix of a larger one. Scores are normalised by the
    best possible sum of the lists that took part (rank 1 in each of them scores 1.0).
    """
    mode = validate_mode(params.mode)
    if params.top_k <= 0:
        return []
    depth = max(params.depth, params.top_k)
    use_vectors = mode != "keyword" and vectors is not None and query_vector is not None and vectors.available
    keyword_query = build_keyword_query(query_text) if mode != "vector" else None
    use_keywords = keyword_query is not None and not keyword_query.empty

    candidates: list[int] | None = None
    if use_vectors and flt.sql is not None:
        candidates = [r[0] for r in db.query(flt.sql, flt.params)]

    vector_hits: list[VectorHit] = []
    if use_vectors:
        assert vectors is not None and query_vector is not None
        vector_hits = vectors.search(query_vector, depth, where=flt.where, candidates=candidates)
        if params.min_similarity is not None:
            vector_hits = [h for h in vector_hits if h.similarity >= params.min_similarity]
    similarity = {h.rowid: h.similarity for h in vector_hits}

    keyword_ids: list[int] = []
    if use_keywords:
        assert keyword_query is not None
        keyword_ids = keyword_search(
            db, table, columns, keyword_query, depth, flt, column_weights=column_weights
        )

    # a keyword search that matched nothing takes no part: the vector list alone is then the best
    use_keywords = use_keywords and bool(keyword_ids)
    lists: list[list[int]] = []
    if use_vectors:
        lists.append([h.rowid for h in vector_hits])
    if use_keywords:
        lists.append(keyword_ids)
    weights = fusion_weights(use_vectors, use_keywords, params.vector_weight, params.keyword_weight)
    if not lists:
        return []
    fused = rrf(lists, k=params.rrf_k, weights=weights)[: params.top_k]

    results = []
    for f in fused:
        vrank = f.ranks[0] if use_vectors else None
        krank = f.ranks[-1] if use_keywords else None
        sim = similarity.get(f.key)
        if sim is None and vectors is not None and query_vector is not None and vectors.available:
            stored = vectors.get(f.key)
            if stored is not None:
                sim = _cosine(stored, query_vector)
        results.append(RankedId(f.key, f.score, match_type(vrank, krank), vrank, krank, sim))
    return results


def _cosine(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float | None:
    a = np.asarray(a, dtype=np.float32).reshape(-1)
    b = np.asarray(b, dtype=np.float32).reshape(-1)
    if a.shape != b.shape:
        return None
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b) / norm if norm > 0 else None
