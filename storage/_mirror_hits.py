"""What a search of a vector mirror returns: hits (:class:`VectorHit`), a ranking as arrays
(:class:`Ranked`), or every allowed row scored (:class:`ScoredRows`) for a caller that ranks the
same query ever deeper. Plain values of rowids, scores and positions: :mod:`._mirror_search`
builds them, the mirror and the stores above it pass them on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._array_types import FloatArray, IntArray

__all__ = ["Ranked", "ScoredRows", "VectorHit"]


@dataclass(frozen=True, slots=True)
class VectorHit:
    rowid: int
    similarity: float  # cosine similarity, -1..1


@dataclass(frozen=True, slots=True)
class Ranked:
    """A search's hits as arrays, best first: rowids, cosine similarities, mirror positions
    (valid until the mirror next changes; read its other columns there)."""

    rowids: IntArray
    scores: FloatArray
    positions: IntArray

    def hits(self) -> list[VectorHit]:
        return [VectorHit(r, s) for r, s in zip(self.rowids.tolist(), self.scores.tolist(), strict=True)]


@dataclass(frozen=True, slots=True)
class ScoredRows:
    """Every row a filter allows, scored exactly against one query: ranked to any depth by
    :meth:`top` without scanning again (a recency-decayed search deepens its list up to the
    whole ranking, and scanned every row once per round)."""

    rowids: IntArray  # of the mirror, as when scored
    positions: IntArray  # ascending: storage order
    scores: FloatArray  # row by row, the same bits wherever a row is stored (see scored)

    def __len__(self) -> int:
        return len(self.positions)

    def top(self, k: int) -> Ranked:
        """The best ``k``, best first; equal scores by rowid (as :meth:`MirrorSearch.rank`), so
        a mirror holding its rows in another order ranks them the same."""
        if k <= 0 or not len(self.positions):
            empty = np.zeros(0, dtype=np.int64)
            return Ranked(empty, np.zeros(0, dtype=np.float32), empty)
        scores, rowids = self.scores, self.rowids[self.positions]
        k = min(k, len(scores))
        if k < len(scores):  # every row tied with the k-th takes part, then rowids decide
            kth = np.partition(scores, len(scores) - k)[len(scores) - k]
            chosen = np.flatnonzero(scores >= kth)
        else:
            chosen = np.arange(len(scores))
        chosen = chosen[np.lexsort((rowids[chosen], -scores[chosen]))][:k]
        positions = self.positions[chosen]
        return Ranked(self.rowids[positions], scores[chosen], positions)
