"""Long-term knowledge: what an agent learnt (outcomes, pitfalls, patterns, ...), consulted before
every task with hybrid search.

One store is one SQLite file (``knowledge/{agent}.sqlite`` or ``knowledge/shared.sqlite``).
Entries are plain rows; tags live in a side table so tag filters are SQL; text is indexed by
FTS5 (content, tags, the words inside identifiers) and vectors by sqlite-vec with the category as
a vec0 metadata column, so a category filter is exact inside the KNN. Search fuses the vector and
keyword rankings with weighted Reciprocal Rank Fusion; the weights and depth are measured on real
text (``benchmarks/bench_knowledge.py``), not guessed.

Vectors are derived data: an entry is stored even when embedding fails (its vector is *pending*
and is computed on the next successful write, open or :meth:`KnowledgeStore.reindex`), and when
the embedding model changes, every vector is rebuilt from the stored text before one transaction
swaps the new index in.
"""

from __future__ import annotations

import builtins
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from memstrata.core.constants import EMBED_CHARS, MAX_LIST_LIMIT, SHARED
from memstrata.core.validation import (
    check_author,
    check_category,
    check_content,
    check_int,
    check_min_score,
    check_row_id,
    check_scope,
    check_tags,
    check_top_k,
)
from memstrata.storage import (
    APPROXIMATE_FROM,
    DEFAULT_KEYWORD_WEIGHT,
    DEFAULT_RRF_K,
    DEFAULT_VECTOR_WEIGHT,
    FTS_TOKENIZER,
    MAX_QUERY_TERMS,
    PLAIN_RRF_K,
    Database,
    Embedder,
    EmbeddingCache,
    VectorHit,
    VectorIndex,
    apply_migrations,
    build_keyword_query,
    check_consistency,
    cjk_runs,
    default_embedder,
    embed_documents,
    embed_query,
    embedding_mismatch,
    fusion_weights,
    get_meta,
    identifier_words,
    keyword_terms,
    load_embedder,
    match_type,
    open_database,
    prefetch_query,
    record_embedding,
    rrf,
    text_hash,
    validate_mode,
)
from memstrata.storage._migrations import refresh_keyword_terms

from memstrata.config import Config
from memstrata.errors import EmbedderUnavailableError, EmbeddingError, InvalidInputError, StorageError

from ._common import scope_ancestors, scope_subtree_sql
from ._knowledge_bm25 import Bm25Index

__all__ = ["CATEGORIES", "KnowledgeEntry", "KnowledgeHit", "KnowledgeStore"]

FloatArray = npt.NDArray[np.float32]

