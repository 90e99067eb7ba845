"""Episode vectors in memory, in the storage engine's vector mirror with their filter columns.

Episodic search filters by time range far more often than by anything else, so each episode's
time is an integer range column of the mirror and its task run an equality column: the filter
runs inside the index (a time range over rows added in time order is one run of the matrix,
scanned in place), through the same tuned scan as every other search. The durable copy stays in
the store's ``VectorIndex``; this one is rebuilt from it when another connection changes the
store. Rows are kept as stored (not rescaled), so :meth:`EpisodeVectors.live` gives back the
stored vectors exactly and similarities are the dot products of the stored vectors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from memstrata.storage import Database, Filter, FloatArray, IntArray, Keep
from memstrata.storage._hybrid import settle_unheld
from memstrata.storage._vector_mirror import Mirror, Ranges, ScoredRows

__all__ = ["EpisodeRanking", "EpisodeVectors"]

_RUN = "task_run"
_AT = "at_us"


class EpisodeRanking:
    """Every allowed vector of one query, best first on demand (a deeper prefix ranks again)."""

    def __init__(
        self, vectors: EpisodeVectors, query: FloatArray, where: dict[str, str], ranges: Ranges
    ) -> None:
        self._mirror = vectors.mirror
        self._query = query
        self._where = where
        self._ranges = ranges
        self._scored: ScoredRows | None = None
        self._top: tuple[IntArray, FloatArray, IntArray] | None = None
        self._lookup: tuple[IntArray, IntArray, FloatArray] | None = None  # see ranks_of

    def __len__(self) -> int:
        return len(self._rows())

    def _rows(self) -> ScoredRows:
        """Every allowed row scored once: a deeper prefix is ranked from these scores."""
        if self._scored is None:
            self._scored = self._mirror.scored(self._query, self._where, self._ranges)
        return self._scored

    def keep(self, db: Database, flt: Filter) -> Keep:
        """The same filter as a mask over episode ids (for the keyword side), read from the
        mirror's columns; ids it does not hold (vector pending) are checked by ``flt.sql``."""
        mirror, where, ranges = self._mirror, self._where, self._ranges

        def allows(ids: IntArray) -> npt.NDArray[np.bool_]:
            return settle_unheld(db, flt, ids, mirror.allows(ids, where, ranges), unheld=True)

        spans = tuple(sorted((ranges or {}).items()))
        return Keep(allows, Keep.key_of("episodes", flt.sql, flt.params, tuple(sorted(where.items())), spans))

    def ranks_of(self, ids: IntArray) -> IntArray:
        """1-based ranks of ``ids`` in the ranking read to its end (0: not an allowed row), as
        :meth:`top` places them (ties by episode id), without ranking every row: the rows
        scored better, plus those scored the same with a smaller id."""
        rows = self._rows()
        if self._lookup is None:  # once per search: ids sorted (with their row), scores sorted
            allowed = rows.rowids[rows.positions]
            by_id = np.argsort(allowed, kind="stable")
            self._lookup = (allowed[by_id], by_id, np.sort(rows.scores))
        sorted_ids, row_of, ascending = self._lookup
        out = np.zeros(len(ids), dtype=np.int64)
        if not len(sorted_ids) or not len(ids):
            return out
        at = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
        found = np.flatnonzero(sorted_ids[at] == ids)
        rows_at = row_of[at[found]]
        scores = rows.scores[rows_at]
        above = len(ascending) - np.searchsorted(ascending, scores, side="right")
        tied = np.searchsorted(ascending, scores, side="right") - np.searchsorted(ascending, scores)
        before = np.zeros(len(found), dtype=np.int64)
        allowed = rows.rowids[rows.positions]
        for n in np.flatnonzero(tied > 1).tolist():  # equal scores are rare: count them one by one
            before[n] = np.count_nonzero((rows.scores == scores[n]) & (allowed < ids[found[n]]))
        out[found] = above + before + 1
        return out

    def top(self, k: int) -> tuple[IntArray, FloatArray, IntArray]:
        """The best ``k`` as arrays ``(ids, similarities, at_us)``; ties by episode id."""
        rows = self._rows()
        k = min(max(k, 0), len(rows))
        if self._top is None or len(self._top[0]) < k:
            found = rows.top(k)
            self._top = (found.rowids, found.scores, self._mirror.ints[_AT][found.positions])
        ids, scores, at = self._top
        return ids[:k], scores[:k], at[:k]


class EpisodeVectors:
    """Episode vectors with their times (``at_us``) and task runs; removals are tombstones."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        # no grouping: a task-run column has too many values, and insertion order is kept
        self.mirror = Mirror(dim, [_RUN], group=False, ranges=[_AT], unit=False)

    def __len__(self) -> int:
        return self.mirror.live

    def add(
        self, ids: Sequence[int], vectors: FloatArray, at_us: Sequence[int], runs: Sequence[str | None]
    ) -> None:
        """Add or replace episodes' vectors (a replaced one moves to the end)."""
        if len(ids) == 0:
            return
        rows = np.asarray(vectors, dtype=np.float32).reshape(len(ids), self.dim)
        self.mirror.put_many([int(i) for i in ids], rows, {_RUN: list(runs), _AT: [int(a) for a in at_us]})

    def remove(self, ids: Iterable[int]) -> None:
        self.mirror.remove_many(ids)

    def rank(
        self,
        query: FloatArray,
        *,
        since_us: int | None = None,
        until_us: int | None = None,
        task_run_id: str | None = None,
    ) -> EpisodeRanking:
        """The allowed rows (``since`` inclusive, ``until`` exclusive), ranked against ``query``."""
        self.mirror.maintain(None)  # drops dead rows once they pile up; keeps insertion order
        where = {} if task_run_id is None else {_RUN: task_run_id}
        ranges: Ranges = {} if since_us is None and until_us is None else {_AT: (since_us, until_us)}
        return EpisodeRanking(self, np.asarray(query, dtype=np.float32), where, ranges)

    def live(self) -> tuple[IntArray, FloatArray]:
        """Ids and stored vectors of every row not removed, in insertion order."""
        mirror = self.mirror
        keep = np.flatnonzero(mirror.alive[: mirror.size])
        return mirror.rowids[keep], mirror.matrix[keep]

    def times(self, ids: IntArray) -> tuple[IntArray, npt.NDArray[np.bool_]]:
        """``at_us`` of the episodes ``ids`` the mirror holds (0 for the others), and which it
        holds."""
        positions = self.mirror.positions(ids)
        held = positions >= 0
        at = np.zeros(len(ids), dtype=np.int64)
        at[held] = self.mirror.ints[_AT][positions[held]]
        return at, held

    def stored(self, ids: Sequence[int]) -> dict[int, bytes]:
        """The stored bytes of the vectors of ``ids`` the mirror holds (rows are kept as stored)."""
        asked = np.asarray(ids, dtype=np.int64)
        positions = self.mirror.positions(asked)
        held = positions >= 0
        rows = self.mirror.matrix[positions[held]]
        return {int(i): row.tobytes() for i, row in zip(asked[held].tolist(), rows, strict=True)}

    def similarity(self, ident: int, query: FloatArray) -> float | None:
        position = int(self.mirror.positions(np.array([int(ident)], dtype=np.int64))[0])
        return None if position < 0 else float(self.mirror.matrix[position] @ query)
