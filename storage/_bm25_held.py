"""Every posting of an index as a connection holds it: a complete index file's postings, with the
documents the connection added since and without the ones it removed.

A long-running owner maps a complete file (:mod:`._bm25_file`) and reports its writes
(:mod:`._bm25_writes`); at its close the index is the file's state plus those writes, so the new
file is laid out from memory instead of reading every posting from FTS5 again (at 1M entries
the read took 11-21 s). The caller decides whether memory holds the whole index.

The postings are streamed to the new file a group of words at a time (:class:`._index_files.Pieces`),
never copied whole: at 1M entries a copy was +313 MB at the close's peak. When no document was
removed, the file's own postings are written as they are, with the file's checksums: a posting
damaged on disk stays detectable by the next reader. When documents were removed, every posting
is renumbered, so each word's checksums are checked first and computed again.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ._bm25_bulk import count_bits, run_sums, word_sums
from ._bm25_postings import Postings
from ._bm25_stems import StemTable
from ._index_files import Pieces

__all__ = ["HeldPostings", "held_postings"]

_GROUP_POSTINGS = 1 << 22  # postings laid out at a time (whole words): ~60 MB of temporaries


@dataclass(frozen=True, slots=True)
class HeldPostings:
    """Like :class:`._bm25_bulk.AllPostings`, with the postings and counts as :class:`Pieces`."""

    stems: list[str]
    offsets: npt.NDArray[np.int64]
    pos_sums: npt.NDArray[np.int64]
    tf_sums: npt.NDArray[np.uint64]
    positions: Pieces
    tf: Pieces


def held_postings(
    stems: StemTable,
    offsets: npt.NDArray[np.int64],
    positions: npt.NDArray[np.int32],
    tf: npt.NDArray[Any],
    sums: tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64]],
    alive: npt.NDArray[np.bool_],
    added: Mapping[str, Postings],
    new: Mapping[str, Postings],
) -> HeldPostings | None:
    """The postings of a complete file (its words ``stems``, ``offsets``, ``positions``, ``tf``
    and each stem's checksums ``sums``) over the documents ``alive`` marks (positions are
    renumbered to count only those), each stem followed by its ``added`` postings, and the stems
    of ``new`` after all of them; stems left without a posting are dropped. ``None`` when the file's
    arrays do not fit, a word read fails its checksums, a position is out of range or an added
    count does not fit the file's type exactly."""
    n = len(alive)
    pos_sums, tf_sums = sums
    if len(offsets) != len(stems) + 1 or len(pos_sums) != len(stems) or len(tf_sums) != len(stems):
        return None
    if int(offsets[0]) != 0 or int(offsets[-1]) != len(positions) or len(tf) != len(positions):
        return None
    renumber = (np.cumsum(alive, dtype=np.int64) - 1).astype(np.int32)  # a live document's place
    everyone = bool(alive.all())  # else every posting is renumbered

    def live(found: Postings) -> Postings | None:
        pos, counted = found
        if len(pos) and (int(pos.min()) < 0 or int(pos.max()) >= n):
            return None
        mask = alive[pos]
        stored = counted[mask].astype(tf.dtype)
        if not np.array_equal(stored, counted[mask]):
            return None
        return renumber[pos[mask]], stored

    extra: dict[int, Postings] = {}
    for stem, found in added.items():
        part, number = live(found), stems.get(stem)
        if number is None or part is None:
            return None
        extra[number] = part
    tail: list[Postings] = []
    for stem, found in new.items():
        part = live(found)
        if stem in stems or part is None:
            return None
        tail.append(part)

    groups = _groups(offsets)
    kept = np.diff(offsets)  # each stem's postings of live documents in the file
    out_pos_sums, out_tf_sums = pos_sums.copy(), tf_sums.copy()
    if not everyone:
        for first, last in groups:
            a, b = int(offsets[first]), int(offsets[last])
            pos, bits = positions[a:b], count_bits(tf[a:b])
            if len(pos) and (int(pos.min()) < 0 or int(pos.max()) >= n):
                return None
            starts = offsets[first:last] - a
            if not (
                np.array_equal(run_sums(pos, starts, np.int64), pos_sums[first:last])
                and np.array_equal(run_sums(bits, starts, np.uint64), tf_sums[first:last])
            ):
                return None  # a damaged word is not carried into the new file with new checksums
            keep = alive[pos]
            kept[first:last] = run_sums(keep, starts, np.int64)
            out_pos_sums[first:last] = run_sums(np.where(keep, renumber[pos], 0), starts, np.int64)
            out_tf_sums[first:last] = run_sums(np.where(keep, bits, 0), starts, np.uint64)
    counts = kept.copy()
    for i, (pos, counted) in extra.items():
        more_pos, more_tf = word_sums(pos, counted)
        out_pos_sums[i] += more_pos
        out_tf_sums[i : i + 1] += np.uint64(more_tf)  # an array's sum wraps modulo 2**64 silently
        counts[i] += len(pos)
    order = np.array(sorted(extra), dtype=np.int64)

    def chunks(tfs: bool) -> Iterator[npt.NDArray[Any]]:
        source = tf if tfs else positions
        for first, last in groups:
            a, b = int(offsets[first]), int(offsets[last])
            out = source[a:b]
            if not everyone:
                keep = alive[positions[a:b]]
                out = out[keep] if tfs else renumber[out[keep]]
            inside = order[np.searchsorted(order, first) : np.searchsorted(order, last)]
            if len(inside):  # each stem's added postings go after its own
                ends = np.cumsum(kept[first:last])[inside - first]
                parts = [extra[int(i)][1 if tfs else 0] for i in inside]
                at = np.repeat(ends, [len(p) for p in parts])
                out = np.insert(out, at, np.concatenate(parts))  # stable: in the given order
            yield out
        for part in tail:
            yield part[1 if tfs else 0]

    names = stems.stems() + list(new)
    if tail:  # appended once (one append per word copied the arrays of every word each time)
        tail_sums = [word_sums(pos, counted) for pos, counted in tail]
        counts = np.concatenate([counts, np.array([len(pos) for pos, _ in tail], dtype=np.int64)])
        out_pos_sums = np.concatenate([out_pos_sums, np.array([p for p, _ in tail_sums], dtype=np.int64)])
        out_tf_sums = np.concatenate([out_tf_sums, np.array([t for _, t in tail_sums], dtype=np.uint64)])
    used = counts > 0
    if not used.all():
        names = [stem for stem, keep_it in zip(names, used.tolist(), strict=True) if keep_it]
        counts, out_pos_sums, out_tf_sums = counts[used], out_pos_sums[used], out_tf_sums[used]
    out_offsets = np.zeros(len(names) + 1, dtype=np.int64)
    np.cumsum(counts, out=out_offsets[1:])
    total = int(out_offsets[-1])
    return HeldPostings(
        names,
        out_offsets,
        out_pos_sums,
        out_tf_sums,
        Pieces(np.dtype(np.int32), total, lambda: chunks(False)),
        Pieces(tf.dtype, total, lambda: chunks(True)),
    )


def _groups(offsets: npt.NDArray[np.int64]) -> list[tuple[int, int]]:
    """The stems in runs ``[first, last)`` of about :data:`_GROUP_POSTINGS` postings (a stem with
    more is a run of its own)."""
    groups: list[tuple[int, int]] = []
    first, stems = 0, len(offsets) - 1
    while first < stems:
        last = int(np.searchsorted(offsets, offsets[first] + _GROUP_POSTINGS, side="right")) - 1
        last = min(max(last, first + 1), stems)
        groups.append((first, last))
        first = last
    return groups
