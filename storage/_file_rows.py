"""Rows of an array in an index file, read with ``pread`` rather than through the file's map.

A search reads its final few float32 rows this way: a read copies the row out of the page cache
and maps nothing, where touching the row through the map would map a page (and the kernel maps up
to 64 KB around it), pages that stay in the process's resident memory until it exits. The rows of
the last read are kept: a search reads its best rows twice (scored again in float32, then the
hits it reports), and the second read, of some of the same rows, then costs no system call.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import numpy as np
import numpy.typing as npt

from ._array_types import IntArray

__all__ = ["FileRows", "OpenFile"]


class OpenFile:
    """A file descriptor of its own, closed when the last holder lets go of it."""

    def __init__(self, fd: int) -> None:
        self.fd = os.dup(fd)  # the same open file as the map was made from, even if renamed over
        self._closer = weakref.finalize(self, os.close, self.fd)

    def close(self) -> None:
        self._closer()


class FileRows:
    """The rows of a 2-D array stored at ``offset`` of ``file``."""

    def __init__(self, file: OpenFile, offset: int, dtype: Any, width: int, rows: int) -> None:
        self.file = file
        self.offset = offset
        self.dtype = np.dtype(dtype)
        self.width = width
        self.rows = rows
        self.row_bytes = self.dtype.itemsize * width
        # the last read: its positions in ascending order and their rows (the file never changes)
        self._last: tuple[IntArray, npt.NDArray[Any]] | None = None

    def read(self, positions: IntArray) -> npt.NDArray[Any]:
        """The rows at ``positions`` (each ``< rows``), as an array of their own."""
        last = self._last
        if last is not None and len(positions):
            kept, rows = last
            at = np.minimum(np.searchsorted(kept, positions), len(kept) - 1)
            if np.array_equal(kept[at], positions):
                return rows[at]
        fd, size, offset = self.file.fd, self.row_bytes, self.offset
        data = b"".join(os.pread(fd, size, offset + p * size) for p in positions.tolist())
        if len(data) != size * len(positions):
            raise OSError(f"index file shorter than its rows: {len(data)} of {size * len(positions)} bytes")
        out = np.frombuffer(data, dtype=self.dtype).reshape(len(positions), self.width)
        if len(positions):
            order = np.argsort(positions, kind="stable")
            self._last = (np.asarray(positions)[order], out[order])
        return out
