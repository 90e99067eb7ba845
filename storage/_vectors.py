"""Vectors: durable in sqlite-vec ``vec0`` (cosine), searched from an in-memory mirror.

The durable store is a ``vec0`` table whose filter columns are vec0 metadata columns, so a
filtered KNN inside SQLite is exact. Where sqlite-vec cannot be loaded when a store is created,
the vectors live in a plain table of float32 blobs instead; the backend is recorded in the
database's metadata and reported by :meth:`VectorIndex.status`.

Searches run by default on an in-memory mirror of the vectors (a float32 matrix loaded lazily):
an exact numpy scan that is several times faster than vec0's own scan. ``engine="vec0"`` asks
SQLite. Both engines rank by cosine similarity and agree on ids for the same data, ``k`` and
filters.

Keeping the mirror current: every write through :class:`VectorIndex` also appends the changed
rowids to a change log (``{name}_vec_log``) in the same transaction. A mirror remembers the last
log entry it reflects; when another connection commits (``PRAGMA data_version`` moves) it reads
only the newer entries and re-reads those rows, so a refresh costs what changed, not the table.
It reloads everything only when the log cannot explain the gap (pruned past it, a ``reset``).

At scale (``approximate_from`` live vectors, 100k by default) unfiltered and ``where``-filtered
searches scan only the inverted lists nearest the query (:mod:`._ivf`) and rank what they scan by
exact similarity: measured recall@10 >= 0.99, see ``benchmarks/bench_vectors.py``. Searches with
``candidates``, ``exact=True`` and smaller mirrors stay exact. The lists are stored once built
(``{name}_vec_lists``) so that the next process adopts them instead of building them again.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import numbers
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from memstrata.errors import InvalidInputError, StorageError

from ._connection import Database
from ._heap import trim_heap
from ._ivf import MAX_SAMPLE, SAMPLE_PER_LIST, Partition, assign, list_count, train
from ._migrations import ensure_metadata, get_meta, set_meta
from ._vec0_chunks import read_rows, snapshot, spare_rows

__all__ = ["APPROXIMATE_FROM", "VectorHit", "VectorIndex"]

Engine = Literal["auto", "memory", "vec0"]
ENGINES = ("auto", "memory", "vec0")
FloatArray = npt.NDArray[np.float32]
BoolArray = npt.NDArray[np.bool_]
VEC0_MAX_K = 4096  # sqlite-vec refuses larger k in one KNN query
_CANDIDATE_LOOKUP_MAX = 2048  # up to this many candidate ids, look positions up one by one
METADATA_TYPES = ("text", "integer", "float", "boolean")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

APPROXIMATE_FROM = 100_000  # live vectors from which searches use the inverted lists
PROBE_LISTS = 112  # lists' worth of rows a k=10 search scans (measured: recall@10 >= 0.99)
_EXACT_SHARE = 0.5  # a search that would scan more than this share of the rows scans them all
_TAIL_SHARE = 0.15  # rows added since the partition, as a share of it, that trigger a rebuild
_SEED = 20_240_607
_MOVE_BLOCK = 16_384  # rows moved per step when compacting in place
_ROOM = 0.25  # spare rows allocated with a loaded mirror, as a share of its rows

_PLAIN: dict[str, type] = {"text": str, "integer": int, "float": float}
_OP_UPSERT, _OP_DELETE, _OP_RESET = 1, 2, 3
LOG_KEEP = 100_000  # change-log entries kept; a mirror further behind reloads fully
_LOG_SLACK = 10_000  # prune only when this many entries beyond LOG_KEEP have piled up
_BULK_DELETE = 64  # from this many vec0 deletes, sort them by chunk and raise the page cache
_BULK_CACHE_KIB = 65_536


@dataclass(frozen=True, slots=True)
class VectorHit:
    rowid: int
    similarity: float  # cosine similarity, -1..1


class _Scanner:
    """Row-wise dot products of a large matrix, by whichever way is faster here and now.

    numpy's ``einsum`` scans on the calling thread: memory-bound and predictable. BLAS
    (``matrix @ query``) splits the scan over its threads, which wins on an idle machine (measured
    at 100k x 384: 5 ms against 7) and loses badly on a busy one, where handing work to its
    threads costs more than the scan (measured: 16 ms instead of 0.1 ms for 2k x 384 on 2 loaded
    cores; 28 ms against 17 at 200k). So each way's cost per row is tracked (a moving average);
    scans use the cheaper one and try the other once every ``_EXPLORE`` scans. Small scans always
    stay on the calling thread.
    """

    _EXPLORE = 128
    _MIN_ROWS = 16_384

    def __init__(self) -> None:
        self.cost = {"einsum": 0.0, "blas": 0.0}  # seconds per row; 0 = not measured yet
        self.scans = 0

    def dot(self, matrix: FloatArray, query: FloatArray) -> FloatArray:
        rows = len(matrix)
        if rows < self._MIN_ROWS:
            return self._einsum(matrix, query)
        self.scans += 1
        einsum, blas = self.cost["einsum"], self.cost["blas"]
        if not einsum or not blas:
            way = "blas" if einsum else "einsum"
        else:
            way = "einsum" if einsum <= blas else "blas"
            if self.scans % self._EXPLORE == 0:
                way = "blas" if way == "einsum" else "einsum"
        started = time.perf_counter()
        scores = self._einsum(matrix, query) if way == "einsum" else self._blas(matrix, query)
        per_row = (time.perf_counter() - started) / rows
        known = self.cost[way]
        self.cost[way] = per_row if not known else 0.8 * known + 0.2 * per_row
        return scores

    @staticmethod
    def _einsum(matrix: FloatArray, query: FloatArray) -> FloatArray:
        scores: FloatArray = np.einsum("ij,j->i", matrix, query)
        return scores

    @staticmethod
    def _blas(matrix: FloatArray, query: FloatArray) -> FloatArray:
        scores: FloatArray = matrix @ query
        return scores


_SCANNER = _Scanner()  # per process: every mirror meets the same machine


def _dot(matrix: FloatArray, query: FloatArray) -> FloatArray:
    return _SCANNER.dot(matrix, query)


_HELPER: list[ThreadPoolExecutor] = []
_HELPER_LOCK = threading.Lock()
_CPUS = os.cpu_count() or 1  # read once: each call reads a file (~70 us)


def _in_two(scan: Callable[[int, int], None], count: int, offsets: list[int], rows: int) -> None:
    """``scan(0, count)`` over ``count`` slices starting at ``offsets`` (``rows`` in all), split
    in two halves by rows, one of them on a helper thread when there is a second CPU and enough
    rows: numpy releases the GIL while it scans, so two cores take ~70% of the time of one (a
    k=50 search at 100k x 384: 3.4 -> 2.5 ms; memory bandwidth is shared), and no BLAS threads
    are left spinning afterwards."""
    if rows < _Scanner._MIN_ROWS or count < 2 or _CPUS < 2:
        scan(0, count)
        return
    middle = min(max(1, bisect.bisect_left(offsets, rows // 2)), count - 1)
    with _HELPER_LOCK:
        if not _HELPER:
            _HELPER.append(ThreadPoolExecutor(1, thread_name_prefix="memstrata-scan"))
        helper = _HELPER[0]
    other = helper.submit(scan, middle, count)
    scan(0, middle)
    other.result()


_GATHER_ROWS = 256  # rows copied at a time when scoring scattered rows (~400 KB: stays in cache)


def _dot_rows(matrix: FloatArray, positions: npt.NDArray[np.int64], query: FloatArray) -> FloatArray:
    """``matrix[positions] @ query`` a block of rows at a time, on two cores when there are many:
    gathering every row first writes (and page-faults) a copy as large as the rows themselves,
    measured 3x slower than the scan of the block just gathered."""
    if len(positions) <= _GATHER_ROWS:  # a few rows: one small copy
        few: FloatArray = np.einsum("ij,j->i", matrix[positions], query)
        return few
    scores = np.empty(len(positions), dtype=np.float32)
    offsets = list(range(0, len(positions), _GATHER_ROWS))

    def scan(first: int, last: int) -> None:
        block = np.empty((_GATHER_ROWS, matrix.shape[1]), dtype=matrix.dtype)
        for start in offsets[first:last]:
            chunk = positions[start : start + _GATHER_ROWS]
            rows = block[: len(chunk)]
            np.take(matrix, chunk, axis=0, out=rows)
            np.einsum("ij,j->i", rows, query, out=scores[start : start + len(chunk)])

    _in_two(scan, len(offsets), offsets, len(positions))
    return scores


def _encode(vocab: dict[Any, int], values: Sequence[Any]) -> npt.NDArray[np.int32]:
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


def _unit_rows(array: FloatArray) -> FloatArray:
    norms = np.linalg.norm(array, axis=-1, keepdims=True)
    norms[norms == 0] = 1.0
    unit: FloatArray = (array / norms).astype(np.float32, copy=False)
    return unit


def _permute_rows(matrix: FloatArray, order: npt.NDArray[np.intp]) -> None:
    """``matrix[:len(order)] = matrix[order]`` in place, for a permutation ``order``.

    Block by block, the rows wanted in the block are gathered and the rows they displace move to
    the places just vacated; two bookkeeping arrays track where every row is. Temporary memory is
    two blocks, not a second matrix (and no fresh pages to fault in, which is slow on some hosts).
    """
    n = len(order)
    where = np.arange(n)  # where[r]: current position of the row that was at r
    holds = np.arange(n)  # holds[p]: which original row is now at p
    for a in range(0, n, _MOVE_BLOCK):
        b = min(n, a + _MOVE_BLOCK)
        wanted = order[a:b]
        sources = where[wanted]  # all >= a: rows before a are final
        inside = sources < b
        taken = np.zeros(b - a, dtype=bool)
        taken[sources[inside] - a] = True
        displaced = np.flatnonzero(~taken) + a  # block positions holding rows wanted later
        vacated = sources[~inside]  # positions after the block that the gather empties
        gathered = np.take(matrix, sources, axis=0)
        moved = np.take(matrix, displaced, axis=0)
        matrix[a:b] = gathered
        matrix[vacated] = moved
        moved_rows = holds[displaced]
        holds[vacated] = moved_rows
        where[moved_rows] = vacated
        holds[a:b] = wanted
        where[wanted] = np.arange(a, b)


class _RowIndex:
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


class _Mirror:
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
        self.index = _RowIndex()
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
    ) -> _Mirror:
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
            mirror.codes[c][:n] = _encode(mirror.vocab[c], metas[c])
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
        self.matrix[start:end] = _unit_rows(vectors)
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
        _permute_rows(self.matrix, order)
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
        query = _unit_rows(query.reshape(1, -1))[0]
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
            return self._top(_dot(self.matrix[:size], query), k, None)
        positions = np.flatnonzero(valid)
        if allowed * 2 < size:  # selective: score only the allowed rows
            return self._top(_dot_rows(self.matrix, positions, query), k, positions)
        return self._top(_dot(self.matrix[:size], query)[positions], k, positions)

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
            scores = _dot_rows(self.matrix, positions, query)
        else:
            scores = _dot(self.matrix[:size], query)[positions]
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

        _in_two(scan, len(starts), offsets, at)
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
        _permute_rows(self.matrix, order)
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


# -- rollbacks shared by the indexes of one connection ---------------------------------------------


@dataclass
class _Rollbacks:
    """Writes undone by rollbacks on one connection, per table: ``(log floor, rowids)``; ``None``
    rowids means "reload everything". Mirrors on that connection consume them in order."""

    records: list[tuple[int, frozenset[int] | None]] = field(default_factory=list)
    dropped: int = 0

    @property
    def total(self) -> int:
        return self.dropped + len(self.records)

    def add(self, floor: int, rowids: frozenset[int] | None) -> None:
        self.records.append((floor, rowids))
        if len(self.records) > 256:  # a mirror this far behind reloads
            self.records = self.records[128:]
            self.dropped += 128


_ROLLBACKS: weakref.WeakKeyDictionary[Database, dict[str, _Rollbacks]] = weakref.WeakKeyDictionary()
_ROLLBACKS_LOCK = threading.Lock()


def _rollbacks(db: Database, table: str) -> _Rollbacks:
    with _ROLLBACKS_LOCK:
        return _ROLLBACKS.setdefault(db, {}).setdefault(table, _Rollbacks())


def _int_or(value: Any, default: int = -1) -> int:
    return value if isinstance(value, int) else default


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral) or int(value) <= 0:
        raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _base_type(declared: str) -> str:
    return declared.strip().split()[0].lower() if declared.strip() else ""


class VectorIndex:
    """Vectors of one table of a store, with equality-filterable metadata columns.

    ``metadata`` maps column names to vec0 types (``text``, ``integer``, ``float``,
    ``boolean``; ``"text partition key"`` is passed through to vec0). Every vector must carry a
    value of the declared type for each column (vec0 stores no NULL metadata).

    Writes join the caller's transaction (call them inside ``db.transaction()``); if that
    transaction rolls back, the mirror re-reads the rows it touched.

    ``approximate_from``: from this many live vectors, searches without ``candidates`` use the
    inverted lists (``None``: always exact).
    """

    def __init__(
        self,
        db: Database,
        name: str,
        dim: int,
        *,
        metadata: Mapping[str, str] | None = None,
        mirror: bool = True,
        approximate_from: int | None = APPROXIMATE_FROM,
    ) -> None:
        dim = _positive_int(dim, "dim")
        if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
            raise InvalidInputError(f"name must be an SQL identifier ([A-Za-z_][A-Za-z0-9_]*), got {name!r}")
        if approximate_from is not None:
            approximate_from = _positive_int(approximate_from, "approximate_from")
        self.metadata = dict(metadata or {})
        for column, declared in self.metadata.items():
            if not _IDENTIFIER.fullmatch(column) or column.lower() in ("rowid", "embedding", "distance", "k"):
                raise InvalidInputError(f"metadata column name {column!r} is not allowed")
            if _base_type(declared) not in METADATA_TYPES:
                raise InvalidInputError(
                    f"metadata column {column!r} has type {declared!r}; "
                    f"use one of {', '.join(METADATA_TYPES)}"
                )
        self.db = db
        self.name = name
        self.dim = dim
        self.use_mirror = mirror
        self.approximate_from = approximate_from
        self._types = {c: _base_type(t) for c, t in self.metadata.items()}
        self._mirror: _Mirror | None = None
        self._data_version = -1
        self._seen_generation = -1
        self._rollbacks_seen = 0
        self._log_seq = 0
        self.reloads = 0  # full loads of the mirror
        self.refreshes = 0  # incremental catch-ups from the change log
        self.last_reload_seconds = 0.0
        self._has_log = False
        self.backend = self._ensure_schema()

    # -- schema --------------------------------------------------------------------------------

    @property
    def table(self) -> str:
        return f"{self.name}_vec"

    @property
    def log_table(self) -> str:
        return f"{self.name}_vec_log"

    @property
    def partition_table(self) -> str:
        return f"{self.name}_vec_lists"

    @property
    def _pending_table(self) -> str:
        return f"{self.name}_vec_pending_delete"

    def _table_exists(self, name: str) -> bool:
        return (
            self.db.scalar("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
            is not None
        )

    def _ensure_schema(self) -> str:
        key = f"vector_backend:{self.name}"
        backend = get_meta(self.db, key)
        stored_dim = get_meta(self.db, f"vector_dim:{self.name}")
        if backend is not None and stored_dim is not None and int(stored_dim) != self.dim:
            raise StorageError(
                f"vector table {self.table} holds {stored_dim}-dimensional vectors, not {self.dim}; "
                "rebuild it with VectorIndex.reset()"
            )
        has_log = self._table_exists(self.log_table) and self._table_exists(self.partition_table)
        if backend is None or (not has_log and not self.db.read_only):
            with self.db.transaction():
                if backend is None:
                    backend = "vec0" if self.db.native_vectors else "blob"
                    ensure_metadata(self.db)
                    self._create(backend)
                    set_meta(self.db, key, backend)
                    set_meta(self.db, f"vector_dim:{self.name}", self.dim)
                self.db.execute(
                    f"CREATE TABLE IF NOT EXISTS {self.log_table} "
                    "(seq INTEGER PRIMARY KEY AUTOINCREMENT, item INTEGER NOT NULL, op INTEGER NOT NULL)"
                )
                # the inverted lists last built, so that the next process need not build them
                self.db.execute(
                    f"CREATE TABLE IF NOT EXISTS {self.partition_table} "
                    "(id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL, dim INTEGER NOT NULL, "
                    "trained_rows INTEGER NOT NULL, centroids BLOB NOT NULL, rowids BLOB NOT NULL, "
                    "sizes BLOB NOT NULL)"
                )
            has_log = True
        self._has_log = has_log
        self.backend = backend
        if self.available:
            self._apply_pending_deletes()
        return backend

    def _create(self, backend: str) -> None:
        if backend == "vec0":
            cols = "".join(f", {c} {t}" for c, t in self.metadata.items())
            self.db.execute(
                f"CREATE VIRTUAL TABLE IF NOT EXISTS {self.table} USING vec0("
                f"embedding float[{self.dim}] distance_metric=cosine{cols})"
            )
        else:
            cols = "".join(f", {c} {self._types[c]}" for c in self.metadata)
            self.db.execute(
                f"CREATE TABLE IF NOT EXISTS {self.table} "
                f"(rowid INTEGER PRIMARY KEY, embedding BLOB NOT NULL{cols})"
            )

    def _apply_pending_deletes(self) -> None:
        """Deletes recorded while sqlite-vec was missing are applied once it is back."""
        if not self._table_exists(self._pending_table):
            return
        with self.db.transaction():
            pending = [int(r[0]) for r in self.db.query(f"SELECT rowid FROM {self._pending_table}")]
            self._delete_logged(pending)
            self.db.execute(f"DROP TABLE {self._pending_table}")

    def reset(self, dim: int) -> None:
        """Drop every vector and recreate the table for ``dim`` dimensions (model change).

        The new table uses vec0 whenever sqlite-vec is loaded now, even if the old one was a blob
        table.
        """
        dim = _positive_int(dim, "dim")
        old_dim, old_backend = self.dim, self.backend
        backend = "vec0" if self.db.native_vectors else "blob"

        def undo() -> None:
            self.dim, self.backend = old_dim, old_backend
            _rollbacks(self.db, self.table).add(0, None)
            self._bump_generation()

        with self.db.transaction():
            self.db.on_rollback(undo)
            self.db.execute(f"DROP TABLE IF EXISTS {self.table}")
            self.db.execute(f"DROP TABLE IF EXISTS {self._pending_table}")
            self.dim, self.backend = dim, backend
            self._create(backend)
            if self._has_log:
                self.db.execute(f"DELETE FROM {self.partition_table}")
            set_meta(self.db, f"vector_backend:{self.name}", backend)
            set_meta(self.db, f"vector_dim:{self.name}", dim)
            if self._has_log:
                self._log([0], _OP_RESET)
            self._mirror = None
            self._bump_generation()

    @property
    def available(self) -> bool:
        """False when the store was made with vec0 but sqlite-vec cannot be loaded now."""
        return self.backend == "blob" or self.db.native_vectors

    def _require(self) -> None:
        if not self.available:
            raise StorageError(
                f"vector table {self.table} needs sqlite-vec, which could not be loaded "
                f"({self.db.vec_reason})"
            )

    # -- writes --------------------------------------------------------------------------------

    def _check(self, vectors: FloatArray, what: str = "vectors") -> FloatArray:
        try:
            array = np.asarray(vectors, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"{what} must be an array of numbers: {exc}") from exc
        if array.ndim == 1:
            array = array.reshape(1, -1)
        if array.ndim != 2 or array.shape[1] != self.dim:
            raise InvalidInputError(f"{what} must have shape (n, {self.dim}), got {array.shape}")
        if not np.isfinite(array).all():
            raise InvalidInputError(f"{what} contain NaN or infinity")
        if len(array) and not np.linalg.norm(array, axis=1).all():
            raise InvalidInputError(f"{what} contain a zero vector, which has no cosine similarity")
        return np.ascontiguousarray(array)

    def _meta_value(self, column: str, value: Any, index: int) -> Any:
        kind = self._types[column]
        plain = type(value)
        if plain is _PLAIN.get(kind) and (plain is not float or math.isfinite(value)):
            return value  # the common case, without the slower numbers ABC checks
        ok = False
        if kind == "text":
            ok = isinstance(value, str)
        elif kind == "integer":
            ok = isinstance(value, numbers.Integral)
            value = int(value) if ok else value
        elif kind == "float":
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
            value = float(value) if ok else value
        elif kind == "boolean":
            ok = isinstance(value, bool | np.bool_)
            ok = ok or (isinstance(value, numbers.Integral) and int(value) in (0, 1))
            value = int(value) if ok else value
        if not ok:
            raise InvalidInputError(
                f"metas[{index}][{column!r}] must be a {kind} value for vector table {self.table}, "
                f"got {value!r}"
            )
        return value

    def _metas(self, metas: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        checked = []
        for index, meta in enumerate(metas):
            unknown = set(meta) - set(self.metadata)
            if unknown:
                raise InvalidInputError(f"metas[{index}] has unknown column(s) {sorted(unknown)}")
            row = {}
            for column in self.metadata:
                if column not in meta:
                    raise InvalidInputError(f"metas[{index}] lacks metadata column {column!r}")
                row[column] = self._meta_value(column, meta[column], index)
            checked.append(row)
        return checked

    def upsert_many(
        self,
        rowids: Sequence[int],
        vectors: FloatArray,
        metas: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Replace the vectors of ``rowids`` (delete then insert: re-indexing never hits UNIQUE).

        A rowid given twice keeps its last vector.
        """
        self._require()
        if len(rowids) == 0:
            return
        array = self._check(vectors)
        if len(array) != len(rowids):
            raise InvalidInputError(f"{len(rowids)} rowids but {len(array)} vectors")
        meta_rows = self._metas(list(metas) if metas is not None else [{} for _ in rowids])
        if len(meta_rows) != len(rowids):
            raise InvalidInputError(f"{len(rowids)} rowids but {len(meta_rows)} metas")
        last: dict[int, int] = {}
        for index, rowid in enumerate(rowids):
            last[int(rowid)] = index
        ids, picks = list(last), list(last.values())
        if len(ids) != len(rowids):
            array, meta_rows = array[picks], [meta_rows[i] for i in picks]
        columns = list(self.metadata)
        placeholders = ", ".join("?" for _ in range(2 + len(columns)))
        col_sql = "".join(f", {c}" for c in columns)

        def write() -> Callable[[_Mirror], None]:
            self._delete_rows(ids)
            self.db.executemany(
                f"INSERT INTO {self.table}(rowid, embedding{col_sql}) VALUES ({placeholders})",
                [(r, array[i].tobytes(), *(meta_rows[i][c] for c in columns)) for i, r in enumerate(ids)],
            )
            by_column = {c: [m[c] for m in meta_rows] for c in columns}
            return lambda mirror: mirror.put_many(ids, array, by_column)

        self._write(write, ids, _OP_UPSERT)

    def upsert(self, rowid: int, vector: FloatArray, meta: Mapping[str, Any] | None = None) -> None:
        self.upsert_many([rowid], self._check(vector), [meta or {}])

    def delete_many(self, rowids: Iterable[int]) -> None:
        """Delete vectors; unknown rowids are ignored. Without sqlite-vec for a vec0 store the
        deletes are recorded and applied when the store is next opened with sqlite-vec."""
        ids = sorted({int(r) for r in rowids})
        if not ids:
            return
        if not self.available:
            with self.db.transaction():
                pending = self._pending_table
                self.db.execute(f"CREATE TABLE IF NOT EXISTS {pending} (rowid INTEGER PRIMARY KEY)")
                self.db.executemany(f"INSERT OR IGNORE INTO {pending}(rowid) VALUES (?)", [(r,) for r in ids])
            return
        self._delete_logged(ids)

    def _delete_logged(self, ids: Sequence[int]) -> None:
        found: list[int] = []

        def write() -> Callable[[_Mirror], None]:
            found.extend(self._delete_rows(ids))
            return lambda mirror: mirror.remove_many(found)

        self._write(write, found, _OP_DELETE)

    def delete(self, rowid: int) -> None:
        self.delete_many([rowid])

    def update_metadata(self, rowid: int, meta: Mapping[str, Any]) -> None:
        """Change filter columns without touching the vector."""
        vector = self.get(rowid)
        if vector is not None:
            self.upsert(rowid, vector, meta)

    def _write(
        self, write: Callable[[], Callable[[_Mirror], None] | None], logged: Sequence[int], op: int
    ) -> None:
        """Run ``write`` in a transaction, log the rowids it changed, then bring this index's
        mirror along if it was current (otherwise the next search catches up from the log).

        ``logged`` may be filled by ``write`` itself (deletes log only rows that existed).
        """
        with self.db.transaction():
            record: list[tuple[int, frozenset[int]]] = []
            rollbacks = _rollbacks(self.db, self.table)

            def undo() -> None:  # idempotent: a savepoint rollback and its outer one both run it
                for floor, items in record:
                    rollbacks.add(floor, items)
                self._bump_generation()

            self.db.on_rollback(undo)
            current = self._mirror is not None and self._is_current()
            apply = write()
            newest = self._log(logged, op) if self._has_log else 0
            record.append((newest - len(logged), frozenset(int(r) for r in logged)))
            generation = self._bump_generation()
            if current and self._mirror is not None and apply is not None:
                apply(self._mirror)
                self._log_seq = newest
                self._seen_generation = generation

    def _bump_generation(self) -> int:
        generations = self.db._vector_generations
        generations[self.table] = generations.get(self.table, 0) + 1
        return generations[self.table]

    def _log(self, rowids: Sequence[int], op: int) -> int:
        """Append change-log entries; returns the newest seq. Old entries are pruned here."""
        if rowids:
            self.db.executemany(
                f"INSERT INTO {self.log_table}(item, op) VALUES (?, {op})", [(r,) for r in rowids]
            )
        oldest, newest = self.db.query(
            f"SELECT (SELECT min(seq) FROM {self.log_table}), (SELECT max(seq) FROM {self.log_table})"
        )[0]
        if newest is None:
            return 0
        if newest - oldest >= LOG_KEEP + _LOG_SLACK:
            self.db.execute(f"DELETE FROM {self.log_table} WHERE seq <= ?", (newest - LOG_KEEP,))
        return int(newest)

    def _delete_rows(self, ids: Sequence[int]) -> list[int]:
        """Delete the stored rows among ``ids``; returns those that existed.

        vec0 zeroes a deleted vector inside its chunk blob, walking the blob's overflow pages up to
        the row's offset: ~0.5 ms a row when scattered. Deleting in (chunk, offset) order with a
        larger page cache for the duration keeps each chunk's pages cached: ~4x faster.
        """
        if not ids:
            return []
        id_json = json.dumps([int(i) for i in ids])
        if self.backend == "blob":
            found = [
                int(r[0])
                for r in self.db.query(
                    f"SELECT rowid FROM {self.table} WHERE rowid IN (SELECT value FROM json_each(?))",
                    (id_json,),
                )
            ]
        elif self._table_exists(f"{self.table}_rowids"):
            located = self.db.query(
                f"SELECT rowid, chunk_id, chunk_offset FROM {self.table}_rowids "
                "WHERE rowid IN (SELECT value FROM json_each(?))",
                (id_json,),
            )
            located.sort(key=lambda r: (_int_or(r[1]), _int_or(r[2])))
            found = [int(r[0]) for r in located]
        else:  # an unknown vec0 layout: delete them all (vec0 ignores rowids it does not hold)
            found = [int(i) for i in ids]
        if found:
            with self._page_cache(len(found)):
                self.db.executemany(f"DELETE FROM {self.table} WHERE rowid = ?", [(r,) for r in found])
        return found

    @contextlib.contextmanager
    def _page_cache(self, rows: int) -> Iterator[None]:
        if rows < _BULK_DELETE or self.backend != "vec0":
            yield
            return
        previous = self.db.scalar("PRAGMA cache_size")
        self.db.execute(f"PRAGMA cache_size = -{_BULK_CACHE_KIB}")
        try:
            yield
        finally:
            self.db.execute(f"PRAGMA cache_size = {int(previous)}")

    # -- reads ---------------------------------------------------------------------------------

    def get(self, rowid: int) -> FloatArray | None:
        if not self.available:
            return None
        blob = self.db.scalar(f"SELECT embedding FROM {self.table} WHERE rowid = ?", (int(rowid),))
        return None if blob is None else np.frombuffer(blob, dtype=np.float32).copy()

    def count(self) -> int:
        if not self.available:
            return 0
        return int(self.db.scalar(f"SELECT count(*) FROM {self.table}"))

    def rowids(self) -> set[int]:
        if not self.available:
            return set()
        return {int(r[0]) for r in self.db.query(f"SELECT rowid FROM {self.table}")}

    def search(
        self,
        query: FloatArray,
        k: int,
        *,
        where: Mapping[str, Any] | None = None,
        candidates: Iterable[int] | None = None,
        engine: Engine = "auto",
        exact: bool = False,
    ) -> list[VectorHit]:
        """Top-``k`` by cosine similarity, restricted to ``where`` and ``candidates``.

        Exact, except on a mirror of ``approximate_from`` vectors or more, where searches without
        ``candidates`` scan the nearest inverted lists (``exact=True`` forces a full scan).
        ``engine="vec0"`` returns at most 4096 hits (sqlite-vec's limit for one query).
        """
        self._require()
        if engine not in ENGINES:
            raise InvalidInputError(f"engine must be one of {', '.join(ENGINES)}; got {engine!r}")
        q = self._check(query, "query")
        if len(q) != 1:
            raise InvalidInputError(f"query must be one vector of {self.dim} numbers, got shape {q.shape}")
        where = dict(where or {})
        unknown = set(where) - set(self.metadata)
        if unknown:
            raise InvalidInputError(f"unknown vector filter column(s): {sorted(unknown)}")
        try:  # numpy scalars become Python values; a value of another type can match nothing
            where = {c: self._meta_value(c, v, 0) for c, v in where.items()}
        except InvalidInputError:
            return []
        cand = None if candidates is None else np.fromiter((int(c) for c in candidates), dtype=np.int64)
        if cand is not None and len(cand) == 0:
            return []
        if engine == "vec0" or (engine == "auto" and not self.use_mirror and self.backend == "vec0"):
            if self.backend != "vec0":
                raise StorageError(f"vector table {self.table} is not a vec0 table")
            return self._search_vec0(q[0], k, where, cand)
        mirror = self._mirror_now()
        if q.shape[1] != self.dim:
            raise InvalidInputError(
                f"query must have shape (n, {self.dim}): vector table {self.table} was reset to "
                f"{self.dim} dimensions by another connection"
            )
        built = mirror.partitions_built
        mirror.maintain(self.approximate_from)
        if mirror.partitions_built != built:
            self._save_partition(mirror)
            trim_heap()  # the build's temporaries, as after a load
        return mirror.search(q[0], k, where, cand, exact=exact)

    def _search_vec0(
        self, q: FloatArray, k: int, where: Mapping[str, Any], cand: npt.NDArray[np.int64] | None
    ) -> list[VectorHit]:
        if k <= 0:
            return []
        sql = f"SELECT rowid, distance FROM {self.table} WHERE embedding MATCH ? AND k = ?"
        params: list[Any] = [q.tobytes(), int(min(k, VEC0_MAX_K))]
        for column, value in where.items():
            sql += f" AND {column} = ?"
            params.append(value)
        if cand is not None:
            sql += " AND rowid IN (SELECT value FROM json_each(?))"
            params.append("[" + ",".join(str(int(c)) for c in np.unique(cand)) + "]")
        sql += " ORDER BY distance"
        return [VectorHit(int(r), 1.0 - float(d)) for r, d in self.db.query(sql, params) if d is not None]

    # -- the mirror ----------------------------------------------------------------------------

    def _generation(self) -> int:
        """This connection's own write count for this table (``data_version`` ignores it)."""
        return self.db._vector_generations.get(self.table, 0)

    def _is_current(self) -> bool:
        """True when nothing was written since the mirror last caught up."""
        return (
            self._seen_generation == self._generation()
            and self._rollbacks_seen == _rollbacks(self.db, self.table).total
            and self._data_version == self.db.data_version()
        )

    def _mirror_now(self) -> _Mirror:
        if self._mirror is None or not self._has_log:
            if self._mirror is None or not self._is_current():
                self._reload()
        elif not self._is_current():
            self._catch_up()
        assert self._mirror is not None
        return self._mirror

    def _reload(self) -> None:
        started = time.perf_counter()
        generation = self._generation()
        rollbacks = _rollbacks(self.db, self.table).total
        version = self.db.data_version()
        with snapshot(self.db):  # the rows, the log position and the stored lists must agree
            seq = int(self.db.scalar(f"SELECT max(seq) FROM {self.log_table}") or 0) if self._has_log else 0
            self._mirror = self._load()
            if (
                self._has_log
                and self.approximate_from is not None
                and self._mirror.live >= self.approximate_from
            ):
                self._restore_partition(self._mirror)
        self._log_seq = seq
        self._data_version, self._seen_generation, self._rollbacks_seen = version, generation, rollbacks
        self.reloads += 1
        self.last_reload_seconds = time.perf_counter() - started
        trim_heap()  # the load's temporaries: tens of MB that would otherwise stay resident

    def _save_partition(self, mirror: _Mirror) -> None:
        """Store the lists just built (centroids and the rowids in list order, ~10 MB at 1M rows).

        Best effort, never waiting: when another connection holds the write lock, or the
        database is read-only, the next process builds its own lists.
        """
        part = mirror.partition
        if part is None or not self._has_log or self.db.read_only or mirror.size != part.end:
            return
        row = (
            self._log_seq,
            self.dim,
            part.trained_rows,
            part.centroids.astype(np.float32).tobytes(),
            mirror.rowids[: part.end].astype(np.int64).tobytes(),
            np.diff(part.starts).astype(np.int64).tobytes(),
        )
        sql = (
            f"INSERT OR REPLACE INTO {self.partition_table}"
            "(id, seq, dim, trained_rows, centroids, rowids, sizes) VALUES (1, ?, ?, ?, ?, ?, ?)"
        )
        if self.db.in_transaction:  # joins the caller's transaction (and its fate)
            self.db.execute(sql, row)
            return
        conn = self.db.conn
        timeout = conn.execute("PRAGMA busy_timeout").fetchone()[0]
        try:
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(sql, row)
                conn.execute("COMMIT")
            except Exception:
                conn.execute("ROLLBACK")
                raise
        except Exception:  # busy, read-only file, disk full: the stored lists are only a cache
            pass
        finally:
            conn.execute(f"PRAGMA busy_timeout = {int(timeout)}")

    def _restore_partition(self, mirror: _Mirror) -> None:
        """Adopt the stored lists if the change log explains every change since they were built."""
        row = self.db.query(
            f"SELECT seq, dim, trained_rows, centroids, rowids, sizes FROM {self.partition_table} "
            "WHERE id = 1"
        )
        if not row:
            return
        built_at, dim, trained_rows, centroids_blob, rowids_blob, sizes_blob = row[0]
        if dim != self.dim:
            return
        oldest, newest = self.db.query(
            f"SELECT (SELECT min(seq) FROM {self.log_table}), (SELECT max(seq) FROM {self.log_table})"
        )[0]
        if newest is None or newest < built_at or (newest > built_at and oldest > built_at + 1):
            return  # the log was pruned past the build (or does not reach it): changes unknown
        entries = self.db.query(f"SELECT item, op FROM {self.log_table} WHERE seq > ?", (built_at,))
        if any(op == _OP_RESET for _, op in entries):
            return
        try:
            centroids = np.frombuffer(centroids_blob, dtype=np.float32).reshape(-1, dim).copy()
            ordered = np.frombuffer(rowids_blob, dtype=np.int64)
            sizes = np.frombuffer(sizes_blob, dtype=np.int64)
        except (TypeError, ValueError):
            return
        if len(sizes) != len(centroids) or int(sizes.sum()) != len(ordered) or (sizes < 0).any():
            return
        changed = np.unique(np.array([int(item) for item, _ in entries], dtype=np.int64))
        mirror.adopt(centroids, ordered, sizes, int(trained_rows), changed)

    def _catch_up(self) -> None:
        """Apply the change-log entries written since the mirror's position (re-reading those
        rows), or reload when the log cannot account for everything that changed."""
        generation = self._generation()
        rollbacks = _rollbacks(self.db, self.table)
        total = rollbacks.total
        version = self.db.data_version()
        last = self._log_seq
        reread: set[int] = set()
        if self._rollbacks_seen != total:
            if self._rollbacks_seen < rollbacks.dropped:
                self._reload()
                return
            for floor, items in rollbacks.records[self._rollbacks_seen - rollbacks.dropped :]:
                if items is None:
                    self._reload()
                    return
                last = min(last, floor)
                reread |= items
        with snapshot(self.db):
            entries = self.db.query(
                f"SELECT seq, item, op FROM {self.log_table} WHERE seq > ? ORDER BY seq", (last,)
            )
            if entries and entries[0][0] != last + 1:
                oldest = self.db.scalar(f"SELECT min(seq) FROM {self.log_table}")
                gap = oldest is None or int(oldest) > last + 1
            else:
                newest = self.db.scalar(f"SELECT max(seq) FROM {self.log_table}")
                gap = int(newest or 0) < last  # entries this mirror saw were rolled back
            if gap or any(op == _OP_RESET for _, _, op in entries):
                self._reload()
                return
            reread.update(int(item) for _, item, _ in entries)
            assert self._mirror is not None
            if len(reread) > max(50_000, self._mirror.live // 2) and self._mirror.partition is None:
                self._reload()  # cheaper than re-reading most rows one by one
                return
            if reread:
                self._apply_rows(sorted(reread))
        if entries:
            last = int(entries[-1][0])
        self._log_seq = last
        self._data_version, self._seen_generation, self._rollbacks_seen = version, generation, total
        self.refreshes += 1

    def _apply_rows(self, items: list[int]) -> None:
        """Make the mirror hold exactly what the store holds for ``items`` now."""
        assert self._mirror is not None
        rows = self._read(items)
        present = set(rows.rowids.tolist())
        self._mirror.remove_many(i for i in items if i not in present)
        if len(rows.rowids):
            self._mirror.put_many(rows.rowids.tolist(), rows.storage[: len(rows.rowids)], rows.metas)

    def _read(self, items: list[int] | None, room: float = 0.0) -> _Rows:
        """Rows of the store (``items=None``: all of them) as ids, a matrix and metadata columns;
        the matrix gets spare rows (``room`` as a share of the rows read)."""
        columns = list(self.metadata)
        if self.backend == "vec0":
            fast = read_rows(self.db, self.table, self.dim, list(self.metadata.items()), items, room=room)
            if fast is not None:
                return _Rows(fast.rowids, fast.storage, fast.metas)
        col_sql = "".join(f", t.{c}" for c in columns)
        if items is None:
            rows = self.db.query(f"SELECT t.rowid, t.embedding{col_sql} FROM {self.table} t")
        else:
            rows = []
            for start in range(0, len(items), 50_000):
                rows += self.db.query(
                    f"SELECT t.rowid, t.embedding{col_sql} FROM json_each(?) j "
                    f"JOIN {self.table} t ON t.rowid = j.value",
                    (json.dumps(items[start : start + 50_000]),),
                )
        storage = np.empty((len(rows) + spare_rows(len(rows), room), self.dim), dtype=np.float32)
        for i, row in enumerate(rows):
            storage[i] = np.frombuffer(row[1], dtype=np.float32)
        return _Rows(
            np.array([int(r[0]) for r in rows], dtype=np.int64),
            storage,
            {c: [r[2 + i] for r in rows] for i, c in enumerate(columns)},
        )

    def _load(self) -> _Mirror:
        stored_dim = get_meta(self.db, f"vector_dim:{self.name}")
        if stored_dim is not None and int(stored_dim) != self.dim:  # reset by another connection
            self.dim = int(stored_dim)
            self.backend = get_meta(self.db, f"vector_backend:{self.name}") or self.backend
        rows = self._read(None, room=_ROOM)
        return _Mirror.bulk(self.dim, list(self.metadata), rows.rowids, rows.storage, rows.metas)

    def _read_vec0_chunks(self) -> tuple[list[int], FloatArray] | None:
        """All vectors of a vec0 table read from its chunk tables, or ``None`` (layout surprise)."""
        rows = read_rows(self.db, self.table, self.dim, list(self.metadata.items()))
        return None if rows is None else (rows.rowids.tolist(), rows.vectors)

    def status(self) -> dict[str, Any]:
        """Backend (``vec0`` or ``blob``), whether it can be used now and why not, and the mirror."""
        mirror = self._mirror
        return {
            "backend": self.backend,
            "available": self.available,
            "native_vectors": self.db.native_vectors,
            "reason": None if self.available and self.db.native_vectors else self.db.vec_reason,
            "search_engine": "memory" if self.use_mirror or self.backend == "blob" else "vec0",
            "dim": self.dim,
            "count": self.count(),
            "mirror": self.use_mirror,
            "mirror_loaded": mirror is not None,
            "mirror_rows": 0 if mirror is None else mirror.live,
            "mirror_reloads": self.reloads,
            "mirror_refreshes": self.refreshes,
            "change_log": self._has_log,
            "approximate_from": self.approximate_from,
            "approximate": None if mirror is None else mirror.describe(),
        }


@dataclass
class _Rows:
    rowids: npt.NDArray[np.int64]
    storage: FloatArray  # the vectors of ``rowids`` first, then any spare rows
    metas: dict[str, list[Any]]
