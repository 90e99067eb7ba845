"""The vectors of items: one dimension per store, and which model computed them.

A vector is either the caller's (given with the item: its ``model`` is null and the store keeps
it as given) or computed by the store's owner from one field of the item's value with a named
model. When the owner's model changes, the computed vectors are the ones to compute again: a
vector of another model ranks by another meaning, even at the same dimension.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from memstrata.core.errors import ConfigError, InvalidInputError

from ._item_records import ItemStoreState

__all__ = ["ItemVectors", "StaleItem", "vector_blob"]

_DROP = "DELETE FROM item_vectors WHERE item_id = ? AND field = ?"
_SET = "UPDATE item_vectors SET vec = ?, model = ? WHERE item_id = ? AND field = ?"

StaleItem = tuple[int, dict[str, Any], list[str]]
"""(item id, its value, the fields whose vectors another model computed)"""


def vector_blob(vector: object, what: str) -> bytes:
    """A vector as stored: float32 bytes. Refused when empty or not finite once in float32 (a
    float64 such as 1e308 overflows to inf there, and would poison every later search)."""
    with np.errstate(over="ignore", invalid="ignore"):
        try:
            row = np.asarray(vector, dtype=np.float32).ravel()
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"{what} is not a list of numbers: {exc}") from None
    if row.size == 0 or not np.isfinite(row).all():
        raise InvalidInputError(f"{what} is empty or not finite in float32 (|x| <= 3.4e38)")
    return row.tobytes()


class ItemVectors(ItemStoreState):
    """The vector bookkeeping of :class:`~._items.ItemStore` (one of its bases)."""

    def vector_dim(self) -> int | None:
        """The length of the stored vectors (one per store), ``None`` while there are none."""
        held = self._db.scalar("SELECT length(vec) / 4 FROM item_vectors LIMIT 1")
        return None if held is None else int(held)

    def _check_dims(self, dims: set[int]) -> None:
        """One dimension per store: every vector, stored or new, has the same length."""
        if not dims:
            return
        held = self.vector_dim()
        if held is not None:
            dims = {*dims, held}
        if len(dims) > 1:
            raise InvalidInputError(
                f"item vectors must all have one dimension: got {sorted(dims)}"
                + ("" if held is None else f" (the store holds {held})")
            )

    def stale_items(self, model: str, dim: int) -> list[StaleItem]:
        """Every item with vectors that another model, or ``model`` at another length, computed,
        by id. Refused (:class:`ConfigError`) when the callers' own vectors have another length
        than ``dim``: computing the others again would leave the store two dimensions."""
        with self._lock:
            theirs = self._db.scalar("SELECT length(vec) / 4 FROM item_vectors WHERE model IS NULL LIMIT 1")
            rows = self._db.query(
                "SELECT v.item_id, i.value, json_group_array(v.field) FROM item_vectors v"
                " JOIN items i ON i.id = v.item_id"
                " WHERE v.model IS NOT NULL AND (v.model != ? OR length(v.vec) != ?)"
                " GROUP BY v.item_id ORDER BY v.item_id",
                (model, dim * 4),
            )
        if rows and theirs is not None and int(theirs) != dim:
            raise ConfigError(
                f"the item store holds vectors given with the items ({int(theirs)} numbers) and "
                f"vectors of another model; the model {model!r} gives {dim}: put those items again "
                "with vectors of this length, or without vectors"
            )
        return [(int(r[0]), orjson.loads(r[1]), orjson.loads(r[2])) for r in rows]

    def replace_vectors(self, vectors: Sequence[tuple[int, str, Sequence[float] | None]], model: str) -> None:
        """Store ``(item id, field, vector)`` as computed by ``model``, all in one transaction
        (the store never holds two lengths); a ``None`` vector drops the field's (its text is
        gone from the value)."""
        rows = [(i, f, None if v is None else vector_blob(v, f"vector of {f!r}")) for i, f, v in vectors]
        with self._lock, self._db.transaction():
            self._writes += 1
            for item_id, field, blob in rows:
                if blob is None:
                    self._db.execute(_DROP, (item_id, field))
                else:
                    self._db.execute(_SET, (blob, model, item_id, field))
            dims = self._db.query("SELECT DISTINCT length(vec) / 4 FROM item_vectors")
            if len(dims) > 1:
                raise ConfigError(
                    f"the model {model!r}'s vectors and the item store's others differ in length "
                    f"({sorted(int(d[0]) for d in dims)}): nothing was changed"
                )
