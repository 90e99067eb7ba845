"""How an item is addressed and returned: namespace paths as stored text, and the item record.

Shared by the store and its search, listing and expiry parts, so the separator and the record
shape are defined once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from memstrata.core.errors import InvalidInputError
from memstrata.core.item_record import ItemRecord
from memstrata.storage import Database

__all__ = ["SEP", "ComputedItemRow", "ItemRecord", "ItemRow", "ItemStoreState", "namespace_key"]

SEP = "\x1f"  # between namespace labels; a label may not contain it
_AFTER_SEP = chr(ord(SEP) + 1)


def namespace_key(namespace: Sequence[str]) -> str:
    """One namespace path as the stored text; refuses what would make prefixes ambiguous."""
    if isinstance(namespace, str) or not namespace:
        raise InvalidInputError(f"namespace must be a non-empty tuple of labels, got {namespace!r}")
    for label in namespace:
        if not isinstance(label, str) or not label:
            raise InvalidInputError(f"namespace labels must be non-empty strings, got {namespace!r}")
        if SEP in label or "\x00" in label:  # SQLite's substr() miscounts text holding \x00
            raise InvalidInputError(f"namespace label {label!r} holds a reserved character (\\x00 or \\x1f)")
    return SEP.join(namespace)


class ItemStoreState:
    """What the parts of :class:`~._items.ItemStore` share, set by its constructor."""

    _db: Database
    _lock: threading.RLock
    _clock: Callable[[], float]
    _writes: int  # own writes; other connections' show in PRAGMA data_version


ItemRow = tuple[Sequence[str], str, dict[str, Any], Mapping[str, Sequence[float]] | None, float | None]
"""(namespace, key, value, vectors per field or None, ttl in minutes or None): vectors given
by the caller, kept as they are"""
ComputedItemRow = tuple[Sequence[str], str, dict[str, Any], Mapping[str, Sequence[float]], float | None, str]
"""An :data:`ItemRow` whose vectors the model named last computed from the value's fields"""


def _record(row: Any, score: float | None = None) -> ItemRecord:
    return ItemRecord(
        namespace=tuple(row[1].split(SEP)),
        key=row[2],
        value=orjson.loads(row[3]),
        created_at=row[4],
        updated_at=row[5],
        score=score,
        expires_at=row[6],
    )
