"""Row-wise dot products and row moves on large float32 matrices, tuned for busy machines."""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt

from ._array_types import FloatArray

_MOVE_BLOCK = 16_384  # rows moved per step when compacting in place


class _Scanner:
    """Row-wise dot products of a large matrix, by whichever way is faster here and now.

    numpy's ``einsum`` scans on the calling thread: memory-bound and predictable. BLAS
    (``matrix @ query``) splits the scan over its threads, which wins on an idle machine (measured
    at 100k x 384: 5 ms against 7) and loses badly on a busy one, where handing work to its
    threads costs more than the scan (measured: 16 ms instead of 0.1 ms for 2k x 384 on 2 loaded
    cores; 28 ms against 17 at 200k). So each way's cost per row is tracked (a moving average);
    scans use the cheaper one and try the other once every ``_EXPLORE`` scans. Small scans always
    stay on the calling thread.
    """

    _EXPLORE = 128
    _MIN_ROWS = 16_384

    def __init__(self) -> None:
        self.cost = {"einsum": 0.0, "blas": 0.0}  # seconds per row; 0 = not measured yet
        self.scans = 0

    def dot(self, matrix: FloatArray, query: FloatArray) -> FloatArray:
        rows = len(matrix)
        if rows < self._MIN_ROWS:
            return self._einsum(matrix, query)
        self.scans += 1
        einsum, blas = self.cost["einsum"], self.cost["blas"]
        if not einsum or not blas:
            way = "blas" if einsum else "einsum"
        else:
            way = "einsum" if einsum <= blas else "blas"
            if self.scans % self._EXPLORE == 0:
                way = "blas" if way == "einsum" else "einsum"
        started = time.perf_counter()
        scores = self._einsum(matrix, query) if way == "einsum" else self._blas(matrix, query)
        per_row = (time.perf_counter() - started) / rows
        known = self.cost[way]
        self.cost[way] = per_row if not known else 0.8 * known + 0.2 * per_row
        return scores

    @staticmethod
    def _einsum(matrix: FloatArray, query: FloatArray) -> FloatArray:
        scores: FloatArray = np.einsum("ij,j->i", matrix, query)
        return scores

    @staticmethod
    def _blas(matrix: FloatArray, query: FloatArray) -> FloatArray:
        scores: FloatArray = matrix @ query
        return scores


SCANNER = _Scanner()  # per process: every mirror meets the same machine


def dot(matrix: FloatArray, query: FloatArray) -> FloatArray:
    return SCANNER.dot(matrix, query)


_HELPER: list[ThreadPoolExecutor] = []
_HELPER_LOCK = threading.Lock()
_CPUS = os.cpu_count() or 1  # read once: each call reads a file (~70 us)


