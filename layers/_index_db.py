"""The index database: one SQLite database of a root's files, chunks, full text, vectors and embedding
cache, kept in line with the files by incremental syncs, and searched.

An :class:`IndexDatabase` owns one connection and is used by one thread at a time (the owner, or the
watcher's worker, which opens its own index on the same file; WAL lets both work).

Sync is incremental. :func:`._sync_plan.plan_sync` stats every source file and lists the changed
ones. Each is read and hashed: the same sha256 only refreshes the row; different content is
chunked, embedded (only texts the embedding cache does not hold yet) and written by
:class:`._index_writes.ChunkWriter`, replacing that file's chunks in one transaction. Files that
disappeared are pruned.

The chunker signature (chunker version, budget, overlap, token counter, model) is stored per file,
so a change of any of them rebuilds each file's chunks on the next sync: the old chunks stay
searchable until that file's new ones are committed.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from memstrata.core.config import Config
from memstrata.core.errors import EmbedderUnavailableError, EmbeddingError
from memstrata.storage import (
    Database,
    Embedder,
    EmbeddingCache,
    Filter,
    SearchParams,
    VectorIndex,
    apply_migrations,
    check_consistency,
    embed_query,
    embedding_mismatch,
    get_meta,
    hybrid_search,
    open_database,
    record_embedding,
    refresh_keyword_terms,
    set_meta,
)

from ._chunk import CHUNKER_VERSION, ESTIMATE_NAME, TokenCounter, estimate_tokens, model_token_counter
from ._chunk_file import chunk_file
from ._index_schema import COLUMN_WEIGHTS, COLUMNS, MIGRATIONS, TABLE
from ._index_writes import ChunkWriter, SyncLimit, _Pending
from ._paths import SkipFile, SourceReader, SourceRules, decode
from ._sync_plan import Plan, SyncResult, plan_sync

log = logging.getLogger("memstrata.files")

__all__ = ["IndexDatabase", "SearchRow", "SearchRows"]

BATCH_CHUNKS = 128  # chunks written per commit at most: files are batched together (see batch_full)


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


class SearchRows(list[SearchRow]):
    """Search rows, best first; ``degraded`` says why they were ranked by keywords only when a
    hybrid search meant otherwise (the query embedding failed), else ``None``."""

    def __init__(self, rows: Any = (), *, degraded: str | None = None) -> None:
        super().__init__(rows)
        self.degraded = degraded


class IndexDatabase:
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
            refresh_keyword_terms(self.db, table=TABLE, column="words", source="text")
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
            self.writes = ChunkWriter(self.db, self.vectors, self.cache, embedder, self.signature)
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
                record_embedding(self.db, model, dim)
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

    # -- sync ----------------------------------------------------------------------------------

    def _chunk(self, rel: str, data: bytes) -> tuple[str, list[Any]]:
        """The file's language and chunks. A chunker's fault with one file is that file's
        :class:`SkipFile` (its reason kept, not tried again until the file changes), never the
        whole sync's."""
        try:
            return chunk_file(
                rel,
                decode(data),
                tokens=self.config.chunking.tokens,
                overlap=self.config.chunking.overlap,
                count=self.counter,
            )
        except Exception as exc:
            log.warning("%s: could not be chunked, left out of the index: %r", rel, exc)
            raise SkipFile(f"could not be chunked ({type(exc).__name__}: {exc})", sticky=True) from exc

    def plan(self) -> Plan:
        return plan_sync(self.db, self.root, self.rules, self.signature)

    def behind(self, plan: Plan) -> bool:
        """Whether ``plan`` holds changes the index lacks: files new, changed (by stat), gone or
        to be chunked anew. A file planned only to be hashed again, because it was read right
        after a write, is indexed as it is on disk."""
        if plan.deleted:
            return True
        for entry in plan.todo:
            row = plan.known.get(entry.rel)
            if row is None or row.signature != self.signature:
                return True
            if (row.size, row.mtime_ns, row.mode) != (entry.size, entry.mtime_ns, entry.mode):
                return True
        return False

    def sync(
        self,
        *,
        plan: Plan | None = None,
        progress: Callable[[int, int, str], None] | None = None,
        deadline: float | None = None,
        should_stop: Callable[[], bool] | None = None,
        newest_first: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> SyncResult:
        """Bring the index in line with the files. With ``deadline`` (a ``clock()`` value) files
        are committed one by one, newest first; once it passes, or ``should_stop()`` says so, no
        file and no embedding batch is started: the rest, and a file stopped half-embedded, stay
        dirty for the next sync (``complete`` is then False)."""
        started = time.perf_counter()
        limit = SyncLimit(deadline, should_stop, clock)
        plan = plan or self.plan()
        result = SyncResult(files_unchanged=plan.unchanged)
        result.skipped.extend(plan.scan.skipped)
        result.skipped.extend(plan.skipped_known)
        if plan.deleted:
            self.writes.prune(plan.deleted, result)
        todo = sorted(plan.todo, key=lambda e: (-e.mtime_ns, e.rel)) if newest_first else plan.todo
        total, done = len(todo), 0
        if progress is not None and total:  # the size of the work, before its first (slow) batch
            progress(0, total, "")
        pending: list[_Pending] = []
        touched: list[tuple[Any, ...]] = []
        pending_chunks = pending_chars = 0
        batch = 1 if deadline is not None else BATCH_CHUNKS

        def flush() -> bool:
            """Write what is pending; False when the limit stopped its embedding."""
            nonlocal pending, touched, pending_chunks, pending_chars, done
            if not pending and not touched:
                return True
            files = pending
            # between the embedding steps of a batch: the file it ends with, none done yet
            step = (
                None if progress is None or not files else partial(progress, done, total, files[-1].entry.rel)
            )
            written = self.writes.write(files, touched, result, limit, step)
            pending, touched, pending_chunks, pending_chars = [], [], 0, 0
            if written and progress is not None:
                for item in files:
                    done += 1
                    progress(done, total, item.entry.rel)
            return written

        reader = SourceReader(self.root)  # one root descriptor: every read walks down from it
        try:
            for entry in todo:
                if limit.reached():
                    result.complete = False
                    if should_stop is not None and should_stop():
                        pending, touched = [], []  # stopping: leave them dirty rather than embed now
                    break
                row = plan.known.get(entry.rel)
                checked_ns = time.time_ns()
                try:
                    data, st = reader.read(entry.target, self.rules.max_bytes)
                    sha = hashlib.sha256(data).digest()
                    unchanged = (
                        row is not None
                        and row.sha256 == sha
                        and row.skipped is None
                        and row.signature == self.signature
                    )
                    if not unchanged:
                        language, chunks = self._chunk(entry.rel, data)
                except SkipFile as skip:
                    result.skipped.append((entry.rel, skip.reason))
                    self.writes.skip(entry, skip, row, checked_ns, result)
                    done += 1
                    if progress is not None:
                        progress(done, total, entry.rel)
                    continue
                if unchanged:
                    touched.append((st.st_size, st.st_mtime_ns, st.st_mode, checked_ns, entry.rel))
                    result.files_unchanged += 1
                    done += 1
                    if progress is not None:
                        progress(done, total, entry.rel)
                    continue
                purged = row is not None and row.sha256 == sha and row.skipped is None
                pending.append(_Pending(entry, st, sha, checked_ns, language, chunks, purged))
                pending_chunks += len(chunks)
                pending_chars += sum(len(chunk.text) for chunk in chunks)
                full = pending_chunks >= batch or self.writes.batch_full(pending_chunks, pending_chars)
                if (full or deadline is not None) and not flush():
                    result.complete = False
                    break
            if not flush():
                result.complete = False
        finally:
            reader.close()
        if result.chunks_deleted or result.chunks_purged:
            self.writes.collect_cache()
        result.seconds = time.perf_counter() - started
        return result

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
    ) -> SearchRows:
        """The best chunks for ``query``. A keyword-only index, or ``mode="keyword"``, ranks by
        keywords as asked; a hybrid search whose query embedding fails does too, and says so
        (``degraded``, logged): ``mode="vector"`` raises instead."""
        search = self.config.search
        use_vectors = mode != "keyword" and self.semantic
        if mode == "vector" and not use_vectors:
            raise EmbedderUnavailableError(
                "vector search needs an embedding model; this index is keyword-only"
            )
        query_vector = None
        degraded = None
        if use_vectors:
            assert self.embedder is not None
            try:
                query_vector = embed_query(self.embedder, query)
            except EmbeddingError as exc:
                if mode == "vector":
                    raise
                use_vectors = False
                mode = "keyword"
                reason = " ".join(str(exc).split()) or type(exc).__name__
                degraded = f"the query embedding failed ({reason}); ranked by keywords only"
                log.warning("%s: %s", self.root, degraded)
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
            return SearchRows(degraded=degraded)
        marks = ",".join("?" for _ in ranked)
        rows = {
            r[0]: r
            for r in self.db.query(
                f"SELECT id, path, start_line, end_line, language, text FROM {TABLE} WHERE id IN ({marks})",
                [r.id for r in ranked],
            )
        }
        out = SearchRows(degraded=degraded)
        for r in ranked:
            row = rows.get(r.id)
            if row is not None:
                out.append(
                    SearchRow(
                        r.id, row[1], row[2], row[3], row[4], row[5], r.score, r.match_type, r.similarity
                    )
                )
        return out
