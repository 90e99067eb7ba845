"""Every posting of an index as a connection holds it: a complete index file's postings, with the
documents the connection added since and without the ones it removed.

A long-running owner maps a complete file (:mod:`._bm25_file`) and reports its writes
(:mod:`._bm25_writes`); at its close the index is the file's state plus those writes, so the new
file is laid out from memory instead of reading every posting from FTS5 again (a close at 1M
entries: 4.4 s, half of it writing the file, against 21 s). The caller decides whether memory
holds the whole index.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from ._bm25_bulk import AllPostings
from ._bm25_postings import Postings

__all__ = ["held_postings"]


def _laid_out(
    stems: list[str], counts: npt.NDArray[np.int64], positions: npt.NDArray[np.int32], tf: npt.NDArray[Any]
) -> AllPostings:
    """The postings of ``stems`` laid end to end (``counts[i] > 0`` of them for ``stems[i]``),
    with each stem's checksums (:func:`._bm25_bulk.word_sums`)."""
    offsets = np.zeros(len(stems) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    if not stems:
        none = np.zeros(0, dtype=np.int64)
        return AllPostings(stems, offsets, positions, tf, none, none.astype(np.uint64))
    bits = tf.view(np.uint32 if tf.dtype == np.float32 else np.uint64)
    starts = offsets[:-1]  # every run holds a posting: sums by reduceat (a cumsum of 40M took 0.3 s)
    pos_sums = np.add.reduceat(positions, starts, dtype=np.int64)
    tf_sums = np.add.reduceat(bits, starts, dtype=np.uint64)
    return AllPostings(stems, offsets, positions, tf, pos_sums, tf_sums)


def held_postings(
    stems: list[str],
    offsets: npt.NDArray[np.int64],
    positions: npt.NDArray[np.int32],
    tf: npt.NDArray[Any],
    alive: npt.NDArray[np.bool_],
    added: Mapping[str, Postings],
    new: Mapping[str, Postings],
) -> AllPostings | None:
    """The postings of a complete file (``stems``, ``offsets``, ``positions``, ``tf``) over the
    documents ``alive`` marks (positions are renumbered to count only those), each stem followed
    by its ``added`` postings, and the stems of ``new`` after all of them; stems left without a
    posting are dropped. ``None`` when a position is out of range or an added count does not fit
    the file's type exactly."""
    n = len(alive)
    if len(offsets) != len(stems) + 1 or (len(positions) and int(positions.max()) >= n):
        return None
    renumber = np.cumsum(alive, dtype=np.int64) - 1  # a live document's position among the live
    counts = np.diff(offsets)
    out_pos, out_tf = positions, tf
    if not alive.all():  # (else every posting stays where it is: writes that only added)
        keep = alive[positions]
        runs = np.flatnonzero(counts)
        counts[runs] = np.add.reduceat(keep, offsets[runs], dtype=np.int64) if len(runs) else []
        out_pos, out_tf = renumber[positions[keep]].astype(np.int32), tf[keep]

    def live(found: Postings) -> Postings | None:
        pos, counted = found
        if len(pos) and (int(pos.min()) < 0 or int(pos.max()) >= n):
            return None
        mask = alive[pos]
        stored = counted[mask].astype(tf.dtype)
        if not np.array_equal(stored, counted[mask]):
            return None
        return renumber[pos[mask]].astype(np.int32), stored

    number = {stem: i for i, stem in enumerate(stems)}
    where, more_pos, more_tf = [], [], []
    for stem, found in added.items():
        part = live(found)
        if stem not in number or part is None:
            return None
        where.append(number[stem])
        more_pos.append(part[0])
        more_tf.append(part[1])
    if where:
        lengths = np.array([len(p) for p in more_pos], dtype=np.int64)
        ends = np.cumsum(counts)  # where each stem's postings end now: the added ones go there
        at = np.repeat(ends[np.asarray(where)], lengths)
        out_pos = np.insert(out_pos, at, np.concatenate(more_pos))  # stable: in the given order
        out_tf = np.insert(out_tf, at, np.concatenate(more_tf))
        counts[np.asarray(where)] += lengths
    names = list(stems)
    for stem, found in new.items():
        part = live(found)
        if stem in number or part is None:
            return None
        names.append(stem)
        counts = np.append(counts, len(part[0]))
        out_pos = np.concatenate([out_pos, part[0]])
        out_tf = np.concatenate([out_tf, part[1]])
    used = counts > 0
    if not used.all():
        names = [stem for stem, keep_it in zip(names, used.tolist(), strict=True) if keep_it]
        counts = counts[used]
    return _laid_out(names, counts, out_pos, out_tf)
