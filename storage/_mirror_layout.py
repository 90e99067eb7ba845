"""The order of a vector mirror's rows: by inverted list, then by a filter column (the group).

Compaction of dead rows, regrouping of the tail, and building, extending, adopting or dropping
the partition (the inverted lists) as the mirror's size asks. Rows move in place: a 1M x 384
mirror is 1.5 GB, there is no room for a second matrix.
"""

from __future__ import annotations

import time

import numpy as np
import numpy.typing as npt

from ._array_types import FloatArray
from ._ivf import MAX_SAMPLE, SAMPLE_PER_LIST, Partition, assign, list_count, train
from ._mirror_matrix import MirrorMatrix
from ._vector_kernels import permute_rows

__all__ = ["GROUP_FROM", "GROUP_MAX", "MirrorLayout"]

_TAIL_SHARE = 0.15  # rows added since the partition, as a share of it, that trigger a rebuild
_SEED = 20_240_607
_MOVE_BLOCK = 16_384  # rows moved per step when compacting in place
GROUP_MAX = 16  # a group column with more values is not grouped (a filtered search through the
# lists scans one slice per list it probes: more groups, smaller slices)
GROUP_FROM = 4096  # live rows from which a mirror keeps its rows grouped (below, masks are cheap)


class MirrorLayout(MirrorMatrix):
    """The upkeep of :class:`~._vector_mirror.Mirror`'s blocks and partition."""

    def _groupable(self) -> bool:
        return self.group is not None and 1 < len(self.vocab[self.group]) <= GROUP_MAX

    def maintain(self, approximate_from: int | None) -> None:
        """Drop dead rows when they pile up; build, extend or drop the partition as size asks;
        fold a grown tail into the groups."""
        self._check_blocks()
        if self.dead > max(1024, self.size // 4):
            self.compact()
        part = self.partition
        live = self.live
        if self.can_sieve:  # large mirrors sieve by sign codes and need no inverted lists
            floor = approximate_from // 2 if self.sieving and approximate_from else approximate_from
            self.sieving = floor is not None and live >= floor
            if part is not None:
                self._drop_partition()
        elif approximate_from is None or (part is not None and live < approximate_from // 2):
            if part is not None:
                self._drop_partition()
        elif part is None:
            if live >= approximate_from:
                self.repartition(retrain=True)
                return
        elif self.size - self.sorted_end > _TAIL_SHARE * max(self.sorted_end, 1):
            # the tail is folded into the lists; the centroids are retrained when the data
            # has grown or shrunk by half since they were made
            self.repartition(retrain=not part.trained_rows / 2 <= live <= part.trained_rows * 2)
            return
        if self.partition is None and live >= GROUP_FROM:
            tail = self.size - self.sorted_end
            if tail > _TAIL_SHARE * max(self.sorted_end, 1) and (self._groupable() or self.grouped):
                self._regroup()

    def _check_blocks(self) -> None:
        """Blocks that match the partition: a mirror whose rows and partition were set directly
        (rows grouped by list only, ``partition.starts`` their starts) is read as ungrouped."""
        part = self.partition
        lists = 1 if part is None else part.lists
        if len(self.blocks) == self.groups * lists + 1:
            return
        self.groups = 1
        if part is None:
            self.blocks = np.zeros(2, dtype=np.int64)
        else:
            self.blocks = np.asarray(part.starts, dtype=np.int64).copy()
        self.sorted_end = int(self.blocks[-1])

    def _drop_partition(self) -> None:
        """Forget the lists; a grouped mirror sorts its rows by group alone again (under the lists
        each group was spread over every list)."""
        self.partition = None
        self.lists[: self.size] = -1
        if self.groups > 1:
            self._regroup()
        else:
            self.blocks = np.array([0, self.sorted_end], dtype=np.int64)

    def _sync_partition_starts(self) -> None:
        """``partition.starts`` from the blocks: list ``l`` is the rows ``blocks[l * groups]`` to
        ``blocks[(l + 1) * groups]``, its groups' blocks side by side."""
        part = self.partition
        if part is None:
            return
        part.starts = self.blocks[:: self.groups].copy()

    def _vector_rows(self, moved: int) -> list[npt.NDArray[np.generic]]:
        """The arrays of vectors whose rows are about to move from row ``moved`` on: the matrix
        and the int8 rows (brought up to date first); rows from ``moved`` on are no longer as
        the index file has them."""
        self.file_rows = min(self.file_rows, moved)
        if self._int8 is None or self._int8.scale is None:
            return [self.matrix]
        self._int8.update(self.matrix, self.size)
        return [self.matrix, self._int8.codes]

    def compact(self) -> None:
        """Drop dead rows in place (rows only move towards the front, so no second matrix)."""
        self._check_blocks()
        keep = np.flatnonzero(self.alive[: self.size])
        kept = len(keep)
        moved = np.flatnonzero(keep != np.arange(kept))
        for rows in self._vector_rows(int(moved[0]) if len(moved) else kept):
            for a in range(0, kept, _MOVE_BLOCK):
                picks = keep[a : a + _MOVE_BLOCK]
                if picks[0] != a or picks[-1] != a + len(picks) - 1:  # else already in place
                    rows[a : a + len(picks)] = rows[picks]
        if self._int8 is not None:
            self._int8.rows = min(self._int8.rows, kept)
        self._take_rows(keep)
        if self._signs is not None:
            self._signs.take(keep)
        self.alive[:kept] = True
        self.alive[kept : self.size] = False
        self.blocks = np.searchsorted(keep, self.blocks).astype(np.int64)
        self.sorted_end = int(self.blocks[-1])
        self._sync_partition_starts()
        self.size, self.dead = kept, 0
        self.index.rebuild(self.rowids[:kept], self.alive[:kept])

    def _take_rows(self, picks: npt.NDArray[np.int64]) -> None:
        """The small per-row arrays (not the matrix) of rows ``picks``, moved to the front."""
        n = len(picks)
        self.rowids[:n] = self.rowids[picks]
        self.lists[:n] = self.lists[picks]
        for c in self.columns:
            self.codes[c][:n] = self.codes[c][picks]
        for c in self.ranges:
            self.ints[c][:n] = self.ints[c][picks]

    def _regroup(self) -> None:
        """Sort every row into its block (list, then group code): one in-place permutation."""
        if self.dead:
            self.compact()
        size = self.size
        part = self.partition
        lists = 1 if part is None else part.lists
        groups = len(self.vocab[self.group]) if self.group is not None and self._groupable() else 1
        key = np.zeros(size, dtype=np.int64)
        if groups > 1:
            assert self.group is not None
            key += self.codes[self.group][:size]
        if part is not None:
            labels = self.lists[:size]
            key += labels.astype(np.int64) * groups
            key[labels < 0] = groups * lists  # rows without a list yet stay in the tail
        order = np.argsort(key, kind="stable")
        moved = np.flatnonzero(order != np.arange(size))
        if len(moved):
            for rows in self._vector_rows(int(moved[0])):
                permute_rows(rows, order)
            self._take_rows(order)
            if self._signs is not None:
                self._signs.take(order)
        self.groups = groups
        self.blocks = np.searchsorted(key[order], np.arange(groups * lists + 1)).astype(np.int64)
        self.sorted_end = int(self.blocks[-1])
        self._sync_partition_starts()
        self.regroups += 1
        self.index.rebuild(self.rowids[:size], self.alive[:size])

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
            tail = labels < 0
            labels[tail] = assign(self.matrix[:size][tail], centroids)
        self.lists[:size] = labels
        self.partition = Partition(centroids, np.zeros(2, dtype=np.int64), trained_rows)
        self._regroup()
        self.partitions_built += 1
        self.partition_seconds = time.perf_counter() - started

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
        self.lists[:size] = np.where(labels < lists, labels, -1)
        self.partition = Partition(centroids, np.zeros(2, dtype=np.int64), trained_rows)
        self._regroup()
        self.partitions_restored += 1
        self.partition_seconds = time.perf_counter() - started

    def list_order(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The live sorted rows' rowids grouped by inverted list, and each list's size (what a
        later :meth:`adopt` takes back)."""
        part = self.partition
        if part is None:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        end = self.sorted_end
        keep = np.flatnonzero(self.alive[:end])
        labels = self.lists[keep]
        order = np.argsort(labels, kind="stable")
        return self.rowids[keep][order], np.bincount(labels, minlength=part.lists).astype(np.int64)
