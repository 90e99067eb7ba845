"""The one rank fusion every store uses: weighted Reciprocal Rank Fusion.

``score(d) = sum over lists of w / (k + rank)``, ranks from 1, normalised to 0..1 by the best
possible sum (rank 1 in every list), so a document first everywhere scores 1.0, the score only
grows as a rank improves, and a threshold means the same for any ``k`` and weights.

Why these defaults (``k = 5``, keyword list weighted 1.5, vector 1.0): with the textbook
``k = 60`` every document found by both lists (even at rank 50 in each: 2/110) outranks the
keyword list's first hit when the vector list missed it (1/61). Where the vector side is weak
(dialogue, code) that buries keyword's best hits and fusion scores below keyword search alone.
A small ``k`` keeps the head of each list decisive; the heavier keyword weight reflects that
an exact word match is the stronger signal on every corpus measured (``benchmarks/
bench_quality.py``, chosen leave-one-corpus-out). ``PLAIN_RRF_K`` with equal weights is the
textbook fusion, still selectable through the search settings.

Adaptive weight (:func:`fusion_weights` given the query): under the default settings a query
that is not a question (no ``?``, no opening who/what/when/...) weighs its keyword list
:data:`STATEMENT_KEYWORD_WEIGHT` (1.25) instead of 1.5. Questions about a conversation share
few words with the answer but their rare words (names, places) are decisive, so keyword search
leads there; on statement-like queries (a code search, a topic) where the vector list is the
stronger one (JavaScript, Go), weight 1.5 pulled fused results below vector search alone. The
pair was chosen as the best worst-case gain over the best single mode on all corpora; chosen
on all but one corpus, it kept the held-out one above its best single mode every time, which no
single fixed weight did (``docs/performance.md``). Weights set
explicitly (anything but the defaults) are used as given.

:func:`fuse` works on numpy int64 keys (the episodic store fuses deep lists in rounds);
:func:`rrf` is the same fusion for any hashable keys.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from memstrata.core.errors import InvalidInputError

from ._array_types import IntArray

__all__ = [
    "DEFAULT_KEYWORD_WEIGHT",
    "DEFAULT_RRF_K",
    "DEFAULT_VECTOR_WEIGHT",
    "PLAIN_RRF_K",
    "STATEMENT_KEYWORD_WEIGHT",
    "Fused",
    "FusedArrays",
    "best_score",
    "check_fusion",
    "fuse",
    "fusion_weights",
    "is_question",
    "match_type",
    "rrf",
]

DEFAULT_RRF_K = 5
DEFAULT_VECTOR_WEIGHT = 1.0
DEFAULT_KEYWORD_WEIGHT = 1.5
PLAIN_RRF_K = 60  # textbook RRF; also fuses the keyword sub-lists (words, CJK) of one query
STATEMENT_KEYWORD_WEIGHT = 1.25  # the keyword list's default weight for a query that is no question
_QUESTION_WORD = re.compile(r"^\W*(?:who|what|when|where|why|how|which|whom|whose)\b", re.IGNORECASE)
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Fused(Generic[K]):
    key: K
    score: float  # normalised 0..1
    ranks: tuple[int | None, ...]  # 1-based rank in each input list, None where absent


@dataclass(slots=True)
class FusedArrays:
    """Fused keys in no particular order; sort with ``np.lexsort((first, -scores))``."""

    keys: IntArray  # distinct keys
    scores: npt.NDArray[np.float64]  # 0..1
    first: IntArray  # position of the first appearance in the concatenated lists (breaks ties)
    ranks: list[IntArray]  # 1-based rank in each list, 0 where absent

    def order(self) -> IntArray:
        """Best first; equal scores keep the order of first appearance."""
        return np.lexsort((self.first, -self.scores)).astype(np.int64)


def check_fusion(k: object, weights: Sequence[float], count: int) -> list[float]:
    """Validated weights as floats; one-line errors naming the bad argument."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise InvalidInputError(f"k must be an integer >= 0, got {k!r}")
    if len(weights) != count:
        raise InvalidInputError(f"weights has {len(weights)} values for {count} lists")
    out = [float(w) for w in weights]
    if any(not math.isfinite(w) or w < 0 for w in out):
        raise InvalidInputError(f"weights must be finite and >= 0, got {out}")
    return out


