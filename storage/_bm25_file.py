"""The BM25 caches saved in an index file beside the database, and mapped by the next process.

The document lengths and the postings read so far are written (:mod:`._index_files`) when the
connection closes; a new process maps them instead of reading ``_docsize`` again, after checking
the file against FTS5's own structure and averages records (both change with every write) and
the random stamp the database keeps for that state of them (:mod:`._bm25_stamp`: the records
alone cannot tell a database restored from a backup, and written again, from the file's history).

An index of ``_COMPLETE_FROM`` documents or more, or one of ``MIN_ROWS`` or more that a connection
has bulk-loaded (and kept so by the processes that use it), keeps every posting in its file
instead (read in one pass, :mod:`._bm25_bulk`: 10 s at a million entries, once per state of the
index), since reading a common word's postings from FTS5 at the first search that needs it cost
20-100 ms. Its words are taken from the map when first used, each checked then (document order,
range, a checksum per word), so opening it touches only the document lengths.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ._array_types import Bm25Floats
from ._bm25_bulk import AllPostings, read_all_postings, word_sums
from ._bm25_fit import ascending_within, postings_fit
from ._bm25_held import HeldPostings, held_postings
from ._bm25_postings import _PHRASE, Bm25Postings, Postings, _varints, appended
from ._bm25_stamp import vouch, vouched_stamp
from ._bm25_stems import StemTable, stem_arrays
from ._index_files import (
    DamagedFile,
    Pieces,
    database_token,
    index_path,
    persist_at_close,
    read_index,
    write_index,
)
from ._vec0_chunks import snapshot

__all__ = ["Bm25Files"]

_SAVED_POSTINGS = 4_000_000  # postings written to the index file at most
_REREAD_STEMS = 256  # stems whose postings are read again for the file when the index changed
# postings read from FTS5 (not the file) from which a process rewrites a file still current at
# close: reading 50k postings again costs ~7 ms, writing and syncing the file at 100k entries
# 8-16 ms (a `memstrata query` process reads a few words, and paid that at every close)
_WORTH_WRITING = 50_000
# from this many documents the file holds every posting (below, the first read of a common word
# costs a few milliseconds; at a million documents, 20-100 ms) ...
_COMPLETE_FROM = 200_000
# ... and from ``MIN_ROWS`` after a bulk load: a connection that added this share of the index's
# documents pays the full read at its close (~2.5 s at 100k), as large indexes do after any write;
# a process searching the loaded index then reads no word from FTS5, and one that used the
# complete file keeps it complete at its close. A process that found the file out of date keeps
# the words it read instead (reading all again would be on every `memstrata query` after a write).
_BULK_SHARE = 0.5
_LAYOUT = 2  # the file's words are arrays (:mod:`._bm25_stems`); in layout 1 its header listed them

log = logging.getLogger("memstrata.storage")


def _listed_words(listed: Any) -> StemTable | None:
    """The words a file of layout 1 listed in its header, as a table; ``None``: not a list of words."""
    if not isinstance(listed, list) or not all(isinstance(stem, str) for stem in listed):
        return None
    return StemTable.of(stem_arrays(listed))


class Bm25Files(Bm25Postings):
    """Loading the caches of :class:`Bm25Postings` from the index file, and saving them to it."""

    # class defaults: the constructor need not know about the file
    files_loaded = 0  # document lengths taken from the index file instead of SQLite
    files_saved = 0
    files_from_memory = 0  # complete files written from the postings held, not read from FTS5
    files_rejected = 0
    files_note: str | None = None
    _file_mark: str | None = None  # the FTS5 records the saved file reflects
    _file_stems = 0  # stems in that file
    _file_complete = False  # that file holds every posting
    _file_damaged = False  # a word of it failed its checks: rewritten at close
    _hooked = False
    # a complete file's arrays: offsets by stem number, positions, tf, and each stem's checksums
    _map_arrays: tuple[npt.NDArray[Any], ...] = ()
    _map_path: Path | None = None

    def _reset(self) -> None:
        super()._reset()
        self._map_arrays = ()  # unmapped once no word refers to it

    def _opened(self) -> None:
        self._hook_close()  # a process that only writes still leaves the file of a large index

    def _hook_close(self) -> None:
        if self._hooked:
            return
        self._hooked = True
        persist_at_close(self._db, self.persist)

    def files_status(self) -> dict[str, Any]:
        """The index file: how often it was used, written and refused (and why, last)."""
        path = index_path(self._db, f"bm25-{self._fts}")
        return {
            "path": None if path is None else str(path),
            "loaded": self.files_loaded,
            "saved": self.files_saved,
            "rejected": self.files_rejected,
            "note": self.files_note,
            "complete": self._file_complete,
        }

    def _refuse(self, note: str, warn: bool) -> bool:
        """Count a file not taken; one refused with a warning (damaged, or another table's) is
        written again at close even where its header says it is current."""
        self.files_rejected += 1
        self.files_note = note
        if warn:
            self._file_damaged = True
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
        index as it is now (same database token, same FTS5 records and the database's stamp for
        them, same columns and weights)."""
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
        if not self._vouched(meta):
            why = "written in another history: a database restored from a backup?"
            why = why if "stamp" in meta else "written before the database kept stamps for its files"
            return self._refuse(f"index file {path} is not vouched for by the database ({why})", False)
        layout = meta.get("layout", 1)
        if layout not in (1, _LAYOUT):
            note = f"index file {path} has layout {layout!r}, not {_LAYOUT}; rewritten at close"
            return self._refuse(note, False)
        table = StemTable.of(arrays) if layout == _LAYOUT else _listed_words(meta.get("stems"))
        if table is None:
            return self._refuse(f"index file {path} is damaged (its words do not fit); rebuilding it", True)
        if meta.get("complete"):
            taken = self._map_complete(path, table, arrays, mark)
        else:
            taken = self._take_cached(path, table, arrays, mark)
        if taken and layout != _LAYOUT:
            self._file_mark = None  # used as it is, and written in this layout at close
        return taken

    def _take_cached(self, path: Path, table: StemTable, arrays: dict[str, Any], mark: str) -> bool:
        """Take the document lengths and the postings of the words a file holds (not every word)."""
        try:
            stems = table.stems()
            ids, sizes = arrays["ids"], arrays["sizes"]
            offsets, positions, tfs = arrays["offsets"], arrays["positions"], arrays["tf"]
        except (KeyError, UnicodeDecodeError) as exc:
            return self._refuse(f"index file {path} is damaged ({exc}); rebuilding it", True)
        n = len(ids)
        if (
            not postings_fit(len(stems), ids, sizes, offsets, positions, tfs, (np.float64,))
            or (len(positions) and (int(positions.min()) < 0 or int(positions.max()) >= n))
            or not ascending_within(positions, offsets)
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
        return self._took(mark, len(stems), complete=False)

    def _map_complete(self, path: Path, table: StemTable, arrays: dict[str, Any], mark: str) -> bool:
        """Take the document lengths of a complete file, and its words as a map (see the module
        docstring); only the small arrays are checked here."""
        try:
            ids, sizes = arrays["ids"], arrays["sizes"]
            offsets, positions, tfs = arrays["offsets"], arrays["positions"], arrays["tf"]
            pos_sums, tf_sums = arrays["pos_sums"], arrays["tf_sums"]
        except KeyError as exc:
            return self._refuse(f"index file {path} is damaged (missing {exc}); rebuilding it", True)
        n, words = len(ids), len(table)
        # a sum is finite only when every length is: one pass over them instead of two
        total = float(sizes.sum()) if sizes.dtype == np.float64 else math.nan
        if (
            not postings_fit(words, ids, sizes, offsets, positions, tfs, (np.float32, np.float64))
            or pos_sums.dtype != np.int64
            or tf_sums.dtype != np.uint64
            or len(pos_sums) != words
            or len(tf_sums) != words
            or not math.isfinite(total)
        ):
            return self._refuse(f"index file {path} is damaged (arrays do not fit); rebuilding it", True)
        self._ids, self._sizes = ids, sizes
        self._alive = np.ones(n, dtype=bool)
        self._live = n
        self._total = total
        self._postings = {}
        self._cached = 0
        self._views = set()
        self._mapped = table
        self._map_arrays = (offsets, positions, tfs, pos_sums, tf_sums)
        self._map_path = path
        return self._took(mark, words, complete=True)

    def _took(self, mark: str, stems: int, *, complete: bool) -> bool:
        """The caches now hold the file's state of the index (``mark``, ``stems`` words)."""
        self._loaded = True
        self._mark = self._file_mark = mark
        self._file_stems = stems
        self._file_complete = complete
        self._read = 0
        self.files_loaded += 1
        self.files_note = None
        return True

    def _mapped_count(self, stem: str) -> int | None:
        number = self._mapped.get(stem)
        if number is None or not self._map_arrays:
            return None
        offsets = self._map_arrays[0]
        added = self._map_added.get(stem)
        return int(offsets[number + 1] - offsets[number]) + (len(added[0]) if added else 0)

    def _mapped_postings(self, stem: str) -> Postings | None:
        """``stem``'s postings from the complete file, checked (ascending positions in range,
        positive counts, its checksums); a word that fails drops the whole map, with a warning."""
        number = self._mapped.get(stem)
        if number is None or not self._map_arrays:
            return None
        offsets, positions, tfs, pos_sums, tf_sums = self._map_arrays
        start, end = int(offsets[number]), int(offsets[number + 1])
        # the counts stay as stored (float32 for whole counts: no copy; scoring widens them)
        pos, tf = positions[start:end], tfs[start:end]
        sums = word_sums(pos, tf)
        if (
            len(pos)
            and (
                int(pos[0]) < 0
                or int(pos[-1]) >= len(self._ids)
                or bool(np.any(pos[1:] <= pos[:-1]))
                or not bool(np.all(tf > 0.0))
                or not bool(np.all(np.isfinite(tf)))
            )
        ) or (sums != (int(pos_sums[number]), int(tf_sums[number]))):
            self._drop_map()
            self._map_arrays = ()
            self._file_mark = None  # rewritten at close
            self._file_damaged = True
            self._refuse(f"index file {self._map_path} is damaged (postings of a word); rebuilding it", True)
            return None
        added = self._map_added.get(stem)
        if added is not None:  # documents this connection added since: after the file's ones
            return appended((pos, tf), added)
        return pos, tf

    def persist(self) -> None:
        """Write the document lengths and the postings to the index file, as they are in the
        database now: every posting for a large index (also when this process never searched
        it: after a bulk load), else the cached ones (re-read if this connection's view changed
        since they were loaded). Called when the connection closes; best effort, never raises."""
        from . import _index_files

        db = self._db
        if db.read_only or db.in_transaction or db.conn.in_transaction:
            return
        path = index_path(db, f"bm25-{self._fts}")
        if path is None:
            return
        try:
            rows = self._index_rows()
            bulk = rows is not None and self.docs_added >= rows * _BULK_SHARE
            if (
                rows is not None
                and rows >= _index_files.MIN_ROWS
                and (rows >= _COMPLETE_FROM or bulk or self._file_complete)
            ):
                self._persist_complete(path, bulk=bulk)
                return
            if not self._loaded or len(self._ids) < _index_files.MIN_ROWS:
                return
            mark = self._index_mark()
            if mark is None or (
                mark == self._file_mark and (self._file_complete or len(self._postings) <= self._file_stems)
            ):
                return  # the file on disk is as good as what this process holds, or holds every word
            if mark == self._file_mark and not self._file_complete and self._read < _WORTH_WRITING:
                return  # a few words read from FTS5: reading them again costs less than the write
            if self._mark != mark:  # patched by writes, or another connection wrote: read afresh
                stems = [stem for stem in self._postings if _PHRASE not in stem][:_REREAD_STEMS]
                self._reset()
                self._version = self._current_version()
                self._read_sizes()
                for stem in stems:
                    self._postings_of(stem)
                if self._mark != mark:
                    return
            vouched = vouch(db, self._fts, mark, self._index_mark)
            if vouched is None:
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
            meta = self._file_meta(vouched, mark)
            arrays: dict[str, npt.NDArray[Any]] = {
                **stem_arrays(stems),
                "ids": np.ascontiguousarray(self._ids, dtype=np.int64),
                "sizes": np.ascontiguousarray(self._sizes, dtype=np.float64),
                "offsets": offsets,
                "positions": np.concatenate(chunks).astype(np.int32) if chunks else np.zeros(0, np.int32),
                "tf": np.concatenate(tf_chunks).astype(np.float64) if chunks else np.zeros(0, np.float64),
            }
            if write_index(path, meta, arrays):
                self.files_saved += 1
                self._file_mark, self._file_stems, self._file_complete = mark, len(stems), False
                self._read = 0
        except Exception as exc:  # a cache: the next process reads the database
            log.debug("index file %s not written: %s", path, exc)

    def _file_meta(self, vouched: tuple[str, str], mark: str) -> dict[str, Any]:
        """The header of this index's file: the database (its token), table, state (the mark and
        the database's stamp for it) and weights it reflects, and the layout of its arrays."""
        token, stamp = vouched
        return {
            "kind": "bm25",
            "fts": self._fts,
            "token": token,
            "mark": mark,
            "stamp": stamp,
            "columns": self._columns,
            "weights": self._weights,
            "layout": _LAYOUT,
        }

    def _complete_file(self, path: Path) -> dict[str, Any] | None:
        """The header of the complete file at ``path`` written by an index like this one (same
        database, table, columns and weights); ``None`` for any other file."""
        try:
            found = read_index(path)
        except DamagedFile:
            return None
        if found is None:
            return None
        meta = found.meta
        ours = (
            meta.get("kind") == "bm25"
            and meta.get("fts") == self._fts
            and meta.get("token") == database_token(self._db)
            and meta.get("columns") == self._columns
            and meta.get("weights") == self._weights
            and meta.get("layout") == _LAYOUT
        )
        return meta if ours and meta.get("complete") and meta.get("mark") else None

    def _vouched(self, meta: dict[str, Any]) -> bool:
        """Whether the database keeps the stamp of a file with this header for the file's mark."""
        stamp = meta.get("stamp")
        return isinstance(stamp, str) and stamp == vouched_stamp(self._db, self._fts, str(meta.get("mark")))

    def _index_totals(self) -> tuple[int, int] | None:
        """The documents and the tokens FTS5 counts in its averages record (the documents, then
        each column's tokens), without reading the document lengths; ``None`` when it cannot be
        read."""
        try:
            found = self._db.query(f"SELECT block FROM {self._fts}_data WHERE id = 1")
        except Exception:
            return None
        if not found or not found[0][0]:
            return None
        counts = list(_varints(bytes(found[0][0])))
        return (counts[0], sum(counts[1:])) if counts else None

    def _index_rows(self) -> int | None:
        totals = self._index_totals()
        return None if totals is None else totals[0]

    def _postings_held(self) -> tuple[HeldPostings, npt.NDArray[np.int64], Bm25Floats] | None:
        """Every posting (and the ids and lengths of the live documents) as this connection holds
        them (:mod:`._bm25_held`), when that is the whole index: the complete file's map still in
        use, every write since reported (no other connection wrote), and FTS5's counts of
        documents and tokens equal to the ones held."""
        if (
            not (self._loaded and self._map_arrays and self._mapped)
            or self._version != self._current_version()
        ):
            return None
        if self._index_totals() != (self._live, self._total):
            return None
        offsets, positions, tfs, pos_sums, tf_sums = self._map_arrays
        found = held_postings(
            self._mapped,
            offsets,
            positions,
            tfs,
            (pos_sums, tf_sums),
            self._alive,
            self._map_added,
            self._map_new,
        )
        if found is None:
            return None
        return found, self._ids[self._alive], self._sizes[self._alive]

    def _persist_complete(self, path: Path, *, bulk: bool = False) -> None:
        """Write every posting of the index (see the module docstring) unless the file on disk
        already holds them for the index as it is. A process that never searched rewrites a
        complete file of an earlier state only after a ``bulk`` load or when it has no other and
        wrote (a write-only process does not pay the full read for every few rows it adds; the
        next one that searches rewrites it; one that only counted writes nothing)."""
        db = self._db
        if not self._loaded and not self._wrote():
            return  # neither searched nor wrote (a status query): leaves the file as it is
        mark = self._index_mark()
        if mark is None or (self._file_complete and self._file_mark == mark):
            return
        on_disk = None if self._file_damaged else self._complete_file(path)
        if on_disk is not None and (
            (on_disk.get("mark") == mark and self._vouched(on_disk)) or (not self._loaded and not bulk)
        ):
            return  # current (another index of this table wrote it), or left to a searcher
        held = self._postings_held()
        found: AllPostings | HeldPostings
        if held is not None:
            found, ids, sizes = held
        else:
            started = time.perf_counter()
            log.info(
                "%s: reading every posting for its index file %s (about 11 s per 1M rows)", self._fts, path
            )
            read = self._read_every_posting()
            if read is None or self._mark is None:
                return
            found, ids, sizes, mark = read, self._ids, self._sizes, self._mark
            seconds = time.perf_counter() - started
            log.info("%s: %d postings read in %.1f s", self._fts, len(found.positions), seconds)
        vouched = vouch(db, self._fts, mark, self._index_mark)
        if vouched is None:
            return
        meta = {**self._file_meta(vouched, mark), "complete": True}
        arrays: dict[str, npt.NDArray[Any] | Pieces] = {
            **stem_arrays(found.stems),
            "ids": np.ascontiguousarray(ids, dtype=np.int64),
            "sizes": np.ascontiguousarray(sizes, dtype=np.float64),
            "offsets": found.offsets,
            "pos_sums": found.pos_sums,
            "tf_sums": found.tf_sums,
            "positions": found.positions,
            "tf": found.tf,
        }
        # the postings are checked word by word when used (the sums above), not at every open
        if write_index(path, meta, arrays, unchecked=("positions", "tf")):
            self.files_saved += 1
            self.files_from_memory += held is not None
            self._file_damaged = False
            self._file_mark, self._file_stems, self._file_complete = mark, len(found.stems), True

    def _read_every_posting(self) -> AllPostings | None:
        """The lengths and every word's postings of one state of the index, read in one pass
        (``None`` when FTS5's records do not add up)."""
        # whole counts (integer column weights) are exact as float32, in half the bytes
        integral = all(float(w).is_integer() and abs(w) < 2**16 for w in self._weights)
        with snapshot(self._db):
            self._reset()
            self._version = self._current_version()
            self._read_sizes()
            self._ensure_tables()
            every_one = all(w == 1.0 for w in self._weights)
            return read_all_postings(
                self._db,
                self._vocab,
                self._doc_counts,
                None if every_one else self._column_number(),
                self._column_weights(),
                self._positions,
                np.float32 if integral else np.float64,
            )