def in_two(scan: Callable[[int, int], None], count: int, offsets: list[int], rows: int) -> None:
    """``scan(0, count)`` over ``count`` slices starting at ``offsets`` (``rows`` in all), split
    in two halves by rows, one of them on a helper thread when there is a second CPU and enough
    rows: numpy releases the GIL while it scans, so two cores take ~70% of the time of one (a
    k=50 search at 100k x 384: 3.4 -> 2.5 ms; memory bandwidth is shared), and no BLAS threads
    are left spinning afterwards."""
    if rows < _Scanner._MIN_ROWS or count < 2 or _CPUS < 2:
        scan(0, count)
        return
    middle = min(max(1, bisect.bisect_left(offsets, rows // 2)), count - 1)
    with _HELPER_LOCK:
        if not _HELPER:
            _HELPER.append(ThreadPoolExecutor(1, thread_name_prefix="memstrata-scan"))
        helper = _HELPER[0]
    other = helper.submit(scan, middle, count)
    scan(0, middle)
    other.result()


_GATHER_ROWS = 256  # rows copied at a time when scoring scattered rows (~400 KB: stays in cache)


def check_positions(positions: npt.NDArray[np.int64], rows: int) -> None:
    """Raise ``IndexError`` unless every position is a row of a matrix of ``rows`` rows: checked
    once for a whole gather by :func:`gather_rows`'s callers."""
    if len(positions) and (int(positions.min()) < 0 or int(positions.max()) >= rows):
        raise IndexError(
            f"row positions {int(positions.min())}..{int(positions.max())} outside 0..{rows - 1}"
        )


def gather_rows(matrix: npt.NDArray[Any], positions: npt.NDArray[np.int64], out: npt.NDArray[Any]) -> None:
    """``out[:] = matrix[positions]`` for positions already checked (:func:`check_positions`).
    ``np.take`` into ``out`` with its default bounds mode copies through a buffer first: 4x
    slower (25k scattered rows of 384 floats: 25 ms against 6)."""
    np.take(matrix, positions, axis=0, out=out, mode="clip")


def dot_rows(matrix: FloatArray, positions: npt.NDArray[np.int64], query: FloatArray) -> FloatArray:
    """``matrix[positions] @ query`` a block of rows at a time, on two cores when there are many:
    gathering every row first writes (and page-faults) a copy as large as the rows themselves,
    measured 3x slower than the scan of the block just gathered."""
    if len(positions) <= _GATHER_ROWS:  # a few rows: one small copy
        few: FloatArray = np.einsum("ij,j->i", matrix[positions], query)
        return few
    check_positions(positions, len(matrix))
    scores = np.empty(len(positions), dtype=np.float32)
    offsets = list(range(0, len(positions), _GATHER_ROWS))

    def scan(first: int, last: int) -> None:
        block = np.empty((_GATHER_ROWS, matrix.shape[1]), dtype=matrix.dtype)
        for start in offsets[first:last]:
            chunk = positions[start : start + _GATHER_ROWS]
            rows = block[: len(chunk)]
            gather_rows(matrix, chunk, rows)
            np.einsum("ij,j->i", rows, query, out=scores[start : start + len(chunk)])

    in_two(scan, len(offsets), offsets, len(positions))
    return scores


_EACH_BLOCK = 8_192  # rows per einsum call of dot_each_row: two cores share the blocks


def dot_each_row(matrix: FloatArray, starts: list[int], ends: list[int], query: FloatArray) -> FloatArray:
    """Row-wise dot products of the slices ``starts[i]:ends[i]``, concatenated. By einsum, whose
    sum for a row is the same bits wherever the row is stored and whatever is scanned with it
    (BLAS sums in another order that depends on both, and :func:`dot` picks it by timing), in
    blocks shared by two cores when large: a ranking read from these scores replays exactly."""
    pieces: list[tuple[int, int]] = []
    for a, b in zip(starts, ends, strict=True):
        pieces.extend((s, min(s + _EACH_BLOCK, b)) for s in range(a, b, _EACH_BLOCK))
    offsets = [0]
    for a, b in pieces:
        offsets.append(offsets[-1] + b - a)
    total = offsets.pop()
    out = np.empty(total, dtype=np.float32)

    def scan(first: int, last: int) -> None:
        for (a, b), o in zip(pieces[first:last], offsets[first:last], strict=True):
            np.einsum("ij,j->i", matrix[a:b], query, out=out[o : o + b - a])

    in_two(scan, len(pieces), offsets, total)
    return out


def unit_rows(array: FloatArray) -> FloatArray:
    norms = np.linalg.norm(array, axis=-1, keepdims=True)
    norms[norms == 0] = 1.0
    unit: FloatArray = (array / norms).astype(np.float32, copy=False)
    return unit


def permute_rows(matrix: npt.NDArray[Any], order: npt.NDArray[np.intp]) -> None:
    """``matrix[:len(order)] = matrix[order]`` in place, for a permutation ``order``.

    Block by block, the rows wanted in the block are gathered and the rows they displace move to
    the places just vacated; two bookkeeping arrays track where every row is. Temporary memory is
    two blocks, not a second matrix (and no fresh pages to fault in, which is slow on some hosts).
    """
    n = len(order)
    where = np.arange(n)  # where[r]: current position of the row that was at r
    holds = np.arange(n)  # holds[p]: which original row is now at p
    for a in range(0, n, _MOVE_BLOCK):
        b = min(n, a + _MOVE_BLOCK)
        wanted = order[a:b]
        sources = where[wanted]  # all >= a: rows before a are final
        inside = sources < b
        taken = np.zeros(b - a, dtype=bool)
        taken[sources[inside] - a] = True
        displaced = np.flatnonzero(~taken) + a  # block positions holding rows wanted later
        vacated = sources[~inside]  # positions after the block that the gather empties
        gathered = np.take(matrix, sources, axis=0)
        moved = np.take(matrix, displaced, axis=0)
        matrix[a:b] = gathered
        matrix[vacated] = moved
        moved_rows = holds[displaced]
        holds[vacated] = moved_rows
        where[moved_rows] = vacated
        holds[a:b] = wanted
        where[wanted] = np.arange(a, b)
