"""Reciprocal Rank Fusion: ``score(d) = sum over lists of w / (k + rank)``, ranks from 1.

Scores are normalised to 0..1 by dividing by the best possible sum (rank 1 in every list), so
a document first in both lists scores 1.0 and thresholds mean the same for any ``k``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from memstrata.errors import InvalidInputError

__all__ = ["DEFAULT_RRF_K", "Fused", "match_type", "rrf"]

DEFAULT_RRF_K = 60
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Fused(Generic[K]):
    key: K
    score: float  # normalised 0..1
    ranks: tuple[int | None, ...]  # 1-based rank in each input list, None where absent


def rrf(
    lists: Sequence[Sequence[K]],
    *,
    k: int = DEFAULT_RRF_K,
    weights: Sequence[float] | None = None,
) -> list[Fused[K]]:
    """Fuse ranked lists of keys (best first); ties keep the order of first appearance.

    A key repeated inside one list counts at its first (best) rank only.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise InvalidInputError(f"k must be an integer >= 0, got {k!r}")
    weights = [1.0] * len(lists) if weights is None else [float(w) for w in weights]
    if len(weights) != len(lists):
        raise InvalidInputError(f"weights has {len(weights)} values for {len(lists)} lists")
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise InvalidInputError(f"weights must be finite and >= 0, got {weights}")
    best = sum(w / (k + 1) for w in weights) or 1.0
    ranks: dict[K, list[int | None]] = {}
    sums: dict[K, float] = {}
    empty: list[int | None] = [None] * len(lists)
    for index, keys in enumerate(lists):
        weight = weights[index]
        for rank, key in enumerate(keys, start=1):
            slot = ranks.get(key)
            if slot is None:
                slot = ranks[key] = empty.copy()
                sums[key] = 0.0
            if slot[index] is None:
                slot[index] = rank
                sums[key] += weight / (k + rank)
    # sorted() is stable: equal scores keep the order of first appearance
    order = sorted(ranks, key=lambda key: -sums[key])
    return [Fused(key, sums[key] / best, tuple(ranks[key])) for key in order]


def match_type(vector_rank: int | None, keyword_rank: int | None) -> str:
    if vector_rank is not None and keyword_rank is not None:
        return "hybrid"
    return "semantic" if vector_rank is not None else "keyword"
