"""Keeping a :class:`VectorIndex`'s in-memory mirror in line with the durable vectors.

Every write runs through :meth:`MirrorUpkeep._write`, which appends the changed rowids to the
change log in the same transaction and brings a current mirror along. A mirror remembers the last
change-log entry it reflects. When another connection commits (``PRAGMA data_version`` moves) it
reads only the newer entries and re-reads those rows; it reloads everything only when the log
cannot explain the gap (pruned past it, a ``reset``). Rollbacks on the same connection are
recorded per table so mirrors re-read the rows they touched. The inverted lists built at scale are
saved and restored here too. Separate from :mod:`._vectors`, which holds the schema, the row
writes and the searches; :class:`MirrorUpkeep` is its base class.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ._connection import Database
from ._heap import trim_heap
from ._migrations import get_meta
from ._vec0_chunks import read_rows, snapshot, spare_rows
from ._vector_mirror import Mirror

__all__ = ["MirrorUpkeep"]

FloatArray = npt.NDArray[np.float32]
LOG_KEEP = 100_000  # change-log entries kept; a mirror further behind reloads fully
_LOG_SLACK = 10_000  # prune only when this many entries beyond LOG_KEEP have piled up
_ROOM = 0.25  # spare rows allocated with a loaded mirror, as a share of its rows
_OP_UPSERT, _OP_DELETE, _OP_RESET = 1, 2, 3


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


class MirrorUpkeep:
    """The mirror upkeep of :class:`VectorIndex` (its base): reload, catch-up, stored lists."""

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

    # -- the change log, written with every write -------------------------------------------

    def _write(
        self, write: Callable[[], Callable[[Mirror], None] | None], logged: Sequence[int], op: int
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

    # -- catching up -----------------------------------------------------------------------

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

    def _mirror_now(self) -> Mirror:
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

    def _save_partition(self, mirror: Mirror) -> None:
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

    def _restore_partition(self, mirror: Mirror) -> None:
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
