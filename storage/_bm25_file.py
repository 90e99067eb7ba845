"""The BM25 caches saved in an index file beside the database, and mapped by the next process.

The document lengths and the postings read so far are written (:mod:`._index_files`) when the
connection closes; a new process maps them instead of reading ``_docsize`` again, after checking
the file against FTS5's own structure and averages records (both change with every write).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import numpy.typing as npt

from ._bm25_postings import _PHRASE, Bm25Postings
from ._index_files import (
    DamagedFile,
    database_token,
    ensure_token,
    index_path,
    persist_at_close,
    read_index,
    write_index,
)

__all__ = ["Bm25Files"]

_SAVED_POSTINGS = 4_000_000  # postings written to the index file at most
_REREAD_STEMS = 256  # stems whose postings are read again for the file when the index changed

log = logging.getLogger("memstrata.storage")


class Bm25Files(Bm25Postings):
    """Loading the caches of :class:`Bm25Postings` from the index file, and saving them to it."""

    # class defaults: the constructor need not know about the file
    files_loaded = 0  # document lengths taken from the index file instead of SQLite
    files_saved = 0
    files_rejected = 0
    files_note: str | None = None
    _file_mark: str | None = None  # the FTS5 records the saved file reflects
    _file_stems = 0  # stems in that file
    _hooked = False

    def _hook_close(self) -> None:
        if self._hooked:
            return
        self._hooked = True
        persist_at_close(self._db, self.persist)

    def files_status(self) -> dict[str, Any]:
        return {
            "loaded": self.files_loaded,
            "saved": self.files_saved,
            "rejected": self.files_rejected,
            "note": self.files_note,
        }

    def _refuse(self, note: str, warn: bool) -> bool:
        self.files_rejected += 1
        self.files_note = note
        if warn:
            log.warning("%s", note)
        return False

    def _load_sizes(self) -> None:
        if self._loaded:
            return
        self._hook_close()
        if self._load_file():
            return
        self._read_sizes()

    def _load_file(self) -> bool:
        """Take the document lengths and postings from the index file when it reflects the
        index as it is now (same database token, same FTS5 records, same columns and weights)."""
        path = index_path(self._db, f"bm25-{self._fts}")
        if path is None:
            return False
        try:
            found = read_index(path)
        except DamagedFile as exc:
            return self._refuse(f"index file {path} is damaged ({exc}); rebuilding it", True)
        if found is None:
            return False
        meta, arrays = found.meta, found.arrays
        if meta.get("kind") != "bm25" or meta.get("fts") != self._fts:
            return self._refuse(f"index file {path} belongs to another table; rebuilding it", True)
        token = database_token(self._db)
        if token is None or meta.get("token") != token:
            return self._refuse(f"index file {path} was written for another database", False)
        if meta.get("columns") != self._columns or meta.get("weights") != self._weights:
            return self._refuse(f"index file {path} was written with other column weights", False)
        mark = self._index_mark()
        if mark is None or meta.get("mark") != mark:
            return self._refuse(f"index file {path} is older than the index", False)
        try:
            stems = [str(stem) for stem in meta["stems"]]
            ids, sizes = arrays["ids"], arrays["sizes"]
            offsets, positions, tfs = arrays["offsets"], arrays["positions"], arrays["tf"]
        except (KeyError, TypeError) as exc:
            return self._refuse(f"index file {path} is damaged (missing {exc}); rebuilding it", True)
        n = len(ids)
        if (
            ids.dtype != np.int64
            or sizes.dtype != np.float64
            or offsets.dtype != np.int64
            or positions.dtype != np.int32
            or tfs.dtype != np.float64
            or len(sizes) != n
            or len(offsets) != len(stems) + 1
            or int(offsets[0]) != 0
            or int(offsets[-1]) != len(positions)
            or len(tfs) != len(positions)
            or bool(np.any(np.diff(offsets) < 0))
            or bool(np.any(np.diff(ids) <= 0))
            or (len(positions) and (int(positions.min()) < 0 or int(positions.max()) >= n))
            or not _ascending_within(positions, offsets)
        ):
            return self._refuse(f"index file {path} is damaged (arrays do not fit); rebuilding it", True)
        self._ids, self._sizes = ids, sizes
        self._alive = np.ones(n, dtype=bool)
        self._live = n
        self._total = float(sizes.sum())
        bounds = offsets.tolist()
        self._postings = {  # the file lists the most recently used first; the cache keeps them last
            stems[i]: (positions[bounds[i] : bounds[i + 1]], tfs[bounds[i] : bounds[i + 1]])
            for i in reversed(range(len(stems)))
        }
        self._cached = len(positions)
        self._loaded = True
        self._mark = self._file_mark = mark
        self._file_stems = len(stems)
        self.files_loaded += 1
        self.files_note = None
        return True

    def persist(self) -> None:
        """Write the document lengths and the cached postings to the index file, as they are
        in the database now (re-read if this connection's view changed since they were loaded).
        Called when the connection closes; best effort, never raises."""
        from . import _index_files

        db = self._db
        if not self._loaded or db.read_only or db.in_transaction or db.conn.in_transaction:
            return
        if len(self._ids) < _index_files.MIN_ROWS:
            return
        path = index_path(db, f"bm25-{self._fts}")
        if path is None:
            return
        try:
            mark = self._index_mark()
            if mark is None or (mark == self._file_mark and len(self._postings) <= self._file_stems):
                return  # the file on disk is as good as what this process holds
            if self._mark != mark:  # patched by writes, or another connection wrote: read afresh
                stems = [stem for stem in self._postings if _PHRASE not in stem][:_REREAD_STEMS]
                self._reset()
                self._version = self._current_version()
                self._read_sizes()
                for stem in stems:
                    self._postings_of(stem)
                if self._mark != mark:
                    return
            token = ensure_token(db)
            if token is None:
                return
            stems, chunks, tf_chunks, total = [], [], [], 0
            for stem, (pos, tf) in reversed(self._postings.items()):  # the most recently used first
                if total + len(pos) > _SAVED_POSTINGS:
                    break
                stems.append(stem)
                chunks.append(pos)
                tf_chunks.append(tf)
                total += len(pos)
            offsets = np.zeros(len(stems) + 1, dtype=np.int64)
            offsets[1:] = np.cumsum([len(c) for c in chunks]) if chunks else []
            meta = {
                "kind": "bm25",
                "fts": self._fts,
                "token": token,
                "mark": mark,
                "columns": self._columns,
                "weights": self._weights,
                "stems": stems,
            }
            arrays: dict[str, npt.NDArray[Any]] = {
                "ids": np.ascontiguousarray(self._ids, dtype=np.int64),
                "sizes": np.ascontiguousarray(self._sizes, dtype=np.float64),
                "offsets": offsets,
                "positions": np.concatenate(chunks).astype(np.int32) if chunks else np.zeros(0, np.int32),
                "tf": np.concatenate(tf_chunks).astype(np.float64) if chunks else np.zeros(0, np.float64),
            }
            if write_index(path, meta, arrays):
                self.files_saved += 1
                self._file_mark, self._file_stems = mark, len(stems)
        except Exception as exc:  # a cache: the next process reads the database
            log.debug("index file %s not written: %s", path, exc)


def _ascending_within(positions: npt.NDArray[np.int32], offsets: npt.NDArray[np.int64]) -> bool:
    """Each stem's positions rise strictly (the top-k search looks documents up in them)."""
    falls = np.flatnonzero(np.diff(positions) <= 0) + 1
    return bool(np.isin(falls, offsets[1:-1]).all())
