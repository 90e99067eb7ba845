"""One episodic search over the live store and (optionally) its archives, as a single corpus:
exact vector rankings and keyword lists (:class:`storage.KeywordIndex`) merged across sources,
fused by :func:`storage.fuse`, optionally decayed by age (see :class:`_Search`)."""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from memstrata.core.config import Config
from memstrata.core.errors import (
    MemstrataError,
)
from memstrata.storage import (
    PLAIN_RRF_K,
    Filter,
    FloatArray,
    IntArray,
    KeywordQuery,
    best_score,
    fuse,
    fusion_weights,
    match_type,
)

from ._episode_records import (
    EPISODE_COLUMNS,
    Episode,
    EpisodeHit,
    episode_from_row,
    query_in,
)
from ._episodic_lists import MARGIN, Fused, Keys, Ranked, fused_prefix, settled, source_top, with_times
from ._episodic_state import _Source


class _Owner(Protocol):
    """What a search needs from its store: the search settings and where to report an
    archive whose full-text index failed."""

    _config: Config

    def _archive_unusable(self, path: str, problem: str) -> None: ...


MAX_DEPTH = 10_000  # deepest candidate lists recency decay may ask for


class _Search:
    """One search over live episodes and (optionally) archives, as a single corpus.

    The vector list merges every source's exact ranking by cosine similarity; each keyword
    sub-list (words, CJK trigrams, short CJK runs) merges by its score, and the sub-lists fuse
    by RRF as in a single store. An archived copy of an episode that is live again, or that an
    earlier archive also holds, is dropped (matched by uuid).

    With recency decay, an old episode ranked first can fall below a recent one ranked far
    down both lists, so the lists deepen (x4 per round, or to the depth a bound asks for) until
    the top ``k`` is that of the full-depth ranking, scores included: every one of them is in
    every list not read to its end (its score is whole), and no other episode, seen in one list
    only or in none, could reach the ``k``-th even ranked just below where each list was read.
    Past ``MAX_DEPTH`` the vector list is the whole exact ranking and the keyword list stops at
    ``MAX_DEPTH`` (the full-depth ranking). A shallower list is always a prefix of that one, ties
    included (:meth:`source_top`, :func:`settled`), so a smaller ``k`` returns a prefix of a
    larger one. Episodes are int64 keys ``source << 40 | id`` and fusion runs in numpy, so deep
    rounds stay cheap.
    """

    def __init__(
        self,
        memory: _Owner,
        sources: list[_Source],
        query_vector: FloatArray | None,
        text: str,
        keywords: KeywordQuery,
        conditions: tuple[list[str], list[Any]],
        *,
        top_k: int,
        half_life_us: float | None,
        now_us: int,
    ) -> None:
        self.memory = memory
        self.sources = sources
        self.query_vector = query_vector
        self.text = text
        self.keywords = keywords
        self.conds, self.params = conditions
        self.top_k = top_k
        self.half_life_us = half_life_us
        self.now_us = now_us
        search = memory._config.search
        self.rrf_k = search.rrf_k
        self.use_vectors = query_vector is not None and any(s.ranking is not None for s in sources)
        self.use_keywords = not keywords.empty
        self.weights = fusion_weights(
            self.use_vectors,
            self.use_keywords,
            search.vector_weight,
            search.keyword_weight,
            query=text,
            k=search.rrf_k,
        )
        self.depth = max(search.depth, top_k)
        self.shadowed: dict[int, bool] = {}
        self.owner: dict[str, int] = {}
        self.keyword_cache: dict[int, tuple[int, list[Ranked]]] = {}

    def run(self) -> list[EpisodeHit]:
        if not self.weights:
            return []
        depth = self.depth
        best = best_score(self.weights, self.rrf_k)
        newest_log_decay: float | None = None
        while True:
            full = depth > MAX_DEPTH
            exact = self.half_life_us is not None and not full  # a prefix of the full-depth lists
            vkeys, vsims, vat, vector_more = self._vector_list(depth, full=full, exact=exact)
            if exact and len(self.sources) == 1:
                # one source: its keyword list is fetched whole (to MAX_DEPTH) once, so it is
                # used whole, as the full-depth ranking has it: no keyword rank is left unknown
                kkeys, kat, _ = self._keyword_list(MAX_DEPTH)
                keyword_more = False
            else:
                kkeys, kat, keyword_more = self._keyword_list(min(depth, MAX_DEPTH), exact=exact)
            lists: list[Keys] = []
            ats: list[IntArray] = []
            mores: list[bool] = []
            if self.use_vectors:
                lists.append(vkeys)
                ats.append(vat)
                mores.append(vector_more)
            if self.use_keywords:
                lists.append(kkeys)
                ats.append(kat)
                mores.append(keyword_more)
            fused = Fused.of(fuse(lists, self.weights, self.rrf_k), ats)
            if self.half_life_us is None:
                order = np.lexsort((fused.first, -fused.scores))
                scores = fused.scores[order]
                break
            # log space: a decay of 0.5 ** (a year / an hour) underflows, yet still ranks
            decay = self._log_decay(fused.at)
            logs = np.log(fused.scores) + decay
            order = np.lexsort((fused.first, -fused.at, -logs))
            # what an episode absent from a list not read to its end may still gain from it
            gaps = [
                w / (self.rrf_k + len(keys) + 1) / best if more else 0.0
                for w, keys, more in zip(self.weights, lists, mores, strict=True)
            ]
            if full or not any(gaps):
                scores = np.exp(logs[order])
                break
            if newest_log_decay is None:
                newest_log_decay = float(self._log_decay(np.array([self._newest_at()], dtype=np.int64))[0])
            needed = self._needed_depth(depth, fused, decay, gaps, newest_log_decay)
            if needed is None:  # ranks looked up may have changed scores: rank again
                logs = np.log(fused.scores) + decay
                order = np.lexsort((fused.first, -fused.at, -logs))
                scores = np.exp(logs[order])
                break
            depth = needed if needed > MAX_DEPTH else max(depth + 1, min(depth * 4, needed))
        top = order[: self.top_k]
        return self._hits(fused, top, scores[: self.top_k], vsims)

    def _needed_depth(
        self,
        depth: int,
        fused: Fused,
        decay: npt.NDArray[np.float64],
        gaps: list[float],
        newest_log_decay: float,
    ) -> int | None:
        """``None`` when the top ``k`` of lists read to ``depth`` is the full-depth one, scores
        included; else the depth to read next (past ``MAX_DEPTH``: the full ranking).

        An episode absent from a list not read to its end may rank just below its last entry
        there and gain that list's gap: a top-``k`` episode with a gap has no final score yet,
        and any other (one seen, or one in no list, decayed as the newest) must stay below the
        ``k``-th even with its gaps. The ``k``-th score only grows with depth. With one source,
        the vector ranks such episodes lack are looked up (:meth:`_look_up`) rather than found by
        reading deeper: a recent keyword hit far down the vector list costs no deep round."""
        k = self.top_k
        best = best_score(self.weights, self.rrf_k)
        known = np.zeros(len(fused.keys), dtype=bool)  # vector rank looked up (0: not ranked)
        vector_gap = gaps[0] if self.use_vectors else 0.0
        while True:
            logs = np.log(fused.scores) + decay
            order = np.lexsort((fused.first, -fused.at, -logs))
            if len(order) < k:
                return depth * 4
            missing = np.zeros(len(fused.keys), dtype=np.float64)  # what each may still gain
            weight = np.zeros(len(fused.keys), dtype=np.float64)  # the weight of the lists it lacks
            for n, (w, gap, ranks) in enumerate(zip(self.weights, gaps, fused.ranks, strict=True)):
                if gap:
                    absent = (ranks == 0) & ~known if n == 0 and self.use_vectors else ranks == 0
                    missing += absent * gap
                    weight += absent * (w / best)
            unsure = order[:k][missing[order[:k]] > 0]  # top-k scores not whole yet
            kth = float(logs[order[k - 1]]) - MARGIN
            rivals = order[k:][missing[order[k:]] > 0]
            upper = np.log(fused.scores[rivals] + missing[rivals]) + decay[rivals]
            if not len(unsure):
                unsure = rivals[upper >= kth]
                if not len(unsure) and kth > math.log(sum(gaps)) + newest_log_decay:
                    return None
            lookup = unsure[(fused.ranks[0][unsure] == 0) & ~known[unsure]] if vector_gap else unsure[:0]
            if not len(lookup) or not self._look_up(fused, lookup, best):
                break
            known[lookup] = True
        if len(order[:k][missing[order[:k]] > 0]):  # a top-k score is not whole yet: find it
            return depth * 4
        # a gap is weight / (rrf_k + depth + 1): the depth at which each bound falls below the k-th
        unseen = sum(w for w, gap in zip(self.weights, gaps, strict=True) if gap) / best
        log_needed = math.log(unseen) - (kth - newest_log_decay)  # log(rrf_k + depth + 1)
        if log_needed > math.log(self.rrf_k + MAX_DEPTH + 1):
            return MAX_DEPTH + 1  # even MAX_DEPTH leaves room for an unseen episode
        needed = math.ceil(math.exp(log_needed)) - self.rrf_k
        if len(rivals):
            with np.errstate(over="ignore"):
                room = np.exp(kth - decay[rivals]) - fused.scores[rivals]
            if not (room > 0).all():
                return depth * 4  # a rival at or above the k-th already: only finding it settles it
            reach = float((weight[rivals] / room).max())
            needed = max(needed, min(MAX_DEPTH, math.ceil(reach) - self.rrf_k))
        return needed

    def _look_up(self, fused: Fused, at: IntArray, best: float) -> bool:
        """Give the fused entries ``at`` their rank in the full vector ranking of the one source
        (0: not in it), with the score and first appearance that rank gives them, as the
        full-depth fusion would; ``False`` when there is no single source to look in."""
        if len(self.sources) != 1 or self.sources[0].ranking is None:
            return False
        ranks = self.sources[0].ranking.ranks_of(fused.keys[at] & _MASK)
        fused.ranks[0][at] = ranks
        found = ranks > 0
        fused.first[at[found]] = ranks[found] - 1  # the vector list comes first
        raw = np.zeros(len(at), dtype=np.float64)  # summed list by list, as fuse's bincount does
        for w, list_ranks in zip(self.weights, fused.ranks, strict=True):
            r = list_ranks[at]
            raw = np.where(r > 0, raw + w / (self.rrf_k + r.astype(np.float64)), raw)
        fused.scores[at] = raw / best
        return True

    def _log_decay(self, at_us: IntArray) -> npt.NDArray[np.float64]:
        """``log(0.5 ** (age / half_life))``; episodes dated in the future do not decay."""
        assert self.half_life_us is not None
        age = np.maximum(0, self.now_us - at_us).astype(np.float64)
        return -age / self.half_life_us * math.log(2)

    def _newest_at(self) -> int:
        """The newest time any allowed episode has, in any source (bounds unseen episodes)."""
        where = " WHERE " + " AND ".join(self.conds) if self.conds else ""
        newest = [
            s.db.scalar(f"SELECT max(e.at_us) FROM episodes e{where}", self.params) for s in self.sources
        ]
        return max((int(n) for n in newest if n is not None), default=self.now_us)

    # -- candidate lists -----------------------------------------------------------------------

    def _vector_list(
        self, depth: int, *, full: bool, exact: bool = False
    ) -> tuple[Keys, FloatArray, IntArray, bool]:
        """The merged vector list, best first, and whether it goes on. ``exact``: a prefix of
        the full ranking (ties as there), maybe shorter than ``depth`` (see :func:`settled`)."""
        empty = np.zeros(0, dtype=np.int64)
        if not self.use_vectors:
            return empty, np.zeros(0, dtype=np.float32), empty, False
        keys, sims, ats = [], [], []
        frontier: list[tuple[int, float]] = []
        more = False
        for index, source in enumerate(self.sources):
            if source.ranking is None:
                continue
            size = len(source.ranking) if full else depth
            ids, scores, at, going = source_top(source.ranking, size, exact=exact)
            more = more or going
            if going and len(scores):
                frontier.append((index, float(scores[-1])))
            keys.append((np.int64(index) << _SHIFT) | ids)
            sims.append(scores)
            ats.append(at)
        key = np.concatenate(keys) if keys else empty
        sim = np.concatenate(sims) if sims else np.zeros(0, dtype=np.float32)
        at_all = np.concatenate(ats) if ats else empty
        if len(key) and int(key.max()) >> _SHIFT:  # an archive's copies may be shadowed
            keep = self._unshadowed(key)
            key, sim, at_all = key[keep], sim[keep], at_all[keep]
        if len(keys) > 1:
            order = np.argsort(-sim, kind="stable")  # source order breaks ties
            cut = depth
            if exact:
                cut = min(cut, settled(sim[order], key[order] >> _SHIFT, frontier))
            if not full and len(order) > cut:
                order, more = order[:cut], True
            key, sim, at_all = key[order], sim[order], at_all[order]
        return key, sim, at_all, more

    def _keyword_list(self, depth: int, *, exact: bool = False) -> tuple[Keys, IntArray, bool]:
        """The keyword list (its sub-lists merged across sources, then fused), best first, and
        whether it goes on. ``exact``: a prefix of the list read to ``MAX_DEPTH``, maybe shorter
        than ``depth`` (see :func:`settled`)."""
        empty = np.zeros(0, dtype=np.int64)
        if not self.use_keywords:
            return empty, empty, False
        fetched = [self._source_keywords(index, depth) for index in range(len(self.sources))]
        more = any(len(sub[0]) > depth or len(sub[0]) >= limit for limit, lists in fetched for sub in lists)
        per_source = [[sub.cut(depth) for sub in lists] for _, lists in fetched]
        count = max((len(lists) for lists in per_source), default=0)
        subkeys: list[Keys] = []
        subats: list[IntArray] = []
        going: list[bool] = []  # whether each sub-list has entries past what is kept of it
        for n in range(count):
            parts = [
                (index, lists[n])
                for index, lists in enumerate(per_source)
                if n < len(lists) and len(lists[n].ids)
            ]
            frontier = [
                (index, float(lists[n].scores[depth - 1]))
                for index, (_, lists) in enumerate(fetched)
                if n < len(lists) and len(lists[n].ids) > depth
            ]
            going.append(bool(frontier))
            if not parts:
                subkeys.append(empty)
                subats.append(empty)
                continue
            key = np.concatenate([(np.int64(i) << _SHIFT) | ranked.ids for i, ranked in parts])
            score = np.concatenate([ranked.scores for _, ranked in parts])
            at = np.concatenate([ranked.at for _, ranked in parts])
            if parts[-1][0]:  # an archive's copies may be shadowed, even where it alone matches
                keep = self._unshadowed(key)
                key, score, at = key[keep], score[keep], at[keep]
            if len(parts) > 1:
                order = np.argsort(-score, kind="stable")
                cut = depth
                if exact:
                    cut = min(cut, settled(score[order], key[order] >> _SHIFT, frontier))
                if len(order) > cut:
                    order, more, going[-1] = order[:cut], True, True
                key, at = key[order], at[order]
            subkeys.append(key.astype(np.int64))
            subats.append(at)
        if len(subkeys) == 1:
            return subkeys[0], subats[0], more
        fused = Fused.of(fuse(subkeys, [1.0] * len(subkeys), PLAIN_RRF_K), subats)
        order = np.lexsort((fused.first, -fused.scores))
        cut = depth
        if exact:
            cut = min(cut, fused_prefix(fused, order, subkeys, going))
        if len(order) > cut:
            order, more = order[:cut], True
        return fused.keys[order], fused.at[order], more

    def _source_keywords(self, index: int, depth: int) -> tuple[int, list[Ranked]]:
        """One source's keyword sub-lists, at least ``depth`` long where possible, and the limit
        they were fetched with. BM25 scores every match whatever the limit, so with decay (which
        may deepen) they are fetched once at the deepest limit and sliced in later rounds."""
        cached = self.keyword_cache.get(index)
        if cached is not None and (cached[0] >= depth or all(len(sub) < cached[0] for sub in cached[1])):
            return cached
        limit = max(depth, MAX_DEPTH) if self.half_life_us is not None else depth
        source = self.sources[index]
        where = " AND ".join(self.conds)
        flt = Filter(f"SELECT e.id FROM episodes e WHERE {where}", tuple(self.params)) if where else Filter()
        # the filter as a mask read from the vector mirror's columns, when the source has one:
        # no list of allowed ids from SQL
        keep = source.ranking.keep(source.db, flt) if where and source.ranking is not None else None
        try:
            assert source.keywords is not None
            found = source.keywords.lists(self.text, limit, flt, query=self.keywords, keep=keep)
            lists = [with_times(source, ids, scores) for ids, scores in found]
        except MemstrataError as exc:
            if source.label is None:
                raise
            self.memory._archive_unusable(source.label, f"its full-text index failed: {exc}")
            lists = []
        self.keyword_cache[index] = (limit, lists)
        return limit, lists

    def _unshadowed(self, keys: Keys) -> npt.NDArray[np.bool_]:
        """Mask dropping archived copies of episodes that are live or held by an earlier archive."""
        unknown: dict[int, list[int]] = {}
        for key in keys.tolist():
            if key >> _SHIFT and key not in self.shadowed:
                unknown.setdefault(key >> _SHIFT, []).append(key & _MASK)
        for index in sorted(unknown):
            archive = self.sources[index].archive
            assert archive is not None
            uuids = archive.uuids(unknown[index])
            sql = "SELECT uuid FROM episodes WHERE uuid IN"
            live = {str(r[0]) for r in query_in(self.sources[0].db, sql, list(uuids.values()))}
            gone = "SELECT uuid FROM deleted_episodes WHERE uuid IN"  # deleted for good: never shown
            live |= {str(r[0]) for r in query_in(self.sources[0].db, gone, list(uuids.values()))}
            for ident, uuid in uuids.items():
                key = (index << _SHIFT) | ident
                owner = self.owner.setdefault(uuid, key)
                self.shadowed[key] = uuid in live or owner != key
        return np.array([not self.shadowed.get(k, False) for k in keys.tolist()], dtype=bool)

    # -- results -------------------------------------------------------------------------------

    def _hits(
        self, fused: Fused, top: IntArray, scores: npt.NDArray[np.float64], similarities: FloatArray
    ) -> list[EpisodeHit]:
        keys = fused.keys[top].tolist()
        wanted: dict[int, list[int]] = {}
        for key in keys:
            wanted.setdefault(key >> _SHIFT, []).append(key & _MASK)
        episodes: dict[int, Episode] = {}
        for index, ids in wanted.items():
            source = self.sources[index]
            for row in query_in(source.db, f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE id IN", ids):
                episodes[(index << _SHIFT) | int(row[0])] = episode_from_row(row, source.label)
        hits = []
        for position, key in enumerate(keys):
            episode = episodes.get(key)
            if episode is None:  # removed by another connection between the two queries
                continue
            n = int(top[position])
            vrank = (int(fused.ranks[0][n]) or None) if self.use_vectors else None
            krank = (int(fused.ranks[-1][n]) or None) if self.use_keywords else None
            sim = float(similarities[vrank - 1]) if vrank and vrank <= len(similarities) else None
            matrix = self.sources[key >> _SHIFT].matrix
            if sim is None and matrix is not None and self.query_vector is not None:
                sim = matrix.similarity(key & _MASK, self.query_vector)
            hits.append(
                EpisodeHit(
                    episode=episode,
                    score=min(1.0, max(0.0, float(scores[position]))),
                    match_type=match_type(vrank, krank),
                    similarity=sim,
                    vector_rank=vrank,
                    keyword_rank=krank,
                )
            )
        return hits


_SHIFT = 40  # an episode key is ``source << 40 | id``
_MASK = (1 << _SHIFT) - 1
