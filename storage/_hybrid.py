"""The retrieval engine every layer calls: candidate sources (a :class:`VectorIndex` and the
:class:`KeywordIndex`) restricted exactly to a filter the layer supplies, fused once by
:func:`storage.rrf` (weighted RRF, see ``_fusion``), scores normalised to 0..1.

A layer owns a content table (integer primary key ``id``) indexed by :func:`fts_schema` and a
:class:`VectorIndex` keyed by the same ids. It describes its filters once (:class:`Filter`:
SQL that selects the allowed ids plus equality filters on vector metadata columns), and both
sources search exactly that set, so filtered results are exact, never over-fetched and
post-filtered. When the metadata filters are the whole filter (``where_is_exact``), it runs
inside the vector index on both sides: the vector mirror scans only the allowed rows, and the
keyword matches are checked against the mirror's columns (rows without a vector by the SQL), so
no list of allowed ids is built. The layer gets back ranked ids with each list's rank, the
match type and the score, and only maps them to its rows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, cast

import numpy as np
import numpy.typing as npt

from memstrata.core.validation import check_mode

from ._array_types import FloatArray
from ._connection import Database
from ._fulltext import KeywordQuery, build_keyword_query
from ._fusion import (
    DEFAULT_KEYWORD_WEIGHT,
    DEFAULT_RRF_K,
    DEFAULT_VECTOR_WEIGHT,
    fusion_weights,
    match_type,
    rrf,
)
from ._keep import Keep
from ._keywords import Filter, KeywordIndex, KeywordTable
from ._vectors import VectorHit, VectorIndex

__all__ = [
    "Filter",
    "Mode",
    "QueryVector",
    "RankedId",
    "SearchParams",
    "hybrid_search",
    "keyword_search",
    "settle_unheld",
    "validate_mode",
]

Mode = Literal["hybrid", "vector", "keyword"]
# the query's vector, or a function computing it (called after the keyword side has ranked, so
# an embedding started earlier overlaps it); ``None`` from the function: keyword-only
QueryVector = FloatArray | Callable[[], FloatArray | None] | None


def validate_mode(mode: object) -> Mode:
    """``mode`` as a :data:`Mode` (the one rule: :func:`memstrata.core.validation.check_mode`)."""
    return cast(Mode, check_mode(mode))


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


_INDEXES_ATTRIBUTE = "_memstrata_keyword_indexes"


def keyword_index(
    db: Database, table: str, columns: Sequence[str], column_weights: Sequence[float] | None = None
) -> KeywordIndex:
    """The connection's :class:`KeywordIndex` of a :func:`fts_schema` table (its postings stay
    cached between searches; any write through the connection drops them). The indexes hang on
    the connection object, so they go with it."""
    weights = tuple(float(w) for w in (column_weights or [1.0] * len(columns)))
    key = (table, tuple(columns), weights)
    indexes: dict[tuple[str, tuple[str, ...], tuple[float, ...]], KeywordIndex] | None
    indexes = getattr(db, _INDEXES_ATTRIBUTE, None)
    if indexes is None:
        indexes = {}
        setattr(db, _INDEXES_ATTRIBUTE, indexes)
    index = indexes.get(key)
    if index is None:
        spec = KeywordTable(table=table, columns=tuple(columns), weights=weights)
        index = indexes[key] = KeywordIndex(db, spec, track_writes=True)
    return index


def keyword_search(
    db: Database,
    table: str,
    columns: Sequence[str],
    query: KeywordQuery,
    limit: int,
    flt: Filter,
    *,
    column_weights: Sequence[float] | None = None,
    text: str | None = None,
) -> list[int]:
    """Ids ranked by BM25 (words), trigram match (CJK) and LIKE (short CJK), fused by RRF.

    ``text`` is the query as typed (its words are scored); without it, ``query``'s words are.
    """
    if query.empty or limit <= 0:
        return []
    index = keyword_index(db, table, columns, column_weights)
    return index.ranking(text if text is not None else _query_text(query), limit, flt, query=query)


def _query_text(query: KeywordQuery) -> str:
    """The words of a built query (its FTS5 ``"a" OR "b"`` form back to plain words)."""
    words = query.words or ""
    return " ".join(part.strip().strip('"').replace('""', '"') for part in words.split(" OR "))


def hybrid_search(
    db: Database,
    *,
    table: str | None = None,
    columns: Sequence[str] = (),
    vectors: VectorIndex | None,
    query_vector: QueryVector,
    query_text: str,
    params: SearchParams,
    flt: Filter,
    column_weights: Sequence[float] | None = None,
    keywords: KeywordIndex | None = None,
) -> list[RankedId]:
    """Top ``params.top_k`` ids for a query, best first.

    The keyword source is ``keywords``, or the connection's index of ``table``/``columns``.
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
    if keywords is None:
        if table is None:
            raise ValueError("hybrid_search needs keywords or a table")
        keywords = keyword_index(db, table, columns, column_weights)
    depth = max(params.depth, params.top_k)
    use_vectors = mode != "keyword" and vectors is not None and query_vector is not None and vectors.available
    keyword_query = build_keyword_query(query_text) if mode != "vector" else None
    use_keywords = keyword_query is not None and not keyword_query.empty

    # A filter the vector metadata states exactly is applied inside the vector index (its
    # mirror's columns: no id list), on both sides: the word matches are checked against the
    # mirror's columns by position. Otherwise the allowed ids are queried once for both sides.
    allowed: list[int] | None = None
    keep: Keep | None = None
    if flt.sql is not None and flt.where_is_exact and vectors is not None and vectors.use_mirror:
        keep = _mirror_keep(db, vectors, flt)
    words = use_keywords and keyword_query is not None and keyword_query.words is not None
    need_ids = (use_vectors and not flt.where_is_exact) or (words and keep is None)
    if flt.sql is not None and need_ids:
        allowed = keywords.allowed(flt)

    keyword_ids: list[int] = []
    if use_keywords:
        keyword_ids = keywords.ranking(
            query_text, depth, flt, query=keyword_query, allowed=allowed, keep=keep
        )

    qv: FloatArray | None = None
    if use_vectors:
        qv = query_vector() if callable(query_vector) else query_vector
        use_vectors = qv is not None
        if qv is None and not use_keywords:  # the model failed: a vector search answers by keywords
            keyword_query = build_keyword_query(query_text)
            if not keyword_query.empty:
                use_keywords = True
                if (
                    flt.sql is not None
                    and keyword_query.words is not None
                    and allowed is None
                    and keep is None
                ):
                    allowed = keywords.allowed(flt)
                keyword_ids = keywords.ranking(
                    query_text, depth, flt, query=keyword_query, allowed=allowed, keep=keep
                )
    elif query_vector is not None and not callable(query_vector):
        qv = query_vector  # keyword mode: still gives each hit its similarity
    vector_hits: list[VectorHit] = []
    if use_vectors:
        assert vectors is not None and qv is not None
        if allowed is not None and not flt.where_is_exact:
            vector_hits = vectors.search(qv, depth, where=flt.where, candidates=allowed) if allowed else []
        else:
            vector_hits = vectors.search(qv, depth, where=flt.where)
        if params.min_similarity is not None:
            vector_hits = [h for h in vector_hits if h.similarity >= params.min_similarity]
    similarity = {h.rowid: h.similarity for h in vector_hits}

    # a keyword search that matched nothing takes no part: the vector list alone is then the best
    use_keywords = use_keywords and bool(keyword_ids)
    ranked: list[list[int]] = []
    if use_vectors:
        ranked.append([h.rowid for h in vector_hits])
    if use_keywords:
        ranked.append(keyword_ids)
    weights = fusion_weights(
        use_vectors,
        use_keywords,
        params.vector_weight,
        params.keyword_weight,
        query=query_text,
        k=params.rrf_k,
    )
    if not ranked:
        return []
    fused = rrf(ranked, k=params.rrf_k, weights=weights, limit=params.top_k)

    if vectors is not None and qv is not None and vectors.available:
        missing = [f.key for f in fused if f.key not in similarity]
        if missing:  # keyword-only hits: their similarity, from their stored vectors
            for hit in vectors.search(qv, len(missing), candidates=missing):
                similarity[hit.rowid] = hit.similarity
    results = []
    for f in fused:
        vrank = f.ranks[0] if use_vectors else None
        krank = f.ranks[-1] if use_keywords else None
        results.append(
            RankedId(f.key, f.score, match_type(vrank, krank), vrank, krank, similarity.get(f.key))
        )
    return results


