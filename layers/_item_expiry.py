"""Time to live of items: the longest lifetime, sweeping expired items, refreshing on read.

An item's ``expires_at`` is ``ttl_minutes`` after its last write (or read with ``refresh_ttl``);
expired items are invisible to reads at once and deleted by :meth:`ItemExpiry.sweep`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ._item_records import _AFTER_SEP, SEP, ItemRecord, ItemStoreState, namespace_key

__all__ = ["ItemExpiry"]


class ItemExpiry(ItemStoreState):
    """The expiry of :class:`~._items.ItemStore` (one of its bases)."""

    def sweep(self, prefix: Sequence[str] = ()) -> int:
        """Delete expired items (only under the namespace ``prefix`` when given); returns how many."""
        sql = "DELETE FROM items WHERE expires_at IS NOT NULL AND expires_at <= ?"
        extra: list[Any] = []
        if prefix:
            ns = namespace_key(prefix)
            sql += " AND ns >= ? AND ns < ? AND (ns = ? OR substr(ns, ?, 1) = ?)"
            extra = [ns, ns + _AFTER_SEP, ns, len(ns) + 1, SEP]
        with self._lock, self._db.transaction():
            self._writes += 1
            return int(self._db.execute(sql, (self._clock(), *extra)).rowcount)

    # reads --------------------------------------------------------------------------------

    def _refreshed(self, records: list[ItemRecord], now: float) -> list[ItemRecord]:
        """``records`` with their lifetimes started again at ``now``: stored, and in the records
        returned (a reader that refreshes sees the expiry it set)."""
        out = []
        with self._db.transaction():
            for record in records:
                row = self._db.execute(
                    "UPDATE items SET expires_at = ? + ttl_minutes * 60.0"
                    " WHERE ns = ? AND key = ? AND ttl_minutes IS NOT NULL RETURNING expires_at",
                    (now, SEP.join(record.namespace), record.key),
                ).fetchone()
                out.append(record if row is None else dataclasses.replace(record, expires_at=row[0]))
        return out
