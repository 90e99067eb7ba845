"""Distinct values of an array, sorted: ``numpy.unique`` without its first-call cost.

A plain ``numpy.unique(values)`` asks ``numpy.ma`` whether the array is masked, which imports
``numpy.ma`` (~20 ms, bytecode cached) the first time, in the middle of a fresh process's first
search. The search paths call this instead; the result is the same.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

__all__ = ["distinct"]

T = TypeVar("T", bound=np.generic)


def distinct(values: npt.NDArray[T]) -> npt.NDArray[T]:
    """The distinct values of ``values`` (flattened), in ascending order."""
    ordered = np.sort(values.reshape(-1))
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]
