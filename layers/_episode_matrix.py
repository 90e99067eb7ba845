"""An in-memory matrix of episode vectors with their times and task runs, searched exactly.

Episodic search filters by time range far more often than by anything else. Handing a vector
index tens of thousands of candidate ids costs more than the scan itself, so this matrix keeps
each vector's time and task run beside it and filters with boolean masks: one matrix-vector
product, one mask, one partial sort. The durable copy stays in the store's ``VectorIndex``;
this mirror is rebuilt from it whenever another connection changes the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["Ranking", "TimedMatrix"]

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]


class Ranking:
    """Every allowed vector of one query, best first on demand (prefixes grow cheaply)."""

    def __init__(self, ids: IntArray, scores: FloatArray, at_us: IntArray) -> None:
        self._ids = ids
        self._scores = scores
        self._at = at_us
        self._order: IntArray | None = None
        self._sorted = 0

    def __len__(self) -> int:
        return len(self._ids)

    def top(self, k: int) -> tuple[IntArray, FloatArray, IntArray]:
        """The best ``k`` as arrays ``(ids, cosine similarities, at_us)``; ties keep insertion order."""
        n = len(self._ids)
        k = min(max(k, 0), n)
        if k > self._sorted:
            if k < n:
                part = np.argpartition(-self._scores, k - 1)[:k]
                order = part[np.lexsort((part, -self._scores[part]))]
            else:
                order = np.argsort(-self._scores, kind="stable")
            self._order = order.astype(np.int64)
            self._sorted = k
        order = self._order[:k] if self._order is not None else np.zeros(0, dtype=np.int64)
        return self._ids[order], self._scores[order], self._at[order]


class TimedMatrix:
    """Growable float32 rows with ``at_us`` and task-run codes; removals are tombstones."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.matrix: FloatArray = np.zeros((0, dim), dtype=np.float32)
        self.ids: IntArray = np.zeros(0, dtype=np.int64)
        self.at: IntArray = np.zeros(0, dtype=np.int64)
        self.runs = np.zeros(0, dtype=np.int32)
        self.alive = np.zeros(0, dtype=bool)
        self.position: dict[int, int] = {}
        self.run_codes: dict[str, int] = {}
        self.size = 0
        self.dead = 0

    def __len__(self) -> int:
        return self.size - self.dead

    def _grow(self, need: int) -> None:
        capacity = len(self.ids)
        if need <= capacity:
            return
        new = max(need, capacity * 2, 1024)
        matrix = np.zeros((new, self.dim), dtype=np.float32)
        matrix[: self.size] = self.matrix[: self.size]
        self.matrix = matrix
        self.ids = np.resize(self.ids, new)
        self.at = np.resize(self.at, new)
        self.runs = np.resize(self.runs, new)
        alive = np.zeros(new, dtype=bool)
        alive[: self.size] = self.alive[: self.size]
        self.alive = alive

    def _code(self, run: str | None) -> int:
        if run is None:
            return -1
        code = self.run_codes.get(run)
        if code is None:
            code = self.run_codes[run] = len(self.run_codes)
        return code

    def add(
        self,
        ids: Sequence[int],
        vectors: FloatArray,
        at_us: Sequence[int],
        runs: Sequence[str | None],
    ) -> None:
        self.remove(ids)
        n = len(ids)
        start, end = self.size, self.size + n
        self._grow(end)
        self.matrix[start:end] = vectors
        self.ids[start:end] = ids
        self.at[start:end] = at_us
        self.runs[start:end] = [self._code(r) for r in runs]
        self.alive[start:end] = True
        for offset, ident in enumerate(ids):
            self.position[int(ident)] = start + offset
        self.size = end

    def remove(self, ids: Iterable[int]) -> None:
        for ident in ids:
            pos = self.position.pop(int(ident), None)
            if pos is not None:
                self.alive[pos] = False
                self.dead += 1

    def _compact(self) -> None:
        if self.dead <= max(1024, self.size // 4):
            return
        keep = np.flatnonzero(self.alive[: self.size])
        self.matrix = self.matrix[keep].copy()
        self.ids = self.ids[keep].copy()
        self.at = self.at[keep].copy()
        self.runs = self.runs[keep].copy()
        self.alive = np.ones(len(keep), dtype=bool)
        self.position = {int(r): i for i, r in enumerate(self.ids)}
        self.size = len(keep)
        self.dead = 0

    def rank(
        self,
        query: FloatArray,
        *,
        since_us: int | None = None,
        until_us: int | None = None,
        task_run_id: str | None = None,
    ) -> Ranking:
        """The allowed rows (``since`` inclusive, ``until`` exclusive) scored against ``query``."""
        self._compact()
        n = self.size
        mask = self.alive[:n].copy() if self.dead else None
        if since_us is not None:
            part = self.at[:n] >= since_us
            mask = part if mask is None else mask & part
        if until_us is not None:
            part = self.at[:n] < until_us
            mask = part if mask is None else mask & part
        if task_run_id is not None:
            code = self.run_codes.get(task_run_id)
            part = self.runs[:n] == code if code is not None else np.zeros(n, dtype=bool)
            mask = part if mask is None else mask & part
        if mask is None:
            positions = None
            scores = self.matrix[:n] @ query
        else:
            positions = np.flatnonzero(mask)
            if len(positions) * 3 < n:  # few rows allowed: score only those
                scores = self.matrix[positions] @ query
            else:
                scores = (self.matrix[:n] @ query)[positions]
        ids = self.ids[:n] if positions is None else self.ids[positions]
        at = self.at[:n] if positions is None else self.at[positions]
        return Ranking(ids, scores.astype(np.float32, copy=False), at)

    def live(self) -> tuple[IntArray, FloatArray]:
        """Ids and vectors of every row not removed, in insertion order."""
        keep = np.flatnonzero(self.alive[: self.size])
        return self.ids[keep], self.matrix[keep]

    def similarity(self, ident: int, query: FloatArray) -> float | None:
        pos = self.position.get(int(ident))
        return None if pos is None else float(self.matrix[pos] @ query)
