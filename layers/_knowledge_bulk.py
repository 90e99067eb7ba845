"""Bulk loads of knowledge: the next batch prepared on a worker thread while the writer writes
this one, the load's own rows deduplicated in memory, and the cyclic collector paused.

The writer's thread alone uses the connection; the worker runs Python and numpy only.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from memstrata.storage import FloatArray

from ._knowledge_rows import RowPlan, row_plan
from ._knowledge_schema import _Item

__all__ = ["Ahead", "OwnRows", "Prepared", "cycles_paused", "prepare"]

Prepare = Callable[[int], "Prepared"]


def _unit_rows(rows: FloatArray, lengths: npt.NDArray[np.float64], start: int, end: int) -> FloatArray:
    """``rows[start:end]`` divided by their lengths, in float32 unless a length is too large
    for it (a finite row of huge values: float64 then)."""
    part = lengths[start:end, None]
    if part.size and float(part.max()) < 1e30:
        return np.asarray(rows[start:end] / part.astype(np.float32), dtype=np.float32)
    return np.asarray(rows[start:end] / part, dtype=np.float32)


@dataclass(slots=True)
class Prepared:
    """A batch prepared ahead (see :class:`Ahead`): its normalised vectors, dedup keys, and
    the plan of its rows should every item be new."""

    part: FloatArray | None
    keys: list[tuple[bytes, str, str]]
    unique: bool
    plan: RowPlan


def prepare(
    batch: Sequence[_Item], given: tuple[FloatArray, npt.NDArray[np.float64]] | None, start: int, end: int
) -> Prepared:
    """Everything of a batch that depends on its items alone; no database (a worker runs it)."""
    for item in batch:
        item.prepare()
    keys = [item.key for item in batch]
    part = None if given is None else _unit_rows(*given, start, end)  # no copy of the whole input
    return Prepared(part, keys, len(set(keys)) == len(keys), row_plan(batch))


@contextlib.contextmanager
def cycles_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused, if it runs, until the block ends.

    A bulk load allocates a few container objects per item that all live until it ends; with
    100k items the collector's full passes, re-walking every one of them, took ~0.34 s of a
    ~4.6 s load. Objects are still freed when their last reference goes; only cycles wait
    for the collector, which runs again (as before) at the end.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class OwnRows:
    """The entries of a bulk load into an empty store, while nothing else writes to it.

    While the store holds only what this call wrote (it was empty when the call began, and no
    commit from elsewhere nor any other write on this connection came between its batches:
    ``PRAGMA data_version`` and the connection's change count are where the last batch left
    them), a batch's duplicates are found here instead of by probing the dedup index for every
    item. Any other write turns it off for the rest of the call.
    """

    def __init__(self) -> None:
        self.ids: dict[tuple[bytes, str, str], int] = {}
        self.mark: tuple[int, int] | None = None
        self.off = False

    def usable(self, db: Any, empty: Callable[[], bool]) -> bool:
        if not self.off:
            now = (db.data_version(), db.conn.total_changes)
            self.off = now != self.mark if self.mark is not None else not empty()
        return not self.off

    def settle(self, db: Any) -> None:
        if not self.off:
            self.mark = (db.data_version(), db.conn.total_changes)


class Ahead:
    """Batches prepared one ahead of the writer: ``prepare(start)`` (hashes, indexed texts, row
    tuples, normalised vectors: pure Python and numpy, no database) runs for batch k+1 on one worker
    thread while the writer's thread, which alone uses the connection, writes batch k.

    SQLite releases the GIL while it executes a statement, so the worker uses the second core
    then; :meth:`start_next` is called where the writer enters its long statements (the
    full-text ``INSERT ... SELECT`` and the commit), because during the short per-row steps of
    an ``executemany`` the two threads would only take turns. Batches are handed out in order;
    an error of ``prepare`` is raised (the same exception) when its batch is taken, before
    anything of that batch is written. One batch: no thread.
    """

    def __init__(self, prepare: Prepare, starts: Sequence[int]) -> None:
        self._prepare = prepare
        self._starts = list(starts)
        self._at = -1  # index of the batch handed out last
        self._future: Future[Prepared] | None = None  # of batch _at + 1, once started
        self._pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="memstrata-ingest")
            if len(self._starts) > 1
            else None
        )

    def __iter__(self) -> Iterator[tuple[int, Prepared]]:
        for index, start in enumerate(self._starts):
            future, self._future = self._future, None
            part = self._prepare(start) if future is None else future.result()
            self._at = index
            yield start, part

    def start_next(self) -> None:
        """Start preparing the batch after the one handed out last (once; no-op at the end)."""
        if self._pool is None or self._future is not None or self._at + 1 >= len(self._starts):
            return
        self._future = self._pool.submit(self._prepare, self._starts[self._at + 1])

    def close(self) -> None:
        """Wait for the worker (a batch being prepared when the write failed is dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
