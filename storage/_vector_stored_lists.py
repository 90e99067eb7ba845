"""The inverted lists of a vector mirror stored in the database and adopted again at load.

A list build at scale takes seconds; storing its centroids and row order lets the next process
skip it when the change log explains every change since the build.
"""

from __future__ import annotations

import numpy as np

from ._distinct import distinct
from ._vector_freshness import _OP_RESET, MirrorState
from ._vector_mirror import Mirror

__all__ = ["StoredLists"]


class StoredLists(MirrorState):
    """Saving and restoring the mirror's partition (its inverted lists) in ``<name>_vec_lists``."""

    def _store_lists(self, mirror: Mirror) -> None:
        """Store the lists just built (centroids and the rowids in list order, ~10 MB at 1M rows).

        Best effort, never waiting: when another connection holds the write lock, or the
        database is read-only, the next process builds its own lists.
        """
        part = mirror.partition
        if part is None or not self._has_log or self.db.read_only or mirror.size != part.end:
            return
        ordered, sizes = mirror.list_order()  # rows are grouped by filter column, then list
        row = (
            self._log_seq,
            self.dim,
            part.trained_rows,
            part.centroids.astype(np.float32).tobytes(),
            ordered.astype(np.int64).tobytes(),
            sizes.astype(np.int64).tobytes(),
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
        """Adopt the stored lists if the change log explains every change since they were built
        (a mirror that sieves by sign codes has no lists)."""
        if mirror.can_sieve:
            return
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
        changed = distinct(np.array([int(item) for item, _ in entries], dtype=np.int64))
        mirror.adopt(centroids, ordered, sizes, int(trained_rows), changed)
