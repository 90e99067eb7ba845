"""Sign codes: the sieve of a large vector mirror's searches.

One bit per coordinate, its sign, packed in 64-bit words (48 bytes a row at 384 dimensions,
3% of the float32 row). The Hamming distance between two codes tracks the angle between their
rows, so the rows nearest the query in Hamming distance hold its nearest neighbours by cosine;
a few thousand of them (:func:`candidates`) are then scored by the caller (on int8 rows, the
best few again in float32: :mod:`._int8_rows`). Measured at
100k x 384 on the corpora of ``benchmarks/bench_vectors.py`` and ``bench_peers.py``: recall@10
1.0 on both, where scanning inverted lists gave 0.997 and 0.89 (entries that mix three topics
spread their neighbours over many lists), in 0.45-0.8x the time. Its weak spot: rows told apart
only by small differences, as real embeddings copied many times with noise (recall@10 0.91 on
such code embeddings, where the lists keep 0.99). Fewer bits are too coarse a
sieve (at 32 dimensions recall@10 fell to 0.97), hence :data:`MIN_DIM`.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ._array_types import BoolArray, FloatArray, IntArray
from ._vector_kernels import in_two

__all__ = ["MIN_DIM", "SignCodes", "candidates", "nearest_within", "sign_codes"]

MIN_DIM = 256  # dimensions from which a mirror sieves by sign codes
_CANDIDATES = 2048  # rows rescored, at least, up to 1M rows sieved (sqrt(n / 1M) times more
# beyond). 512 gave recall@10 1.0 on the benchmarks' corpora at 100k, but 0.79-0.98 on real
# prose, dialogue and code embeddings tiled to 100k with noise; 2048 gives 0.91-0.997 there (the
# inverted lists: 0.99-0.997) and 0.986 on 25k real code chunks (lists: 0.977) ...
_PER_K = 40  # ... and this many per hit asked for (recall@50 at 1M: 0.9997 with 2048)
_BLOCK = 65_536  # rows per step of a scan (its temporaries stay small)
# from this many rows a scan is split over two threads: a code is 48 bytes, so handing half of a
# scan to a second thread pays off only for large scans (2 cores, one thread against two: 100k
# rows 1.2-1.8 ms against 1.2-1.5 idle, 1.3-1.8 against 2.7-3.9 busy; 1M rows 13-14 ms against
# 8.4-10 idle, 23 against 19 busy)
_SPLIT_FROM = 262_144
_SAMPLE_FROM = 65_536  # from this many distances the cut-off is guessed from a sample first ...
_SAMPLE_STEP = 16  # ... of every 16th distance, aiming at twice the rows wanted (plus a few)
_SAMPLE_SLACK = 8


def sign_codes(rows: FloatArray, words: int) -> npt.NDArray[np.uint64]:
    """The sign bit of each coordinate of ``rows``, packed into ``words`` 64-bit words a row."""
    packed = np.packbits(rows > 0, axis=1)
    padded = np.zeros((len(rows), words * 8), dtype=np.uint8)
    padded[:, : packed.shape[1]] = packed
    return padded.view(np.uint64)


def candidates(rows: int, k: int) -> int:
    """How many of ``rows`` sieved rows are scored exactly for a top ``k``."""
    return int(max(_CANDIDATES * max(1.0, (rows / 1_000_000) ** 0.5), _PER_K * k))


def nearest_within(distances: npt.NDArray[np.uint16], count: int, bits: int) -> IntArray:
    """Indices of every distance up to the smallest cut-off (at most ``bits``) that at least
    ``count`` of them are within: all those at the cut-off, none beyond.

    A histogram of every distance costs ~1.4 ms at 1M rows, most of a sieve's selection. Here a
    sample's histogram (every :data:`_SAMPLE_STEP` th distance) guesses a cut-off with room to
    spare; the distances within it are found in one pass and their own histogram gives the exact
    cut-off, which cannot lie beyond the guess. A guess that holds too few (a sample unlike the
    whole) falls back to the full histogram, so the answer is always the same."""
    if len(distances) >= _SAMPLE_FROM:
        sample = np.bincount(distances[::_SAMPLE_STEP], minlength=bits + 2)[: bits + 1]
        wanted = 2 * count // _SAMPLE_STEP + _SAMPLE_SLACK
        guess = int(np.searchsorted(np.cumsum(sample), wanted))
        if guess < bits:
            near = np.flatnonzero(distances <= guess)
            if len(near) >= count:
                within = np.cumsum(np.bincount(distances[near], minlength=guess + 1))
                cut = int(np.searchsorted(within, count))
                return near if cut == guess else near[distances[near] <= cut]
    within = np.cumsum(np.bincount(distances, minlength=bits + 2)[: bits + 1])
    cut = min(int(np.searchsorted(within, count)), bits)
    return np.flatnonzero(distances <= cut)


class SignCodes:
    """The sign codes of a mirror's rows, word-major (``codes[w]`` is word ``w`` of every row:
    each step of a scan reads one contiguous array). Kept for the rows ``[0, rows)``: the first
    ``len(base)`` in ``base`` (as made at first use or mapped from the index file, never grown in
    place), the rows appended since in ``extra``, so that an append never copies every code. A
    move of the rows (compaction, regrouping) permutes or drops them into one ``base`` again."""

    def __init__(self, dim: int, codes: npt.NDArray[np.uint64] | None = None) -> None:
        """Codes for no rows yet, or ``codes`` (word-major, as :meth:`saved`) for their rows."""
        self.words = (dim + 63) // 64
        self.bits = self.words * 64
        self.base = np.zeros((self.words, 0), dtype=np.uint64) if codes is None else codes
        self.extra = np.zeros((self.words, 0), dtype=np.uint64)
        self.rows = self.base.shape[1]

    @property
    def _split(self) -> int:
        return int(self.base.shape[1])

    def saved(self) -> npt.NDArray[np.uint64]:
        """The codes of the coded rows, to save with the mirror (a view when all are in one part)."""
        split = self._split
        if self.rows <= split:
            return self.base[:, : self.rows]
        if split == 0:
            return self.extra[:, : self.rows]
        return np.concatenate([self.base, self.extra[:, : self.rows - split]], axis=1)

    def update(self, matrix: FloatArray, size: int) -> None:
        """Codes for the rows appended since the last call."""
        if size < self.rows:
            self.base, self.extra, self.rows = self.base[:, :0], self.extra[:, :0], 0
        split = self._split
        if size - split > self.extra.shape[1]:
            if split == 0 and self.rows:  # the codes made at first use become ``base``, uncopied
                self.base, split = self.extra[:, : self.rows], self.rows
                self.extra = self.extra[:, :0]
            kept = self.rows - split
            grown = np.empty((self.words, max(size - split, 2 * self.extra.shape[1], 1024)), dtype=np.uint64)
            grown[:, :kept] = self.extra[:, :kept]
            self.extra = grown
        for a in range(self.rows, size, _BLOCK):
            b = min(size, a + _BLOCK)
            self.extra[:, a - split : b - split] = sign_codes(matrix[a:b], self.words).T
        self.rows = size

    def take(self, order: IntArray) -> None:
        """The rows moved: row ``i`` is now the one that was at ``order[i]`` (kept only when every
        row moved has its code)."""
        if len(order) and int(order.max()) < self.rows:
            self.base = self.saved()[:, order]
            self.extra = self.extra[:, :0]
            self.rows = len(order)
        else:
            self.base, self.extra, self.rows = self.base[:, :0], self.extra[:, :0], 0

    def distances(
        self, query: FloatArray, starts: list[int], ends: list[int], valid: BoolArray | None
    ) -> npt.NDArray[np.uint16]:
        """Hamming distance from the query's code to each row of the slices ``starts[i]:ends[i]``
        (in order); ``bits + 1`` for rows ``valid`` (by position) rejects. On two cores from
        ``_SPLIT_FROM`` rows (numpy releases the GIL on each step)."""
        q = sign_codes(query.reshape(1, -1), self.words)[0]
        split = self._split
        pieces: list[tuple[npt.NDArray[np.uint64], int, int, int]] = []  # codes, rows a:b, offset
        offset = 0
        for start, end in zip(starts, ends, strict=True):
            for a in range(start, end, _BLOCK):
                b = min(end, a + _BLOCK)
                for lo, hi in ((a, min(b, split)), (max(a, split), b)):
                    if lo < hi:
                        pieces.append((self.base if lo < split else self.extra, lo, hi, offset))
                        offset += hi - lo
        out = np.empty(offset, dtype=np.uint16)
        bits = self.bits

        def scan(first: int, last: int) -> None:
            step = np.empty(_BLOCK, dtype=np.uint64)
            counts = np.empty(_BLOCK, dtype=np.uint8)
            for codes, a, b, o in pieces[first:last]:
                shift = 0 if codes is self.base else split
                x, c, d = step[: b - a], counts[: b - a], out[o : o + b - a]
                for w in range(self.words):
                    np.bitwise_xor(codes[w, a - shift : b - shift], q[w], out=x)
                    np.bitwise_count(x, out=c)
                    if w:
                        np.add(d, c, out=d)
                    else:
                        d[:] = c
                if valid is not None:
                    d[~valid[a:b]] = bits + 1

        if offset >= _SPLIT_FROM:
            in_two(scan, len(pieces), [o for _, _, _, o in pieces], offset)
        else:
            scan(0, len(pieces))
        return out

    def nearest(
        self, query: FloatArray, starts: list[int], ends: list[int], valid: BoolArray | None, count: int
    ) -> IntArray:
        """Positions of at least ``count`` allowed rows of the slices nearest ``query`` by Hamming
        distance (all those at the cut-off distance: no arbitrary tie-break)."""
        chosen = nearest_within(self.distances(query, starts, ends, valid), count, self.bits)
        if len(starts) == 1:
            return (chosen + starts[0]).astype(np.int64)
        lengths = np.subtract(ends, starts)
        before = np.cumsum(lengths) - lengths  # each slice's offset in ``distances``
        slice_of = np.searchsorted(before, chosen, side="right") - 1
        positions: IntArray = chosen - before[slice_of] + np.asarray(starts, dtype=np.int64)[slice_of]
        return positions