CATEGORIES: Final = ("outcome", "pitfall", "pattern", "codebase", "preference")
ORDER_BY: Final = ("updated_at", "created_at", "id")
_BATCH: Final = 1000  # rows per transaction in add_many and rebuilds
_TABLE: Final = "knowledge"
_FTS_COLUMNS: Final = ("content", "tag_text", "ident")
_ENTRY_COLUMNS: Final = "id, content, category, scope, author, created_at, updated_at"
_ALLOWED_ITEM_KEYS: Final = frozenset({"content", "category", "tags", "scope", "author"})


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
CREATE TABLE {_TABLE} (
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
CREATE UNIQUE INDEX {_TABLE}_dedup ON {_TABLE}(content_hash, category, scope);
CREATE INDEX {_TABLE}_updated ON {_TABLE}(updated_at);
CREATE INDEX {_TABLE}_category ON {_TABLE}(category, updated_at);
CREATE INDEX {_TABLE}_scope ON {_TABLE}(scope);
CREATE INDEX {_TABLE}_pending ON {_TABLE}(id) WHERE vector_pending = 1;
CREATE INDEX {_TABLE}_has_cjk ON {_TABLE}(id) WHERE cjk != '';
CREATE TABLE {_TABLE}_tags (
    entry_id INTEGER NOT NULL REFERENCES {_TABLE}(id) ON DELETE CASCADE,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (entry_id, key)
) WITHOUT ROWID;
CREATE INDEX {_TABLE}_tags_kv ON {_TABLE}_tags(key, value, entry_id);
CREATE VIRTUAL TABLE {_TABLE}_fts USING fts5(content, tag_text, ident, content='{_TABLE}',
    content_rowid='id', tokenize='{FTS_TOKENIZER}');
CREATE VIRTUAL TABLE {_TABLE}_tri USING fts5(cjk, content='{_TABLE}', content_rowid='id',
    tokenize='trigram');
CREATE TRIGGER {_TABLE}_ai AFTER INSERT ON {_TABLE} BEGIN
    INSERT INTO {_TABLE}_fts(rowid, content, tag_text, ident)
        VALUES (new.id, new.content, new.tag_text, new.ident);
    INSERT INTO {_TABLE}_tri(rowid, cjk) SELECT new.id, new.cjk WHERE new.cjk != '';
END;
CREATE TRIGGER {_TABLE}_ad AFTER DELETE ON {_TABLE} BEGIN
    INSERT INTO {_TABLE}_fts({_TABLE}_fts, rowid, content, tag_text, ident)
        VALUES ('delete', old.id, old.content, old.tag_text, old.ident);
    INSERT INTO {_TABLE}_tri({_TABLE}_tri, rowid, cjk) SELECT 'delete', old.id, old.cjk WHERE old.cjk != '';
END;
CREATE TRIGGER {_TABLE}_au AFTER UPDATE OF content, tag_text, ident, cjk ON {_TABLE} BEGIN
    INSERT INTO {_TABLE}_fts({_TABLE}_fts, rowid, content, tag_text, ident)
        VALUES ('delete', old.id, old.content, old.tag_text, old.ident);
    INSERT INTO {_TABLE}_tri({_TABLE}_tri, rowid, cjk) SELECT 'delete', old.id, old.cjk WHERE old.cjk != '';
    INSERT INTO {_TABLE}_fts(rowid, content, tag_text, ident)
        VALUES (new.id, new.content, new.tag_text, new.ident);
    INSERT INTO {_TABLE}_tri(rowid, cjk) SELECT new.id, new.cjk WHERE new.cjk != '';
END;
"""

MIGRATIONS: Final = [_SCHEMA_V1]


def _tag_text(tags: Mapping[str, str]) -> str:
    """Tags as indexed words: ``{"lang": "python"}`` -> ``"lang python"``."""
    return " ".join(f"{k} {v}" if v else k for k, v in tags.items())


def _cjk_text(content: str, tag_text: str) -> str:
    """The CJK runs of an entry, one per line, for the trigram index (``""`` for most text)."""
    return "\n".join(dict.fromkeys(cjk_runs(content) + cjk_runs(tag_text)))


@dataclass(slots=True)
class _Item:
    content: str
    category: str
    tags: dict[str, str]
    scope: str
    author: str | None
    hash: bytes = b""

    @property
    def key(self) -> tuple[bytes, str, str]:
        return (self.hash, self.category, self.scope)


class KnowledgeStore:
    """Categorised, tagged, scoped knowledge of one agent (or the shared store), with hybrid search.

    A plain synchronous object that owns its database connection: use it from one thread at a
    time (the actors serialise access). Open it with :meth:`open`; it is a context manager.
    """

    SHARED: Final = SHARED

    def __init__(
        self,
        db: Database,
        embedder: Embedder | None,
        *,
        unavailable_reason: str | None = None,
        max_content_bytes: int = 4_000_000,
        tuning: SearchTuning | None = None,
    ) -> None:
        if embedder is not None and not isinstance(embedder, Embedder):
            raise InvalidInputError(
                f"embedder must implement the Embedder protocol, got {type(embedder).__name__}"
            )
        self._db = db
        self._embedder = embedder
        self._unavailable = unavailable_reason
        self._max_bytes = max_content_bytes
        self._tuning = tuning or SearchTuning()
        self._closed = False
        # UNIX seconds for created_at/updated_at; a system sets it from its clock (simulations)
        self.clock: Callable[[], float] = time.time
        # the name entries carry as their ``store`` (an agent id or "shared"); a system sets it
        self.owner: str | None = None
        self._last_error: str | None = None
        self._rebuild_needed = False
        self._seen_version = -1
        self._foreign_model: str | None = None  # another process rebuilt vectors with this model
        apply_migrations(db, "knowledge", MIGRATIONS)
        refresh_keyword_terms(db, table=_TABLE, column="ident", source="content")
        self._cache = EmbeddingCache(db)
        self._bm25 = Bm25Index(db, f"{_TABLE}_fts", _FTS_COLUMNS, self._tuning.column_weights)
        self._vectors = self._open_vectors()
        self._consistency = check_consistency(
            db,
            table=_TABLE,
            fts={f"{_TABLE}_fts": None, f"{_TABLE}_tri": "cjk != ''"},
            vectors=self._vectors,
            vector_rows="vector_pending = 0",
            repair_missing=self._mark_pending,
        )
        if self._consistency.fts_rebuilt:
            self._bm25.reset()
        if embedder is not None:
            self._start_vectors(embedder)

    def _mark_pending(self, entry_ids: list[int]) -> int:
        """Entries found without a vector are re-embedded by the pending-vector catch-up."""
        with self._db.transaction():
            self._db.executemany(
                f"UPDATE {_TABLE} SET vector_pending = 1 WHERE id = ?", [(i,) for i in entry_ids]
            )
        return 0

    # -- opening ----------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | Path,
        embedder: Embedder | None = None,
        *,
        config: Config | None = None,
    ) -> KnowledgeStore:
        """Open (creating if needed) the store at ``path``.

        ``embedder`` ``None`` loads the configured model (the packaged default unless ``config``
        names another); when no model can be loaded the store runs keyword-only and
        :meth:`status` says why.
        """
        if not isinstance(path, str | Path):
            raise InvalidInputError(f"path must be a str or Path, got {type(path).__name__}")
        config = config or Config.load()  # memstrata.toml and MEMSTRATA_* apply
        reason: str | None = None
        if embedder is None:
            try:
                if config.embedding.model in ("", "default"):
                    embedder = default_embedder()
                else:
                    embedder = load_embedder(
                        config.embedding.model, dim=config.embedding.dim, threads=config.embedding.threads
                    )
            except EmbedderUnavailableError as exc:
                reason = f"no embedding model: {exc}"
        search = config.search
        tuning = SearchTuning(
            depth=search.depth,
            rrf_k=search.rrf_k,
            vector_weight=search.vector_weight,
            keyword_weight=search.keyword_weight,
            approximate_from=search.approximate_from,
        )
        db = open_database(path)
        try:
            return cls(
                db,
                embedder,
                unavailable_reason=reason,
                max_content_bytes=config.max_content_bytes,
                tuning=tuning,
            )
        except BaseException:
            db.close()
            raise

    @staticmethod
    def path_for(data_dir: str | Path, owner: str) -> Path:
        """``{data_dir}/knowledge/{owner}.sqlite``; ``owner`` is an agent id or ``"shared"``."""
        if (
            not isinstance(owner, str)
            or not owner
            or owner in (".", "..")
            or len(owner) > 128
            or any(not (c.isalnum() or c in "-_.@") for c in owner)
        ):
            raise InvalidInputError(
                f"owner {owner!r} must be 1-128 letters, digits or '-_.@' (an agent id or 'shared')"
            )
        return Path(data_dir) / "knowledge" / f"{owner}.sqlite"

    def _open_vectors(self) -> VectorIndex | None:
        """The existing vector table (any model), or ``None`` if this store never had one."""
        stored_dim = get_meta(self._db, f"vector_dim:{_TABLE}")
        if stored_dim is None:
            return None
        return self._vector_index(int(stored_dim))

    def _vector_index(self, dim: int) -> VectorIndex:
        return VectorIndex(
            self._db,
            _TABLE,
            dim,
            metadata={"category": "text"},
            approximate_from=self._tuning.approximate_from,
        )

    def _start_vectors(self, embedder: Embedder) -> None:
        if self._vectors is None:
            with self._db.transaction():
                self._vectors = self._vector_index(embedder.dim)
                record_embedding(self._db, embedder.model_id, embedder.dim)
        elif embedding_mismatch(self._db, embedder.model_id, embedder.dim) is not None:
            self._rebuild_needed = True
        elif get_meta(self._db, "embedding_model") is None:
            record_embedding(self._db, embedder.model_id, embedder.dim)
        self._seen_version = self._db.data_version()
        self._catch_up()

    # -- state ------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"knowledge store {self._db.path} is closed")

    def _vectors_writable(self) -> bool:
        """New vectors can be computed and stored with the current model."""
        return (
            self._embedder is not None
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
        stored_dim = _int_or_none(get_meta(self._db, f"vector_dim:{_TABLE}"))
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
    def path(self) -> Path:
        return self._db.path

    @property
    def embedder(self) -> Embedder | None:
        return self._embedder

    @property
    def mode(self) -> str:
        """``"hybrid"`` when vector search is usable, else ``"keyword-only"``."""
        return "hybrid" if self._vector_reason() is None else "keyword-only"

    def _vector_reason(self) -> str | None:
        if self._embedder is None:
            return self._unavailable or "no embedding model"
        if self._vectors is None:
            return "no vector index"
        if not self._vectors.available:
            return f"sqlite-vec could not be loaded: {self._db.vec_reason}"
        if self._foreign_model is not None:
            return (
                f"another process rebuilt the vectors with model {self._foreign_model!r}; "
                "reopen the store to use them"
            )
        if self._rebuild_needed:
            return (
                f"vectors were made by another model; rebuilding them for {self._embedder.model_id!r} "
                f"failed ({self._last_error}); call reindex()"
            )
        return None

    # -- writes -----------------------------------------------------------------------------------

    def add(
        self,
        content: str,
        *,
        category: str = "pattern",
        tags: Mapping[str, str] | Sequence[str] | None = None,
        scope: str = "/",
        author: str | None = None,
    ) -> int:
        """Store one entry and return its id. The same content, category and scope as an existing
        entry returns that entry's id: its ``updated_at`` is refreshed and the given tags are
        merged into its tags (a given key's value replaces the old one; other keys stay)."""
        self._check_open()
        item = {"content": content, "category": category, "tags": tags, "scope": scope, "author": author}
        return self._write([self._check_item(item, "")])[0]

    def add_many(self, items: Iterable[Mapping[str, Any]]) -> list[int]:
        """Store many entries (mappings with :meth:`add`'s keyword names); ids in input order.

        Every item is checked before anything is written. Embedding is batched; writes are one
        transaction per batch of 1000.
        """
        self._check_open()
        if isinstance(items, str | bytes) or not isinstance(items, Iterable):
            raise InvalidInputError(f"items must be an iterable of mappings, got {type(items).__name__}")
        checked = []
        for index, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise InvalidInputError(f"items[{index}] must be a mapping, got {type(item).__name__}")
            checked.append(self._check_item(item, f"items[{index}]."))
        return self._write(checked)

    def _write(self, checked: list[_Item]) -> list[int]:
        self._refresh_foreign()
        if self._rebuild_needed and checked:
            self._try_rebuild()
        ids: list[int] = []
        embedded_ok = True
        for start in range(0, len(checked), _BATCH):
            batch_ids, ok = self._add_batch(checked[start : start + _BATCH])
            ids.extend(batch_ids)
            embedded_ok = embedded_ok and ok
        if embedded_ok and checked:
            self._catch_up()
        return ids

    def _check_item(self, item: Mapping[str, Any], where: str) -> _Item:
        unknown = set(item) - _ALLOWED_ITEM_KEYS
        if unknown:
            raise InvalidInputError(
                f"{where.rstrip('.') or 'item'} has unknown key(s) {sorted(map(str, unknown))}; "
                f"allowed: {', '.join(sorted(_ALLOWED_ITEM_KEYS))}"
            )
        if "content" not in item:
            raise InvalidInputError(f"{where.rstrip('.') or 'item'} has no 'content'")
        category = item.get("category", "pattern")
        scope = item.get("scope", "/")
        checked = _Item(
            content=check_content(item["content"], max_bytes=self._max_bytes, name=f"{where}content"),
            category=check_category("pattern" if category is None else category, name=f"{where}category"),
            tags=check_tags(item.get("tags"), name=f"{where}tags"),
            scope=check_scope("/" if scope is None else scope, name=f"{where}scope"),
            author=check_author(item.get("author"), name=f"{where}author"),
        )
        checked.hash = text_hash(checked.content)
        return checked

    def _existing(self, items: Sequence[_Item]) -> dict[tuple[bytes, str, str], int]:
        """Ids of stored entries with the content of ``items``, by (hash, category, scope); an
        entry with the same content elsewhere is also listed under (hash, "", "")."""
        found: dict[tuple[bytes, str, str], int] = {}
        hashes = list(dict.fromkeys(i.hash for i in items))
        for start in range(0, len(hashes), 500):
            chunk = hashes[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for row_id, digest, category, scope in self._db.query(
                f"SELECT id, content_hash, category, scope FROM {_TABLE} WHERE content_hash IN ({marks})",
                chunk,
            ):
                found[(bytes(digest), category, scope)] = int(row_id)
                found.setdefault((bytes(digest), "", ""), int(row_id))
        return found

    def _embed(self, texts: Sequence[str], *, cache: bool = False) -> FloatArray | None:
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

    def _add_batch(self, batch: list[_Item]) -> tuple[list[int], bool]:
        """Write one batch; returns its ids and whether its embedding succeeded."""
        existing = self._existing(batch)
        fresh: dict[tuple[bytes, str, str], _Item] = {}
        for item in batch:
            if item.key not in existing and item.key not in fresh:
                fresh[item.key] = item
        vectors: dict[tuple[bytes, str, str], FloatArray] = {}
        embedded_ok = True
        if fresh and self._vectors_writable():
            assert self._vectors is not None
            for key in list(fresh):  # the same content stored in another category or scope
                sibling = existing.get((key[0], "", ""))
                stored = None if sibling is None else self._vectors.get(sibling)
                if stored is not None:
                    vectors[key] = stored
            keys = [k for k in fresh if k not in vectors]
            array = self._embed([fresh[k].content for k in keys]) if keys else None
            if keys and array is None:
                embedded_ok = False
            elif array is not None:
                vectors.update(zip(keys, array, strict=True))
        now = self.clock()
        with self._db.transaction():
            existing = self._existing(batch)  # authoritative, under the write lock
            next_id = self._next_id()
            new_rows: dict[tuple[bytes, str, str], tuple[int, _Item]] = {}
            refresh: dict[int, _Item] = {}
            ids: list[int] = []
            for item in batch:
                if item.key in existing:
                    row_id = existing[item.key]
                    _merge_into(refresh, row_id, item)
                elif item.key in new_rows:
                    row_id, first = new_rows[item.key]
                    first.tags = {**first.tags, **item.tags}  # items are never shared: rebinding is safe
                    first.author = first.author or item.author
                else:
                    row_id = next_id
                    next_id += 1
                    new_rows[item.key] = (row_id, item)
                ids.append(row_id)
            if new_rows:
                self._insert_rows(new_rows, vectors, now)
            if refresh:
                self._refresh_rows(refresh, now)
        return ids, embedded_ok

    def _next_id(self) -> int:
        seq = self._db.scalar("SELECT seq FROM sqlite_sequence WHERE name = ?", (_TABLE,))
        top = self._db.scalar(f"SELECT max(id) FROM {_TABLE}")
        return max(int(seq or 0), int(top or 0)) + 1

    def _insert_rows(
        self,
        rows: Mapping[tuple[bytes, str, str], tuple[int, _Item]],
        vectors: Mapping[tuple[bytes, str, str], FloatArray],
        now: float,
    ) -> None:
        texts = {r: (_tag_text(i.tags), identifier_words(i.content)) for r, i in rows.values()}
        self._db.executemany(
            f"INSERT INTO {_TABLE}(id, content, category, scope, author, content_hash, tag_text, ident, "
            "cjk, created_at, updated_at, vector_pending) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    row_id,
                    item.content,
                    item.category,
                    item.scope,
                    item.author,
                    item.hash,
                    texts[row_id][0],
                    texts[row_id][1],
                    _cjk_text(item.content, texts[row_id][0]),
                    now,
                    now,
                    0 if key in vectors else 1,
                )
                for key, (row_id, item) in rows.items()
            ],
        )
        self._db.on_rollback(self._bm25.reset)
        self._bm25.added([(r, i.content, *texts[r]) for r, i in rows.values()])
        tag_rows = [(row_id, k, v) for row_id, item in rows.values() for k, v in item.tags.items()]
        if tag_rows:
            self._db.executemany(
                f"INSERT INTO {_TABLE}_tags(entry_id, key, value) VALUES (?, ?, ?)", tag_rows
            )
        with_vectors = [
            (row_id, item, vectors[key]) for key, (row_id, item) in rows.items() if key in vectors
        ]
        if with_vectors:
            assert self._vectors is not None
            self._vectors.upsert_many(
                [r for r, _, _ in with_vectors],
                np.stack([v for _, _, v in with_vectors]),
                [{"category": item.category} for _, item, _ in with_vectors],
            )

    def _refresh_rows(self, refresh: Mapping[int, _Item], now: float) -> None:
        """Dedup hits: bump ``updated_at``, merge tags, fill a missing author."""
        self._db.executemany(
            f"UPDATE {_TABLE} SET updated_at = ?, author = coalesce(author, ?) WHERE id = ?",
            [(now, item.author, row_id) for row_id, item in refresh.items()],
        )
        tagged = {row_id: item.tags for row_id, item in refresh.items() if item.tags}
        if not tagged:
            return
        self._db.executemany(
            f"INSERT INTO {_TABLE}_tags(entry_id, key, value) VALUES (?, ?, ?) "
            "ON CONFLICT(entry_id, key) DO UPDATE SET value = excluded.value",
            [(row_id, k, v) for row_id, tags in tagged.items() for k, v in tags.items()],
        )
        merged = self._tags_of(list(tagged))
        texts = {row_id: _tag_text(merged.get(row_id, {})) for row_id in tagged}
        changed = [
            i for i, t in texts.items()
            if self._db.execute(
                f"UPDATE {_TABLE} SET tag_text = ?, cjk = ? WHERE id = ? AND tag_text != ?",
                (t, _cjk_text(refresh[i].content, t), i, t),
            ).rowcount
        ]  # fmt: skip
        self._db.on_rollback(self._bm25.reset)
        self._bm25.changed(changed)

    def get(self, id: int) -> KnowledgeEntry | None:
        """The entry with this id, or ``None``."""
        self._check_open()
        entries = self._load([check_row_id(id)])
        return entries.get(id)

    def update(
        self,
        id: int,
        *,
        content: str | _Unset = UNSET,
        category: str | _Unset = UNSET,
        tags: Mapping[str, str] | Sequence[str] | _Unset | None = UNSET,
        scope: str | _Unset = UNSET,
        author: str | _Unset | None = UNSET,
    ) -> KnowledgeEntry | None:
        """Change the given fields (``tags`` replaces all tags; ``None`` or ``{}`` clears them);
        re-embeds when the content changes. Returns the new entry, or ``None`` if ``id`` does not
        exist. A change that would duplicate another entry (same content, category and scope)
        raises ``InvalidInputError`` (a ``ValueError``) naming it, and changes nothing."""
        self._check_open()
        entry_id = check_row_id(id)
        new_content = (
            None if isinstance(content, _Unset) else check_content(content, max_bytes=self._max_bytes)
        )
        new_category = None if isinstance(category, _Unset) else check_category(category)
        new_tags = None if isinstance(tags, _Unset) else check_tags(tags)
        new_scope = None if isinstance(scope, _Unset) else check_scope(scope)
        new_author = UNSET if isinstance(author, _Unset) else check_author(author)
        current = self.get(entry_id)
        if current is None:
            return None
        current_tag_text = _tag_text(current.tags)
        self._refresh_foreign()
        content_changed = new_content is not None and new_content != current.content
        vector: FloatArray | None = None
        embedded_ok = True
        if content_changed and self._vectors_writable():
            assert new_content is not None
            array = self._embed([new_content])
            embedded_ok = array is not None
            vector = None if array is None else array[0]
        final_content = new_content if new_content is not None else current.content
        final_category = new_category or current.category
        final_scope = new_scope or current.scope
        digest = text_hash(final_content)
        with self._db.transaction():
            other = self._db.scalar(
                f"SELECT id FROM {_TABLE} WHERE content_hash = ? AND category = ? AND scope = ? AND id != ?",
                (digest, final_category, final_scope, entry_id),
            )
            if other is not None:
                raise InvalidInputError(
                    f"update of entry {entry_id} would duplicate entry {other} "
                    "(same content, category and scope)"
                )
            if self._db.scalar(f"SELECT 1 FROM {_TABLE} WHERE id = ?", (entry_id,)) is None:
                return None
            sets = ["updated_at = ?", "category = ?", "scope = ?"]
            params: list[Any] = [self.clock(), final_category, final_scope]
            tag_text = None if new_tags is None else _tag_text(new_tags)
            if content_changed:
                sets += ["content = ?", "content_hash = ?", "ident = ?"]
                params += [final_content, digest, identifier_words(final_content)]
            if tag_text is not None:
                sets.append("tag_text = ?")
                params.append(tag_text)
            if content_changed or tag_text is not None:
                # only text changes touch the full-text indexes (a 1 MB entry is costly to reindex)
                sets.append("cjk = ?")
                params.append(
                    _cjk_text(final_content, tag_text if tag_text is not None else current_tag_text)
                )
            if not isinstance(new_author, _Unset):
                sets.append("author = ?")
                params.append(new_author)
            if new_tags is not None:
                self._db.execute(f"DELETE FROM {_TABLE}_tags WHERE entry_id = ?", (entry_id,))
                self._db.executemany(
                    f"INSERT INTO {_TABLE}_tags(entry_id, key, value) VALUES (?, ?, ?)",
                    [(entry_id, k, v) for k, v in new_tags.items()],
                )
            self._db.execute(f"UPDATE {_TABLE} SET {', '.join(sets)} WHERE id = ?", (*params, entry_id))
            if content_changed or tag_text is not None:
                self._db.on_rollback(self._bm25.reset)
                self._bm25.changed([entry_id])
            self._update_vector(entry_id, content_changed, vector, final_category, current.category)
        if embedded_ok and content_changed:
            self._catch_up()
        return self.get(entry_id)

    def _update_vector(
        self,
        entry_id: int,
        content_changed: bool,
        vector: FloatArray | None,
        category: str,
        old_category: str,
    ) -> None:
        if vector is not None:
            assert self._vectors is not None
            self._vectors.upsert_many([entry_id], vector.reshape(1, -1), [{"category": category}])
            self._db.execute(f"UPDATE {_TABLE} SET vector_pending = 0 WHERE id = ?", (entry_id,))
        elif content_changed:
            # the old vector describes old text: drop it, compute the new one later
            if self._vectors is not None:
                self._vectors.delete_many([entry_id])
            self._db.execute(f"UPDATE {_TABLE} SET vector_pending = 1 WHERE id = ?", (entry_id,))
        elif category != old_category and self._vectors is not None:
            stored = self._vectors.get(entry_id) if self._vectors.available else None
            if stored is not None and not self._rebuild_needed and self._foreign_model is None:
                self._vectors.upsert_many([entry_id], stored.reshape(1, -1), [{"category": category}])
            elif self._db.scalar(f"SELECT vector_pending FROM {_TABLE} WHERE id = ?", (entry_id,)) == 0:
                # the vector cannot be reached now: rewrite it (with its new category) later
                self._vectors.delete_many([entry_id])
                self._db.execute(f"UPDATE {_TABLE} SET vector_pending = 1 WHERE id = ?", (entry_id,))

    def delete(self, id: int) -> bool:
        """Delete an entry: ``True`` if it existed, ``False`` otherwise."""
        self._check_open()
        entry_id = check_row_id(id)
        with self._db.transaction():
            gone = self._db.execute(f"DELETE FROM {_TABLE} WHERE id = ?", (entry_id,)).rowcount > 0
            if gone:
                self._db.on_rollback(self._bm25.reset)
                self._bm25.removed([entry_id])
            if gone and self._vectors is not None:
                self._vectors.delete_many([entry_id])
        return bool(gone)

    # -- vectors: pending rows and model changes -------------------------------------------------

    def reindex(self, *, full: bool = False) -> int:
        """Compute missing vectors (``full=True``: rebuild every vector, e.g. after changing the
        model outside memstrata). Returns how many vectors were written. Raises
        :class:`EmbeddingError` if the model fails and :class:`EmbedderUnavailableError` in
        keyword-only mode."""
        self._check_open()
        if self._embedder is None:
            raise EmbedderUnavailableError(
                f"knowledge store {self.path} is keyword-only: {self._vector_reason()}"
            )
        self._refresh_foreign()
        if self._foreign_model is not None:
            raise StorageError(str(self._vector_reason()))
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
        elif self._vectors_writable() and self._pending_count() > 0:
            self._embed_pending()

    def _pending_count(self) -> int:
        return int(self._db.scalar(f"SELECT count(*) FROM {_TABLE} WHERE vector_pending = 1"))

    def pending_vectors(self) -> int:
        """Entries whose vector is still to be computed (found by keywords meanwhile)."""
        self._check_open()
        return self._pending_count() if self._embedder is not None else 0

    def catch_up_vectors(self) -> int:
        """Compute pending vectors now (or finish a model change); returns how many are still
        pending. A model fault leaves them pending and is recorded for :meth:`status`: the owner
        calls this again later (the actors do, with backoff, in the same process)."""
        self._check_open()
        if self._embedder is None:
            return 0
        self._refresh_foreign()
        if self._rebuild_needed:
            self._try_rebuild()
        elif self._vectors_writable():
            self._embed_pending()
        return self._pending_count()

    def _embed_pending(self) -> tuple[int, bool]:
        """Embed rows whose vector is pending; returns (vectors written, whether the model worked)."""
        written = 0
        after = 0
        while self._vectors_writable():
            rows = self._db.query(
                f"SELECT id, content FROM {_TABLE} WHERE vector_pending = 1 AND id > ? ORDER BY id LIMIT ?",
                (after, _BATCH),
            )
            if not rows:
                break
            after = int(rows[-1][0])
            array = self._embed([r[1] for r in rows])
            if array is None:
                return written, False
            by_id = {int(r[0]): (text_hash(r[1]), v) for r, v in zip(rows, array, strict=True)}
            with self._db.transaction():
                marks = ",".join("?" * len(by_id))
                current = self._db.query(
                    f"SELECT id, content_hash, category FROM {_TABLE} "
                    f"WHERE vector_pending = 1 AND id IN ({marks})",
                    list(by_id),
                )
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
                        f"UPDATE {_TABLE} SET vector_pending = 0 WHERE id = ?", [(i,) for i, _ in ready]
                    )
                    written += len(ready)
        self._last_error = None
        return written, True

    def _try_rebuild(self) -> None:
        try:
            self._rebuild()
        except EmbeddingError as exc:
            self._last_error = str(exc)

    def _rows(self) -> Iterator[list[tuple[int, str, str]]]:
        after = 0
        while True:
            rows = self._db.query(
                f"SELECT id, content, category FROM {_TABLE} WHERE id > ? ORDER BY id LIMIT ?",
                (after, _BATCH),
            )
            if not rows:
                return
            after = int(rows[-1][0])
            yield [(int(i), str(c), str(cat)) for i, c, cat in rows]

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
                self._db.execute(f"UPDATE {_TABLE} SET vector_pending = 0 WHERE vector_pending != 0")
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

    # -- reads ------------------------------------------------------------------------------------

    def _tags_of(self, ids: Sequence[int]) -> dict[int, dict[str, str]]:
        tags: dict[int, dict[str, str]] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for entry_id, key, value in self._db.query(
                f"SELECT entry_id, key, value FROM {_TABLE}_tags WHERE entry_id IN ({marks}) "
                "ORDER BY entry_id, key",
                list(chunk),
            ):
                tags.setdefault(int(entry_id), {})[key] = value
        return tags

    def _load(self, ids: Sequence[int]) -> dict[int, KnowledgeEntry]:
        """Entries by id, two queries for the lot (rows, then tags)."""
        if not ids:
            return {}
        rows: list[Any] = []
        for start in range(0, len(ids), 500):
            chunk = list(ids[start : start + 500])
            marks = ",".join("?" * len(chunk))
            rows.extend(self._db.query(f"SELECT {_ENTRY_COLUMNS} FROM {_TABLE} WHERE id IN ({marks})", chunk))
        tags = self._tags_of([int(r[0]) for r in rows])
        return {int(r[0]): _entry(r, tags.get(int(r[0]), {}), self.owner) for r in rows}

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
                conditions.append(f"id IN (SELECT entry_id FROM {_TABLE}_tags WHERE key = ? AND value = ?)")
                params.extend((key, value))
            else:
                conditions.append(f"id IN (SELECT entry_id FROM {_TABLE}_tags WHERE key = ?)")
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
        self._check_open()
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
            f"SELECT {_ENTRY_COLUMNS} FROM {_TABLE}{where} ORDER BY {order} LIMIT ? OFFSET ?",
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
        self._check_open()
        conditions, params, _ = self._filter(category, tags, scope, subtree=True)
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        return int(self._db.scalar(f"SELECT count(*) FROM {_TABLE}{where}", params))

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
        self._check_open()
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
        want_vectors = vectors is not None and checked_mode != "keyword"
        if want_vectors and query_vector is None:
            assert self._embedder is not None
            prefetch_query(self._embedder, query[:EMBED_CHARS])  # computed while keywords are ranked
        tuning = self._tuning
        allowed = _Allowed(self._db, conditions, params)
        # one ranking alone needs no candidates beyond top_k; fusion looks deeper into both
        deep = max(tuning.depth, top_k)
        keyword_ids: builtins.list[int] = []
        if not want_vectors:  # keyword mode, or a store without vectors: keywords alone
            keyword_ids = self._keyword_ids(query, top_k, conditions, params, allowed)
        elif checked_mode == "hybrid":
            keyword_ids = self._keyword_ids(query, deep, conditions, params, allowed)
        qv: FloatArray | None = None
        if want_vectors:
            assert vectors is not None
            qv = self._query_vector(query, query_vector, vectors.dim)
            if qv is None:  # the embedder failed: keywords alone
                keyword_ids = self._keyword_ids(query, top_k, conditions, params, allowed)
        use_vectors = qv is not None
        use_keywords = not use_vectors or checked_mode == "hybrid"
        vector_hits: builtins.list[VectorHit] = []
        if use_vectors:
            assert vectors is not None and qv is not None
            depth = deep if use_keywords else top_k
            vector_hits = self._vector_search(vectors, qv, depth, conditions, allowed, where)
            if threshold is not None:
                vector_hits = [h for h in vector_hits if h.similarity >= threshold]

        lists: builtins.list[builtins.list[int]] = []
        if use_vectors:
            lists.append([h.rowid for h in vector_hits])
        if use_keywords:
            lists.append(keyword_ids)
        weights = fusion_weights(use_vectors, use_keywords, tuning.vector_weight, tuning.keyword_weight)
        fused = [(f.key, f.score, f.ranks) for f in rrf(lists, k=tuning.rrf_k, weights=weights)[:top_k]]
        if not fused:
            return []
        similarity = {h.rowid: h.similarity for h in vector_hits}
        missing = [key for key, _, _ in fused if key not in similarity]
        if missing and use_vectors:
            assert vectors is not None and qv is not None
            for hit in vectors.search(qv, len(missing), candidates=missing):
                similarity[hit.rowid] = hit.similarity
        entries = self._load([key for key, _, _ in fused])
        hits = []
        for key, score, ranks in fused:
            entry = entries.get(key)
            if entry is None:  # deleted by another connection since the ranking
                continue
            vrank = ranks[0] if use_vectors else None
            krank = ranks[-1] if use_keywords else None
            hits.append(
                KnowledgeHit(entry, score, match_type(vrank, krank), vrank, krank, similarity.get(key))
            )
        return hits

    def _keyword_ids(
        self,
        text: str,
        limit: int,
        conditions: builtins.list[str],
        params: builtins.list[Any],
        allowed: _Allowed,
    ) -> builtins.list[int]:
        """Ids ranked by BM25 over words (:class:`Bm25Index`), trigram matches (CJK) and substring
        matches (CJK runs too short for trigrams), fused by RRF when more than one applies.

        A filtered trigram query joins the entries table with the full-text table driving it:
        written as ``rowid IN (subquery)``, SQLite probes the full-text index once per allowed id.
        """
        query = build_keyword_query(text)
        if query.empty:
            return []
        lists: builtins.list[builtins.list[int]] = []
        join = f" CROSS JOIN {_TABLE} AS k ON k.id = {_TABLE}_tri.rowid" if conditions else ""
        extra = "".join(f" AND {c}" for c in conditions)
        if query.words:
            terms = keyword_terms(text) or keyword_terms(text, keep_stop_words=True)
            lists.append(self._bm25.search(terms[:MAX_QUERY_TERMS], limit, allowed.ids()))
        if query.cjk:
            sql = (
                f"SELECT {_TABLE}_tri.rowid FROM {_TABLE}_tri{join} WHERE {_TABLE}_tri MATCH ?{extra} "
                f"ORDER BY bm25({_TABLE}_tri) LIMIT ?"
            )
            lists.append([int(r[0]) for r in self._db.query(sql, (query.cjk, *params, limit))])
        if query.cjk_short:
            likes = " OR ".join("cjk LIKE ?" for _ in query.cjk_short)
            sql = f"SELECT id FROM {_TABLE} WHERE cjk != '' AND ({likes}){extra} ORDER BY id DESC LIMIT ?"
            lists.append(
                [
                    int(r[0])
                    for r in self._db.query(sql, (*(f"%{r}%" for r in query.cjk_short), *params, limit))
                ]
            )
        if len(lists) == 1:
            return lists[0]
        return [f.key for f in rrf(lists, k=PLAIN_RRF_K)][:limit]

    def _query_vector(self, query: str, given: object, dim: int) -> FloatArray | None:
        if given is not None:
            try:
                array = np.asarray(given, dtype=np.float32).reshape(-1)
            except (TypeError, ValueError) as exc:
                raise InvalidInputError(f"query_vector must be an array of {dim} numbers: {exc}") from exc
            if array.shape != (dim,) or not np.isfinite(array).all() or not array.any():
                raise InvalidInputError(
                    f"query_vector must be {dim} finite numbers, not all zero; got shape {array.shape}"
                )
            return array
        assert self._embedder is not None
        try:
            return embed_query(self._embedder, query[:EMBED_CHARS])
        except EmbeddingError as exc:  # a search still answers, by keywords
            self._last_error = str(exc)
            return None

    def _vector_search(
        self,
        vectors: VectorIndex,
        qv: FloatArray,
        depth: int,
        conditions: builtins.list[str],
        allowed: _Allowed,
        where: dict[str, Any],
    ) -> builtins.list[VectorHit]:
        """Exact KNN; a category alone is a vec0 metadata filter, other filters give candidates."""
        if not conditions or conditions == ["category = ?"]:
            return vectors.search(qv, depth, where=where)
        candidates = allowed.ids()
        if not candidates:
            return []
        return vectors.search(qv, depth, where=where, candidates=candidates)

    # -- status and lifetime ----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What this store holds and how it searches; ``mode`` is ``"keyword-only"`` (with a
        ``reason``) whenever vector search cannot be used."""
        self._check_open()
        self._refresh_foreign()
        reason = self._vector_reason()
        return {
            "kind": "knowledge",
            "path": str(self.path),
            "mode": "hybrid" if reason is None else "keyword-only",
            "reason": reason,
            "entries": self.count(),
            "pending_vectors": self._pending_count(),
            "model": None if self._embedder is None else self._embedder.model_id,
            "dim": None if self._embedder is None else self._embedder.dim,
            "stored_model": get_meta(self._db, "embedding_model"),
            "stored_dim": _int_or_none(get_meta(self._db, "embedding_dim")),
            "vectors": None if self._vectors is None else self._vectors.status(),
            "last_error": self._last_error,
            "consistency": self._consistency.as_dict(),
            "schema_version": len(MIGRATIONS),
            "tuning": dataclasses.asdict(self._tuning),
        }

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if not self._closed:
            self._closed = True
            self._db.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> KnowledgeStore:
        self._check_open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else self.mode
        return f"KnowledgeStore({str(self.path)!r}, {state})"


class _Allowed:
    """The ids a filtered search may return, queried once and only if a side needs them."""

    def __init__(self, db: Database, conditions: Sequence[str], params: Sequence[Any]) -> None:
        self._db = db
        self._conditions = conditions
        self._params = params
        self._ids: builtins.list[int] | None = None

    def ids(self) -> builtins.list[int] | None:
        """``None`` without filters."""
        if not self._conditions:
            return None
        if self._ids is None:
            sql = f"SELECT id FROM {_TABLE} WHERE {' AND '.join(self._conditions)}"
            self._ids = [int(r[0]) for r in self._db.query(sql, self._params)]
        return self._ids


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
