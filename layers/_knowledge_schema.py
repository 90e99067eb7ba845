"""What a knowledge store holds: its entry and hit records, its schema and the rows it writes
(:mod:`._knowledge` describes the store)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from memstrata.storage import (
    APPROXIMATE_FROM,
    DEFAULT_KEYWORD_WEIGHT,
    DEFAULT_RRF_K,
    DEFAULT_VECTOR_WEIGHT,
    FTS_TOKENIZER,
    KeywordTable,
    Migration,
    NamedMigration,
    cjk_runs,
    identifier_words,
    text_hash,
)

__all__ = ["CATEGORIES", "KnowledgeEntry", "KnowledgeHit", "SearchTuning"]

CATEGORIES: Final = ("outcome", "pitfall", "pattern", "codebase", "preference")
ORDER_BY: Final = ("updated_at", "created_at", "id")
BATCH: Final = 1000  # rows per transaction in add_many and rebuilds
BULK_BATCH: Final = 10_000  # rows per transaction in add_many with precomputed vectors
TABLE: Final = "knowledge"
FTS_COLUMNS: Final = ("content", "tag_text", "ident")
ENTRY_COLUMNS: Final = "id, content, category, scope, author, created_at, updated_at"
ALLOWED_ITEM_KEYS: Final = frozenset({"content", "category", "tags", "scope", "author"})


def keyword_table(column_weights: Sequence[float]) -> KeywordTable:
    """How entries are found by keywords: words in content, tags and identifiers (BM25 with
    ``column_weights``), CJK runs by trigrams and, too short for trigrams, by substring."""
    return KeywordTable(
        table=TABLE,
        columns=FTS_COLUMNS,
        weights=tuple(column_weights),
        trigram=f"{TABLE}_tri",
        like_columns=("cjk",),
        like_where="cjk != ''",
    )


@dataclass(frozen=True, slots=True)
class SearchTuning:
    """How the two rankings are fused; defaults measured by ``benchmarks/bench_knowledge.py``."""

    depth: int = 50  # candidates taken from each ranking before fusion
    rrf_k: int = DEFAULT_RRF_K  # PLAIN_RRF_K with equal weights: textbook RRF
    vector_weight: float = DEFAULT_VECTOR_WEIGHT
    keyword_weight: float = DEFAULT_KEYWORD_WEIGHT
    column_weights: tuple[float, float, float] = (1.0, 1.0, 1.0)  # bm25: content, tags, identifiers
    approximate_from: int | None = APPROXIMATE_FROM  # see VectorIndex


@dataclass(frozen=True, slots=True)
class KnowledgeEntry:
    """One piece of knowledge. Times are UNIX seconds (UTC)."""

    id: int
    content: str
    category: str
    tags: dict[str, str] = field(default_factory=dict)
    scope: str = "/"
    author: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    # which store holds it: an agent's id or "shared" (ids are per store, so id + store names
    # one entry); None for a store opened on its own without an owner
    store: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class KnowledgeHit:
    """A search result: ``score`` is the fused score normalised to 0..1 (1 = first in every
    ranking used), ``similarity`` the cosine similarity to the query when a vector exists."""

    entry: KnowledgeEntry
    score: float
    match_type: str  # "semantic" | "keyword" | "hybrid"
    vector_rank: int | None
    keyword_rank: int | None
    similarity: float | None

    @property
    def store(self) -> str | None:
        """The store the entry is in (``entry.store``): merged own and shared hits stay apart."""
        return self.entry.store

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset()


# Text is indexed twice: by words (porter stemming; content, tags and the words inside
# identifiers) and, for CJK only, by trigrams. The trigram index holds just the CJK runs (column
# ``cjk``): indexing English text by trigrams would triple the cost of every write for nothing.
_SCHEMA_V1 = f"""
CREATE TABLE {TABLE} (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    content TEXT NOT NULL,
    category TEXT NOT NULL,
    scope TEXT NOT NULL DEFAULT '/',
    author TEXT,
    content_hash BLOB NOT NULL,
    tag_text TEXT NOT NULL DEFAULT '',
    ident TEXT NOT NULL DEFAULT '',
    cjk TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    vector_pending INTEGER NOT NULL DEFAULT 1
);
CREATE UNIQUE INDEX {TABLE}_dedup ON {TABLE}(content_hash, category, scope);
CREATE INDEX {TABLE}_updated ON {TABLE}(updated_at);
CREATE INDEX {TABLE}_category ON {TABLE}(category, updated_at);
CREATE INDEX {TABLE}_scope ON {TABLE}(scope);
CREATE INDEX {TABLE}_pending ON {TABLE}(id) WHERE vector_pending = 1;
CREATE INDEX {TABLE}_has_cjk ON {TABLE}(id) WHERE cjk != '';
CREATE TABLE {TABLE}_tags (
    entry_id INTEGER NOT NULL REFERENCES {TABLE}(id) ON DELETE CASCADE,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (entry_id, key)
) WITHOUT ROWID;
CREATE INDEX {TABLE}_tags_kv ON {TABLE}_tags(key, value, entry_id);
CREATE VIRTUAL TABLE {TABLE}_fts USING fts5(content, tag_text, ident, content='{TABLE}',
    content_rowid='id', tokenize='{FTS_TOKENIZER}');
CREATE VIRTUAL TABLE {TABLE}_tri USING fts5(cjk, content='{TABLE}', content_rowid='id',
    tokenize='trigram');
