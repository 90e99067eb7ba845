"""Reading a vector table's rows (vectors and metadata columns) into a mirror.

Apart from the freshness checks and the change log: this is the one place that knows how rows are
read back, through the vec0 chunk tables when it can and plain SQL otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ._array_types import FloatArray
from ._migrations import get_meta
from ._vec0_chunks import read_rows, spare_rows
from ._vector_freshness import MirrorState
from ._vector_mirror import Mirror

__all__ = ["MirrorRows"]

_ROOM = 0.25  # spare rows allocated with a loaded mirror, as a share of its rows


class MirrorRows(MirrorState):
    """Rows of the store read into (or re-read for) the mirror."""

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

    def _load(self) -> Mirror:
        stored_dim = get_meta(self.db, f"vector_dim:{self.name}")
        if stored_dim is not None and int(stored_dim) != self.dim:  # reset by another connection
            self.dim = int(stored_dim)
            self.backend = get_meta(self.db, f"vector_backend:{self.name}") or self.backend
        rows = self._read(None, room=_ROOM)
        return Mirror.bulk(self.dim, list(self.metadata), rows.rowids, rows.storage, rows.metas)

    def _read_vec0_chunks(self) -> tuple[list[int], FloatArray] | None:
        """All vectors of a vec0 table read from its chunk tables, or ``None`` (layout surprise)."""
        rows = read_rows(self.db, self.table, self.dim, list(self.metadata.items()))
        return None if rows is None else (rows.rowids.tolist(), rows.vectors)


@dataclass
class _Rows:
    rowids: npt.NDArray[np.int64]
    storage: FloatArray  # the vectors of ``rowids`` first, then any spare rows
    metas: dict[str, list[Any]]
