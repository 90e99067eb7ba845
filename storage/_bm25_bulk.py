"""Every posting of an FTS5 index in one pass, for the index file of a large index.

Reading one common word's postings through ``fts5vocab`` costs 20-100 ms at a million entries,
and a query of ordinary words reads several: the first search for new words paid most of its
time there. A large index therefore keeps all its postings in its index file
(:mod:`._bm25_file`), read here once: the ``instance`` rows of a range of words at a time (a few
million, joined by ``group_concat`` and parsed in C), grouped by word and document in numpy.
FTS5 remains the source of truth; the file is checked against it like any other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ._bm25_postings import _ints
from ._connection import Database

__all__ = ["AllPostings", "count_bits", "read_all_postings", "run_sums", "word_sums"]

_CHUNK_INSTANCES = 1_000_000  # instance rows read per query (a ~7 MB string)


@dataclass(frozen=True, slots=True)
class AllPostings:
    """Each stem's postings laid end to end: ``positions[offsets[i]:offsets[i + 1]]`` (ascending)
    and their weighted counts ``tf`` for ``stems[i]``, with the stem's :func:`word_sums`."""

    stems: list[str]
    offsets: npt.NDArray[np.int64]
    positions: npt.NDArray[np.int32]
    tf: npt.NDArray[np.float32] | npt.NDArray[np.float64]
    pos_sums: npt.NDArray[np.int64]
    tf_sums: npt.NDArray[np.uint64]


def word_sums(positions: npt.NDArray[np.int32], tf: npt.NDArray[Any]) -> tuple[int, int]:
    """A word's checksums: the sum of its positions, and of its counts' bits (modulo 2**64; a
    sum of integers, so the same in any order)."""
    return int(positions.sum(dtype=np.int64)), int(count_bits(tf).sum(dtype=np.uint64))


def count_bits(tf: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Counts' bits as unsigned integers of their width (what the checksums add up)."""
    return tf.view(np.uint32 if tf.dtype == np.float32 else np.uint64)


def run_sums(values: npt.NDArray[Any], starts: npt.NDArray[np.int64], dtype: type) -> npt.NDArray[Any]:
    """Sums of the runs of ``values`` beginning at ``starts`` (empty runs sum to 0)."""
    cum: npt.NDArray[Any] = np.zeros(len(values) + 1, dtype=dtype)
    np.cumsum(values, dtype=dtype, out=cum[1:])
    ends = np.append(starts[1:], len(values))
    out: npt.NDArray[Any] = cum[ends] - cum[starts]
    return out


def read_all_postings(
    db: Database,
    instances: str,
    rows: str,
    column_sql: str | None,
    column_weights: npt.NDArray[np.float64],
    positions_of: Callable[[npt.NDArray[np.int64]], npt.NDArray[np.int32]],
    tf_dtype: type = np.float64,
) -> AllPostings | None:
    """Every stem's postings from the ``fts5vocab`` tables ``instances`` and ``rows``, as
    positions (``positions_of`` maps document ids; -1 drops a document), counts stored as
    ``tf_dtype``. ``column_sql`` gives an instance's column number (``None``: every instance
    counts 1). ``None`` when what FTS5 returned does not add up (the caller then keeps reading
    words one at a time)."""
    listed = db.query(f"SELECT term, doc, cnt FROM {rows}")
    stems = [str(r[0]) for r in listed]
    docs_of = np.fromiter((int(r[1]) for r in listed), dtype=np.int64, count=len(listed))
    counts = np.fromiter((int(r[2]) for r in listed), dtype=np.int64, count=len(listed))
    del listed
    if any(stems[i] >= stems[i + 1] for i in range(len(stems) - 1)):
        return None  # not in the order ranges are read in
    room = int(docs_of.sum())
    positions = np.empty(room, dtype=np.int32)
    tfs: npt.NDArray[Any] = np.empty(room, dtype=tf_dtype)
    per_stem = np.zeros(len(stems), dtype=np.int64)
    pos_sums = np.zeros(len(stems), dtype=np.int64)
    tf_sums = np.zeros(len(stems), dtype=np.uint64)
    start = filled = 0
    while start < len(stems):
        end, size = start, 0
        while end < len(stems) and (end == start or size + int(counts[end]) <= _CHUNK_INSTANCES):
            size += int(counts[end])
            end += 1
        read = _read_range(db, instances, column_sql, stems[start], stems[end - 1])
        if read is None:
            return None
        docs, cols = read
        if len(docs) != size or (cols is not None and len(cols) != size):
            return None
        stem_of = np.repeat(np.arange(end - start), counts[start:end])
        same_stem = stem_of[1:] == stem_of[:-1]
        if bool(np.any(same_stem & (docs[1:] < docs[:-1]))):
            return None  # a stem's documents out of order
        firsts = np.flatnonzero(np.concatenate(([True], ~same_stem | (docs[1:] != docs[:-1]))))
        if len(firsts) != int(docs_of[start:end].sum()) or filled + len(firsts) > room:
            return None  # FTS5's counts of documents disagree with its instances
        if cols is None:
            weights = np.ones(len(docs), dtype=np.float64)
        else:
            if len(cols) and (int(cols.min()) < 0 or int(cols.max()) >= len(column_weights)):
                return None
            weights = column_weights[cols]
        del cols
        tf = np.add.reduceat(weights, firsts) if len(firsts) else np.zeros(0, dtype=np.float64)
        stored: npt.NDArray[Any] = tf.astype(tf_dtype)
        if not np.array_equal(stored, tf):
            return None  # counts the stored type cannot hold exactly
        pos = positions_of(docs[firsts])
        keep = pos >= 0
        owner = stem_of[firsts][keep]
        pos, stored = pos[keep].astype(np.int32), stored[keep]
        found = np.bincount(owner, minlength=end - start)
        per_stem[start:end] = found
        runs = np.concatenate(([0], np.cumsum(found)[:-1])).astype(np.int64)
        pos_sums[start:end] = run_sums(pos, runs, np.int64)
        tf_sums[start:end] = run_sums(count_bits(stored), runs, np.uint64)
        positions[filled : filled + len(pos)] = pos
        tfs[filled : filled + len(pos)] = stored
        filled += len(pos)
        start = end
    offsets = np.zeros(len(stems) + 1, dtype=np.int64)
    np.cumsum(per_stem, out=offsets[1:])
    return AllPostings(stems, offsets, positions[:filled], tfs[:filled], pos_sums, tf_sums)


def _read_range(
    db: Database, instances: str, column_sql: str | None, first: str, last: str
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64] | None] | None:
    """The documents (and column numbers) of every instance of the stems ``first``..``last``,
    in FTS5's order: by stem, then document."""
    columns = "group_concat(doc)" + (f", group_concat({column_sql})" if column_sql else "")
    found = db.query(f"SELECT {columns} FROM {instances} WHERE term >= ? AND term <= ?", (first, last))
    if not found:
        return None
    docs = _ints(found[0][0])
    cols = _ints(found[0][1]) if column_sql else None
    return docs, cols
