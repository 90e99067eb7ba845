"""Whether a vector mirror still reflects the durable vectors, and the state it is judged by.

A mirror is current when this connection wrote nothing since (its write generation), no rollback
undid rows it had taken (the per-connection rollback records) and no other connection committed
(``PRAGMA data_version``). These are shared by the row reads, the stored lists, the index file and
the upkeep of :mod:`._vector_sync`, so they sit below all of them.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

from ._connection import Database
from ._vector_mirror import Mirror

__all__ = ["MirrorState"]

_OP_UPSERT, _OP_DELETE, _OP_RESET = 1, 2, 3  # change-log operations


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


class MirrorState:
    """What a :class:`VectorIndex` keeps about its mirror, and whether that mirror is current."""

    db: Database
    name: str
    dim: int
    backend: str
    metadata: dict[str, str]
    approximate_from: int | None
    _has_log: bool
    _mirror: Mirror | None
    _data_version: int
    _seen_generation: int
    _rollbacks_seen: int
    _log_seq: int
    reloads: int
    refreshes: int
    last_reload_seconds: float

    @property
    def table(self) -> str:
        return f"{self.name}_vec"

    @property
    def log_table(self) -> str:
        return f"{self.name}_vec_log"

    @property
    def partition_table(self) -> str:
        return f"{self.name}_vec_lists"

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
