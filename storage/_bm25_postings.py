"""The caches BM25 scores from: document lengths and postings read from FTS5's own index.

FTS5 stays the durable index and the source of truth; this reads FTS5's ``_docsize`` records and
its ``fts5vocab`` ``instance`` rows (so tokens and stems are exactly FTS5's) into numpy arrays, and
drops them when another connection commits. Kept apart from the ranking (:mod:`._bm25`), the
index file (:mod:`._bm25_file`) and the incremental upkeep on writes (:mod:`._bm25_writes`).
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ._connection import Database
from ._vec0_chunks import snapshot

__all__ = ["Bm25Postings"]

_MAX_CACHED_POSTINGS = 8_000_000  # postings held in memory (12 bytes each) before the cache is emptied
_PHRASE = "\x00"  # joins the stems of a query word FTS5 reads as a phrase

# changes made by the scratch tokenizer tables of every index on a connection: not store changes
_SCRATCH_CHANGES: weakref.WeakKeyDictionary[Database, int] = weakref.WeakKeyDictionary()

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def _varint_sum(blob: bytes) -> int:
    """Sum of the varints of an FTS5 ``_docsize`` record (one token count per column).

    FTS5 writes SQLite's varints: big-endian groups of 7 bits, the high bit set on every byte
    but the last (a ninth byte, never reached by a token count, would carry 8 bits).
    """
    total = value = 0
    count = 0
    for byte in blob:
        count += 1
        if count == 9:
            total += (value << 8) | byte
            value = count = 0
            continue
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            total += value
            value = count = 0
    return total


class Bm25Postings:
    """Document lengths and per-stem postings of the FTS5 table ``fts``, read on demand."""

    def __init__(
        self,
        db: Database,
        fts: str,
        columns: Sequence[str],
        weights: Sequence[float],
        *,
        track_writes: bool = False,
    ) -> None:
        if len(columns) != len(weights):
            raise ValueError(f"{fts}: one weight per column, got {len(weights)} for {len(columns)}")
        self._track_writes = track_writes
        self._db = db
        self._fts = fts
        self._columns = list(columns)
        self._weights = [float(w) for w in weights]
        self._vocab = f"temp.{fts}_instances"
        self._tok = f"{fts}_tokenizer"
        self._tok_vocab = f"temp.{fts}_tokenizer_instances"
        tokenizer = db.scalar("SELECT sql FROM sqlite_master WHERE name = ?", (fts,))
        self._tokenize_option = _tokenize_option(str(tokenizer or ""))
        self._ready = False
        self._version: tuple[int, int] = (-1, -1)
        self._stems: dict[str, tuple[str, ...]] = {}  # depends on the tokenizer only
        self._reset()

    def reset(self) -> None:
        """Forget every cache (after a rollback of this connection's writes)."""
        self._reset()

    def _reset(self) -> None:
        self._loaded = False
        self._mark: str | None = None  # the FTS5 records the loaded state reflects (None: unknown)
        self._ids: IntArray = np.zeros(0, dtype=np.int64)
        self._sizes: FloatArray = np.zeros(0, dtype=np.float64)
        self._alive = np.zeros(0, dtype=bool)
        self._live = 0
        self._total = 0.0
        self._postings: dict[str, tuple[npt.NDArray[np.int32], FloatArray]] = {}
        self._cached = 0

    def _ensure_tables(self) -> None:
        if self._ready:
            return
        cols = ", ".join(self._columns)
        create = "CREATE VIRTUAL TABLE IF NOT EXISTS"
        self._db.execute(f"{create} {self._vocab} USING fts5vocab(main, {self._fts}, instance)")
        self._db.execute(f"{create} temp.{self._tok} USING fts5({cols}{self._tokenize_option})")
        self._db.execute(f"{create} {self._tok_vocab} USING fts5vocab(temp, {self._tok}, instance)")
        self._ready = True

    # -- caches ----------------------------------------------------------------------------------

    def _current_version(self) -> tuple[int, int]:
        """Another connection's commits, and (``track_writes``) this connection's changes."""
        own = 0
        if self._track_writes:
            own = int(self._db.conn.total_changes) - _SCRATCH_CHANGES.get(self._db, 0)
        return self._db.data_version(), own

    def _sync(self) -> None:
        """Drop every cache when the store changed (see :meth:`_current_version`) since the last look."""
        version = self._current_version()
        if version != self._version:
            self._reset()
            self._version = version

    def _index_mark(self) -> str | None:
        """A digest of FTS5's averages and structure records: any write to the index changes
        them (document count, token totals, segments), so equal marks mean the same index."""
        try:
            rows = self._db.query(f"SELECT id, block FROM {self._fts}_data WHERE id IN (1, 10) ORDER BY id")
        except Exception:  # not an FTS5 table we know the layout of: no file
            return None
        digest = hashlib.blake2b(digest_size=16)
        for rowid, block in rows:
            data = bytes(block or b"")
            digest.update(f"{int(rowid)}:{len(data)}:".encode())
            digest.update(data)
        return digest.hexdigest() if len(rows) == 2 else None

    def _read_sizes(self) -> None:
        with snapshot(self._db):  # the records and the lengths of one state of the index
            mark = self._index_mark()
            rows = self._db.query(f"SELECT id, sz FROM {self._fts}_docsize ORDER BY id")
        self._mark = mark
        self._ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        self._sizes = np.fromiter((_varint_sum(r[1]) for r in rows), dtype=np.float64, count=len(rows))
        self._alive = np.ones(len(rows), dtype=bool)
        self._live = len(rows)
        self._total = float(self._sizes.sum())
        self._loaded = True

    def _positions(self, ids: IntArray) -> npt.NDArray[np.int32]:
        if len(self._ids) == 0:
            return np.full(len(ids), -1, dtype=np.int32)
        pos = np.searchsorted(self._ids, ids)
        ok = (pos < len(self._ids)) & (self._ids[np.minimum(pos, max(len(self._ids) - 1, 0))] == ids)
        return np.where(ok, pos, -1).astype(np.int32)

    def _postings_of(self, stem: str) -> tuple[npt.NDArray[np.int32], FloatArray]:
        cached = self._postings.get(stem)
        if cached is not None:
            return cached
        if _PHRASE in stem:
            ids, tf = self._phrase_postings(stem.split(_PHRASE))
        elif all(w == 1.0 for w in self._weights):
            # one row per occurrence, counted in numpy: twice as fast as GROUP BY in SQL (a word
            # in 12k of 100k entries: ~4 ms instead of ~8 the first time it is searched)
            cursor = self._db.execute(f"SELECT doc FROM {self._vocab} WHERE term = ?", (stem,))
            ids, counts = np.unique(np.fromiter((r[0] for r in cursor), dtype=np.int64), return_counts=True)
            tf = counts.astype(np.float64)
        else:
            cases = " ".join(
                f"WHEN '{c}' THEN {w!r}" for c, w in zip(self._columns, self._weights, strict=True)
            )
            weight = f"sum(CASE col {cases} ELSE 1.0 END)"
            rows = self._db.query(
                f"SELECT doc, {weight} FROM {self._vocab} WHERE term = ? GROUP BY doc", (stem,)
            )
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            tf = np.fromiter((r[1] for r in rows), dtype=np.float64, count=len(rows))
        pos = self._positions(ids)
        keep = pos >= 0
        entry = (pos[keep], tf[keep])
        return self._cache_postings(stem, entry, len(ids))

    def _cache_postings(
        self, stem: str, entry: tuple[npt.NDArray[np.int32], FloatArray], size: int
    ) -> tuple[npt.NDArray[np.int32], FloatArray]:
        if self._cached + size > _MAX_CACHED_POSTINGS:
            self._postings.clear()
            self._cached = 0
        self._postings[stem] = entry
        self._cached += size
        return entry

    def _phrase_postings(self, stems: Sequence[str]) -> tuple[IntArray, FloatArray]:
        """Documents holding the stems one after the other in a column, with the (column
        weighted) count of such runs: FTS5's phrase match, from the same instance rows."""
        keys: IntArray | None = None
        for shift, stem in enumerate(stems):
            rows = self._db.query(f"SELECT doc, col, offset FROM {self._vocab} WHERE term = ?", (stem,))
            column = {c: n for n, c in enumerate(self._columns)}
            docs = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            cols = np.fromiter((column.get(r[1], 0) for r in rows), dtype=np.int64, count=len(rows))
            offsets = np.fromiter((r[2] for r in rows), dtype=np.int64, count=len(rows)) - shift
            found = (docs << 32) | (cols << 26) | (offsets & ((1 << 26) - 1))
            keys = np.unique(found) if keys is None else np.intersect1d(keys, found)
            if len(keys) == 0:
                break
        if keys is None or len(keys) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        weights = np.asarray(self._weights, dtype=np.float64)[(keys >> 26) & 63]
        ids, inverse = np.unique(keys >> 32, return_inverse=True)
        tf = np.bincount(inverse.reshape(-1), weights=weights, minlength=len(ids)).astype(np.float64)
        return ids, tf

    def _tokenize(self, rows: Sequence[tuple[Any, ...]]) -> dict[int, dict[str, float]]:
        """FTS5's own stems of ``rows`` (``(rowid, text per column...)``): rowid -> stem -> weighted tf."""
        self._ensure_tables()
        cols = ", ".join(self._columns[: len(rows[0]) - 1])
        marks = ", ".join("?" * len(rows[0]))
        weight = dict(zip(self._columns, self._weights, strict=True))
        out: dict[int, dict[str, float]] = {}
        before = int(self._db.conn.total_changes)
        try:
            self._db.executemany(f"INSERT INTO temp.{self._tok}(rowid, {cols}) VALUES ({marks})", rows)
            for term, doc, col in self._db.query(f"SELECT term, doc, col FROM {self._tok_vocab}"):
                counts = out.setdefault(int(doc), {})
                counts[term] = counts.get(term, 0.0) + weight.get(col, 1.0)
        finally:
            self._db.execute(f"DELETE FROM temp.{self._tok}")
            scratch = int(self._db.conn.total_changes) - before
            _SCRATCH_CHANGES[self._db] = _SCRATCH_CHANGES.get(self._db, 0) + scratch
        return out

    def _sizes_of(self, ids: IntArray) -> FloatArray:
        found: dict[int, float] = {}
        for start in range(0, len(ids), 500):
            chunk = [int(i) for i in ids[start : start + 500]]
            marks = ",".join("?" * len(chunk))
            for rowid, blob in self._db.query(
                f"SELECT id, sz FROM {self._fts}_docsize WHERE id IN ({marks})", chunk
            ):
                found[int(rowid)] = float(_varint_sum(blob))
        return np.array([found.get(int(i), 0.0) for i in ids], dtype=np.float64)


def _tokenize_option(create_sql: str) -> str:
    """The ``tokenize=...`` clause of an FTS5 table's CREATE statement, to copy it."""
    lowered = create_sql.lower()
    start = lowered.find("tokenize")
    if start < 0:
        return ""
    quote = create_sql.find("'", start)
    end = create_sql.find("'", quote + 1)
    if quote < 0 or end < 0:
        return ""
    return f", tokenize={create_sql[quote : end + 1]}"
