"""Writing a sync's results: chunks with their keyword text and vectors, ``files`` rows, pruning
of deleted files, and the embedding cache's upkeep.

One file's chunks are replaced in one transaction, so the old chunks stay searchable until the new
ones are committed. Separate from the sync loop, which decides what to write. Texts are embedded in
batches, and a sync's :class:`SyncLimit` (a deadline, a stop request) is checked between them: a
file stopped half-embedded is not written (it stays dirty), its vectors computed so far stay in the
embedding cache for the next sync.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
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

__all__ = ["ChunkWriter", "SyncLimit"]

EMBED_BATCH = 128  # most texts per model call
PROBE_BATCH = 4  # the first call, and a writer's first write batch, before the model's speed is known
# a model call, and a write batch, is sized to about this much embedding at the model's last speed:
# a stop is seen, and a sync's progress reported, at least this often (the default model took
# 12-15 s for a batch of 128 code chunks)
STEP_SECONDS = 2.0


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
class SyncLimit:
    """When a sync stops starting work: once ``clock()`` reaches ``deadline`` (a ``clock`` value),
    or once ``should_stop()`` says so. What it did not start is left for the next sync."""

    deadline: float | None = None
    should_stop: Callable[[], bool] | None = None
    clock: Callable[[], float] = time.monotonic

    def reached(self) -> bool:
        if self.should_stop is not None and self.should_stop():
            return True
        return self.deadline is not None and self.clock() >= self.deadline

    def time_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - self.clock()


class _Stopped(Exception):
    """The sync's limit was reached between two embedding batches."""


@dataclass(slots=True, eq=False)  # a writer, not a value: compared by identity
class ChunkWriter:
    """Writes chunks, vectors and file rows into one index database (the caller's connection)."""

    db: Database
    vectors: VectorIndex | None
    cache: EmbeddingCache
    embedder: Embedder | None
    signature: str
    seconds_per_char: float | None = None  # the model's speed in the last batch, sizes the next
    probing: bool = True  # no batch written yet: the first is small, to learn the model's speed

    @property
    def semantic(self) -> bool:
        """Whether chunks get vectors (an embedder and a usable vector table)."""
        return self.embedder is not None and self.vectors is not None and self.vectors.available

    def batch_full(self, chunks: int, chars: int) -> bool:
        """Whether a write batch of ``chunks`` chunks of ``chars`` characters is as large as it
        should get: about :data:`STEP_SECONDS` of embedding at the model's last speed, or
        :data:`PROBE_BATCH` chunks for the first batch while the speed is unknown."""
        if not self.semantic:
            return False
        if self.seconds_per_char:
            return chars * self.seconds_per_char >= STEP_SECONDS
        return self.probing and chunks >= PROBE_BATCH

    def _embed(
        self,
        texts: Sequence[str],
        result: SyncResult,
        limit: SyncLimit,
        on_step: Callable[[], None] | None = None,
    ) -> npt.NDArray[np.float32] | None:
        """Vectors for ``texts``: cached ones looked up, the rest embedded shortest first (less
        padding per model batch), in batches of about :data:`STEP_SECONDS` or the time ``limit``
        leaves if less, ``on_step()`` called between two; raises :class:`_Stopped` when the limit
        is reached before a batch."""
        if not self.semantic or not texts:
            return None
        assert self.embedder is not None
        hashes = [text_hash(t) for t in texts]
        known = self.cache.lookup(self.embedder.model_id, hashes)
        missing: dict[bytes, str] = {}
        for h, t in zip(hashes, texts, strict=True):
            if h not in known and h not in missing:
                missing[h] = t
        order = sorted(missing, key=lambda h: len(missing[h]))
        while order:
            if limit.reached():
                raise _Stopped
            left = limit.time_left()
            step = STEP_SECONDS if left is None else min(left, STEP_SECONDS)
            size = self._batch_size([missing[h] for h in order[:EMBED_BATCH]], step)
            part, order = order[:size], order[size:]
            texts_now = [missing[h] for h in part]
            started = limit.clock()
            vectors = embed_documents(self.embedder, texts_now, self.cache)
            elapsed = max(0.0, limit.clock() - started)
            self.seconds_per_char = elapsed / max(1, sum(len(t) for t in texts_now))
            known.update(zip(part, vectors, strict=True))
            result.chunks_embedded += len(part)
            if order and on_step is not None:
                on_step()
        return np.stack([known[h] for h in hashes]).astype(np.float32, copy=False)

    def _batch_size(self, texts: Sequence[str], left: float) -> int:
        """How many of ``texts`` (the next ones in line, at most :data:`EMBED_BATCH`) to embed
        now: as many as fit in ``left`` seconds at the model's last speed per character (at
        least one: each sync makes progress), or :data:`PROBE_BATCH` while that speed is
        unknown."""
        if not self.seconds_per_char:
            return min(len(texts), PROBE_BATCH)
        chars = 0
        for size, text in enumerate(texts):
            chars += len(text)
            if size and chars * self.seconds_per_char > left:
                return size
        return len(texts)

    def write(
        self,
        files: list[_Pending],
        touched: list[tuple[Any, ...]],
        result: SyncResult,
        limit: SyncLimit | None = None,
        on_step: Callable[[], None] | None = None,
    ) -> bool:
        """Write ``files`` (their chunks, vectors and rows) and the stat refreshes ``touched``;
        ``on_step()`` is called between two embedding steps of them. False when ``limit`` was
        reached while embedding: only ``touched`` was written."""
        texts = [chunk_embedding_text(p.entry.rel, p.language, c) for p in files for c in p.chunks]
        stopped, self.probing = False, False
        try:
            vectors = self._embed(texts, result, limit or SyncLimit(), on_step)
        except _Stopped:
            files, vectors, stopped = [], None, True
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
        return not stopped

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
