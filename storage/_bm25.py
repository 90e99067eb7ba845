"""BM25 over an FTS5 index, scored with numpy: the word ranking of every layer's keyword search.

FTS5 ranks an ``OR`` query by visiting every document that holds any query word; for a sentence
of ordinary words ("return the list of ...") that is a third of a large store, about 100 ms at
100k entries. This module scores the postings of each query word, read once from FTS5's own index
and kept in memory (:mod:`._bm25_postings`), with the same formula as FTS5's ``bm25()``
(k1 = 1.2, b = 0.75, column weights; :mod:`._bm25_formula`) in a few vectorised numpy
operations, and leaves out the commonest words' postings when they cannot change the best few
(:mod:`._bm25_top`).

Writes made through this connection update the caches incrementally (:mod:`._bm25_writes`); a
commit by another connection (seen through ``PRAGMA data_version``) drops them. An owner that does
not report its writes opens the index with ``track_writes=True``: any change made through the
connection then drops them too. The caches are kept in an index file beside the database
(:mod:`._bm25_file`); a large index keeps every posting there, so no search reads postings from
FTS5 word by word (:mod:`._bm25_bulk`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ._array_types import Bm25Floats, BoolArray, IntArray
from ._bm25_file import Bm25Files
from ._bm25_postings import _PHRASE, _SCRATCH_CHANGES
from ._bm25_top import Bm25Top, PositionMask
from ._bm25_writes import Bm25Writes
from ._keep import Keep

__all__ = ["Bm25Index"]

_MAX_CACHED_STEMS = 50_000  # query words whose units are kept, per tokenizer
_KEPT_MASKS = 8  # filters whose masks over every document an index keeps (1 byte a document)

# query word -> its units, per ``tokenize=`` clause: a word's units depend on the tokenizer only,
# so every index of the process shares them. A pre-task retrieval asks three stores (the agent's,
# the shared one, its episodes) about the same new words, and tokenizing them goes through a
# scratch FTS5 table: three statements per store, each a wait for the GIL when other agents are
# busy (docs/storage.md, "Query words").
_UNITS: dict[str, dict[str, tuple[str, ...]]] = {}


def _units_of(tokenize_option: str) -> dict[str, tuple[str, ...]]:
    """The shared units of the words tokenized by ``tokenize_option`` (read and extended without
    a lock: a word looked up while another thread clears the dict is only tokenized again)."""
    return _UNITS.setdefault(tokenize_option, {})


class Bm25Index(Bm25Files, Bm25Writes, Bm25Top):
    """Top-k BM25 for the FTS5 table ``fts`` (external content, integer rowids)."""

    def stems(self, terms: Sequence[str]) -> list[str]:
        """Distinct FTS5 stems of query words, in order (a word of several tokens gives one
        phrase unit: its stems joined by ``_PHRASE``)."""
        self._ensure_tables()  # what reads postings next uses the vocabulary tables made here
        known = _units_of(self._tokenize_option)
        units = {t: known.get(t) for t in dict.fromkeys(terms)}
        unknown = [t for t, u in units.items() if u is None]
        if unknown:
            found = dict(zip(unknown, self._query_units(unknown), strict=True))
            units.update(found)
            if len(known) + len(found) > _MAX_CACHED_STEMS:
                known.clear()
            known.update(found)
        if len(self._phrase_words) > _MAX_CACHED_STEMS:
            self._phrase_words.clear()
        stems: dict[str, None] = {}
        for term, parts in units.items():
            for stem in parts or ():
                stems.setdefault(stem, None)
                if _PHRASE in stem:  # this index reads a phrase's postings by matching this word
                    self._phrase_words.setdefault(stem, term)
        return list(stems)

    def _query_units(self, terms: Sequence[str]) -> list[tuple[str, ...]]:
        """What FTS5 matches for each quoted query word: its stem, or for a word of several
        tokens (``"don't"``, ``"Caroline's"``) the phrase of its stems in order, one unit."""
        before = int(self._db.conn.total_changes)
        try:
            self._db.executemany(
                f"INSERT INTO temp.{self._tok}(rowid, {self._columns[0]}) VALUES (?, ?)",
                [(i + 1, t) for i, t in enumerate(terms)],
            )
            rows = self._db.query(f"SELECT doc, term FROM {self._tok_vocab} ORDER BY doc, col, offset")
        finally:
            self._clear_scratch()
            scratch = int(self._db.conn.total_changes) - before
            _SCRATCH_CHANGES[self._db] = _SCRATCH_CHANGES.get(self._db, 0) + scratch
        tokens: dict[int, list[str]] = {}
        for doc, term in rows:
            tokens.setdefault(int(doc), []).append(str(term))
        out: list[tuple[str, ...]] = []
        for i in range(1, len(terms) + 1):
            parts = tokens.get(i, [])
            out.append(tuple(parts) if len(parts) <= 1 else (_PHRASE.join(parts),))
        return out

    def scores(self, terms: Sequence[str], ids: Sequence[int]) -> list[float]:
        """BM25 of the documents ``ids`` for ``terms``, as FTS5's ``bm25()`` but positive
        (0.0 for a document that matches no word or does not exist)."""
        found, scores = self.top(terms, len(ids), ids)  # a limit no match can exceed: every word read
        by_id = dict(zip(found.tolist(), scores.tolist(), strict=True))
        return [by_id.get(int(i), 0.0) for i in ids]

    def top(
        self,
        terms: Sequence[str],
        limit: int,
        allowed: Sequence[int] | IntArray | None = None,
        keep: Keep | None = None,
    ) -> tuple[IntArray, Bm25Floats]:
        """The ``limit`` best documents for ``terms`` (OR semantics) with their scores, best
        first, equal scores by lower id (as FTS5 ranks them), without reading the commonest
        words' postings when they cannot change the result (:mod:`._bm25_top`). ``allowed``
        (ids) and ``keep`` (a mask over ids) restrict the candidates."""
        stems = self.stems(terms)
        self._sync()
        allow: PositionMask | None = None
        if allowed is not None or keep is not None:
            self._load_sizes()
            ok: npt.NDArray[np.bool_] | None = None
            if allowed is not None:
                ok = np.zeros(len(self._ids), dtype=bool)
                apos = self._positions(np.asarray(allowed, dtype=np.int64))
                ok[apos[apos >= 0]] = True
            kept = None if keep is None else self._kept(keep)
            if kept is not None:
                ok, keep = (kept if ok is None else ok & kept), None
            asks = None if keep is None else keep.allows

            def mask_of(pos: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
                mask = ok[pos] if ok is not None else np.ones(len(pos), dtype=bool)
                if asks is not None and mask.any():
                    mask[mask] = asks(self._ids[pos[mask]])
                return mask

            allow = mask_of
        return self._top(stems, limit, allow)

    def _kept(self, keep: Keep) -> BoolArray | None:
        """``keep`` over every document, for a filter asked again while the store has not
        changed: computed the second time it is asked with no change made through this
        connection in between (another connection's commit drops every cache, :meth:`_sync`),
        then kept, so its later queries ask nothing (each ask cost a mirror lookup, ~0.3 ms of
        a 2 ms filtered query at 100k entries). ``None``: ask ``keep`` as the words are scored."""
        if keep.key is None:
            return None
        changes = int(self._db.conn.total_changes) - _SCRATCH_CHANGES.get(self._db, 0)
        if any(kept[0] != changes for kept in self._masks.values()):  # stale for good: let go
            self._masks = {key: kept for key, kept in self._masks.items() if kept[0] == changes}
        seen = self._masks.pop(keep.key, None)
        mask = None  # first asked since the last change: the next one may come first
        if seen is not None and seen[1] is self._ids:
            mask = seen[2] if seen[2] is not None else keep.allows(self._ids)
        while len(self._masks) >= _KEPT_MASKS:
            del self._masks[next(iter(self._masks))]
        self._masks[keep.key] = (changes, self._ids, mask)
        return mask

    def search(self, terms: Sequence[str], limit: int, allowed: Sequence[int] | None = None) -> list[int]:
        """Rowids of the ``limit`` best documents for the query words ``terms`` (OR semantics:
        a document needs one of them), best first; ``allowed`` restricts the candidates."""
        return [int(i) for i in self.top(terms, limit, allowed)[0]]
