"""Whether the arrays of a BM25 index file (:mod:`._bm25_file`) have their types and fit one
another: checked before the file is trusted, so a damaged or foreign file is rebuilt instead."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["ascending_within", "postings_fit"]


def postings_fit(
    words: int,
    ids: npt.NDArray[Any],
    sizes: npt.NDArray[Any],
    offsets: npt.NDArray[Any],
    positions: npt.NDArray[Any],
    tfs: npt.NDArray[Any],
    tf_types: tuple[type[np.floating[Any]], ...],
) -> bool:
    """Whether the arrays of a file's postings of ``words`` words have their types and fit one
    another (ids ascending, one offset per word and one more, offsets ascending over the
    positions)."""
    return not (
        ids.dtype != np.int64
        or sizes.dtype != np.float64
        or offsets.dtype != np.int64
        or positions.dtype != np.int32
        or tfs.dtype not in [np.dtype(t) for t in tf_types]
        or len(sizes) != len(ids)
        or len(offsets) != words + 1
        or int(offsets[0]) != 0
        or int(offsets[-1]) != len(positions)
        or len(tfs) != len(positions)
        or bool(np.any(offsets[1:] < offsets[:-1]))
        or bool(np.any(ids[1:] <= ids[:-1]))  # no array of differences: 8 MB at 1M documents
    )


def ascending_within(positions: npt.NDArray[np.int32], offsets: npt.NDArray[np.int64]) -> bool:
    """Each stem's positions rise strictly (the top-k search looks documents up in them).

    ``falls`` holds distinct values, so the membership test may assume so: without the
    assumption numpy deduplicates both sides with ``np.unique``, which imports ``numpy.ma``,
    ~20 ms of a process's first search."""
    falls = np.flatnonzero(np.diff(positions) <= 0) + 1
    return bool(np.isin(falls, offsets[1:-1], assume_unique=True).all())
