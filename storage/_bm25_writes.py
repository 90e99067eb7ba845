"""Patching the BM25 caches for writes made through this connection, instead of dropping them.

An owner reports its writes (:meth:`Bm25Writes.added`, :meth:`Bm25Writes.removed`,
:meth:`Bm25Writes.changed`) so the document lengths and the postings read so far stay usable;
large writes drop the postings rather than patch them. A complete index file's map stays in use
through added documents (their postings are kept beside it, per word, also for words the file
does not hold) and removed ones (they are marked dead), so a long-running owner that writes does
not go back to reading FTS5 word by word, and writes the file again at close from memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._bm25_postings import _PHRASE, Bm25Postings, appended

__all__ = ["Bm25Writes"]

_INCREMENTAL_LIMIT = 256  # larger writes drop cached postings instead of patching them
# postings of added documents kept beside a complete file's map at most (12 bytes each); past
# that the map is dropped and words are read from FTS5 until the file is written again at close
_MAX_MAP_ADDED = 2_000_000


class Bm25Writes(Bm25Postings):
    """The caches of :class:`Bm25Postings`, kept in line with this connection's writes."""

    def added(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """New documents ``(rowid, text per column...)`` with rowids above every known one."""
        if not rows:
            return
        self.told_of_writes = True
        self.docs_added += len(rows)
        self._df.clear()
        version = self._current_version()
        if version != self._version or not self._loaded:
            self._reset()
            self._version = version
            return
        self._mark = None  # patched: no longer one state of the index as read
        if len(rows) > _INCREMENTAL_LIMIT:  # the file holds none of the new documents
            self._drop_map()
        ids = np.array([int(r[0]) for r in rows], dtype=np.int64)
        if len(self._ids) and ids.min() <= self._ids[-1]:
            self._reset()
            return
        order = np.argsort(ids)
        ids = ids[order]
        sizes = self._sizes_of(ids)
        start = len(self._ids)
        self._ids = np.concatenate([self._ids, ids])
        self._sizes = np.concatenate([self._sizes, sizes])
        self._alive = np.concatenate([self._alive, np.ones(len(ids), dtype=bool)])
        self._live += len(ids)
        self._total += float(sizes.sum())
        if not self._postings and not self._mapped:
            return
        if len(rows) > _INCREMENTAL_LIMIT:
            self._postings.clear()
            self._cached = 0
            self._views.clear()
            return
        for phrase in [p for p in self._postings if _PHRASE in p]:  # not patched: recomputed
            self._cached -= len(self._postings.pop(phrase)[0])
        position = {int(i): start + n for n, i in enumerate(ids)}
        new: dict[str, tuple[list[int], list[float]]] = {}  # stem -> this write's postings
        for doc, counts in sorted(self._tokenize(rows).items()):  # postings stay in position order
            for stem, tf in counts.items():
                found = new.setdefault(stem, ([], []))
                found[0].append(position[doc])
                found[1].append(tf)
        for stem, (positions, tfs) in new.items():
            more = np.asarray(positions, dtype=np.int32), np.asarray(tfs, dtype=np.float64)
            if self._mapped:
                beside = self._map_added if stem in self._mapped else self._map_new
                added = beside.get(stem)
                beside[stem] = more if added is None else appended(added, more)
                self._map_added_count += len(positions)
            cached = self._postings.get(stem)
            if cached is not None:
                self._postings[stem] = appended(cached, more)
                if stem in self._views:  # a copy in memory now
                    self._views.discard(stem)
                    self._cached += len(cached[0])
        if self._map_added_count > _MAX_MAP_ADDED:  # far from the file's state: FTS5 again
            self._drop_map()
        self._trim()

    def _patch(self, ids: Sequence[int]) -> bool:
        """Told of a write to ``ids``: whether the loaded caches are to be patched for it (they
        then no longer hold one state of the index as read)."""
        self.told_of_writes = True
        self._df.clear()
        if not self._loaded or not ids:
            return False
        self._mark = None
        return True

    def removed(self, ids: Sequence[int]) -> None:
        if not self._patch(ids):
            return
        pos = self._positions(np.asarray(ids, dtype=np.int64))
        pos = pos[pos >= 0]
        pos = pos[self._alive[pos]]
        self._alive[pos] = False
        self._live -= len(pos)
        self._total -= float(self._sizes[pos].sum())

    def changed(self, ids: Sequence[int]) -> None:
        """Documents whose text changed: new lengths; cached postings are dropped."""
        if not self._patch(ids):
            return
        arr = np.asarray(ids, dtype=np.int64)
        pos = self._positions(arr)
        ok = pos >= 0
        new = self._sizes_of(arr[ok])
        old = self._sizes[pos[ok]]
        self._total += float(new.sum() - old[self._alive[pos[ok]]].sum())
        self._sizes[pos[ok]] = new
        self._postings.clear()
        self._cached = 0
        self._views.clear()
        self._drop_map()
        self._contribs.clear()  # computed with the old lengths
        self._contrib_count = 0
        self._norms = None
