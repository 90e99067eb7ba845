"""How a vector mirror scores its rows: float32 or int8, from the map or from the index file.

A mirror that does not sieve scores float32 rows of its matrix. A sieved one
(:attr:`MirrorScoring.sieved`) scores its int8 rows (:mod:`._int8_rows`) and then the best few
again in float32 (:meth:`MirrorScoring._best`), rows still as the index file has them read from
the file (:mod:`._file_rows`): at large, its searches touch the int8 copy (a quarter of the
matrix) and no float32 page. Picking the rows to score (filters, sign codes, inverted lists) is
:mod:`._mirror_search`.
"""

from __future__ import annotations

import time

import numpy as np

from ._array_types import FloatArray, IntArray
from ._file_rows import FileRows
from ._int8_rows import Int8Rows, refine_count
from ._mirror_threads import TwoOrOne, one_blas_thread
from ._row_slices import slice_rows
from ._sign_codes import MIN_DIM, SignCodes
from ._vector_kernels import dot_rows, in_two

__all__ = ["Found", "MirrorScoring"]

Found = tuple[IntArray, FloatArray]  # positions and scores, best first

_SPLIT = TwoOrOne()  # per process: every mirror meets the same machine
_SPLIT_SLICE_ROWS = 128  # rows per slice, on average, from which a scan may be split in two
_FILE_READ_MAX = 256  # up to this many float32 rows are read from the index file one by one


