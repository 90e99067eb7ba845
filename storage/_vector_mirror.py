"""The in-memory mirror of a vector table: one float32 matrix, metadata codes, inverted lists."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ._ivf import MAX_SAMPLE, SAMPLE_PER_LIST, Partition, assign, list_count, train
from ._vector_kernels import dot, dot_rows, in_two, permute_rows, unit_rows

FloatArray = npt.NDArray[np.float32]
BoolArray = npt.NDArray[np.bool_]
_CANDIDATE_LOOKUP_MAX = 2048  # up to this many candidate ids, look positions up one by one

PROBE_LISTS = 112  # lists' worth of rows a k=10 search scans (measured: recall@10 >= 0.99)
_EXACT_SHARE = 0.5  # a search that would scan more than this share of the rows scans them all
_TAIL_SHARE = 0.15  # rows added since the partition, as a share of it, that trigger a rebuild
_SEED = 20_240_607
_MOVE_BLOCK = 16_384  # rows moved per step when compacting in place


@dataclass(frozen=True, slots=True)
class VectorHit:
    rowid: int
    similarity: float  # cosine similarity, -1..1


def encode_values(vocab: dict[Any, int], values: Sequence[Any]) -> npt.NDArray[np.int32]:
    """Codes of metadata ``values`` in ``vocab`` (extended with new values). Numbers are
    grouped by numpy first, so a million rows cost one sort rather than a million dict calls."""
    if values and all(type(v) is int for v in values[:64]):
        try:
            array = np.asarray(values, dtype=np.int64)
        except (OverflowError, TypeError, ValueError):
            array = None
        if array is not None:
            distinct, inverse = np.unique(array, return_inverse=True)
            table = np.fromiter(
                (vocab.setdefault(v, len(vocab)) for v in distinct.tolist()),
                dtype=np.int32,
                count=len(distinct),
            )
            return table[inverse.reshape(-1)]
    return np.fromiter((vocab.setdefault(v, len(vocab)) for v in values), dtype=np.int32, count=len(values))


class RowIndex:
    """rowid -> position in the mirror, in 16 bytes a row (a dict takes ~100: 100 MB at 1M rows).

    A sorted snapshot of (rowid, position) pairs, plus a dict of the changes made since (-1 for a
    removed row); the snapshot is rebuilt when the changes pile up.
    """

    def __init__(self) -> None:
        self.keys = np.zeros(0, dtype=np.int64)
        self.values = np.zeros(0, dtype=np.int64)
        self.recent: dict[int, int] = {}

    def rebuild(self, rowids: npt.NDArray[np.int64], alive: BoolArray) -> None:
        positions = np.flatnonzero(alive)
        keys = rowids[positions]
        order = np.argsort(keys, kind="stable")
        self.keys, self.values, self.recent = keys[order], positions[order], {}

    def lookup(self, rowids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Positions of ``rowids``, -1 for those not in the mirror."""
        found = np.full(len(rowids), -1, dtype=np.int64)
        if len(self.keys):
            at = np.searchsorted(self.keys, rowids)
            at[at == len(self.keys)] = 0
            hit = self.keys[at] == rowids
            found[hit] = self.values[at[hit]]
        if self.recent:
            recent = self.recent
            for i, rowid in enumerate(rowids.tolist()):
                pos = recent.get(rowid)
                if pos is not None:
                    found[i] = pos
        return found

    @property
    def stale(self) -> bool:
        return len(self.recent) > max(4096, len(self.keys) // 8)


class Mirror:
    """The live vectors (unit length) as one float32 matrix, plus their metadata codes.

    Rows are appended; a replaced or deleted row is marked dead and dropped by :meth:`compact`.
    Under a :class:`Partition` the rows before ``partition.end`` are grouped by inverted list
    (``lists`` holds each row's list) and later rows form the tail.
    """

    def __init__(self, dim: int, columns: Sequence[str]) -> None:
        self.dim = dim
        self.columns = list(columns)
        self.matrix: FloatArray = np.zeros((0, dim), dtype=np.float32)
        self.rowids = np.zeros(0, dtype=np.int64)
        self.alive = np.zeros(0, dtype=bool)
        self.lists = np.zeros(0, dtype=np.int32)
        self.codes: dict[str, npt.NDArray[np.int32]] = {c: np.zeros(0, dtype=np.int32) for c in columns}
        self.vocab: dict[str, dict[Any, int]] = {c: {} for c in columns}
        self.index = RowIndex()
        self.size = 0
        self.dead = 0
        self.partition: Partition | None = None
        self.partitions_built = 0
        self.partitions_restored = 0
        self.partition_seconds = 0.0
        self._scores = np.empty(0, dtype=np.float32)
        self._allowed = np.empty(0, dtype=bool)

    @classmethod
    def bulk(
        cls,
        dim: int,
        columns: Sequence[str],
        rowids: Sequence[int] | npt.NDArray[np.int64],
        storage: FloatArray,
        metas: Mapping[str, Sequence[Any]],
    ) -> Mirror:
        """A mirror of distinct ``rowids`` whose vectors are the first rows of ``storage``; it
        takes ownership of ``storage`` (normalised in place; spare rows are room to grow)."""
        mirror = cls(dim, columns)
        n = len(rowids)
        vectors = storage[:n]
        norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors))  # no full-size temporary
        norms[norms == 0] = 1.0
        vectors /= norms[:, None]
        capacity = len(storage)
        mirror.matrix = storage
        mirror.rowids = np.zeros(capacity, dtype=np.int64)
        mirror.rowids[:n] = rowids
        mirror.alive = np.zeros(capacity, dtype=bool)
        mirror.alive[:n] = True
        mirror.lists = np.full(capacity, -1, dtype=np.int32)
        for c in mirror.columns:
            mirror.codes[c] = np.zeros(capacity, dtype=np.int32)
            mirror.codes[c][:n] = encode_values(mirror.vocab[c], metas[c])
        mirror.index.rebuild(mirror.rowids[:n], mirror.alive[:n])
        mirror.size = n
        return mirror

    @property
    def live(self) -> int:
        return self.size - self.dead

    def _grow(self, need: int) -> None:
        capacity = len(self.rowids)
        if need <= capacity:
            return
        new_capacity = max(need, capacity * 2, 1024)
        matrix = np.zeros((new_capacity, self.dim), dtype=np.float32)
        matrix[: self.size] = self.matrix[: self.size]
        self.matrix = matrix
        self.rowids = np.resize(self.rowids, new_capacity)
        alive = np.zeros(new_capacity, dtype=bool)
        alive[: self.size] = self.alive[: self.size]
        self.alive = alive
        lists = np.full(new_capacity, -1, dtype=np.int32)
        lists[: self.size] = self.lists[: self.size]
        self.lists = lists
        for c in self.columns:
            self.codes[c] = np.resize(self.codes[c], new_capacity)

    def put_many(
        self, rowids: Sequence[int], vectors: FloatArray, metas: Mapping[str, Sequence[Any]]
    ) -> None:
        """Add or replace; ``rowids`` must be distinct. New rows join the tail."""
        self.remove_many(rowids)
        start = self.size
        end = start + len(rowids)
        self._grow(end)
        self.matrix[start:end] = unit_rows(vectors)
        self.rowids[start:end] = rowids
        self.alive[start:end] = True
        self.lists[start:end] = -1
        for c in self.columns:
            vocab = self.vocab[c]
            self.codes[c][start:end] = [vocab.setdefault(v, len(vocab)) for v in metas[c]]
        recent = self.index.recent
        for offset, rowid in enumerate(rowids):
            recent[int(rowid)] = start + offset
        self.size = end
        if self.index.stale:
            self.index.rebuild(self.rowids[:end], self.alive[:end])

    def remove_many(self, rowids: Iterable[int]) -> None:
        ids = np.fromiter((int(r) for r in rowids), dtype=np.int64)
        if not len(ids):
            return
        positions = self.index.lookup(ids)
        present = positions >= 0
        if not present.any():
            return
        self.alive[positions[present]] = False
        self.dead += int(np.count_nonzero(present))
        recent = self.index.recent
        for rowid in ids[present].tolist():
            recent[rowid] = -1

    # -- upkeep --------------------------------------------------------------------------------

    def maintain(self, approximate_from: int | None) -> None:
        """Drop dead rows when they pile up; build, extend or drop the partition as size asks."""
        if self.dead > max(1024, self.size // 4):
            self.compact()
        if approximate_from is None:
            self.partition = None
            return
        live = self.live
        part = self.partition
        if part is None:
            if live >= approximate_from:
                self.repartition(retrain=True)
            return
        if live < approximate_from // 2:
            self.partition = None
        elif self.size - part.end > _TAIL_SHARE * max(part.end, 1):
            # the tail is folded into the lists; the centroids are retrained when the data
            # has grown or shrunk by half since they were made
            self.repartition(retrain=not part.trained_rows / 2 <= live <= part.trained_rows * 2)

    def compact(self) -> None:
        """Drop dead rows in place (rows only move towards the front, so no second matrix)."""
        keep = np.flatnonzero(self.alive[: self.size])
        kept = len(keep)
        for a in range(0, kept, _MOVE_BLOCK):
            picks = keep[a : a + _MOVE_BLOCK]
            if picks[0] != a or picks[-1] != a + len(picks) - 1:  # else already in place
                self.matrix[a : a + len(picks)] = self.matrix[picks]
        self.rowids[:kept] = self.rowids[keep]
        self.lists[:kept] = self.lists[keep]
        for c in self.columns:
            self.codes[c][:kept] = self.codes[c][keep]
        self.alive[:kept] = True
        self.alive[kept : self.size] = False
        part = self.partition
        if part is not None:
            end = int(np.searchsorted(keep, part.end))
            part.starts = np.searchsorted(self.lists[:end], np.arange(part.lists + 1)).astype(np.int64)
        self.size, self.dead = kept, 0
        self.index.rebuild(self.rowids[:kept], self.alive[:kept])

    def repartition(self, *, retrain: bool) -> None:
        """Group the live rows by inverted list: train new centroids, or fold the tail into the
        existing lists. Rows move in place (no second matrix: a 1M x 384 mirror is 1.5 GB)."""
        started = time.perf_counter()
        if self.dead:
            self.compact()
        size = self.size
        part = self.partition
        if retrain or part is None:
            lists = list_count(size)
            rng = np.random.default_rng(_SEED)
            n_sample = min(size, lists * SAMPLE_PER_LIST, MAX_SAMPLE)
            sample = np.take(self.matrix, np.sort(rng.choice(size, n_sample, replace=False)), axis=0)
            centroids = train(sample, lists, seed=_SEED)
            del sample
            labels = assign(self.matrix[:size], centroids)
            trained_rows = size
        else:
            centroids, trained_rows = part.centroids, part.trained_rows
            labels = self.lists[:size].copy()
            labels[part.end : size] = assign(self.matrix[part.end : size], centroids)
        order = np.argsort(labels, kind="stable")
        permute_rows(self.matrix, order)
        self.rowids[:size] = self.rowids[order]
        for c in self.columns:
            self.codes[c][:size] = self.codes[c][order]
        sorted_labels = labels[order]
        self.lists[:size] = sorted_labels
        self.index.rebuild(self.rowids[:size], self.alive[:size])
        starts = np.searchsorted(sorted_labels, np.arange(len(centroids) + 1)).astype(np.int64)
        self.partition = Partition(centroids, starts, trained_rows)
        self.partitions_built += 1
        self.partition_seconds = time.perf_counter() - started

    # -- search --------------------------------------------------------------------------------

    def search(
        self,
        query: FloatArray,
        k: int,
        where: Mapping[str, Any],
        candidates: npt.NDArray[np.int64] | None,
        *,
        exact: bool = False,
    ) -> list[VectorHit]:
        if self.size == 0 or k <= 0:
            return []
        query = unit_rows(query.reshape(1, -1))[0]
        if candidates is not None:
            return self._search_candidates(query, k, where, candidates)
        size = self.size
        valid: BoolArray | None = None
        for column, value in where.items():
            code = self.vocab[column].get(value)
            if code is None:
                return []
            match = self.codes[column][:size] == code
            valid = match if valid is None else np.logical_and(valid, match, out=valid)
        if self.dead:
            valid = (
                self.alive[:size].copy()
                if valid is None
                else np.logical_and(valid, self.alive[:size], out=valid)
            )
        allowed = size if valid is None else int(np.count_nonzero(valid))
        if allowed == 0:
            return []
        k = min(k, allowed)
        part = self.partition
        if part is not None and not exact:
            # about PROBE_LISTS lists (lists hold ~sqrt(n) rows: ~11% of 1M rows, ~22% of 100k-200k);
            # more for a larger k, and 1/f times more for a filter passing a share f of the rows:
            # scaling less loses recall on filters that follow topics (measured at 1M, f = 10%:
            # recall@10 0.92 with sqrt(1/f)), so a filter under ~20% scans its rows exactly
            rows = PROBE_LISTS * part.end / part.lists * max(1.0, (k / 10) ** 0.25) * (size / allowed)
            if rows < _EXACT_SHARE * size:
                hits = self._search_lists(part, query, k, valid, rows)
                if hits is not None:
                    return hits
        if valid is None:
            return self._top(dot(self.matrix[:size], query), k, None)
        positions = np.flatnonzero(valid)
        if allowed * 2 < size:  # selective: score only the allowed rows
            return self._top(dot_rows(self.matrix, positions, query), k, positions)
        return self._top(dot(self.matrix[:size], query)[positions], k, positions)

    def _search_candidates(
        self, query: FloatArray, k: int, where: Mapping[str, Any], candidates: npt.NDArray[np.int64]
    ) -> list[VectorHit]:
        size = self.size
        positions: npt.NDArray[np.int64] | None
        if len(candidates) <= _CANDIDATE_LOOKUP_MAX:
            positions = self.index.lookup(np.unique(candidates))
            positions = positions[positions >= 0]
            mask = np.ones(len(positions), dtype=bool)
            for column, value in where.items():
                code = self.vocab[column].get(value)
                if code is None:
                    return []
                mask &= self.codes[column][positions] == code
            positions = positions[mask]
        else:
            valid = self.alive[:size] & np.isin(self.rowids[:size], candidates)
            for column, value in where.items():
                code = self.vocab[column].get(value)
                if code is None:
                    return []
                valid &= self.codes[column][:size] == code
            positions = np.flatnonzero(valid)
        if len(positions) == 0:
            return []
        if len(positions) * 2 < size:
            scores = dot_rows(self.matrix, positions, query)
        else:
            scores = dot(self.matrix[:size], query)[positions]
        return self._top(scores, min(k, len(positions)), positions)

    def _top(self, scores: FloatArray, k: int, positions: npt.NDArray[np.int64] | None) -> list[VectorHit]:
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
        top = top[np.argsort(-scores[top], kind="stable")]
        chosen = top if positions is None else positions[top]
        rowids = self.rowids
        return [VectorHit(int(rowids[p]), float(scores[i])) for i, p in zip(top, chosen, strict=True)]

    def _search_lists(
        self, part: Partition, query: FloatArray, k: int, valid: BoolArray | None, rows: float
    ) -> list[VectorHit] | None:
        """Top ``k`` among the rows of the lists nearest ``query`` and the tail, scored exactly;
        ``None`` when those rows hold fewer than ``k`` allowed ones (the caller scans all)."""
        starts, ends = part.spans(query, rows)
        if self.size > part.end:
            if ends and ends[-1] == part.end:
                ends[-1] = self.size
            else:
                starts.append(part.end)
                ends.append(self.size)
        total = sum(ends) - sum(starts)
        if total < k:
            return None
        if len(self._scores) < total:
            self._scores = np.empty(max(total, 2 * len(self._scores)), dtype=np.float32)
        if valid is not None and len(self._allowed) < total:
            self._allowed = np.empty(max(total, 2 * len(self._allowed)), dtype=bool)
        scores, allowed, matrix = self._scores, self._allowed, self.matrix
        lengths = np.subtract(ends, starts)
        offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).tolist()
        at = int(lengths.sum())

        def scan(first: int, last: int) -> None:
            for a, b, o in zip(starts[first:last], ends[first:last], offsets[first:last], strict=True):
                np.einsum("ij,j->i", matrix[a:b], query, out=scores[o : o + b - a])

        in_two(scan, len(starts), offsets, at)
        if valid is not None:
            for a, b, o in zip(starts, ends, offsets, strict=True):
                allowed[o : o + b - a] = valid[a:b]
        scored = scores[:at]
        if valid is not None:
            ok = allowed[:at]
            if int(np.count_nonzero(ok)) < k:
                return None
            scored[~ok] = -np.inf
        top = np.argpartition(-scored, k - 1)[:k] if k < at else np.arange(at)
        top = top[np.argsort(-scored[top], kind="stable")]
        first = np.asarray(offsets, dtype=np.int64)
        span = np.searchsorted(first, top, side="right") - 1
        positions = np.asarray(starts, dtype=np.int64)[span] + (top - first[span])
        rowids = self.rowids
        return [VectorHit(int(rowids[p]), float(scored[i])) for i, p in zip(top, positions, strict=True)]

    def adopt(
        self,
        centroids: FloatArray,
        ordered: npt.NDArray[np.int64],
        sizes: npt.NDArray[np.int64],
        trained_rows: int,
        changed: npt.NDArray[np.int64],
    ) -> None:
        """Take a partition made earlier (by this or another process) instead of building one:
        rows in ``ordered`` (grouped by list, ``sizes`` rows each) keep their list unless they
        ``changed`` since; every other row joins the tail. Costs one in-place regrouping."""
        started = time.perf_counter()
        if self.dead:
            self.compact()
        size, lists = self.size, len(centroids)
        list_of = np.repeat(np.arange(lists, dtype=np.int64), sizes)
        by_rowid = np.argsort(ordered, kind="stable")
        keys, values = ordered[by_rowid], list_of[by_rowid]
        rowids = self.rowids[:size]
        at = np.searchsorted(keys, rowids)
        at[at == len(keys)] = 0
        labels = np.where(keys[at] == rowids, values[at], lists) if len(keys) else np.full(size, lists)
        if len(changed):
            labels[np.isin(rowids, changed)] = lists  # a changed vector may belong elsewhere now
        order = np.argsort(labels, kind="stable")
        permute_rows(self.matrix, order)
        self.rowids[:size] = rowids[order]
        for c in self.columns:
            self.codes[c][:size] = self.codes[c][order]
        sorted_labels = labels[order]
        self.lists[:size] = np.where(sorted_labels < lists, sorted_labels, -1)
        self.index.rebuild(self.rowids[:size], self.alive[:size])
        starts = np.searchsorted(sorted_labels, np.arange(lists + 1)).astype(np.int64)
        self.partition = Partition(centroids, starts, trained_rows)
        self.partitions_restored += 1
        self.partition_seconds = time.perf_counter() - started

    def describe(self) -> dict[str, Any] | None:
        part = self.partition
        if part is None:
            return None
        return {
            "lists": part.lists,
            "probe_lists": PROBE_LISTS,
            "partitioned_rows": part.end,
            "tail_rows": self.size - part.end,
            "trained_rows": part.trained_rows,
            "builds": self.partitions_built,
            "restored": self.partitions_restored,
            "last_build_seconds": round(self.partition_seconds, 3),
        }