def _mirror_keep(db: Database, vectors: VectorIndex, flt: Filter) -> Keep:
    """``flt`` as a mask over ids, read from the vector mirror's columns; ids the index does
    not hold (their vector pending or failed) are checked by ``flt.sql``, so the mask is exact."""

    def allows(ids: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        state = vectors.allows(ids, flt.where)
        if state is None:
            state = np.full(len(ids), -1, dtype=np.int8)
        return settle_unheld(db, flt, ids, state, unheld=False)

    return Keep(allows, Keep.key_of("mirror", flt.sql, flt.params, tuple(sorted(flt.where.items()))))


def settle_unheld(
    db: Database, flt: Filter, ids: npt.NDArray[np.int64], state: npt.NDArray[np.int8], *, unheld: bool
) -> npt.NDArray[np.bool_]:
    """A mirror's verdict on ``ids`` (``state``: 1 allowed, 0 refused, -1 not held) as a mask:
    the ids it does not hold are asked of ``flt.sql``; without SQL they are ``unheld``."""
    out = state > 0
    unknown = np.flatnonzero(state < 0)
    if len(unknown) and flt.sql is not None:
        asked = ids[unknown]
        sql = f"SELECT value FROM json_each(?) WHERE value IN ({flt.sql})"
        found = [int(r[0]) for r in db.query(sql, (json.dumps(asked.tolist()), *flt.params))]
        out[unknown] = np.isin(asked, np.asarray(found, dtype=np.int64))
    elif len(unknown):
        out[unknown] = unheld
    return out
