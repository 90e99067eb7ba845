"""Writing a sync's results: chunks with their keyword text and vectors, ``files`` rows, pruning
of deleted files, and the embedding cache's upkeep.

One file's chunks are replaced in one transaction, so the old chunks stay searchable until the new
ones are committed. Separate from the sync loop, which decides what to write.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from memstrata.storage import Database, Embedder, EmbeddingCache, VectorIndex, embed_documents, text_hash

from ._chunk import Chunk
from ._chunk_file import chunk_embedding_text, chunk_keyword_text
from ._index_schema import path_words
from ._paths import Entry, SkipFile
from ._sync_plan import SyncResult, _Known

__all__ = ["ChunkWriter"]


@dataclass(slots=True)
class _Pending:
    entry: Entry
    st: os.stat_result
    sha256: bytes
    checked_ns: int
    language: str
    chunks: list[Chunk]
    purged: bool  # same content, new signature


@dataclass(slots=True, eq=False)  # a writer, not a value: compared by identity
class ChunkWriter:
    """Writes chunks, vectors and file rows into one index database (the caller's connection)."""

    db: Database
    vectors: VectorIndex | None
    cache: EmbeddingCache
    embedder: Embedder | None
    signature: str

    @property
    def semantic(self) -> bool:
        """Whether chunks get vectors (an embedder and a usable vector table)."""
        return self.embedder is not None and self.vectors is not None and self.vectors.available

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

    def write(self, files: list[_Pending], touched: list[tuple[Any, ...]], result: SyncResult) -> None:
        texts = [chunk_embedding_text(p.entry.rel, p.language, c) for p in files for c in p.chunks]
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
                            f"{chunk_keyword_text(item.language, c)} {words}",
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

    def skip(
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

    def prune(self, paths: list[str], result: SyncResult) -> None:
        for start in range(0, len(paths), 500):
            batch = paths[start : start + 500]
            with self.db.transaction():
                result.chunks_deleted += self._delete_chunks(batch)
                self.db.executemany("DELETE FROM files WHERE path = ?", [(p,) for p in batch])
            result.files_deleted += len(batch)

    def collect_cache(self) -> None:
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
