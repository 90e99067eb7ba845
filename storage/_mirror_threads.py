"""Threads for a mirror's scans: one BLAS thread, and two cores or one as the load allows.

A search through the inverted lists scores ~100 slices of a few hundred rows each with
``np.matmul`` (BLAS ``sgemv``: single-threaded, the fastest kernel for a slice). OpenBLAS hands any
product over ~9k elements to its own threads, so each slice would wake a second thread: on two
cores, beside the helper thread the scan already uses, that costs more than the product
(measured on a loaded machine, 108 slices of 305 x 384: 2.9-4.5 ms with BLAS threads, 1.8 ms
without). While a scan runs, OpenBLAS is held at one thread; other BLAS libraries are left alone.

Splitting a scan over two cores (:func:`._vector_kernels.in_two`) takes ~70% of the time on an
idle machine and up to twice as long on a loaded one, where waking the helper thread waits for a
core; :class:`TwoOrOne` keeps the cost per row of either way and takes the cheaper.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy  # noqa: F401 - loads the BLAS the controller is to find
from threadpoolctl import ThreadpoolController

__all__ = ["TwoOrOne", "one_blas_thread"]


def _controls() -> tuple[Callable[[int], None], Callable[[], int]] | None:
    """numpy's OpenBLAS thread setter and getter, or ``None`` when numpy uses another BLAS."""
    for library in ThreadpoolController().select(internal_api="openblas").lib_controllers:
        return library.set_num_threads, lambda found=library: int(found.get_num_threads())
    return None


_CONTROLS = _controls()
_LOCK = threading.Lock()
_ACTIVE = [0, 0]  # scans running, threads to restore when the last one ends


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """OpenBLAS on one thread until the last concurrent scan ends (then as it was)."""
    if _CONTROLS is None:
        yield
        return
    setter, getter = _CONTROLS
    with _LOCK:
        if _ACTIVE[0] == 0:
            _ACTIVE[1] = getter()
            if _ACTIVE[1] > 1:
                setter(1)
        _ACTIVE[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _ACTIVE[0] -= 1
            if _ACTIVE[0] == 0 and _ACTIVE[1] > 1:
                setter(_ACTIVE[1])


class TwoOrOne:
    """Whether a large scan is split over two threads, by each way's measured seconds per row
    (a moving average); the other way is tried once every ``_EXPLORE`` scans, as load changes."""

    _EXPLORE = 64
    MIN_ROWS = 16_384  # smaller scans are never split (``in_two``'s own bound)

    def __init__(self) -> None:
        self.cost = [0.0, 0.0]  # seconds per row: one thread, two threads (0: not measured yet)
        self.scans = 0

    def split(self, rows: int) -> bool:
        """Split this scan of ``rows`` rows?"""
        if rows < self.MIN_ROWS:
            return False
        self.scans += 1
        one, two = self.cost
        if not one or not two:
            return bool(one)  # measure one thread first, then two
        cheaper = two < one
        return cheaper != (self.scans % self._EXPLORE == 0)

    def timed(self, split: bool, rows: int, started: float) -> None:
        """Record a scan begun at ``started`` (``time.perf_counter``)."""
        if rows < self.MIN_ROWS:
            return
        per_row = (time.perf_counter() - started) / rows
        known = self.cost[split]
        self.cost[split] = per_row if not known else 0.8 * known + 0.2 * per_row
