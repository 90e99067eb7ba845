"""Paired bootstrap: is one retrieval mode really better than another on the same queries?

Per-query scores of two modes are paired (same query, same corpus), so the interval is taken over
the per-query differences: resampling queries with replacement keeps each pair together.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["paired_bootstrap"]


def paired_bootstrap(
    a: Sequence[float], b: Sequence[float], *, n: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """``(mean of a - b, 2.5 % bound, 97.5 % bound)`` of the mean paired difference.

    An interval whose lower bound is above zero says ``a`` beats ``b`` on this kind of query,
    not just on these particular queries.
    """
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired scores need two equal-length 1-d sequences, got {x.shape} and {y.shape}")
    if len(x) == 0:
        raise ValueError("paired scores are empty")
    if n <= 0:
        raise ValueError(f"n must be > 0, got {n}")
    diff = x - y
    rng = np.random.default_rng(seed)
    means = np.empty(n, dtype=np.float64)
    # in blocks, so a large n over many queries never builds one huge index matrix
    block = max(1, 2_000_000 // len(diff))
    for start in range(0, n, block):
        count = min(block, n - start)
        picks = rng.integers(0, len(diff), size=(count, len(diff)))
        means[start : start + count] = diff[picks].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(diff.mean()), float(low), float(high)
