"""The consistency check a store runs when it opens, kept off the path of its first answer.

:func:`check_consistency` compares a store's rows with its full-text indexes and vectors at every
open: no stored mark is trusted. On a large store that costs ~0.2 s per million rows, more than
the first search itself. So a store opens with an :class:`OpenCheck`:

* a small database (under :data:`BACKGROUND_FROM_BYTES`) is checked, and repaired, at once, as
  before;
* a large one is *examined* on a thread with a read-only connection of its own, on one snapshot
  (:func:`examine_consistency`: the same counts and fingerprints, no repair), while the store
  answers. The owner settles it on its own thread at the start of its next call
  (:meth:`OpenCheck.settle`): an examination that found everything in agreement becomes the
  report; one that found a difference (rare: a hand edit, a crash of an older version, a process
  without sqlite-vec) runs the repairing :func:`check_consistency` there, under the write lock,
  exactly as an open used to. The calls made before that see the store as it is: a row that
  lacks its vector or its full-text entry is missed by that side of a search until the repair,
  nothing worse.

:meth:`OpenCheck.report` (a store's ``status()``) waits for the examination. Closing the store
stops it (its statements are aborted through SQLite's progress handler) and waits for its thread,
so no thread or connection outlives the store, and a process that opens a store to answer one
query (``memstrata query``) does not wait for a check it would not act on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from ._connection import Database, open_database
from ._consistency import CheckSpec, CheckTarget, ConsistencyReport, examine_consistency

__all__ = ["BACKGROUND_FROM_BYTES", "OpenCheck"]

log = logging.getLogger("memstrata.storage")

# from this database size on (about 100k entries), the open's check is examined on a thread
BACKGROUND_FROM_BYTES = 64 * 1024 * 1024
_PROGRESS_STEPS = 10_000  # SQLite instructions between two looks at whether to stop (~0.1 ms)


class OpenCheck:
    """One store's open-time check (see the module docstring).

    ``check`` runs the repairing :func:`check_consistency` on the owner's connection and returns
    its report; ``target`` is what it compares (as the store passes it to
    :func:`check_consistency`), for the examination on another connection.
    """

    def __init__(self, db: Database, target: CheckTarget, check: Callable[[], ConsistencyReport]) -> None:
        self._check = check
        self._report: ConsistencyReport | None = None
        self._examined: list[ConsistencyReport | None] = []
        self._failed: list[BaseException] = []
        self._thread: threading.Thread | None = None
        self._checking = False  # the repairing check runs (it may call back into the store)
        self._stop = threading.Event()  # closed: the examination's statements are aborted
        if _in_memory(db) or db.path.stat().st_size < BACKGROUND_FROM_BYTES:
            self._report = self._run_check()
            return
        spec = CheckSpec.of(db, **target)  # plain names: the examination's connection uses them
        self._thread = threading.Thread(
            target=self._examine, args=(db.path, spec), name="memstrata-open-check", daemon=True
        )
        self._thread.start()

    def _examine(self, path: Path, spec: CheckSpec) -> None:
        try:
            reader = open_database(path, read_only=True, load_vec=False)
            reader.conn.set_progress_handler(self._stop.is_set, _PROGRESS_STEPS)
            try:
                if not self._stop.is_set():
                    self._examined.append(examine_consistency(reader, spec))
            finally:
                reader.close()
        except BaseException as exc:  # settled on the owner's thread: the check runs there
            if not self._stop.is_set():
                self._failed.append(exc)

    @property
    def pending(self) -> bool:
        """The examination is still running."""
        return self._thread is not None and self._thread.is_alive()

    def settle(self, *, wait: bool = False) -> ConsistencyReport | None:
        """The check's report once known, on the owner's thread: an examination that finished
        clean is the report; one that found a difference (or failed) runs the repairing check
        now. ``None`` while the examination runs (``wait``: wait for it)."""
        if self._report is not None or self._checking:
            return self._report
        thread = self._thread
        if thread is not None:
            if not wait and thread.is_alive():
                return None
            thread.join()
        examined = self._examined[0] if self._examined else None
        if examined is None:
            if self._failed:
                log.warning(
                    "consistency examination failed (%s); checking on the store's connection", self._failed[0]
                )
            examined = self._run_check()
        self._report, self._thread = examined, None
        return examined

    def _run_check(self) -> ConsistencyReport:
        self._checking = True
        try:
            return self._check()
        finally:
            self._checking = False

    def report(self) -> ConsistencyReport:
        """The check's report, waiting for the examination (and repairing) if needed."""
        report = self.settle(wait=True)
        assert report is not None
        return report

    def close(self) -> None:
        """Stop the examination and wait for its thread: its connection goes before the store's
        (nothing is repaired; the next open examines again)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()


def _in_memory(db: Database) -> bool:
    return str(db.path) == ":memory:"
