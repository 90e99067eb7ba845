"""Inverted lists (IVF): the approximate stage of a large in-memory vector mirror that cannot
sieve by sign codes (fewer than 256 dimensions, or rows not of unit length; see :mod:`._sign_codes`).

Spherical k-means splits the unit vectors into lists around centroids. The mirror keeps its rows
physically grouped by list, so scanning a list means reading one contiguous slice of the matrix. A
query ranks the centroids, scans the nearest lists until they cover a fixed share of the rows, and
ranks those rows by their exact cosine similarity. The share scanned trades speed for recall, which
is measured (``tests/test_storage_vectors_scale.py``, ``benchmarks/bench_vectors.py``), not assumed.

Everything here is plain numpy. Training and assignment are matrix products (BLAS, all cores: they
run once per partition); the per-query work is single-threaded (``einsum``), because handing a small
product to BLAS threads costs more than it saves on a busy machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ._array_types import FloatArray, IntArray

__all__ = ["Partition", "assign", "list_count", "train"]

MIN_LISTS = 64
MAX_LISTS = 2048
SAMPLE_PER_LIST = 32  # training rows per list: more buys little recall and costs time linearly
MAX_SAMPLE = 65_536
ITERATIONS = 6
_BLOCK = 8192  # rows per matrix product: bounds the scores temporary to 8192 x lists floats


def list_count(rows: int) -> int:
    """About ``sqrt(rows)`` lists, rounded up to a power of two, within [64, 2048]."""
    if rows <= 1:
        return MIN_LISTS
    wanted = 2 ** math.ceil(math.log2(math.sqrt(rows)))
    return int(min(MAX_LISTS, max(MIN_LISTS, wanted)))


def _nearest(rows: FloatArray, centroids: FloatArray) -> tuple[npt.NDArray[np.int32], FloatArray]:
    """Index of the most similar centroid for each row, and that similarity."""
    labels = np.empty(len(rows), dtype=np.int32)
    best = np.empty(len(rows), dtype=np.float32)
    for start in range(0, len(rows), _BLOCK):
        scores = rows[start : start + _BLOCK] @ centroids.T
        chosen = np.argmax(scores, axis=1)
        labels[start : start + len(chosen)] = chosen
        best[start : start + len(chosen)] = scores[np.arange(len(chosen)), chosen]
    return labels, best


def train(sample: FloatArray, lists: int, *, iterations: int = ITERATIONS, seed: int = 0) -> FloatArray:
    """Unit centroids of spherical k-means over ``sample`` (unit rows), ``lists`` of them.

    A list left empty by an iteration is re-seeded with the sample row its centroid fits worst,
    so every centroid keeps covering part of the data.
    """
    rng = np.random.default_rng(seed)
    lists = max(1, min(lists, len(sample)))
    centroids: FloatArray = sample[np.sort(rng.choice(len(sample), lists, replace=False))].copy()
    for _ in range(iterations):
        labels, fit = _nearest(sample, centroids)
        counts = np.bincount(labels, minlength=lists)
        order = np.argsort(labels, kind="stable")
        filled = np.flatnonzero(counts)
        bounds = np.concatenate(([0], np.cumsum(counts)[:-1]))[filled]
        sums = np.zeros_like(centroids)
        sums[filled] = np.add.reduceat(sample[order], bounds, axis=0)
        empty = np.flatnonzero(counts == 0)
        if len(empty):
            worst = np.argsort(fit, kind="stable")[: len(empty)]
            sums[empty] = sample[worst]
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        centroids = (sums / norms).astype(np.float32)
    return centroids


def assign(rows: FloatArray, centroids: FloatArray) -> npt.NDArray[np.int32]:
    """The list of each row: its most similar centroid."""
    return _nearest(rows, centroids)[0]


@dataclass
class Partition:
    """Where each list's rows lie in the mirror: list ``i`` is ``matrix[starts[i]:starts[i + 1]]``.

    Rows from ``starts[-1]`` on (added after the partition was made) form the tail, which every
    query scans exactly.
    """

    centroids: FloatArray  # (lists, dim), unit rows
    starts: IntArray  # (lists + 1,), non-decreasing, starts[0] == 0
    trained_rows: int  # live rows when the centroids were trained

    @property
    def lists(self) -> int:
        return len(self.centroids)

    @property
    def end(self) -> int:
        return int(self.starts[-1])

    def spans(self, query: FloatArray, rows: float) -> tuple[list[int], list[int]]:
        """Slices ``(starts, ends)`` to scan: the lists nearest ``query`` until they hold at least
        ``rows`` rows, in storage order, adjacent lists merged into one slice."""
        scores = np.einsum("ij,j->i", self.centroids, query)
        ranked = np.argsort(-scores, kind="stable")
        sizes = np.diff(self.starts)[ranked]
        count = min(len(ranked), int(np.searchsorted(np.cumsum(sizes), rows)) + 1)
        chosen = np.sort(ranked[:count])
        lo, hi = self.starts[chosen], self.starts[chosen + 1]
        keep = hi > lo
        lo, hi = lo[keep], hi[keep]
        if len(lo) == 0:
            return [], []
        breaks = np.flatnonzero(lo[1:] != hi[:-1])
        first = np.concatenate(([0], breaks + 1))
        last = np.concatenate((breaks, [len(lo) - 1]))
        return lo[first].tolist(), hi[last].tolist()
