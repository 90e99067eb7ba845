"""BM25 over an FTS5 index, scored with numpy: the word ranking of every layer's keyword search.

FTS5 ranks an ``OR`` query by visiting every document that holds any query word; for a sentence
of ordinary words ("return the list of ...") that is a third of a large store, about 100 ms at
100k entries. This module reads the postings of each query word once from FTS5's own index
(``fts5vocab`` ``instance`` rows, so tokens and stems are exactly FTS5's) and keeps them in
memory, then scores with the same formula as FTS5's ``bm25()`` (k1 = 1.2, b = 0.75, column
weights) in a few vectorised numpy operations. FTS5 stays the durable index and the source of
truth; these are caches:

* document lengths (FTS5's ``_docsize`` table), loaded on first use;
* postings per stem, loaded when a query first uses the stem;
* stems per query word.

Writes made through this connection update them incrementally (:meth:`Bm25Index.added`,
:meth:`Bm25Index.removed`, :meth:`Bm25Index.changed`); a commit by another connection (seen
through ``PRAGMA data_version``) drops them. An owner that does not report its writes opens the
index with ``track_writes=True``: any change made through the connection then drops them too.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ._connection import Database

__all__ = ["Bm25Index", "top_scored"]

K1 = 1.2
B = 0.75
_MAX_CACHED_POSTINGS = 8_000_000  # postings held in memory (12 bytes each) before the cache is emptied
_MAX_CACHED_STEMS = 50_000
_PHRASE = "\x00"  # joins the stems of a query word FTS5 reads as a phrase
_INCREMENTAL_LIMIT = 256  # larger writes drop cached postings instead of patching them

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


class Bm25Index:
    """Top-k BM25 for the FTS5 table ``fts`` (external content, integer rowids)."""

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

    def _load_sizes(self) -> None:
        if self._loaded:
            return
        rows = self._db.query(f"SELECT id, sz FROM {self._fts}_docsize ORDER BY id")
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

    # -- writes through this connection ---------------------------------------------------------

    def added(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """New documents ``(rowid, text per column...)`` with rowids above every known one."""
        if not rows:
            return
        version = self._current_version()
        if version != self._version or not self._loaded:
            self._reset()
            self._version = version
            return
        ids = np.array([int(r[0]) for r in rows], dtype=np.int64)
        if len(self._ids) and ids.min() <= self._ids[-1]:
            self._reset()
            return
        order = np.argsort(ids)
        ids = ids[order]
        sizes = self._sizes_of(ids)
        start = len(self._ids)
        self._ids = np.concatenate([self._ids, ids])
        self._sizes = np.concatenate([self._sizes, sizes])
        self._alive = np.concatenate([self._alive, np.ones(len(ids), dtype=bool)])
        self._live += len(ids)
        self._total += float(sizes.sum())
        if not self._postings:
            return
        if len(rows) > _INCREMENTAL_LIMIT:
            self._postings.clear()
            self._cached = 0
            return
        for phrase in [p for p in self._postings if _PHRASE in p]:  # not patched: recomputed
            self._cached -= len(self._postings.pop(phrase)[0])
        position = {int(i): start + n for n, i in enumerate(ids)}
        for doc, counts in self._tokenize(rows).items():
            for stem, tf in counts.items():
                cached = self._postings.get(stem)
                if cached is not None:
                    self._postings[stem] = (
                        np.append(cached[0], np.int32(position[doc])),
                        np.append(cached[1], tf),
                    )

    def removed(self, ids: Sequence[int]) -> None:
        if not self._loaded or not ids:
            return
        pos = self._positions(np.asarray(ids, dtype=np.int64))
        pos = pos[pos >= 0]
        pos = pos[self._alive[pos]]
        self._alive[pos] = False
        self._live -= len(pos)
        self._total -= float(self._sizes[pos].sum())

    def changed(self, ids: Sequence[int]) -> None:
        """Documents whose text changed: new lengths; cached postings are dropped."""
        if not self._loaded or not ids:
            return
        arr = np.asarray(ids, dtype=np.int64)
        pos = self._positions(arr)
        ok = pos >= 0
        new = self._sizes_of(arr[ok])
        old = self._sizes[pos[ok]]
        self._total += float(new.sum() - old[self._alive[pos[ok]]].sum())
        self._sizes[pos[ok]] = new
        self._postings.clear()
        self._cached = 0

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

    # -- search ----------------------------------------------------------------------------------

    def stems(self, terms: Sequence[str]) -> list[str]:
        """Distinct FTS5 stems of query words, in order (a word of several tokens gives one
        phrase unit: its stems joined by ``_PHRASE``)."""
        unknown = [t for t in dict.fromkeys(terms) if t not in self._stems]
        if unknown:
            if len(self._stems) + len(unknown) > _MAX_CACHED_STEMS:
                self._stems.clear()
            self._stems.update(zip(unknown, self._query_units(unknown), strict=True))
        stems: dict[str, None] = {}
        for term in terms:
            for stem in self._stems.get(term, ()):
                stems.setdefault(stem, None)
        return list(stems)

    def _query_units(self, terms: Sequence[str]) -> list[tuple[str, ...]]:
        """What FTS5 matches for each quoted query word: its stem, or for a word of several
        tokens (``"don't"``, ``"Caroline's"``) the phrase of its stems in order, one unit."""
        self._ensure_tables()
        before = int(self._db.conn.total_changes)
        try:
            self._db.executemany(
                f"INSERT INTO temp.{self._tok}(rowid, {self._columns[0]}) VALUES (?, ?)",
                [(i + 1, t) for i, t in enumerate(terms)],
            )
            rows = self._db.query(f"SELECT doc, term FROM {self._tok_vocab} ORDER BY doc, col, offset")
        finally:
            self._db.execute(f"DELETE FROM temp.{self._tok}")
            scratch = int(self._db.conn.total_changes) - before
            _SCRATCH_CHANGES[self._db] = _SCRATCH_CHANGES.get(self._db, 0) + scratch
        tokens: dict[int, list[str]] = {}
        for doc, term in rows:
            tokens.setdefault(int(doc), []).append(str(term))
        out: list[tuple[str, ...]] = []
        for i in range(1, len(terms) + 1):
            parts = tokens.get(i, [])
            out.append(tuple(parts) if len(parts) <= 1 else (_PHRASE.join(parts),))
        return out

    def scores(self, terms: Sequence[str], ids: Sequence[int]) -> list[float]:
        """BM25 of the documents ``ids`` for ``terms``, as FTS5's ``bm25()`` but positive
        (0.0 for a document that matches no word or does not exist)."""
        stems = self.stems(terms)
        self._sync()
        scores = self._score_all(stems)
        if scores is None:
            return [0.0] * len(ids)
        pos = self._positions(np.asarray(ids, dtype=np.int64))
        return [float(scores[p]) if p >= 0 else 0.0 for p in pos]

    def _score_all(self, stems: Sequence[str]) -> FloatArray | None:
        """Scores of every known document (dead ones 0), or ``None`` when nothing can match."""
        if not stems:
            return None
        self._load_sizes()
        if self._live == 0:
            return None
        n = float(self._live)
        avg = self._total / n if self._total > 0 else 1.0
        scores = np.zeros(len(self._ids), dtype=np.float64)
        for stem in stems:
            pos, tf = self._postings_of(stem)
            if len(pos) == 0:
                continue
            df = float(len(pos)) if self._live == len(self._ids) else float(self._alive[pos].sum())
            idf = math.log((n - df + 0.5) / (df + 0.5))
            if idf <= 0:
                idf = 1e-6  # as FTS5: a word in most documents still counts a little
            norm = K1 * (1.0 - B + B * self._sizes[pos] / avg)
            scores[pos] += idf * tf * (K1 + 1.0) / (tf + norm)
        if self._live != len(self._ids):
            scores[~self._alive] = 0.0
        return scores

    def matches(
        self, terms: Sequence[str], allowed: Sequence[int] | IntArray | None = None
    ) -> tuple[IntArray, FloatArray]:
        """Every document matching one of ``terms`` (restricted to ``allowed``) with its score,
        in rowid order: ``(rowids, scores)``."""
        stems = self.stems(terms)
        self._sync()
        scores = self._score_all(stems) if stems else None
        if scores is None:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        if allowed is not None:
            keep = np.zeros(len(scores), dtype=bool)
            apos = self._positions(np.asarray(allowed, dtype=np.int64))
            keep[apos[apos >= 0]] = True
            scores[~keep] = 0.0
        matched = np.flatnonzero(scores > 0.0)  # usually a small share of the documents
        return self._ids[matched], scores[matched]

    def search(self, terms: Sequence[str], limit: int, allowed: Sequence[int] | None = None) -> list[int]:
        """Rowids of the ``limit`` best documents for the query words ``terms`` (OR semantics:
        a document needs one of them), best first; ``allowed`` restricts the candidates."""
        if limit <= 0:
            return []
        ids, scores = self.matches(terms, allowed)
        return [int(i) for i in top_scored(ids, scores, limit)[0]]


def top_scored(ids: IntArray, scores: FloatArray, limit: int) -> tuple[IntArray, FloatArray]:
    """The ``limit`` best ``(ids, scores)``, best first; equal scores go to the lower id."""
    if limit <= 0 or len(ids) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    k = min(limit, len(ids))
    cut = scores[np.argpartition(-scores, k - 1)[k - 1]]
    # every document tied with the last one taken competes, so ties go to the lower id
    top = np.flatnonzero(scores >= cut)
    order = top[np.lexsort((ids[top], -scores[top]))][:limit]
    return ids[order], scores[order]


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
