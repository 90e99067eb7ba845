"""The SQLite engine: connections, migrations, vectors, full text, fusion, embeddings."""

if __name__ != "memstrata.storage":  # nothing generic may be importable at top level
    raise ImportError(f"import memstrata.storage, not {__name__}: it is part of the memstrata package")

from ._bm25 import Bm25Index
from ._connection import Database, connection_defaults, open_database
from ._consistency import ConsistencyReport, check_consistency
from ._default_model import DEFAULT_MODEL_ID, default_model_dir
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
from ._keywords import Filter, KeywordIndex, KeywordTable, ScoredIds, query_terms
from ._migrations import (
    EmbeddingMismatch,
    Migration,
    apply_migrations,
    embedding_mismatch,
    get_meta,
    record_embedding,
    schema_version,
    set_meta,
)
from ._vectors import APPROXIMATE_FROM, VectorHit, VectorIndex

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
    "ConsistencyReport",
    "Database",
    "DriverInfo",
    "Embedder",
    "EmbeddingCache",
    "EmbeddingMismatch",
    "FastEmbedEmbedder",
    "Filter",
    "Fused",
    "FusedArrays",
    "KeywordIndex",
    "KeywordQuery",
    "KeywordTable",
    "Migration",
    "Mode",
    "QueryVector",
    "RankedId",
    "ScoredIds",
    "SearchParams",
    "VectorHit",
    "VectorIndex",
    "apply_migrations",
    "best_score",
    "build_keyword_query",
    "check_consistency",
    "cjk_runs",
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
    "prefetch_query",
    "query_terms",
    "record_embedding",
    "rrf",
    "schema_version",
    "set_meta",
    "text_hash",
    "validate_mode",
]
