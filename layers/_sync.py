"""The file index store: schema, incremental sync and search over one SQLite database.

A :class:`Store` owns one connection and is used by one thread at a time (the owner, or the
watcher's worker, which opens its own store on the same file; WAL lets both work).

Sync is incremental. A walk stats every source file; a file whose ``(size, mtime_ns, mode)`` and
chunker signature match its row costs nothing more. Any other file is read and hashed: the same
sha256 only refreshes the row; different content is chunked, embedded (only texts the embedding
cache does not hold yet) and written, replacing that file's chunks in one transaction. Files that
disappeared are pruned. A file read within :data:`RACY_NS` of its modification is re-hashed on the
next sync, since a second write in the same timestamp tick would not change its mtime.

The chunker signature (chunker version, budget, overlap, token counter, model) is stored per file,
so a change of any of them rebuilds each file's chunks on the next sync: the old chunks stay
searchable until that file's new ones are committed.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from memstrata.storage import (
    Database,
    Embedder,
    EmbeddingCache,
    Filter,
    SearchParams,
    VectorIndex,
    apply_migrations,
    check_consistency,
    embed_documents,
    embed_query,
    embedding_mismatch,
    fts_schema,
    get_meta,
    hybrid_search,
    identifier_words,
    keyword_terms,
    open_database,
    set_meta,
    text_hash,
)

from memstrata.config import Config
from memstrata.errors import EmbedderUnavailableError, EmbeddingError

from ._chunking import (
    CHUNKER_VERSION,
    ESTIMATE_NAME,
    Chunk,
    TokenCounter,
    chunk_file,
    estimate_tokens,
    model_token_counter,
)
from ._paths import Entry, Scan, SkipFile, SourceRules, decode, read_source, scan

__all__ = ["RACY_NS", "Plan", "SearchRow", "Store", "SyncResult", "make_snippet"]

RACY_NS = 2_000_000_000
BATCH_CHUNKS = 128  # chunks embedded per call (and per commit): batches across files
TABLE = "chunks"
COLUMNS = ["text", "words"]
COLUMN_WEIGHTS = [1.0, 0.5]

_SCHEMA = """
CREATE TABLE files (
    path TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    mode INTEGER NOT NULL,
    sha256 BLOB,
    skipped TEXT,
    language TEXT NOT NULL DEFAULT '',
    signature TEXT NOT NULL DEFAULT '',
    chunks INTEGER NOT NULL DEFAULT 0,
    checked_ns INTEGER NOT NULL,
    indexed_at REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE chunks (
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL,
    start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL,
    language TEXT NOT NULL,
    hash BLOB NOT NULL,
    text TEXT NOT NULL,
    words TEXT NOT NULL
);
CREATE INDEX chunks_by_path ON chunks(path, start_line);
CREATE INDEX chunks_by_language ON chunks(language);
CREATE INDEX chunks_by_hash ON chunks(hash);
""" + fts_schema(TABLE, COLUMNS)

MIGRATIONS: list[str] = [_SCHEMA]


@dataclass(frozen=True, slots=True)
class _Known:
    size: int
    mtime_ns: int
    mode: int
    sha256: bytes | None
    skipped: str | None
    signature: str
    checked_ns: int
    chunks: int


@dataclass(slots=True)
class Plan:
    """What a sync has to do, from a walk compared with the ``files`` table (nothing read)."""

    scan: Scan
    todo: list[Entry]
    deleted: list[str]
    unchanged: int
    skipped_known: list[tuple[str, str]]
    known: dict[str, _Known]

    @property
    def dirty(self) -> bool:
        return bool(self.todo or self.deleted)


@dataclass(slots=True)
class SyncResult:
    files_processed: int = 0
    files_unchanged: int = 0
    files_deleted: int = 0
    chunks_indexed: int = 0
    chunks_deleted: int = 0
    chunks_purged: int = 0
    chunks_embedded: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    complete: bool = True
    seconds: float = 0.0


@dataclass(slots=True)
class _Pending:
    entry: Entry
    st: os.stat_result
    sha256: bytes
    checked_ns: int
    language: str
    chunks: list[Chunk]
    purged: bool  # same content, new signature


@dataclass(frozen=True, slots=True)
class SearchRow:
    id: int
    path: str
    start_line: int
    end_line: int
    language: str
    text: str
    score: float
    match_type: str
    similarity: float | None


def path_words(rel: str) -> str:
    """Words of a path (``src/authHandler.py`` -> ``src auth handler authhandler py``) for keywords."""
    pieces = [p for p in re.split(r"[^0-9A-Za-z]+", rel) if p]
    extra = identifier_words(" ".join(pieces)).split()
    return " ".join(dict.fromkeys([p.lower() for p in pieces] + extra))


class Store:
    """One index database: files, chunks, full text, vectors and the embedding cache."""

    def __init__(
        self,
        db_path: Path,
        *,
        kind: str,
        root: Path,
        rules: SourceRules,
        embedder: Embedder | None,
        config: Config,
    ) -> None:
        self.root = root
        self.rules = rules
        self.embedder = embedder
        self.config = config
        self.db: Database = open_database(db_path)
        try:
            apply_migrations(self.db, kind, MIGRATIONS)
            self.cache = EmbeddingCache(self.db)
            self.vectors = self._open_vectors()
            self.counter, counter_name = self._counter()
            chunking = config.chunking
            model = embedder.model_id if self.vectors is not None and embedder is not None else "none"
            self.signature = f"v{CHUNKER_VERSION}/{chunking.tokens}/{chunking.overlap}/{counter_name}/{model}"
            if get_meta(self.db, "chunker_signature") != self.signature or get_meta(self.db, "root") != str(
                root
            ):
                with self.db.transaction():
                    set_meta(self.db, "chunker_version", CHUNKER_VERSION)
                    set_meta(self.db, "chunker_signature", self.signature)
                    set_meta(self.db, "root", str(root))
            self.consistency = check_consistency(
                self.db,
                table=TABLE,
                fts={f"{TABLE}_fts": None, f"{TABLE}_tri": None},
                vectors=self.vectors,
                vector_rows=None if self.semantic else "0",
                repair_missing=self._mark_files_stale,
            )
        except BaseException:
            self.db.close()
            raise

    # -- setup ---------------------------------------------------------------------------------

    def _open_vectors(self) -> VectorIndex | None:
        stored_dim = get_meta(self.db, f"vector_dim:{TABLE}")
        meta = {"language": "text"}
        approximate_from = self.config.search.approximate_from
        if self.embedder is None:
            # keyword-only: keep an existing table open so replaced chunks lose their vectors too
            if stored_dim is None:
                return None
            return VectorIndex(
                self.db, TABLE, int(stored_dim), metadata=meta, approximate_from=approximate_from
            )
        model, dim = self.embedder.model_id, self.embedder.dim
        mismatch = embedding_mismatch(self.db, model, dim)
        if stored_dim is not None and (mismatch is not None or int(stored_dim) != dim):
            # another model made these vectors: they cannot be compared with this model's queries
            VectorIndex(self.db, TABLE, int(stored_dim), metadata=meta).reset(dim)
        vectors = VectorIndex(self.db, TABLE, dim, metadata=meta, approximate_from=approximate_from)
        if mismatch is not None or get_meta(self.db, "embedding_model") is None:
            with self.db.transaction():
                set_meta(self.db, "embedding_model", model)
                set_meta(self.db, "embedding_dim", dim)
        return vectors

    def _counter(self) -> tuple[TokenCounter, str]:
        count = getattr(self.embedder, "count_tokens", None)
        if self.embedder is not None and callable(count):
            return model_token_counter(count), f"tokens:{self.embedder.model_id}"
        return estimate_tokens, ESTIMATE_NAME

    def _mark_files_stale(self, chunk_ids: list[int]) -> int:
        """Chunks found without a vector: mark their files stale so the next sync re-indexes them."""
        with self.db.transaction():
            for start in range(0, len(chunk_ids), 500):
                batch = chunk_ids[start : start + 500]
                marks = ",".join("?" for _ in batch)
                self.db.execute(
                    f"UPDATE files SET signature = '' "
                    f"WHERE path IN (SELECT path FROM {TABLE} WHERE id IN ({marks}))",
                    batch,
                )
        return 0  # repaired by the next sync, not now

    @property
    def semantic(self) -> bool:
        """Whether vector search is possible (an embedder and a usable vector table)."""
        return self.embedder is not None and self.vectors is not None and self.vectors.available

    def close(self) -> None:
        self.db.close()

    # -- planning ------------------------------------------------------------------------------

    def known(self) -> dict[str, _Known]:
        rows = self.db.query(
            "SELECT path, size, mtime_ns, mode, sha256, skipped, signature, checked_ns, chunks FROM files"
        )
        return {
            r[0]: _Known(r[1], r[2], r[3], None if r[4] is None else bytes(r[4]), r[5], r[6], r[7], r[8])
            for r in rows
        }

    def plan(self) -> Plan:
        found = scan(self.root, self.rules)
        known = self.known()
        todo: list[Entry] = []
        skipped_known: list[tuple[str, str]] = []
        unchanged = 0
        for rel, entry in found.files.items():
            row = known.get(rel)
            if (
                row is None
                or (row.size, row.mtime_ns, row.mode) != (entry.size, entry.mtime_ns, entry.mode)
                or row.checked_ns - row.mtime_ns < RACY_NS
            ):
                todo.append(entry)
            elif row.skipped is not None:
                skipped_known.append((rel, row.skipped))
            elif row.signature != self.signature:
                todo.append(entry)
            else:
                unchanged += 1
        deleted = [rel for rel in known if rel not in found.files]
        return Plan(found, todo, deleted, unchanged, skipped_known, known)

    # -- sync ----------------------------------------------------------------------------------

    def sync(
        self,
        *,
        plan: Plan | None = None,
        progress: Callable[[int, int, str], None] | None = None,
        deadline: float | None = None,
        should_stop: Callable[[], bool] | None = None,
        newest_first: bool = False,
    ) -> SyncResult:
        """Bring the index in line with the files. With ``deadline`` (a ``time.monotonic()``
        value) files are committed one by one, newest first, until the deadline passes; the rest
        stay dirty for the next sync (``complete`` is then False)."""
        started = time.perf_counter()
        plan = plan or self.plan()
        result = SyncResult(files_unchanged=plan.unchanged)
        result.skipped.extend(plan.scan.skipped)
        result.skipped.extend(plan.skipped_known)
        if plan.deleted:
            self._prune(plan.deleted, result)
        todo = sorted(plan.todo, key=lambda e: (-e.mtime_ns, e.rel)) if newest_first else plan.todo
        total, done = len(todo), 0
        pending: list[_Pending] = []
        touched: list[tuple[Any, ...]] = []
        pending_chunks = 0
        batch = 1 if deadline is not None else BATCH_CHUNKS

        def flush() -> None:
            nonlocal pending, touched, pending_chunks, done
            if not pending and not touched:
                return
            files = pending
            self._write(files, touched, result)
            pending, touched, pending_chunks = [], [], 0
            if progress is not None:
                for item in files:
                    done += 1
                    progress(done, total, item.entry.rel)

        for index, entry in enumerate(todo):
            if index and (
                (deadline is not None and time.monotonic() >= deadline)
                or (should_stop is not None and should_stop())
            ):
                result.complete = False
                if should_stop is not None and should_stop():
                    pending, touched = [], []  # stopping: leave them dirty rather than embed now
                break
            row = plan.known.get(entry.rel)
            checked_ns = time.time_ns()
            try:
                data, st = read_source(entry.real, self.rules.max_bytes)
            except SkipFile as skip:
                result.skipped.append((entry.rel, skip.reason))
                self._skip(entry, skip, row, checked_ns, result)
                done += 1
                if progress is not None:
                    progress(done, total, entry.rel)
                continue
            sha = hashlib.sha256(data).digest()
            if (
                row is not None
                and row.sha256 == sha
                and row.skipped is None
                and row.signature == self.signature
            ):
                touched.append((st.st_size, st.st_mtime_ns, st.st_mode, checked_ns, entry.rel))
                result.files_unchanged += 1
                done += 1
                if progress is not None:
                    progress(done, total, entry.rel)
                continue
            language, chunks = chunk_file(
                entry.rel,
                decode(data),
                tokens=self.config.chunking.tokens,
                overlap=self.config.chunking.overlap,
                count=self.counter,
            )
            purged = row is not None and row.sha256 == sha and row.skipped is None
            pending.append(_Pending(entry, st, sha, checked_ns, language, chunks, purged))
            pending_chunks += len(chunks)
            if pending_chunks >= batch or deadline is not None:
                flush()
        flush()
        if result.chunks_deleted or result.chunks_purged:
            self._collect_cache()
        result.seconds = time.perf_counter() - started
        return result

    def _embed(self, texts: Sequence[str], result: SyncResult) -> npt.NDArray[np.float32] | None:
        """Vectors for ``texts``: cached ones looked up, the rest embedded shortest first (less
        padding per model batch), in one call."""
        if not self.semantic or not texts:
            return None
        assert self.embedder is not None
        hashes = [text_hash(t) for t in texts]
        known = self.cache.lookup(self.embedder.model_id, hashes)
        missing: dict[bytes, str] = {}
        for h, t in zip(hashes, texts, strict=True):
            if h not in known and h not in missing:
                missing[h] = t
        if missing:
            order = sorted(missing, key=lambda h: len(missing[h]))
            vectors = embed_documents(self.embedder, [missing[h] for h in order], self.cache)
            known.update(zip(order, vectors, strict=True))
            result.chunks_embedded += len(missing)
        return np.stack([known[h] for h in hashes]).astype(np.float32, copy=False)

    def _write(self, files: list[_Pending], touched: list[tuple[Any, ...]], result: SyncResult) -> None:
        texts = [c.text for p in files for c in p.chunks]
        vectors = self._embed(texts, result)
        now = time.time()
        with self.db.transaction():
            next_id = int(self.db.scalar("SELECT coalesce(max(id), 0) + 1 FROM chunks"))
            offset = 0
            for item in files:
                removed = self._delete_chunks([item.entry.rel])
                if item.purged:
                    result.chunks_purged += removed
                else:
                    result.chunks_deleted += removed
                n = len(item.chunks)
                ids = list(range(next_id, next_id + n))
                next_id += n
                words = path_words(item.entry.rel)
                self.db.executemany(
                    "INSERT INTO chunks(id, path, start_line, end_line, language, hash, text, words) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            cid,
                            item.entry.rel,
                            c.start_line,
                            c.end_line,
                            item.language,
                            text_hash(c.text),
                            c.text,
                            f"{identifier_words(c.text)} {words}",
                        )
                        for cid, c in zip(ids, item.chunks, strict=True)
                    ],
                )
                if vectors is not None and self.vectors is not None and n:
                    self.vectors.upsert_many(
                        ids, vectors[offset : offset + n], [{"language": item.language}] * n
                    )
                offset += n
                self._upsert_file(
                    item.entry.rel, item.st, item.sha256, None, item.language, n, item.checked_ns, now
                )
                result.files_processed += 1
                result.chunks_indexed += n
            if touched:
                self.db.executemany(
                    "UPDATE files SET size = ?, mtime_ns = ?, mode = ?, checked_ns = ? WHERE path = ?",
                    touched,
                )

    def _upsert_file(
        self,
        rel: str,
        st: os.stat_result | Entry,
        sha: bytes | None,
        skipped: str | None,
        language: str,
        chunks: int,
        checked_ns: int,
        now: float,
    ) -> None:
        if isinstance(st, Entry):
            size, mtime_ns, mode = st.size, st.mtime_ns, st.mode
        else:
            size, mtime_ns, mode = st.st_size, st.st_mtime_ns, st.st_mode
        self.db.execute(
            "INSERT INTO files(path, size, mtime_ns, mode, sha256, skipped, language, signature, chunks, "
            "checked_ns, indexed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(path) DO UPDATE SET size = excluded.size, mtime_ns = excluded.mtime_ns, "
            "mode = excluded.mode, sha256 = excluded.sha256, skipped = excluded.skipped, "
            "language = excluded.language, signature = excluded.signature, chunks = excluded.chunks, "
            "checked_ns = excluded.checked_ns, indexed_at = excluded.indexed_at",
            (rel, size, mtime_ns, mode, sha, skipped, language, self.signature, chunks, checked_ns, now),
        )

    def _skip(
        self, entry: Entry, skip: SkipFile, row: _Known | None, checked_ns: int, result: SyncResult
    ) -> None:
        """A file that cannot be indexed loses its chunks; a sticky reason is remembered by stat."""
        if row is None and not skip.sticky:
            return
        with self.db.transaction():
            result.chunks_deleted += self._delete_chunks([entry.rel])
            if skip.sticky:
                self._upsert_file(entry.rel, entry, None, skip.reason, "", 0, checked_ns, time.time())
            else:
                self.db.execute("DELETE FROM files WHERE path = ?", (entry.rel,))

    def _delete_chunks(self, paths: Iterable[str]) -> int:
        removed = 0
        for rel in paths:
            ids = [r[0] for r in self.db.query("SELECT id FROM chunks WHERE path = ?", (rel,))]
            if ids:
                if self.vectors is not None and self.vectors.available:
                    self.vectors.delete_many(ids)
                self.db.execute("DELETE FROM chunks WHERE path = ?", (rel,))
                removed += len(ids)
        return removed

    def _prune(self, paths: list[str], result: SyncResult) -> None:
        for start in range(0, len(paths), 500):
            batch = paths[start : start + 500]
            with self.db.transaction():
                result.chunks_deleted += self._delete_chunks(batch)
                self.db.executemany("DELETE FROM files WHERE path = ?", [(p,) for p in batch])
            result.files_deleted += len(batch)

    def _collect_cache(self) -> None:
        """Drop cached vectors no chunk uses once they outnumber the chunks two to one (recently
        removed text stays cached a while, so text moved between files is not embedded again)."""
        cached = int(self.db.scalar("SELECT count(*) FROM embedding_cache"))
        live = int(self.db.scalar("SELECT count(*) FROM chunks"))
        if cached <= 2 * live + 1000:
            return
        model = self.embedder.model_id if self.embedder is not None else ""
        with self.db.transaction():
            self.db.execute(
                "DELETE FROM embedding_cache WHERE model_id != ? OR hash NOT IN (SELECT hash FROM chunks)",
                (model,),
            )

    # -- reads ---------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        files, skipped = self.db.query("SELECT count(*) - count(skipped), count(skipped) FROM files")[0]
        return {
            "files": int(files),
            "files_skipped": int(skipped),
            "chunks": int(self.db.scalar("SELECT count(*) FROM chunks")),
        }

    def search(
        self,
        query: str,
        *,
        top_k: int,
        min_score: float | None,
        mode: str,
        language: str | None = None,
    ) -> list[SearchRow]:
        search = self.config.search
        use_vectors = mode != "keyword" and self.semantic
        if mode == "vector" and not use_vectors:
            raise EmbedderUnavailableError(
                "vector search needs an embedding model; this index is keyword-only"
            )
        query_vector = None
        if use_vectors:
            assert self.embedder is not None
            try:
                query_vector = embed_query(self.embedder, query)
            except EmbeddingError:
                if mode == "vector":
                    raise
                use_vectors = False  # the model failed: this search runs on keywords only
                mode = "keyword"
        flt = Filter()
        if language is not None:
            flt = Filter(f"SELECT id FROM {TABLE} WHERE language = ?", (language,), {"language": language})
        params = SearchParams(
            top_k=top_k,
            mode=mode if use_vectors or mode == "keyword" else "keyword",  # type: ignore[arg-type]
            depth=max(search.depth, top_k),
            rrf_k=search.rrf_k,
            vector_weight=search.vector_weight,
            keyword_weight=search.keyword_weight,
            min_similarity=min_score,
        )
        ranked = hybrid_search(
            self.db,
            table=TABLE,
            columns=COLUMNS,
            vectors=self.vectors if use_vectors else None,
            query_vector=query_vector,
            query_text=query,
            params=params,
            flt=flt,
            column_weights=COLUMN_WEIGHTS,
        )
        if not ranked:
            return []
        marks = ",".join("?" for _ in ranked)
        rows = {
            r[0]: r
            for r in self.db.query(
                f"SELECT id, path, start_line, end_line, language, text FROM {TABLE} WHERE id IN ({marks})",
                [r.id for r in ranked],
            )
        }
        out = []
        for r in ranked:
            row = rows.get(r.id)
            if row is not None:
                out.append(
                    SearchRow(
                        r.id, row[1], row[2], row[3], row[4], row[5], r.score, r.match_type, r.similarity
                    )
                )
        return out


# -- snippets ----------------------------------------------------------------------------------


def make_snippet(text: str, query: str, limit: int) -> str:
    """At most ``limit`` characters of ``text``, centred on the densest cluster of query terms."""
    if limit <= 0:
        return ""
    if len(text) <= limit:
        return text
    hits: list[tuple[int, int, str]] = []
    for term in keyword_terms(query)[:16]:
        for n, m in enumerate(re.finditer(re.escape(term), text, re.IGNORECASE)):
            if n >= 64:
                break
            hits.append((m.start(), m.end(), term))
    hits.sort()
    inner = max(1, limit - 2)  # room for the two ellipses
    if hits:
        best, best_key = (hits[0][0], hits[0][1]), (-1, 0)
        for i, (start, end, _) in enumerate(hits):
            terms = set()
            last_end = end
            for _, e2, t2 in hits[i:]:
                if e2 - start > inner * 0.8:
                    break
                terms.add(t2)
                last_end = e2
            key = (len(terms), -start)
            if key > best_key:
                best, best_key = (start, last_end), key
        centre = (best[0] + best[1]) // 2
    else:
        centre = inner // 2
    start = max(0, min(centre - inner // 2, len(text) - inner))
    end = min(len(text), start + inner)
    if start > 0:
        space = text.find(" ", start, min(end, start + 40))
        if space != -1:
            start = space + 1
    if end < len(text):
        space = text.rfind(" ", max(start, end - 40), end)
        if space > start:
            end = space
    body = text[start:end].strip()
    return ("…" if start > 0 else "") + body + ("…" if end < len(text) else "")
