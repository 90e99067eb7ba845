"""Int8 rows: the compact copy of a large vector mirror that its searches score.

Each coordinate of a unit row is kept as a whole number of steps of its dimension's scale (the
largest magnitude the dimension had when the codes were made, over 127; a later row beyond it is
clipped): 384 bytes a row at 384 dimensions, a quarter of the float32 row. A search ranks its
candidates on these, then reads only the best few (:func:`refine_count`) in float32 and ranks
them exactly, so its hits and their similarities are those of float32.

Why: the float32 matrix of 1M rows is 1.5 GB. Scoring a search's ~2,000 scattered candidates in it
maps a page around each row, so a process came to hold nearly all of it after a few dozen queries
(1.7 GB of mapped pages after 50 queries at 1M). At large, searches touch only these 384 MB.

Measured recall@10 against exact search, real prose, dialogue and code embeddings (the default
model) tiled to 100k rows with two levels of noise: sign codes, then these, then float32 for only
the best 32 (a top 10 reads 42): equal to scoring every candidate in float32 on all six
(0.989-0.997); a scan of all rows here, then float32 for the best 32: 1.000 on all six. Scores
here are within ~2.5e-3 of the exact cosine on the benchmark's data. Turning int8 into float32
costs about what reading float32 does (0.1-0.25 us a row on 2 cores), so these save memory, not
scan time: large filters sieve rather than score all their rows (:mod:`._mirror_search`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ._array_types import FloatArray, IntArray
from ._mirror_threads import one_blas_thread
from ._vector_kernels import check_positions, gather_rows, in_two

__all__ = ["Int8Rows", "int8_codes", "refine_count"]

Int8Array = npt.NDArray[np.int8]

_STEPS = 127
_BLOCK = 512  # rows turned into float32 at a time (768 KB at 384 dimensions: stays in cache;
# measured on 2 cores, 2,300 scattered rows 0.29 ms and 15k rows in a block 0.94 ms, against 0.46
# and 1.75 ms a block of 2,048 rows at a time)
_REFINE_MIN = 32  # rows read in float32 at least, for any k ...
_REFINE_PER_K = 2  # ... and this many per hit asked for


def refine_count(k: int) -> int:
    """How many of the best rows by int8 score a top ``k`` reads again in float32."""
    return max(_REFINE_MIN + k, _REFINE_PER_K * k)


def int8_codes(rows: FloatArray, scale: FloatArray) -> Int8Array:
    """``rows`` as steps of ``scale`` (per dimension), clipped to +-127."""
    steps = np.rint(rows / scale)
    np.clip(steps, -_STEPS, _STEPS, out=steps)
    codes: Int8Array = steps.astype(np.int8)
    return codes


class Int8Rows:
    """The int8 codes of a mirror's rows ``[0, rows)``, with room for as many rows as the matrix
    (``codes`` grows with it). Rows appended are coded at the next :meth:`update`; the mirror
    moves rows here as it moves them in the matrix (compaction, regrouping)."""

    def __init__(
        self, dim: int, codes: Int8Array | None = None, scale: FloatArray | None = None, rows: int = 0
    ) -> None:
        """Codes for no rows yet, or ``codes`` made with ``scale`` for their first ``rows`` rows
        (the rest is room to grow)."""
        self.dim = dim
        self.codes: Int8Array = np.zeros((0, dim), dtype=np.int8) if codes is None else codes
        self.scale = scale
        self.rows = rows
        self._spare: list[tuple[Int8Array, FloatArray]] = []  # buffers of :meth:`_buffers`

    def saved(self) -> Int8Array:
        """The codes of the coded rows (a view)."""
        return self.codes[: self.rows]

    def update(self, matrix: FloatArray, size: int) -> None:
        """Codes for the rows of ``matrix`` added since the last call (all of them the first time:
        the scale is taken from them)."""
        if size < self.rows:
            self.rows = size
        if size == self.rows:
            return
        if self.scale is None:
            top = np.zeros(self.dim, dtype=np.float32)
            for a in range(0, size, 16 * _BLOCK):
                np.maximum(top, np.abs(matrix[a : min(size, a + 16 * _BLOCK)]).max(axis=0), out=top)
            top[top == 0] = 1.0
            self.scale = (top / _STEPS).astype(np.float32)
            self.rows = 0
        if len(self.codes) < size:
            grown = np.zeros((max(size, len(matrix)), self.dim), dtype=np.int8)
            grown[: self.rows] = self.codes[: self.rows]
            self.codes = grown
        for a in range(self.rows, size, 16 * _BLOCK):
            b = min(size, a + 16 * _BLOCK)
            self.codes[a:b] = int8_codes(matrix[a:b], self.scale)
        self.rows = size

    def fits(self, matrix: FloatArray, positions: IntArray) -> bool:
        """Whether the codes at ``positions`` are those of the matrix's rows there."""
        assert self.scale is not None
        return bool(np.array_equal(self.codes[positions], int8_codes(matrix[positions], self.scale)))

    def _query(self, query: FloatArray) -> FloatArray:
        assert self.scale is not None
        return (query * self.scale).astype(np.float32)

    def _buffers(self, half: int) -> tuple[Int8Array, FloatArray]:
        """Reused buffers for one half of a scan (fresh megabytes on every call would be
        page-faulted in on every call: 2 of a 2.3 ms rescoring)."""
        while len(self._spare) <= half:
            self._spare.append(
                (np.empty((_BLOCK, self.dim), dtype=np.int8), np.empty((_BLOCK, self.dim), dtype=np.float32))
            )
        return self._spare[half]

    def scores_at(self, positions: IntArray, query: FloatArray) -> FloatArray:
        """Approximate similarities of the rows at ``positions`` to ``query``."""
        q = self._query(query)
        scores = np.empty(len(positions), dtype=np.float32)
        small, rows = self._buffers(0)
        check_positions(positions, len(self.codes))
        with one_blas_thread():  # BLAS threads would cost more than the product (see _mirror_threads)
            for a in range(0, len(positions), _BLOCK):
                chunk = positions[a : a + _BLOCK]
                n = len(chunk)
                gather_rows(self.codes, chunk, small[:n])
                np.copyto(rows[:n], small[:n])
                np.matmul(rows[:n], q, out=scores[a : a + n])
        return scores

    def scores_in(self, starts: list[int], ends: list[int], query: FloatArray) -> FloatArray:
        """Approximate similarities of the rows of the slices ``starts[i]:ends[i]``, in order;
        on two cores when there are many."""
        q = self._query(query)
        pieces: list[tuple[int, int, int]] = []  # rows a:b, their offset in the scores
        offset = 0
        for start, end in zip(starts, ends, strict=True):
            for a in range(start, end, _BLOCK):
                b = min(end, a + _BLOCK)
                pieces.append((a, b, offset))
                offset += b - a
        scores = np.empty(offset, dtype=np.float32)
        self._buffers(1)

        def scan(first: int, last: int) -> None:
            rows = self._spare[0 if first == 0 else 1][1]
            for a, b, o in pieces[first:last]:
                np.copyto(rows[: b - a], self.codes[a:b])
                np.matmul(rows[: b - a], q, out=scores[o : o + b - a])

        with one_blas_thread():
            in_two(scan, len(pieces), [o for _, _, o in pieces], offset)
        return scores
