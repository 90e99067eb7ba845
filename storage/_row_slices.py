"""Slices and masks of a mirror's rows: the shapes a filtered scan reads (runs of allowed rows,
a group's block and the unsorted tail, nearby slices merged into one numpy call)."""

from __future__ import annotations

import numpy as np

from ._array_types import BoolArray, IntArray

__all__ = ["group_mask", "merged", "runs", "slice_rows"]


def runs(mask: BoolArray) -> tuple[IntArray, IntArray]:
    """Starts and ends of the runs of True in ``mask``."""
    edges = np.diff(mask.view(np.int8), prepend=np.int8(0), append=np.int8(0))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def slice_rows(starts: IntArray, ends: IntArray) -> IntArray:
    """The positions of the rows of the slices ``starts[i]:ends[i]``, in order."""
    lengths = ends - starts
    total = int(lengths.sum())
    offsets = np.cumsum(lengths) - lengths
    return np.repeat(starts - offsets, lengths) + np.arange(total, dtype=np.int64)


def group_mask(
    size: int, end: int, inside: IntArray, inner: BoolArray | None, tail: BoolArray
) -> BoolArray | None:
    """A group filter as a mask by position, for scans that read only the group's rows and the
    tail: ``inner`` at the group's sorted rows ``inside``, ``tail`` from ``end``; ``None`` when
    every row read is allowed."""
    if inner is None and size == end:
        return None
    valid = np.ones(size, dtype=bool)
    if inner is not None:
        valid[inside] = inner
    valid[end:size] = tail
    return valid


def merged(lo: IntArray, hi: IntArray, gap: int) -> tuple[list[int], list[int]]:
    """Sorted, disjoint slices ``lo[i]:hi[i]`` with those at most ``gap`` rows apart merged."""
    if not len(lo):
        return [], []
    breaks = np.flatnonzero(lo[1:] - hi[:-1] > gap)
    first = np.concatenate(([0], breaks + 1))
    last = np.concatenate((breaks, [len(lo) - 1]))
    starts: list[int] = lo[first].tolist()
    ends: list[int] = hi[last].tolist()
    return starts, ends
