"""Keeping a :class:`VectorIndex`'s in-memory mirror in line with the durable vectors.

Every write runs through :meth:`MirrorUpkeep._write`, which appends the changed rowids to the
change log in the same transaction and brings a current mirror along. Each entry carries a random
``stamp``: an index file records the stamp of the entry it reflects, so that a database restored
from a backup, whose later writes reach the same positions with the same rowids, is not taken for
the history the file saw (:mod:`._vector_index_file`). A mirror remembers the last
change-log entry it reflects. When another connection commits (``PRAGMA data_version`` moves) it
reads only the newer entries and re-reads those rows; it reloads everything only when the log
cannot explain the gap (pruned past it, a ``reset``). Rollbacks on the same connection are
recorded per table so mirrors re-read the rows they touched. Separate from :mod:`._vectors`,
which holds the schema, the row writes and the searches; :class:`MirrorUpkeep` is its base class.

The pieces it builds on each hold one concern: :mod:`._vector_freshness` (is the mirror current),
:mod:`._vector_rows` (reading rows), :mod:`._vector_stored_lists` (the inverted lists kept in the
database) and :mod:`._vector_index_file` (the mirror's file beside the database). The file is
written after a full load or a partition build, when it lags far behind, and at close.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

from ._heap import trim_heap
from ._vec0_chunks import snapshot
from ._vector_freshness import _OP_DELETE, _OP_RESET, _OP_UPSERT, _rollbacks
from ._vector_index_file import MirrorFiles
from ._vector_mirror import Mirror
from ._vector_stored_lists import StoredLists

# the op codes and the rollback records are imported from here by :mod:`._vectors`
__all__ = ["_OP_DELETE", "_OP_RESET", "_OP_UPSERT", "MirrorUpkeep", "_rollbacks"]

LOG_KEEP = 100_000  # change-log entries kept; a mirror further behind reloads fully
_LOG_SLACK = 10_000  # prune only when this many entries beyond LOG_KEEP have piled up


class MirrorUpkeep(MirrorFiles, StoredLists):
    """The mirror upkeep of :class:`VectorIndex` (its base): change log, reload, catch-up."""

    # -- the change log, written with every write -------------------------------------------

    def _create_log(self) -> None:
        """Create the change log and the stored lists' table, or give a change log from before
        the stamps its ``stamp`` column (entries already there keep none: NULL); in the caller's
        write transaction, at open."""
        self.db.execute(
            f"CREATE TABLE IF NOT EXISTS {self.log_table} (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
            "item INTEGER NOT NULL, op INTEGER NOT NULL, stamp INTEGER)"
        )
        if not self._log_is_stamped():
            self.db.execute(f"ALTER TABLE {self.log_table} ADD COLUMN stamp INTEGER")
        # the inverted lists last built, so that the next process need not build them
        self.db.execute(
            f"CREATE TABLE IF NOT EXISTS {self.partition_table} "
            "(id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL, dim INTEGER NOT NULL, "
            "trained_rows INTEGER NOT NULL, centroids BLOB NOT NULL, rowids BLOB NOT NULL, "
            "sizes BLOB NOT NULL)"
        )

    def _log_is_stamped(self) -> bool:
        """Whether the change log has its ``stamp`` column (a read-only database from before it
        has none: its entries are compared without stamps)."""
        found = self.db.scalar("SELECT 1 FROM pragma_table_info(?) WHERE name = 'stamp'", (self.log_table,))
        return found is not None

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
        if rowids:  # one statement, in the given order (json_each yields its rows by rowid)
            stamp = ", stamp" if self._log_stamped else ""
            value = ", random()" if self._log_stamped else ""  # SQLite's, seeded from the OS
            self.db.execute(
                f"INSERT INTO {self.log_table}(item, op{stamp}) SELECT value, {op}{value} "
                "FROM json_each(?) ORDER BY rowid",
                (json.dumps([int(r) for r in rowids]),),
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

    def _mirror_now(self) -> Mirror:
        if self._mirror is None or not self._has_log:
            if self._mirror is None or not self._is_current():
                self._reload()
        elif not self._is_current():
            self._catch_up()
        assert self._mirror is not None
        mirror = self._mirror
        if self._files_due or self._files_lag() >= max(20_000, mirror.live // 10):
            self._settle(mirror)
        return mirror

    def _settle(self, mirror: Mirror) -> None:
        """Bring the partition up to date (storing new lists), then write the index file."""
        built = mirror.partitions_built
        mirror.maintain(self.approximate_from)
        if mirror.partitions_built != built:
            self._save_partition(mirror)  # writes the index file too
            trim_heap()
        else:
            self._save_files()

    def _reload(self) -> None:
        if self._has_log and self._load_files():
            return
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
        self._files_due = self._has_log
        self._hook_close()
        trim_heap()  # the load's temporaries: tens of MB that would otherwise stay resident

    def _save_partition(self, mirror: Mirror) -> None:
        """Store the lists just built in the database and in the index file."""
        self._store_lists(mirror)
        self._files_due = True
        self._save_files()

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
