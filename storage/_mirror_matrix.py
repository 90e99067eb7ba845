"""The rows of a vector mirror: one float32 matrix with per-row ids, liveness, codes and ints.

Adding, replacing and removing rows (new rows join the tail, removed ones are marked dead) and
answering which rowids a filter allows. How the rows are ordered (groups, inverted lists) is
:mod:`._mirror_layout`; searching them is :mod:`._mirror_search`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Self

import numpy as np
import numpy.typing as npt

from ._array_types import FloatArray
from ._ivf import Partition
from ._mirror_rows import RowIndex, encode_values
from ._mirror_search import MirrorSearch, Ranges
from ._vector_kernels import unit_rows

__all__ = ["MirrorMatrix"]


class MirrorMatrix(MirrorSearch):
    """The per-row arrays of :class:`~._vector_mirror.Mirror` and the writes to them."""

    def __init__(
        self,
        dim: int,
        columns: Sequence[str],
        *,
        group: str | bool | None = True,
        ranges: Sequence[str] = (),
        unit: bool = True,
    ) -> None:
        self.dim = dim
        self.unit = unit  # rows scaled to unit length (cosine); False: kept as given (dot product)
        self.columns = list(columns)
        self.ranges = list(ranges)  # integer columns kept as they are, for range filters
        self.ints: dict[str, npt.NDArray[np.int64]] = {c: np.zeros(0, dtype=np.int64) for c in self.ranges}
        if group is True:
            group = self.columns[0] if self.columns else None
        elif group is False:
            group = None
        if group is not None and group not in self.columns:
            raise ValueError(f"group column {group!r} is not one of {self.columns}")
        self.group: str | None = group
        self.matrix: FloatArray = np.zeros((0, dim), dtype=np.float32)
        self.rowids = np.zeros(0, dtype=np.int64)
        self.alive = np.zeros(0, dtype=bool)
        self.lists = np.zeros(0, dtype=np.int32)
        self.codes: dict[str, npt.NDArray[np.int32]] = {c: np.zeros(0, dtype=np.int32) for c in columns}
        self.vocab: dict[str, dict[Any, int]] = {c: {} for c in columns}
        self.blocks = np.zeros(2, dtype=np.int64)  # (groups * lists + 1,) starts of the sorted blocks
        self.groups = 1  # group codes in ``blocks`` (1: not grouped)
        self.sorted_end = 0
        self.index = RowIndex()
        self.size = 0
        self.dead = 0
        self.partition: Partition | None = None
        self.sieving = False  # large enough to sieve by sign codes (see ``maintain``)
        self.partitions_built = 0
        self.partitions_restored = 0
        self.regroups = 0
        self.partition_seconds = 0.0
        self._scores = np.empty(0, dtype=np.float32)

    @classmethod
    def bulk(
        cls,
        dim: int,
        columns: Sequence[str],
        rowids: Sequence[int] | npt.NDArray[np.int64],
        storage: FloatArray,
        metas: Mapping[str, Sequence[Any]],
        *,
        group: str | bool | None = True,
        ranges: Sequence[str] = (),
        unit: bool = True,
    ) -> Self:
        """A mirror of distinct ``rowids`` whose vectors are the first rows of ``storage``; it
        takes ownership of ``storage`` (normalised in place; spare rows are room to grow)."""
        mirror = cls(dim, columns, group=group, ranges=ranges, unit=unit)
        n = len(rowids)
        if unit:
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
        for c in mirror.ranges:
            mirror.ints[c] = np.zeros(capacity, dtype=np.int64)
            mirror.ints[c][:n] = np.asarray(metas[c], dtype=np.int64)
        mirror.size = n
        # every row starts in the tail: the first search groups them (:meth:`maintain`), or
        # :meth:`adopt` does with the lists, in one permutation either way
        mirror.index.rebuild(mirror.rowids[:n], mirror.alive[:n])
        return mirror

    @property
    def live(self) -> int:
        return self.size - self.dead

    def _grow(self, need: int) -> None:
        """Room for ``need`` rows: the per-row arrays grow to the matrix's spare rows (a mirror
        mapped from a file has them only in its matrix), the matrix when those run out."""
        capacity = len(self.rowids)
        if need <= capacity:
            return
        spare = len(self.matrix)
        new_capacity = spare if need <= spare else max(need, capacity * 2, 1024)
        if new_capacity > spare:
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
        for c in self.ranges:
            self.ints[c] = np.resize(self.ints[c], new_capacity)

    def put_many(
        self, rowids: Sequence[int], vectors: FloatArray, metas: Mapping[str, Sequence[Any]]
    ) -> None:
        """Add or replace; ``rowids`` must be distinct. New rows join the tail."""
        self.remove_many(rowids)
        start = self.size
        end = start + len(rowids)
        self._grow(end)
        self.matrix[start:end] = unit_rows(vectors) if self.unit else vectors
        self.rowids[start:end] = rowids
        self.alive[start:end] = True
        self.lists[start:end] = -1
        for c in self.columns:
            vocab = self.vocab[c]
            self.codes[c][start:end] = [vocab.setdefault(v, len(vocab)) for v in metas[c]]
        for c in self.ranges:
            self.ints[c][start:end] = metas[c]
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

    def positions(self, rowids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Positions of ``rowids`` among the live rows, -1 for those not in the mirror."""
        return self.index.lookup(rowids)

    def allows(
        self, rowids: npt.NDArray[np.int64], where: Mapping[str, Any], ranges: Ranges | None = None
    ) -> npt.NDArray[np.int8]:
        """For each rowid: 1 when the mirror holds it and ``where`` and ``ranges`` allow it, 0
        when it holds it and they do not, -1 when the mirror does not hold it (the caller asks
        the store)."""
        positions = self.index.lookup(rowids)
        held = positions >= 0
        out = np.where(held, 1, -1).astype(np.int8)
        at = positions[held]
        ok = np.ones(len(at), dtype=bool)
        for column, value in where.items():
            code = self.vocab[column].get(value)
            if code is None:
                ok[:] = False
                break
            ok &= self.codes[column][at] == code
        for column, (low, high) in (ranges or {}).items():
            values = self.ints[column][at]
            if low is not None:
                ok &= values >= low
            if high is not None:
                ok &= values < high
        out[np.flatnonzero(held)[~ok]] = 0
        return out
