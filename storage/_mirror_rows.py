"""Rows of a vector mirror by id: metadata values as integer codes, and rowid -> position."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ._array_types import BoolArray

__all__ = ["Confirm", "RowIndex", "encode_values"]

_DENSE_SPAN = 4  # rowids up to this many times their count get a position array (8 bytes each)
_DENSE_FROM = 256  # lookups of more ids than this use (and make) the position array

# whether the rows at some positions hold some rowids (``confirm(rowids, positions)``)
Confirm = Callable[[npt.NDArray[np.int64], npt.NDArray[np.int64]], bool]


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
    removed row); the snapshot is rebuilt when the changes pile up. When the rowids are dense
    (the largest below ``_DENSE_SPAN`` times their count), a position array indexed by rowid,
    made at the first large lookup, answers by one gather instead of a binary search: a keyword
    side checking 50k matches against the mirror's columns costs ~0.2 ms instead of ~2.5.
    """

    def __init__(self) -> None:
        self.keys = np.zeros(0, dtype=np.int64)
        self.values = np.zeros(0, dtype=np.int64)
        self.recent: dict[int, int] = {}
        self._dense: npt.NDArray[np.int64] | None = None
        self._pending: Callable[[], None] | None = None
        self._confirm: Confirm | None = None

    def set(
        self,
        keys: npt.NDArray[np.int64],
        values: npt.NDArray[np.int64],
        check: Callable[[], None] | None = None,
        confirm: Confirm | None = None,
    ) -> None:
        """A new snapshot (``keys`` sorted, distinct), no changes since. ``check`` (for a
        snapshot read from a file) runs at the snapshot's first use, before anything reads or
        changes it, and replaces it when it is wrong: a fresh process that only searches never
        pays for it (~8-40 ms at 1M rows). ``confirm(rowids, positions)`` says whether the
        rows at ``positions`` are ``rowids``: a small lookup that finds every id it asks for,
        each confirmed at its position, is answered before the check (a hybrid search's
        similarities of its keyword hits, at a fresh process's first query)."""
        self.keys, self.values, self.recent, self._dense = keys, values, {}, None
        self._pending = check
        self._confirm = confirm if check is not None else None

    def settle(self) -> None:
        """Run the snapshot's pending check, if any."""
        pending, self._pending, self._confirm = self._pending, None, None
        if pending is not None:
            pending()

    def _confirmed(self, rowids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64] | None:
        """Positions of ``rowids`` from the unchecked snapshot when each one is found and
        confirmed where it was found (then the whole check could not change them); ``None``
        otherwise: an id not found is only known absent once the snapshot is checked."""
        confirm = self._confirm
        if confirm is None or self.recent or len(rowids) > _DENSE_FROM or not len(self.keys):
            return None
        at = np.minimum(np.searchsorted(self.keys, rowids), len(self.keys) - 1)
        if not bool(np.array_equal(self.keys[at], rowids)):
            return None
        found = np.array(self.values[at], dtype=np.int64)
        return found if confirm(rowids, found) else None

    def rebuild(self, rowids: npt.NDArray[np.int64], alive: BoolArray) -> None:
        positions = np.flatnonzero(alive)
        keys = rowids[positions]
        order = np.argsort(keys, kind="stable")
        self.set(keys[order], positions[order])

    def _dense_map(self) -> npt.NDArray[np.int64] | None:
        keys = self.keys
        if self._dense is None and len(keys) and keys[0] >= 0 and keys[-1] < _DENSE_SPAN * len(keys) + 65_536:
            dense = np.full(int(keys[-1]) + 1, -1, dtype=np.int64)
            dense[keys] = self.values
            self._dense = dense
        return self._dense

    def lookup(self, rowids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Positions of ``rowids``, -1 for those not in the mirror."""
        if self._pending is not None:
            confirmed = self._confirmed(rowids)
            if confirmed is not None:
                return confirmed
            self.settle()
        found = np.full(len(rowids), -1, dtype=np.int64)
        dense = self._dense_map() if len(rowids) > _DENSE_FROM else None
        if dense is not None:
            inside = (rowids >= 0) & (rowids < len(dense))
            found[inside] = dense[rowids[inside]]
        elif len(self.keys):
            at = np.searchsorted(self.keys, rowids)
            at[at == len(self.keys)] = 0
            hit = self.keys[at] == rowids
            found[hit] = self.values[at[hit]]
        recent = self.recent
        if recent and len(recent) * 8 < len(rowids):  # few changes, many ids: vectorised
            changed = np.fromiter(recent.keys(), dtype=np.int64, count=len(recent))
            where = np.fromiter(recent.values(), dtype=np.int64, count=len(recent))
            order = np.argsort(changed)
            changed, where = changed[order], where[order]
            at = np.searchsorted(changed, rowids)
            at[at == len(changed)] = 0
            hit = changed[at] == rowids
            found[hit] = where[at[hit]]
        elif recent:
            for i, rowid in enumerate(rowids.tolist()):
                pos = recent.get(rowid)
                if pos is not None:
                    found[i] = pos
        return found

    @property
    def stale(self) -> bool:
        self.settle()
        return len(self.recent) > max(4096, len(self.keys) // 8)