class MirrorScoring:
    """The scoring half of :class:`._mirror_search.MirrorSearch` (its base class)."""

    dim: int
    unit: bool
    matrix: FloatArray
    size: int
    sieving: bool
    _scores: FloatArray
    _signs: SignCodes | None = None  # made by the first search that uses them
    _int8: Int8Rows | None = None  # likewise
    file: FileRows | None = None  # the matrix's rows in the index file it was mapped from ...
    file_rows: int = 0  # ... the first of them that are still as the file has them

    @property
    def can_sieve(self) -> bool:
        """Whether this mirror, once large, sieves by sign codes (unit rows, enough dimensions)
        rather than scanning inverted lists."""
        return self.unit and self.dim >= MIN_DIM

    @property
    def sieved(self) -> bool:
        """True when searches that allow most rows go through sign codes (set by
        :meth:`~._mirror_layout.MirrorLayout.maintain` from ``approximate_from`` rows)."""
        return self.sieving and self.can_sieve

    def sign_codes(self) -> SignCodes | None:
        """The sign codes, up to date with the rows, when :attr:`sieved` (made at first use)."""
        if not self.sieved:
            return None
        if self._signs is None:
            self._signs = SignCodes(self.dim)
        self._signs.update(self.matrix, self.size)
        return self._signs

    def _coarse(self, exact: bool) -> Int8Rows | None:
        """The int8 rows a search scores first, up to date (made at first use); ``None`` for an
        exact search and a mirror that does not sieve (its searches score float32 rows)."""
        if exact or not self.sieved:
            return None
        if self._int8 is None:
            self._int8 = Int8Rows(self.dim)
        self._int8.update(self.matrix, self.size)
        return self._int8

    def _reported(self, positions: IntArray, query: FloatArray, rowids: IntArray) -> Found:
        """The hits a search returns, scored once more row by row in float64 and ranked by that,
        equal scores by rowid: what a caller sees does not depend on the kernel, the thread split
        or the storage position that found each row (a rebuilt mirror orders its rows otherwise
        than one loaded from its index file), so a run replays exactly."""
        if not len(positions):
            return positions, np.zeros(0, dtype=np.float32)
        rows = self._rows_at(positions).astype(np.float64)
        scores = np.einsum("ij,j->i", rows, query.astype(np.float64)).astype(np.float32)
        order = np.lexsort((rowids[positions], -scores))
        return positions[order], scores[order]

    def _rows_at(self, positions: IntArray) -> FloatArray:
        """Float32 rows at ``positions``; a few rows still as the index file has them are read
        from the file rather than touched through the map."""
        file, held = self.file, self.file_rows
        if file is None or not held or len(positions) > _FILE_READ_MAX:
            rows: FloatArray = self.matrix[positions]
            return rows
        inside = positions < held
        rows = np.empty((len(positions), self.dim), dtype=np.float32)
        rows[inside] = file.read(positions[inside])
        outside = ~inside
        if outside.any():
            rows[outside] = self.matrix[positions[outside]]
        return rows

    def _exact_scores(self, positions: IntArray, query: FloatArray) -> FloatArray:
        """Float32 similarities of the rows at ``positions``; a few rows still as the index file
        has them are read from the file rather than touched through the map."""
        if self.file is None or not self.file_rows or len(positions) > _FILE_READ_MAX:
            return dot_rows(self.matrix, positions, query)
        scores: FloatArray = np.einsum("ij,j->i", self._rows_at(positions), query)
        return scores

    def _best(
        self, query: FloatArray, k: int, scores: FloatArray, positions: IntArray, coarse: bool
    ) -> Found:
        """Top ``k`` of scored rows; of ``coarse`` (int8) scores, the best :func:`refine_count`
        rows are scored again in float32 and ranked by those."""
        if not coarse:
            return self._top(scores, k, positions)
        short, _ = self._top(scores, refine_count(k), positions)
        return self._top(self._exact_scores(short, query), k, short)

    def _score_rows(self, query: FloatArray, k: int, positions: IntArray, exact: bool) -> Found:
        """Top ``k`` of the rows at ``positions``."""
        coarse = self._coarse(exact)
        if coarse is None or len(positions) <= refine_count(k):
            return self._top(self._exact_scores(positions, query), k, positions)
        return self._best(query, k, coarse.scores_at(positions, query), positions, True)

    @staticmethod
    def _top(scores: FloatArray, k: int, positions: IntArray | None) -> Found:
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
        top = top[np.lexsort((top, -scores[top]))]  # equal scores: storage order
        chosen = top if positions is None else positions[top]
        return chosen.astype(np.int64, copy=False), scores[top]

    def _scan(
        self, query: FloatArray, starts: list[int], ends: list[int], coarse: Int8Rows | None = None
    ) -> tuple[FloatArray, IntArray]:
        """Similarities of the rows of the slices ``starts[i]:ends[i]`` (float32 ones into one
        reused buffer: a view, valid until the next scan; ``coarse`` ones on its int8 rows), and
        their positions; on two cores when large."""
        if not starts:
            return np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)
        if coarse is not None:
            return coarse.scores_in(starts, ends, query), slice_rows(
                np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
            )
        lengths = np.subtract(ends, starts, dtype=np.int64)
        at = int(lengths.sum())
        if len(self._scores) < at:
            self._scores = np.empty(max(at, 2 * len(self._scores)), dtype=np.float32)
        scores, matrix = self._scores, self.matrix
        offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        listed = offsets.tolist()

        def scan(first: int, last: int) -> None:
            for a, b, o in zip(starts[first:last], ends[first:last], listed[first:last], strict=True):
                np.matmul(matrix[a:b], query, out=scores[o : o + b - a])

        # many short slices stay on one thread: numpy keeps the GIL for a short product, so two
        # threads would take turns at it rather than scan side by side
        split = at >= _SPLIT_SLICE_ROWS * len(starts) and _SPLIT.split(at)
        started = time.perf_counter()
        with one_blas_thread():  # each slice's product on its own core, not handed to BLAS threads
            if split:
                in_two(scan, len(starts), listed, at)
            else:
                scan(0, len(starts))
        _SPLIT.timed(split, at, started)
        positions = np.repeat(np.asarray(starts, dtype=np.int64) - offsets, lengths) + np.arange(at)
        return scores[:at], positions
