"""The best few BM25 documents without reading the commonest words' postings (MaxScore).

A word adds at most ``idf * (k1 + 1)`` to a document's score, and the commoner the word, the
smaller that bound and the longer its postings: "return" is in a third of a million documents
and can add 1.3, a rare name in a thousand and can add 15. So the words are taken rarest first;
once the ``limit``-th best score so far exceeds what all the words left could add together, no
document outside the ones already found can enter the result. The words left are then scored
only for those documents, best first, from cached postings or from the documents' own text
tokenised by FTS5, until no document left can reach the ``limit``-th exact score. The result is
the same documents with the same scores as scoring every posting of every word: the words
are added to a document's score one at a time in the same order on both paths, so the scores
are equal to the last bit.

What a word adds to each of its documents is kept between queries while the index does not
change (at a million entries, a third of a query's time was computing it again), and when
every word was scored the best few are picked from the documents scoring at least the
``limit``-th best of the rarest words' documents, not from every document that matched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from ._array_types import Bm25Floats, IntArray
from ._bm25_formula import K1, contribution_into, idf_of, length_norms, length_norms_into
from ._bm25_postings import _PHRASE, Bm25Postings
from ._distinct import distinct

__all__ = ["Bm25Top", "PositionMask", "top_scored"]

_BLOCK = 64  # documents first scored exactly once the commonest words are left out (then doubling)
_CHECK_SHARE = 50  # a word is worth a check first when it holds over 1/50 of the documents
# tokenising one document's text costs about as much as reading this many postings from FTS5,
# and scoring this many cached postings as looking one document up in them
_TOKENIZE_COST = 400
_CACHED_COST = 8
# below this many documents a word's postings are read at once instead of its documents counted
# first: the commonest word at 100k reads in ~4 ms, and counting every new word of every query
# cost more than the words left out saved
_COUNT_FROM = 200_000

# contributions of words to their documents' scores kept between queries (8 bytes each)
_MAX_CACHED_CONTRIBUTIONS = 8_000_000

# which of some positions (indexes into the sorted ids) a filter allows
PositionMask = Callable[[npt.NDArray[np.int64]], npt.NDArray[np.bool_]]


def top_scored(ids: IntArray, scores: Bm25Floats, limit: int) -> tuple[IntArray, Bm25Floats]:
    """The ``limit`` best ``(ids, scores)``, best first; equal scores go to the lower id."""
    if limit <= 0 or len(ids) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    k = min(limit, len(ids))
    cut = scores[np.argpartition(-scores, k - 1)[k - 1]]
    # every document tied with the last one taken competes, so ties go to the lower id
    top = np.flatnonzero(scores >= cut)
    order = top[np.lexsort((ids[top], -scores[top]))][:limit]
    return ids[order], scores[order]


class Bm25Top(Bm25Postings):
    """:meth:`_top`: the ``limit`` best documents for some stems (see the module docstring)."""

    _normed = 0  # postings whose length norms were computed one by one (:meth:`_norms_at`)

    def _doc_count(self, stem: str) -> int:
        """Live documents holding ``stem``: from its postings (read now in a small store, and
        for a phrase, which is counted by matching it), else counted by FTS5 (about a quarter
        of the time reading the postings takes)."""
        cached = self._postings.get(stem)
        if cached is None and stem in self._mapped and self._live == len(self._ids):
            counted = self._mapped_count(stem)  # no document deleted since the file: its count
            if counted is not None:
                return counted
        if cached is None and (stem in self._mapped or _PHRASE in stem or len(self._ids) < _COUNT_FROM):
            cached = self._postings_of(stem)
        if cached is not None:
            pos = cached[0]
            return len(pos) if self._live == len(self._ids) else int(self._alive[pos].sum())
        df = self._df.get(stem)
        if df is None:
            self._ensure_tables()
            df = int(self._db.scalar(f"SELECT doc FROM {self._doc_counts} WHERE term = ?", (stem,)) or 0)
            self._df[stem] = df
        return df

    def _contribution(
        self, idf: float, pos: npt.NDArray[np.int64] | npt.NDArray[np.int32], tf: Bm25Floats, avg: float
    ) -> Bm25Floats:
        counts = np.asarray(tf, dtype=np.float64)  # a complete file's whole counts are float32
        return contribution_into(idf, counts, self._norms_at(pos, avg), own_tf=counts is not tf)

    def _norms_at(self, pos: npt.NDArray[np.int64] | npt.NDArray[np.int32], avg: float) -> Bm25Floats:
        """The :func:`length_norms` of the documents at ``pos``, in a new array: taken from
        every document's, kept while the lengths and their average stay (half the arithmetic of
        scoring a word's postings), once this index has normed as many postings as it has
        documents; until then computed for ``pos`` alone (a fresh process's first query scores
        a few words: norming a million documents first took 5-12 ms of it). Both ways give the
        same bits."""
        kept = self._norms
        if kept is None or kept[0] != avg or kept[1] is not self._sizes or len(kept[2]) != len(self._sizes):
            if self._normed + len(pos) < len(self._sizes):
                self._normed += len(pos)
                return length_norms_into(self._sizes.take(pos), avg)
            kept = self._norms = (avg, self._sizes, length_norms(self._sizes, avg))
        return kept[2].take(pos)

    def _word_contribution(
        self, stem: str, idf: float, pos: npt.NDArray[np.int32], tf: Bm25Floats, avg: float
    ) -> Bm25Floats:
        """What ``stem`` adds to each of its documents ``pos``: kept for the next query while the
        index does not change (the same ``idf`` and average length; a word's documents' lengths
        change only with writes, which drop these). Computing it was a third of a query's time."""
        kept = self._contribs.pop(stem, None)
        if kept is not None and kept[0] == (idf, avg) and len(kept[1]) == len(pos):
            self._contribs[stem] = kept  # the most recently used go last
            return kept[1]
        if kept is not None:
            self._contrib_count -= len(kept[1])
        out = self._contribution(idf, pos, tf, avg)
        while self._contribs and self._contrib_count + len(out) > _MAX_CACHED_CONTRIBUTIONS:
            oldest = next(iter(self._contribs))
            self._contrib_count -= len(self._contribs.pop(oldest)[1])
        if len(out) <= _MAX_CACHED_CONTRIBUTIONS:
            self._contribs[stem] = ((idf, avg), out)
            self._contrib_count += len(out)
        return out

    def _top(
        self, stems: Sequence[str], limit: int, allow: PositionMask | None
    ) -> tuple[IntArray, Bm25Floats]:
        """The ``limit`` best ``(ids, scores)`` for ``stems``, best first (ties: lower id);
        ``allow`` restricts the documents by position."""
        empty = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        if not stems or limit <= 0:
            return empty
        self._load_sizes()
        if self._live == 0:
            return empty
        n = float(self._live)
        avg = self._total / n if self._total > 0 else 1.0
        plan: list[tuple[float, str, int]] = []  # (idf, stem, df), rarest first
        for stem in stems:
            df = self._doc_count(stem)
            if df > 0:
                plan.append((idf_of(n, df), stem, df))
        plan.sort(key=lambda p: (-p[0], p[1]))
        bounds = [idf * (K1 + 1.0) for idf, _, _ in plan]
        left = [math.fsum(bounds[i:]) for i in range(len(plan) + 1)]  # what the words from i on can add
        scores = np.zeros(len(self._ids), dtype=np.float64)
        allowed = self._allowed_mask(allow)
        check_from = max(len(self._ids) // _CHECK_SHARE, 1)
        costs = [df / _CACHED_COST if self._held(stem) else df for _, stem, df in plan]
        done, scored = len(plan), 0
        for i, (idf, stem, df) in enumerate(plan):
            # a check costs about a pass over the documents found so far (at most ``scored``):
            # worth it only before words that cost more than that to score
            if i and df >= check_from and left[i] < left[0] - left[i] and sum(costs[i:]) > scored:
                found = self._found(scores)
                best, share = self._allowed_best(found, scores[found], limit, allowed)
                if len(best) >= limit:
                    cut = float(np.partition(scores[found[best]], len(best) - limit)[len(best) - limit])
                    # allowed documents that could still reach the cut, estimated from the share
                    # of the best ones the filter allowed
                    contenders = int(np.count_nonzero(scores[found] >= cut - left[i]) * share)
                    if cut > left[i] and self._skipping_pays(contenders, plan[i:]):
                        done = i
                        break
            pos, tf = self._postings_of(stem)
            if len(pos):
                # as ``scores[pos] += ...`` (a word's positions are distinct), three times faster
                np.add.at(scores, pos, self._word_contribution(stem, idf, pos, tf, avg))
            scored += len(pos)
        if done < len(plan):
            found = self._found(scores)
            return self._finish(found, scores[found], plan[done:], left[done], limit, avg, allowed)
        found = self._found(scores, self._floor(scores, plan, limit, allowed))
        if allowed is not None:
            found = found[self._allowed_best(found, scores[found], limit, allowed)[0]]
        return top_scored(self._ids[found], scores[found], limit)

    def _floor(
        self, scores: Bm25Floats, plan: list[tuple[float, str, int]], limit: int, allowed: PositionMask | None
    ) -> float:
        """A score that at least ``limit`` live (and allowed) documents reach, every word
        scored: the ``limit``-th best among the documents of the rarest words, so the best
        ``limit`` are picked from a few documents instead of every one that matched (0.0: none
        known)."""
        held: list[npt.NDArray[np.int32]] = []
        count = 0
        enough = 4 * limit if allowed is None else 16 * limit  # a filter keeps some of them
        for _, stem, _ in plan:
            cached = self._postings.get(stem)
            if cached is None:
                break
            held.append(cached[0])
            count += len(cached[0])
            if count >= enough:
                break
        if count < limit:
            return 0.0
        pos = distinct(np.concatenate(held)) if len(held) > 1 else held[0]
        if self._live != len(self._ids):
            pos = pos[self._alive[pos]]
        if allowed is not None and len(pos) >= limit:
            pos = pos[allowed(pos.astype(np.int64))]
        if len(pos) < limit:
            return 0.0
        values = scores[pos]
        return float(np.partition(values, len(values) - limit)[len(values) - limit])

    def _found(self, scores: Bm25Floats, floor: float = 0.0) -> npt.NDArray[np.int64]:
        """Positions of the live documents with a score (at least ``floor``, when above 0)."""
        found = np.flatnonzero(scores >= floor) if floor > 0.0 else np.flatnonzero(scores > 0.0)
        return found if self._live == len(self._ids) else found[self._alive[found]]

    def _allowed_best(
        self, found: npt.NDArray[np.int64], values: Bm25Floats, limit: int, allowed: PositionMask | None
    ) -> tuple[npt.NDArray[np.int64], float]:
        """Indexes into ``found`` (scored ``values``) of the allowed documents among the best
        ones, enough that no other allowed one can be among the ``limit`` best: at least
        ``limit`` of them, each scoring above every candidate left unchecked (or every allowed
        candidate). The filter is asked about the best candidates only, four times as many at
        each step; also the share of those it allowed."""
        if allowed is None:
            return np.arange(len(found)), 1.0
        m = max(4 * limit, 256)
        while True:
            if m >= len(found):
                checked = np.arange(len(found))
            else:
                floor = np.partition(values, len(values) - m)[len(values) - m]
                checked = np.flatnonzero(values >= floor)  # ties with the floor included
            best = checked[allowed(found[checked])]
            if len(best) >= limit or len(checked) == len(found):
                return best, len(best) / max(len(checked), 1)
            m *= 4

    def _allowed_mask(self, allow: PositionMask | None) -> PositionMask | None:
        """``allow`` evaluated at most once per position (the checks ask again as words are added)."""
        if allow is None:
            return None
        known = np.zeros(len(self._ids), dtype=bool)
        ok = np.zeros(len(self._ids), dtype=bool)

        def mask(pos: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
            new = pos[~known[pos]]
            if len(new):
                ok[new] = allow(new)
                known[new] = True
            return ok[pos]

        return mask

    def _skipping_pays(self, contenders: int, rest: list[tuple[float, str, int]]) -> bool:
        """Whether scoring ``contenders`` documents exactly costs less than reading the words
        ``rest`` (a cached word is scored for a document from its postings, another from the
        document's text)."""
        read = 0.0
        tokenize = False
        for _, stem, df in rest:
            if self._held(stem):
                read += df / _CACHED_COST
            else:
                read += df
                tokenize = True
        return contenders * (_TOKENIZE_COST if tokenize else 1) < read

    def _finish(
        self,
        found: npt.NDArray[np.int64],
        partial: Bm25Floats,
        rest: list[tuple[float, str, int]],
        rest_bound: float,
        limit: int,
        avg: float,
        allowed: PositionMask | None,
    ) -> tuple[IntArray, Bm25Floats]:
        """Add the words left (``rest``) to the allowed documents found, best partial score
        first, until the next one cannot reach the ``limit``-th exact score."""
        best, _ = self._allowed_best(found, partial, limit, allowed)
        if len(best) >= limit:  # the final cut is at least the limit-th allowed partial score
            floor = np.partition(partial[best], len(best) - limit)[len(best) - limit] - rest_bound
            contenders = np.flatnonzero(partial >= floor)
        else:  # every allowed document found is in ``best``
            contenders = best
        if allowed is not None and len(best) >= limit:
            contenders = contenders[allowed(found[contenders])]
        found, partial = found[contenders], partial[contenders]
        order = np.lexsort((self._ids[found], -partial))
        taken: list[npt.NDArray[np.int64]] = []
        exact: list[Bm25Floats] = []
        cut = -np.inf  # the limit-th best exact score so far
        start, size = 0, _BLOCK
        while start < len(order):
            if partial[order[start]] + rest_bound < cut:
                break
            # twice as many documents each time: a query whose common words can lift thousands
            # of documents past the cut takes a few blocks, not hundreds (at 1M: 25k documents,
            # 388 blocks of 64 took 40 ms)
            block = order[start : start + size]
            start, size = start + size, 2 * size
            pos = found[block]
            taken.append(pos)
            exact.append(self._rest_scores(pos, rest, avg, partial[block]))
            if sum(len(e) for e in exact) >= limit:
                exact = [np.concatenate(exact)]
                taken = [np.concatenate(taken)]
                cut = float(np.partition(exact[0], len(exact[0]) - limit)[len(exact[0]) - limit])
        pos = np.concatenate(taken)
        return top_scored(self._ids[pos], np.concatenate(exact), limit)

    def _rest_scores(
        self, pos: npt.NDArray[np.int64], rest: list[tuple[float, str, int]], avg: float, partial: Bm25Floats
    ) -> Bm25Floats:
        """The scores ``partial`` of the documents at ``pos`` plus what the words ``rest`` add:
        from a word's postings at hand, else from the documents' text as FTS5 tokenises it.
        Added one word at a time in the plan's order, as :meth:`_top` adds them to every
        document, so a score is the same to the last bit whichever words were left out."""
        out = np.array(partial, dtype=np.float64)
        counts: dict[int, dict[str, float]] | None = None
        ids = self._ids[pos]
        for idf, stem, _ in rest:
            cached = self._postings_of(stem) if self._held(stem) else None
            if cached is not None:
                holders, counted = cached  # positions in ascending order
                if len(holders) == 0:
                    continue
                # needles of the postings' own type: int64 ones made numpy convert every
                # posting of the word at each call (0.13 ms a block for 300k postings)
                at = np.searchsorted(holders, pos.astype(holders.dtype, copy=False))
                at = np.minimum(at, len(holders) - 1)
                tf = np.where(holders[at] == pos, counted[at], 0.0)
            else:
                if counts is None:
                    wanted = [s for _, s, _ in rest if not self._held(s)]
                    counts = self._tokenize(self._texts(ids), wanted)
                tf = np.asarray([counts.get(int(i), {}).get(stem, 0.0) for i in ids], dtype=np.float64)
            has = tf > 0
            if has.any():
                out[has] += self._contribution(idf, pos[has], tf[has], avg)
        return out

    def _texts(self, ids: IntArray) -> list[tuple[object, ...]]:
        """``(rowid, text per column...)`` of the documents ``ids``, as the index holds them."""
        cols = ", ".join(self._columns)
        marks = ",".join("?" * len(ids))
        return list(
            self._db.query(
                f"SELECT rowid, {cols} FROM {self._fts} WHERE rowid IN ({marks})", [int(i) for i in ids]
            )
        )