CREATE TRIGGER {TABLE}_ai AFTER INSERT ON {TABLE} BEGIN
    INSERT INTO {TABLE}_fts(rowid, content, tag_text, ident)
        VALUES (new.id, new.content, new.tag_text, new.ident);
    INSERT INTO {TABLE}_tri(rowid, cjk) SELECT new.id, new.cjk WHERE new.cjk != '';
END;
CREATE TRIGGER {TABLE}_ad AFTER DELETE ON {TABLE} BEGIN
    INSERT INTO {TABLE}_fts({TABLE}_fts, rowid, content, tag_text, ident)
        VALUES ('delete', old.id, old.content, old.tag_text, old.ident);
    INSERT INTO {TABLE}_tri({TABLE}_tri, rowid, cjk) SELECT 'delete', old.id, old.cjk WHERE old.cjk != '';
END;
CREATE TRIGGER {TABLE}_au AFTER UPDATE OF content, tag_text, ident, cjk ON {TABLE} BEGIN
    INSERT INTO {TABLE}_fts({TABLE}_fts, rowid, content, tag_text, ident)
        VALUES ('delete', old.id, old.content, old.tag_text, old.ident);
    INSERT INTO {TABLE}_tri({TABLE}_tri, rowid, cjk) SELECT 'delete', old.id, old.cjk WHERE old.cjk != '';
    INSERT INTO {TABLE}_fts(rowid, content, tag_text, ident)
        VALUES (new.id, new.content, new.tag_text, new.ident);
    INSERT INTO {TABLE}_tri(rowid, cjk) SELECT new.id, new.cjk WHERE new.cjk != '';
END;
"""

# Migration 2: new rows reach the full-text indexes in one INSERT ... SELECT per batch, written
# by KnowledgeWrites._insert_rows in the same transaction; the per-row insert trigger tripled the
# cost of a bulk load. Updates and deletes keep their triggers (rare, one row at a time).
_BULK_INGEST = NamedMigration(
    "bulk-ingest-1",
    f"""
DROP TRIGGER IF EXISTS {TABLE}_ai;
""",
)

# Migration 3: duplicates are found by the first 8 bytes of the content's SHA-256, then compared
# whole with their category and scope. The unique index of (hash, category, scope) had random
# keys of ~45 bytes: every batch of a bulk load dirtied most of its pages, a fifth of a 1M load's
# time. Uniqueness is kept by the writers, which look duplicates up under ``BEGIN IMMEDIATE``
# (``KnowledgeWrites._add_batch``, ``KnowledgeEdits.update``); they must use HASH_KEY as written
# here for SQLite to use the index.
HASH_KEY_BYTES: Final = 8
HASH_KEY: Final = f"substr(content_hash, 1, {HASH_KEY_BYTES})"
_DEDUP_KEY = NamedMigration(
    "dedup-hash-key-1",
    f"""
DROP INDEX IF EXISTS {TABLE}_dedup;
CREATE INDEX {TABLE}_hash_key ON {TABLE}({HASH_KEY});
""",
)

MIGRATIONS: Final[list[Migration]] = [_SCHEMA_V1, _BULK_INGEST, _DEDUP_KEY]


def _tag_text(tags: Mapping[str, str]) -> str:
    """Tags as indexed words: ``{"lang": "python"}`` -> ``"lang python"``."""
    return " ".join(f"{k} {v}" if v else k for k, v in tags.items())


def _cjk_text(content: str, tag_text: str) -> str:
    """The CJK runs of an entry, one per line, for the trigram index (``""`` for most text)."""
    if content.isascii() and tag_text.isascii():
        return ""
    return "\n".join(dict.fromkeys(cjk_runs(content) + cjk_runs(tag_text)))


@dataclass(slots=True)
class _Item:
    content: str
    category: str
    tags: dict[str, str]
    scope: str
    author: str | None
    hash: bytes = b""
    key: tuple[bytes, str, str] = (b"", "", "")  # (hash, category, scope), set with the hash
    # the indexed texts of a new row (set by ``prepare``; ``tag_text`` and ``cjk`` again when
    # a duplicate later in the same batch merges its tags into this item)
    tag_text: str = ""
    ident: str = ""
    cjk: str = ""

    def seal(self) -> _Item:
        """Compute the content hash and the dedup key (once: a bulk load asks for it often)."""
        self.hash = text_hash(self.content)
        self.key = (self.hash, self.category, self.scope)
        return self

    def prepare(self) -> None:
        """Everything a write needs that depends on this item alone: the dedup key and the
        indexed texts. Pure (no database): a bulk load runs it on a worker thread."""
        self.seal()
        self.ident = identifier_words(self.content)
        self.retag()

    def retag(self) -> None:
        """The tag text and the CJK runs from the current tags."""
        self.tag_text = _tag_text(self.tags) if self.tags else ""
        self.cjk = _cjk_text(self.content, self.tag_text)


def _merge_into(refresh: dict[int, _Item], row_id: int, item: _Item) -> None:
    known = refresh.get(row_id)
    if known is None:
        refresh[row_id] = dataclasses.replace(item, tags=dict(item.tags))
    else:
        known.tags.update(item.tags)
        known.author = known.author or item.author


def _entry(row: Sequence[Any], tags: dict[str, str], store: str | None = None) -> KnowledgeEntry:
    return KnowledgeEntry(
        id=int(row[0]),
        content=row[1],
        category=row[2],
        tags=tags,
        scope=row[3],
        author=row[4],
        created_at=float(row[5]),
        updated_at=float(row[6]),
        store=store,
    )


def _int_or_none(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None
