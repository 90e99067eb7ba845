"""The caches BM25 scores from: document lengths and postings read from FTS5's own index.

FTS5 stays the durable index and the source of truth; this reads FTS5's ``_docsize`` records and
its ``fts5vocab`` ``instance`` rows (so tokens and stems are exactly FTS5's) into numpy arrays, and
drops them when another connection commits. Kept apart from the ranking (:mod:`._bm25`), the
index file (:mod:`._bm25_file`) and the incremental upkeep on writes (:mod:`._bm25_writes`).
"""

from __future__ import annotations

import hashlib
import itertools
import weakref
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from memstrata.core.errors import StorageError

from ._array_types import Bm25Floats, BoolArray, IntArray
from ._bm25_formula import idf_of, weighted_tf
from ._bm25_stems import StemTable
from ._connection import Database
from ._vec0_chunks import snapshot

__all__ = ["Bm25Postings", "Postings", "appended"]

# postings held in memory (12 bytes each); when full, the least recently used words' postings go
_MAX_CACHED_POSTINGS = 8_000_000
_PHRASE = "\x00"  # joins the stems of a query word FTS5 reads as a phrase

# changes made by the scratch tokenizer tables of every index on a connection: not store changes
_SCRATCH_CHANGES: weakref.WeakKeyDictionary[Database, int] = weakref.WeakKeyDictionary()

Postings = tuple[npt.NDArray[np.int32], Bm25Floats]  # a stem's positions (ascending) and counts


def _ints(joined: str | None) -> IntArray:
    """The integers SQLite's ``group_concat`` joined with commas, parsed in C: a common word's
    postings (435k rows at 1M entries) are read in ~50 ms this way, ~150 ms a row at a time."""
    if not joined:  # no row (``group_concat`` gives NULL)
        return np.zeros(0, dtype=np.int64)
    return np.fromstring(joined, dtype=np.int64, sep=",")


def _varint_sums(records: bytes, lengths: IntArray) -> Bm25Floats:
    """:func:`_varint_sum` of each of the records laid end to end in ``records`` (``lengths``
    bytes each), in numpy (with the query that reads them: 0.4 s for a million entries, 0.7 s a
    record at a time)."""
    data = np.frombuffer(records, dtype=np.uint8)
    out = np.zeros(len(lengths), dtype=np.float64)
    if len(data) != int(lengths.sum()):
        raise StorageError(f"document length records of {len(data)} bytes, expected {int(lengths.sum())}")
    filled = lengths > 0
    if not filled.any():
        return out
    starts = (np.cumsum(lengths) - lengths)[filled]
    if not np.any(data & 0x80):  # every count below 128, one byte each: the usual case
        out[filled] = np.add.reduceat(data, starts, dtype=np.int64)
        return out
    ends = (data & 0x80) == 0
    ends[np.cumsum(lengths)[filled] - 1] = True  # a varint never runs into the next record
    varint = np.concatenate(([0], np.cumsum(ends[:-1]))).astype(np.int64)  # each byte's varint
    to_end = np.flatnonzero(ends)[varint] - np.arange(len(data))  # bytes after it in its varint
    if int(to_end.max()) >= 8:  # a ninth byte (never a token count): the exact reading
        return np.asarray([_varint_sum(records[a:b]) for a, b in _spans(lengths)], dtype=np.float64)
    parts = (data & 0x7F).astype(np.int64) << (7 * to_end)
    values = np.add.reduceat(parts, np.flatnonzero(np.concatenate(([True], ends[:-1]))))
    record = np.repeat(np.arange(len(lengths)), lengths)[np.flatnonzero(ends)]  # each varint's record
    out[:] = np.bincount(record, weights=values.astype(np.float64), minlength=len(lengths))
    return out


def _floats(joined: str | None) -> Bm25Floats:
    """The numbers SQLite's ``group_concat`` joined with commas."""
    if not joined:
        return np.zeros(0, dtype=np.float64)
    return np.fromstring(joined, dtype=np.float64, sep=",")


def _sum_by_doc(docs: IntArray, weights: Bm25Floats) -> tuple[IntArray, Bm25Floats]:
    """The distinct ``docs`` and the sum of each one's ``weights`` (a word's weighted count per
    document). FTS5 lists a word's instances by document, so runs are summed without a sort."""
    if len(docs) and bool(np.all(docs[1:] >= docs[:-1])):
        starts = np.flatnonzero(np.concatenate(([True], docs[1:] != docs[:-1])))
        return docs[starts], np.add.reduceat(weights, starts).astype(np.float64)
    ids, inverse = np.unique(docs, return_inverse=True)
    return ids, np.bincount(inverse.reshape(-1), weights=weights, minlength=len(ids)).astype(np.float64)


