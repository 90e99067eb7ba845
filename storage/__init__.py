"""The SQLite engine: connections, migrations, vectors, full text, fusion, embeddings.

The names below are imported when first used (:func:`__getattr__`), not with the package: a
command that only reads the driver's version (``memstrata status``) must not pay for numpy, the
vector mirror and the keyword index it never touches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if __name__ != "memstrata.storage":  # nothing generic may be importable at top level
    raise ImportError(f"import memstrata.storage, not {__name__}: it is part of the memstrata package")

import os

from memstrata.core.lazy import lazy_attributes

# ONNX Runtime (1.32 on Linux) records telemetry events from its import on, in the user's cache
# folder (Microsoft/DeveloperTools), to upload them later; memstrata sends nothing anywhere at run
# time, so it is off unless the environment says otherwise. Set here, before anything in memstrata
# imports onnxruntime (the default model, fastembed), since the import itself records an event.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

if TYPE_CHECKING:
    from ._array_types import BoolArray, FloatArray, IntArray
    from ._bm25 import Bm25Index
    from ._bulk_cache import bulk_cache
    from ._connection import Database, configured, connection_defaults, open_database
    from ._consistency import CheckSpec, CheckTarget, ConsistencyReport, check_consistency
    from ._default_model import default_model_dir
    from ._driver import DriverInfo, disable_vec_for_tests, driver_info
    from ._embed_cache import EmbeddingCache
    from ._embedder import Embedder, text_hash
    from ._embedding import embed_documents, embed_query, prefetch_query
    from ._fastembed import FastEmbedEmbedder, default_embedder, load_embedder
    from ._fulltext import (
        FTS_TOKENIZER,
        MAX_QUERY_TERMS,
        KeywordQuery,
        build_keyword_query,
        cjk_runs,
        fts_schema,
        identifier_words,
        keyword_terms,
    )
    from ._fusion import (
        DEFAULT_KEYWORD_WEIGHT,
        DEFAULT_RRF_K,
        DEFAULT_VECTOR_WEIGHT,
        PLAIN_RRF_K,
        Fused,
        FusedArrays,
        best_score,
        fuse,
        fusion_weights,
        match_type,
        rrf,
    )
    from ._hybrid import (
        Mode,
        QueryVector,
        RankedId,
        SearchParams,
        hybrid_search,
        keyword_index,
        keyword_search,
        validate_mode,
    )
    from ._keep import Keep
    from ._keywords import Filter, KeywordIndex, KeywordTable, ScoredIds, query_terms
    from ._migrations import (
        EmbeddingMismatch,
        Migration,
        NamedMigration,
        apply_migrations,
        embedding_mismatch,
        get_meta,
        record_embedding,
        refresh_keyword_terms,
        schema_version,
        set_meta,
    )
    from ._model_id import DEFAULT_MODEL_ID
    from ._open_check import OpenCheck
    from ._vector_checks import precomputed_vectors
    from ._vectors import APPROXIMATE_FROM, VectorHit, VectorIndex

# each public name -> the submodule that defines it
_HOME: dict[str, str] = {
    "BoolArray": "._array_types",
    "FloatArray": "._array_types",
    "IntArray": "._array_types",
    "Bm25Index": "._bm25",
    "bulk_cache": "._bulk_cache",
    "Database": "._connection",
    "configured": "._connection",
    "connection_defaults": "._connection",
    "open_database": "._connection",
    "CheckSpec": "._consistency",
    "CheckTarget": "._consistency",
    "ConsistencyReport": "._consistency",
    "check_consistency": "._consistency",
    "DEFAULT_MODEL_ID": "._model_id",
    "OpenCheck": "._open_check",
    "default_model_dir": "._default_model",
    "DriverInfo": "._driver",
    "disable_vec_for_tests": "._driver",
    "driver_info": "._driver",
    "EmbeddingCache": "._embed_cache",
    "Embedder": "._embedder",
    "text_hash": "._embedder",
    "embed_documents": "._embedding",
    "embed_query": "._embedding",
    "prefetch_query": "._embedding",
    "FastEmbedEmbedder": "._fastembed",
    "default_embedder": "._fastembed",
    "load_embedder": "._fastembed",
    "FTS_TOKENIZER": "._fulltext",
    "MAX_QUERY_TERMS": "._fulltext",
    "KeywordQuery": "._fulltext",
    "build_keyword_query": "._fulltext",
    "cjk_runs": "._fulltext",
    "fts_schema": "._fulltext",
    "identifier_words": "._fulltext",
    "keyword_terms": "._fulltext",
    "DEFAULT_KEYWORD_WEIGHT": "._fusion",
    "DEFAULT_RRF_K": "._fusion",
    "DEFAULT_VECTOR_WEIGHT": "._fusion",
    "PLAIN_RRF_K": "._fusion",
    "Fused": "._fusion",
    "FusedArrays": "._fusion",
    "best_score": "._fusion",
    "fuse": "._fusion",
    "fusion_weights": "._fusion",
    "match_type": "._fusion",
    "rrf": "._fusion",
    "Mode": "._hybrid",
    "QueryVector": "._hybrid",
    "RankedId": "._hybrid",
    "SearchParams": "._hybrid",
    "hybrid_search": "._hybrid",
    "keyword_index": "._hybrid",
    "keyword_search": "._hybrid",
    "validate_mode": "._hybrid",
    "Filter": "._keywords",
    "Keep": "._keep",
    "KeywordIndex": "._keywords",
    "KeywordTable": "._keywords",
    "ScoredIds": "._keywords",
    "query_terms": "._keywords",
    "EmbeddingMismatch": "._migrations",
    "Migration": "._migrations",
    "NamedMigration": "._migrations",
    "refresh_keyword_terms": "._migrations",
    "apply_migrations": "._migrations",
    "embedding_mismatch": "._migrations",
    "get_meta": "._migrations",
    "record_embedding": "._migrations",
    "schema_version": "._migrations",
    "set_meta": "._migrations",
    "precomputed_vectors": "._vector_checks",
    "APPROXIMATE_FROM": "._vectors",
    "VectorHit": "._vectors",
    "VectorIndex": "._vectors",
}


lazy_attributes(__name__, _HOME)


__all__ = [
    "APPROXIMATE_FROM",
    "DEFAULT_KEYWORD_WEIGHT",
    "DEFAULT_MODEL_ID",
    "DEFAULT_RRF_K",
    "DEFAULT_VECTOR_WEIGHT",
    "FTS_TOKENIZER",
    "MAX_QUERY_TERMS",
    "PLAIN_RRF_K",
    "Bm25Index",
    "BoolArray",
    "CheckSpec",
    "CheckTarget",
    "ConsistencyReport",
    "Database",
    "DriverInfo",
    "Embedder",
    "EmbeddingCache",
    "EmbeddingMismatch",
    "FastEmbedEmbedder",
    "Filter",
    "FloatArray",
    "Fused",
    "FusedArrays",
    "IntArray",
    "Keep",
    "KeywordIndex",
    "KeywordQuery",
    "KeywordTable",
    "Migration",
    "Mode",
    "NamedMigration",
    "OpenCheck",
    "QueryVector",
    "RankedId",
    "ScoredIds",
    "SearchParams",
    "VectorHit",
    "VectorIndex",
    "apply_migrations",
    "best_score",
    "build_keyword_query",
    "bulk_cache",
    "check_consistency",
    "cjk_runs",
    "configured",
    "connection_defaults",
    "default_embedder",
    "default_model_dir",
    "disable_vec_for_tests",
    "driver_info",
    "embed_documents",
    "embed_query",
    "embedding_mismatch",
    "fts_schema",
    "fuse",
    "fusion_weights",
    "get_meta",
    "hybrid_search",
    "identifier_words",
    "keyword_index",
    "keyword_search",
    "keyword_terms",
    "load_embedder",
    "match_type",
    "open_database",
    "precomputed_vectors",
    "prefetch_query",
    "query_terms",
    "record_embedding",
    "refresh_keyword_terms",
    "rrf",
    "schema_version",
    "set_meta",
    "text_hash",
    "validate_mode",
]