def is_question(text: str) -> bool:
    """Whether a query reads as a question: it ends with ``?`` or opens with who/what/when/..."""
    return text.rstrip().endswith(("?", "？")) or _QUESTION_WORD.match(text) is not None


def fusion_weights(
    use_vectors: bool,
    use_keywords: bool,
    vector_weight: float,
    keyword_weight: float,
    *,
    query: str | None = None,
    k: int = DEFAULT_RRF_K,
) -> list[float]:
    """Weights of the lists taking part: vector first, then keyword; a lone list weighs 1.

    With ``query``, under the default fusion (``k``, both weights at their defaults) a query
    that is no question weighs its keyword list :data:`STATEMENT_KEYWORD_WEIGHT` (see the
    module docstring); any other setting is used as given.
    """
    if use_vectors and use_keywords:
        if (
            query is not None
            and (k, vector_weight, keyword_weight)
            == (DEFAULT_RRF_K, DEFAULT_VECTOR_WEIGHT, DEFAULT_KEYWORD_WEIGHT)
            and not is_question(query)
        ):
            keyword_weight = STATEMENT_KEYWORD_WEIGHT
        return [vector_weight, keyword_weight]
    return [1.0] if (use_vectors or use_keywords) else []


def best_score(weights: Sequence[float], k: int) -> float:
    """The raw sum of a key ranked first in every list (the normaliser)."""
    return sum(w / (k + 1) for w in weights) or 1.0


def fuse(lists: Sequence[IntArray], weights: Sequence[float], k: int = DEFAULT_RRF_K) -> FusedArrays:
    """Weighted RRF of ranked int64 key arrays (best first). A key repeated inside one list
    counts at its first (best) rank only."""
    weights = check_fusion(k, weights, len(lists))
    best = best_score(weights, k)
    arrays = [np.asarray(keys, dtype=np.int64).reshape(-1) for keys in lists]
    every = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
    parts = []
    for keys, w in zip(arrays, weights, strict=True):
        contribution = w / (k + np.arange(1, len(keys) + 1, dtype=np.float64))
        _, firsts = np.unique(keys, return_index=True)  # (with an index: no numpy.ma import)
        if len(firsts) != len(keys):
            repeated = np.ones(len(keys), dtype=bool)
            repeated[firsts] = False
            contribution[repeated] = 0.0
        parts.append(contribution)
    contributions = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float64)
    keys, first, inverse = np.unique(every, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    scores = np.bincount(inverse, weights=contributions, minlength=len(keys)) / best
    ranks = []
    offset = 0
    for items in arrays:
        rank = np.zeros(len(keys), dtype=np.int64)
        # reversed, so a repeated key keeps its first (best) rank
        slots = inverse[offset : offset + len(items)]
        rank[slots[::-1]] = np.arange(len(items), 0, -1)
        ranks.append(rank)
        offset += len(items)
    return FusedArrays(keys.astype(np.int64), scores, first.astype(np.int64), ranks)


def rrf(
    lists: Sequence[Sequence[K]],
    *,
    k: int = DEFAULT_RRF_K,
    weights: Sequence[float] | None = None,
    limit: int | None = None,
) -> list[Fused[K]]:
    """:func:`fuse` for any hashable keys, best first (the first ``limit``); ties keep the order
    of first appearance. The same sums in the same order as :func:`fuse`, so the same bits, in
    plain Python: a search fuses a few dozen keys, where numpy's calls cost several times the
    arithmetic."""
    weights = check_fusion(k, [1.0] * len(lists) if weights is None else list(weights), len(lists))
    best = best_score(weights, k)
    sums: dict[K, float] = {}  # in order of first appearance
    firsts: list[dict[K, int]] = []  # each list's keys at their first (best) rank
    for keys, w in zip(lists, weights, strict=True):
        first: dict[K, int] = {}
        for rank, key in enumerate(keys, 1):
            if key not in first:  # a key repeated inside one list counts at its first rank only
                first[key] = rank
                sums[key] = sums.get(key, 0.0) + w / (k + rank)
        firsts.append(first)
    order = sorted(sums, key=sums.__getitem__, reverse=True)  # stable: ties keep first appearance
    return [
        Fused(key, min(1.0, sums[key] / best), tuple(first.get(key) for first in firsts))
        for key in order[:limit]
    ]


def match_type(vector_rank: int | None, keyword_rank: int | None) -> str:
    if vector_rank is not None and keyword_rank is not None:
        return "hybrid"
    return "semantic" if vector_rank is not None else "keyword"
