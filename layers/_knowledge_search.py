"""Knowledge reads: list and count by filters, and search through the storage engine
(:func:`storage.hybrid_search`), with the filter as SQL and the category as a vector metadata
filter; the query is embedded while the keyword side ranks, or its vector is given."""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from memstrata.core.constants import EMBED_CHARS, MAX_LIST_LIMIT
from memstrata.core.errors import EmbeddingError, InvalidInputError
from memstrata.core.validation import (
    check_category,
    check_int,
    check_min_score,
    check_scope,
    check_tags,
    check_top_k,
)
from memstrata.storage import (
    Filter,
    FloatArray,
    Mode,
    QueryVector,
    SearchParams,
    embed_query,
    hybrid_search,
    prefetch_query,
    validate_mode,
)

from ._common import scope_ancestors, scope_subtree_sql
from ._knowledge_edits import KnowledgeEdits
from ._knowledge_schema import (
    ENTRY_COLUMNS,
    ORDER_BY,
    TABLE,
    KnowledgeEntry,
    KnowledgeHit,
    _entry,
)


class KnowledgeSearch(KnowledgeEdits):
    """Listing, counting and hybrid search (see ``KnowledgeStore``)."""

    def _filter(
        self,
        category: str | None,
        tags: Mapping[str, str] | Sequence[str] | None,
        scope: str | None,
        *,
        subtree: bool,
    ) -> tuple[list[str], list[Any], dict[str, Any]]:
        """SQL conditions on the entries table, their parameters and vec0 metadata filters."""
        conditions: list[str] = []
        params: list[Any] = []
        where: dict[str, Any] = {}
        if category is not None:
            conditions.append("category = ?")
            params.append(check_category(category))
            where["category"] = category
        if scope is not None:
            normal = check_scope(scope)
            if subtree:
                sql, values = scope_subtree_sql("scope", normal)
                conditions.append(sql)
                params.extend(values)
            else:
                ancestors = scope_ancestors(normal)
                conditions.append(f"scope IN ({','.join('?' * len(ancestors))})")
                params.extend(ancestors)
        for key, value in check_tags(tags, name="tags filter").items():
            if value:
                conditions.append(f"id IN (SELECT entry_id FROM {TABLE}_tags WHERE key = ? AND value = ?)")
                params.extend((key, value))
            else:
                conditions.append(f"id IN (SELECT entry_id FROM {TABLE}_tags WHERE key = ?)")
                params.append(key)
        return conditions, params, where

    def list(
        self,
        category: str | None = None,
        tags: Mapping[str, str] | Sequence[str] | None = None,
        scope: str | None = None,
        limit: int = 50,
        offset: int = 0,
        order_by: str = "updated_at",
        descending: bool = True,
    ) -> list[KnowledgeEntry]:
        """Entries matching every filter (``scope``: that scope and its descendants), ordered by
        ``order_by`` (``updated_at``, ``created_at`` or ``id``; ties by id), paginated."""
        self._open_db()
        limit = check_int(limit, "limit", 0, MAX_LIST_LIMIT)
        offset = check_int(offset, "offset", 0, 2**62)
        if order_by not in ORDER_BY:
            raise InvalidInputError(f"order_by must be one of {', '.join(ORDER_BY)}; got {order_by!r}")
        if not isinstance(descending, bool):
            raise InvalidInputError(f"descending must be a bool, got {type(descending).__name__}")
        conditions, params, _ = self._filter(category, tags, scope, subtree=True)
        direction = "DESC" if descending else "ASC"
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        order = f"{order_by} {direction}" + (f", id {direction}" if order_by != "id" else "")
        rows = self._db.query(
            f"SELECT {ENTRY_COLUMNS} FROM {TABLE}{where} ORDER BY {order} LIMIT ? OFFSET ?",
            (*params, limit, offset),
        )
        tags_by_id = self._tags_of([int(r[0]) for r in rows])
        return [_entry(r, tags_by_id.get(int(r[0]), {}), self.owner) for r in rows]

    def count(
        self,
        category: str | None = None,
        tags: Mapping[str, str] | Sequence[str] | None = None,
        scope: str | None = None,
    ) -> int:
        """How many entries match (all entries without filters; ``scope`` as in :meth:`list`)."""
        self._open_db()
        conditions, params, _ = self._filter(category, tags, scope, subtree=True)
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        return int(self._db.scalar(f"SELECT count(*) FROM {TABLE}{where}", params))

    def search(
        self,
        query: str,
        *,
        top_k: int = 10,
        mode: str = "hybrid",
        category: str | None = None,
        tags: Mapping[str, str] | Sequence[str] | None = None,
        scope: str | None = None,
        min_score: float | None = None,
        query_vector: FloatArray | None = None,
    ) -> builtins.list[KnowledgeHit]:
        """The ``top_k`` entries that best match ``query``, best first.

        ``mode``: ``"hybrid"`` (weighted RRF of both rankings), ``"vector"`` or ``"keyword"``; in
        keyword-only mode every mode searches by keywords. ``scope`` keeps entries of that scope
        and its ancestors. ``min_score`` drops semantic candidates whose cosine similarity is
        below it; keyword matches are never dropped by it. Any ``str`` query is safe.
        ``query_vector`` replaces embedding the query (it must come from the store's model).
        """
        self._open_db()
        if not isinstance(query, str):
            raise InvalidInputError(f"query must be a str, got {type(query).__name__}")
        top_k = check_top_k(top_k)
        checked_mode = validate_mode(mode)
        threshold = check_min_score(min_score)
        conditions, params, where = self._filter(category, tags, scope, subtree=False)
        if not query.strip() and query_vector is None:
            return []
        self._refresh_foreign()
        vectors = self._vectors if self._vector_reason() is None else None
        engine_mode: Mode = checked_mode
        if vectors is None or checked_mode == "keyword":  # keyword mode, or a store without vectors
            engine_mode = "keyword"
        vector: QueryVector = None
        if vectors is not None and engine_mode != "keyword":
            if query_vector is not None:
                vector = self._checked_query_vector(query_vector, vectors.dim)
            else:
                assert self._embedder is not None
                prefetch_query(self._embedder, query[:EMBED_CHARS])  # computed while keywords are ranked
                vector = lambda: self._embedded_query(query)  # noqa: E731
        flt = Filter(
            sql=f"SELECT id FROM {TABLE} WHERE {' AND '.join(conditions)}" if conditions else None,
            params=tuple(params),
            where=where,
            where_is_exact=not conditions or conditions == ["category = ?"],
        )
        tuning = self._tuning
        ranked = hybrid_search(
            self._db,
            keywords=self._keywords,
            vectors=vectors,
            query_vector=vector,
            query_text=query,
            params=SearchParams(
                top_k=top_k,
                mode=engine_mode,
                depth=tuning.depth,
                rrf_k=tuning.rrf_k,
                vector_weight=tuning.vector_weight,
                keyword_weight=tuning.keyword_weight,
                min_similarity=threshold,
            ),
            flt=flt,
        )
        entries = self._load([r.id for r in ranked])
        return [
            KnowledgeHit(entries[r.id], r.score, r.match_type, r.vector_rank, r.keyword_rank, r.similarity)
            for r in ranked
            if r.id in entries  # else deleted by another connection since the ranking
        ]

    def load_vector_index(self) -> None:
        """Load the vector index now (its files mapped and checked against the database), as the
        next vector search would: for a caller with time to spare before that search (``memstrata
        query`` while its model loads). Nothing is searched; without usable vectors, nothing to
        do (the search meets and reports any problem)."""
        self._refresh_foreign()
        if self._vectors is not None and self._vector_reason() is None:
            self._vectors.load()

    def _checked_query_vector(self, given: object, dim: int) -> FloatArray:
        try:
            array = np.asarray(given, dtype=np.float32).reshape(-1)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"query_vector must be an array of {dim} numbers: {exc}") from exc
        if array.shape != (dim,) or not np.isfinite(array).all() or not array.any():
            raise InvalidInputError(
                f"query_vector must be {dim} finite numbers, not all zero; got shape {array.shape}"
            )
        return array

    def _embedded_query(self, query: str) -> FloatArray | None:
        """The query's vector, or ``None`` when the model fails (the search answers by keywords)."""
        assert self._embedder is not None
        try:
            return embed_query(self._embedder, query[:EMBED_CHARS])
        except EmbeddingError as exc:
            self._last_error = str(exc)
            return None