def appended(postings: Postings, more: Postings) -> Postings:
    """``postings`` followed by ``more`` (documents added after them)."""
    return np.concatenate([postings[0], more[0]]), np.concatenate([postings[1], more[1]])


def _spans(lengths: IntArray) -> list[tuple[int, int]]:
    return list(itertools.pairwise(np.concatenate(([0], np.cumsum(lengths))).tolist()))


def _varints(blob: bytes) -> Iterator[int]:
    """The varints of an FTS5 record (``_docsize``: one token count per column; the averages
    record: the row count first).

    FTS5 writes SQLite's varints: big-endian groups of 7 bits, the high bit set on every byte
    but the last (a ninth byte, never reached by a token count, carries 8 bits). A varint the
    record cuts short is not given.
    """
    value = count = 0
    for byte in blob:
        count += 1
        if count == 9:
            yield (value << 8) | byte
            value = count = 0
            continue
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            yield value
            value = count = 0


def _varint_sum(blob: bytes) -> int:
    """Sum of the varints of an FTS5 ``_docsize`` record: the document's token count."""
    return sum(_varints(blob))


class Bm25Postings:
    """Document lengths and per-stem postings of the FTS5 table ``fts``, read on demand."""

    told_of_writes = False  # an owner reported a write through this connection (:mod:`._bm25_writes`)
    docs_added = 0  # documents an owner reported added through this connection since it opened

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
        self._doc_counts = f"temp.{fts}_rows"  # a word's number of documents, counted by FTS5
        self._tok = f"{fts}_tokenizer"
        self._tok_vocab = f"temp.{fts}_tokenizer_instances"
        tokenizer = db.scalar("SELECT sql FROM sqlite_master WHERE name = ?", (fts,))
        self._tokenize_option = _tokenize_option(str(tokenizer or ""))
        self._ready = False
        self._version: tuple[int, int] = (-1, -1)
        self._phrase_words: dict[str, str] = {}  # phrase of stems -> a query word that gives it
        self._reset()
        self._changes_at_open = self._current_version()[1]
        self._opened()

    def _opened(self) -> None:
        """The end of the constructor, for the parts built on these caches (the index file
        hooks its save at close)."""

    def _wrote(self) -> bool:
        """Whether this connection wrote to the index since it was opened (reported by the
        owner, or seen in its changes when the owner does not report them)."""
        return self.told_of_writes or self._current_version()[1] != self._changes_at_open

    def reset(self) -> None:
        """Forget every cache (after a rollback of this connection's writes)."""
        self._reset()

    def _reset(self) -> None:
        self._loaded = False
        self._mark: str | None = None  # the FTS5 records the loaded state reflects (None: unknown)
        self._ids: IntArray = np.zeros(0, dtype=np.int64)
        self._sizes: Bm25Floats = np.zeros(0, dtype=np.float64)
        self._alive = np.zeros(0, dtype=bool)
        self._live = 0
        self._total = 0.0
        # stem -> (positions in ``_ids``, ascending; weighted term frequencies, float32 when
        # mapped from a complete index file: whole counts)
        self._postings: dict[str, Postings] = {}
        self._cached = 0
        self._read = 0  # postings read from FTS5 since the index file was last read or written
        self._df: dict[str, int] = {}  # documents holding a stem whose postings are not cached
        # stem -> its number in a complete index file: postings taken from the file when first used
        self._mapped = StemTable()
        # mapped stem -> its postings in documents this connection added after the file's state
        self._map_added: dict[str, Postings] = {}
        # a stem the file does not hold -> its postings in those documents (while the map is in
        # use, so that the complete file can be written again from memory: ``_bm25_file``)
        self._map_new: dict[str, Postings] = {}
        self._map_added_count = 0
        self._views: set[str] = set()  # cached stems whose postings are views of that file: free
        # stem -> ((idf, average length), what it adds to each of its postings' documents)
        self._contribs: dict[str, tuple[tuple[float, float], Bm25Floats]] = {}
        self._contrib_count = 0
        self._norms: tuple[float, Bm25Floats, Bm25Floats] | None = None  # (average, lengths, norms)
        # a filter's key -> (this connection's changes when asked, the ids then, its mask or None)
        self._masks: dict[Hashable, tuple[int, IntArray, BoolArray | None]] = {}

    def _drop_map(self) -> None:
        """Stop taking words from a complete index file (they are read from FTS5 again)."""
        self._mapped = StemTable()
        self._map_added.clear()
        self._map_new.clear()
        self._map_added_count = 0

    def _ensure_tables(self) -> None:
        if self._ready:
            return
        cols = ", ".join(self._columns)
        create = "CREATE VIRTUAL TABLE IF NOT EXISTS"
        self._db.execute(f"{create} {self._vocab} USING fts5vocab(main, {self._fts}, instance)")
        self._db.execute(f"{create} {self._doc_counts} USING fts5vocab(main, {self._fts}, row)")
        # contentless: it only tokenises, and 'delete-all' empties it without a delete per row
        self._db.execute(f"{create} temp.{self._tok} USING fts5({cols}, content=''{self._tokenize_option})")
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

    def _load_sizes(self) -> None:
        """Have the document lengths (:class:`Bm25Files` takes them from the index file first)."""
        if not self._loaded:
            self._read_sizes()

    def _read_sizes(self) -> None:
        with snapshot(self._db):  # the records and the lengths of one state of the index
            mark = self._index_mark()
            ids, lengths, records = self._db.query(
                "SELECT group_concat(id), group_concat(coalesce(length(sz), 0)), group_concat(hex(sz), '') "
                f"FROM {self._fts}_docsize"
            )[0]
        self._mark = mark
        ids, lengths = _ints(ids), _ints(lengths)
        if len(ids) != len(lengths):
            raise StorageError(f"{self._fts}_docsize: {len(ids)} ids but {len(lengths)} length records")
        order = np.argsort(ids, kind="stable")
        self._ids = ids[order]
        self._sizes = _varint_sums(bytes.fromhex(records or ""), lengths)[order]
        self._alive = np.ones(len(ids), dtype=bool)
        self._live = len(ids)
        self._total = float(self._sizes.sum())
        self._loaded = True

    def _positions(self, ids: IntArray) -> npt.NDArray[np.int32]:
        """Where ``ids`` stand in ``_ids`` (-1: not there)."""
        n = len(self._ids)
        if n == 0:
            return np.full(len(ids), -1, dtype=np.int32)
        first = int(self._ids[0])
        if int(self._ids[-1]) - first == n - 1:  # no gap (a store never deleted from): arithmetic
            pos = np.asarray(ids, dtype=np.int64) - first
            return np.where((pos >= 0) & (pos < n), pos, -1).astype(np.int32)
        pos = np.searchsorted(self._ids, ids)
        ok = (pos < len(self._ids)) & (self._ids[np.minimum(pos, max(len(self._ids) - 1, 0))] == ids)
        return np.where(ok, pos, -1).astype(np.int32)

    def _postings_of(self, stem: str) -> Postings:
        cached = self._postings.pop(stem, None)
        if cached is not None:
            self._postings[stem] = cached  # the most recently used go last (see _cache_postings)
            return cached
        mapped = self._mapped_postings(stem) if stem in self._mapped else None
        if mapped is not None:
            if stem in self._map_added:  # the file's postings and the added ones: a copy
                return self._cache_postings(stem, mapped, len(mapped[0]))
            self._views.add(stem)
            return self._cache_postings(stem, mapped, 0)
        if _PHRASE in stem:
            ids, tf = self._phrase_postings(stem)
        elif all(w == 1.0 for w in self._weights):  # every instance counts 1: no column needed
            sql = f"SELECT group_concat(doc) FROM {self._vocab} WHERE term = ?"
            found = _ints(self._db.query(sql, (stem,))[0][0])
            ids, tf = _sum_by_doc(found, np.ones(len(found), dtype=np.float64))
        else:
            docs, cols = self._db.query(
                f"SELECT group_concat(doc), group_concat({self._column_number()}) "
                f"FROM {self._vocab} WHERE term = ?",
                (stem,),
            )[0]
            ids, tf = _sum_by_doc(_ints(docs), self._column_weights()[_ints(cols)])
        pos = self._positions(ids)
        keep = pos >= 0
        entry = (pos[keep], tf[keep])
        self._read += len(ids)
        return self._cache_postings(stem, entry, len(ids))

    def _held(self, stem: str) -> bool:
        """Whether ``stem``'s postings are at hand: cached, or in a complete index file."""
        return stem in self._postings or stem in self._mapped

    def _mapped_postings(self, stem: str) -> Postings | None:
        """``stem``'s postings from a complete index file (:class:`Bm25Files`); ``None``: read them."""
        return None

    def _mapped_count(self, stem: str) -> int | None:
        """How many postings a complete index file holds for ``stem`` (``None``: not known)."""
        return None

    def _column_number(self) -> str:
        """SQL giving an instance row's column as its number in ``self._columns``."""
        cases = " ".join(f"WHEN '{c}' THEN {n}" for n, c in enumerate(self._columns))
        return f"CASE col {cases} ELSE {len(self._columns)} END"

    def _column_weights(self) -> Bm25Floats:
        """Each column's weight by number, then 1.0 for a column not listed."""
        return np.asarray([*self._weights, 1.0], dtype=np.float64)

    def _cache_postings(self, stem: str, entry: Postings, size: int) -> Postings:
        """Keep ``entry`` (``size`` postings held in memory); the least recently used stems go
        first when the cache is full (a common word's postings, read again, cost the most)."""
        self._trim(size)
        self._postings[stem] = entry
        self._cached += size
        return entry

    def _trim(self, room: int = 0) -> None:
        """Drop the least recently used postings held in memory until ``room`` more fit (views
        of a mapped file hold none and stay)."""
        if self._cached + room <= _MAX_CACHED_POSTINGS:
            return
        for oldest in list(self._postings):
            if self._cached + room <= _MAX_CACHED_POSTINGS:
                break
            if oldest not in self._views:
                self._cached -= len(self._postings.pop(oldest)[0])

    def _phrase_postings(self, phrase: str) -> tuple[IntArray, Bm25Floats]:
        """Documents holding ``phrase`` (the stems of one query word, in order) with its column
        weighted count. FTS5 matches the word as a phrase and scores it alone with ``bm25()``, in
        C; the count is recovered from that score with this index's document lengths (matching
        every instance of a common token such as "it" in numpy took 0.1-0.3 s at 1M entries)."""
        word = self._phrase_words.get(phrase)
        if word is None:
            raise StorageError(f"{self._fts}: no query word is known for the phrase {phrase!r}")
        self._load_sizes()
        weights = ", ".join(repr(w) for w in self._weights)
        ids, scores = self._db.query(
            f"WITH m AS MATERIALIZED (SELECT rowid AS id, -bm25({self._fts}, {weights}) AS s "
            f"FROM {self._fts} WHERE {self._fts} MATCH ?) "
            "SELECT group_concat(id), group_concat(printf('%.17g', s)) FROM m",
            ('"' + word.replace('"', '""') + '"',),
        )[0]
        found, score = _ints(ids), _floats(scores)
        if len(found) != len(score):
            raise StorageError(f"{self._fts}: {len(found)} documents but {len(score)} scores for {word!r}")
        df = float(len(found))  # as FTS5 counted it for the idf it scored with
        order = np.argsort(found, kind="stable")
        pos = self._positions(found[order])
        known = order[pos >= 0]  # a document FTS5 holds and the lengths do not is left out
        found, score, pos = found[known], score[known], pos[pos >= 0]
        if len(found) == 0 or self._live == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        avg = self._total / self._live if self._total > 0 else 1.0
        idf = idf_of(float(self._live), df)
        return found, weighted_tf(idf, score, self._sizes[pos], avg)

    def _tokenize(
        self, rows: Sequence[tuple[Any, ...]], only: Sequence[str] = ()
    ) -> dict[int, dict[str, float]]:
        """FTS5's own stems of ``rows`` (``(rowid, text per column...)``): rowid -> stem -> weighted
        tf (``only`` those stems, when given)."""
        self._ensure_tables()
        where = f" WHERE term IN ({', '.join('?' * len(only))})" if only else ""
        cols = ", ".join(self._columns[: len(rows[0]) - 1])
        marks = ", ".join("?" * len(rows[0]))
        weight = dict(zip(self._columns, self._weights, strict=True))
        out: dict[int, dict[str, float]] = {}
        before = int(self._db.conn.total_changes)
        try:
            self._db.executemany(f"INSERT INTO temp.{self._tok}(rowid, {cols}) VALUES ({marks})", rows)
            for term, doc, col in self._db.query(
                f"SELECT term, doc, col FROM {self._tok_vocab}{where}", only
            ):
                counts = out.setdefault(int(doc), {})
                counts[term] = counts.get(term, 0.0) + weight.get(col, 1.0)
        finally:
            self._clear_scratch()
            scratch = int(self._db.conn.total_changes) - before
            _SCRATCH_CHANGES[self._db] = _SCRATCH_CHANGES.get(self._db, 0) + scratch
        return out

    def _clear_scratch(self) -> None:
        self._db.execute(f"INSERT INTO temp.{self._tok}({self._tok}) VALUES ('delete-all')")

    def _sizes_of(self, ids: IntArray) -> Bm25Floats:
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
