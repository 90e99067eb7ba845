"""One episodic search over the live store and (optionally) its archives, as a single corpus:
exact vector rankings and keyword lists (:class:`storage.KeywordIndex`) merged across sources,
fused by :func:`storage.fuse`, optionally decayed by age (see :class:`_Search`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from memstrata.core.config import Config
from memstrata.core.errors import (
    MemstrataError,
)
from memstrata.storage import (
    PLAIN_RRF_K,
    Filter,
    FusedArrays,
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
from ._episodic_state import _Source


class _Owner(Protocol):
    """What a search needs from its store: the search settings and where to report an
    archive whose full-text index failed."""

    _config: Config

    def _archive_unusable(self, path: str, problem: str) -> None: ...


FloatArray = npt.NDArray[np.float32]
MAX_DEPTH = 10_000  # deepest candidate lists recency decay may ask for


class _Search:
    """One search over live episodes and (optionally) archives, as a single corpus.

    The vector list merges every source's exact ranking by cosine similarity; each keyword
    sub-list (words, CJK trigrams, short CJK runs) merges by its score, and the sub-lists fuse
    by RRF as in a single store. An archived copy of an episode that is live again, or that an
    earlier archive also holds, is dropped (matched by uuid).

    With recency decay, an old episode ranked first can fall below a recent one ranked far
    down both lists, so the lists deepen (x4 per round) until no episode outside them could
    reach the top ``k``; past ``MAX_DEPTH`` the vector list is the whole exact ranking and the
    keyword list stops at ``MAX_DEPTH``. Episodes are int64 keys ``source << 40 | id`` and
    fusion runs in numpy, so deep rounds stay cheap.
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
        self.keyword_cache: dict[int, tuple[int, list[_Ranked]]] = {}

    def run(self) -> list[EpisodeHit]:
        if not self.weights:
            return []
        depth = self.depth
        best = best_score(self.weights, self.rrf_k)
        newest_log_decay: float | None = None
        while True:
            full = depth > MAX_DEPTH
            vkeys, vsims, vat, vector_more = self._vector_list(depth, full=full)
            kkeys, kat, keyword_more = self._keyword_list(min(depth, MAX_DEPTH))
            lists: list[_Keys] = []
            ats: list[_Ints] = []
            if self.use_vectors:
                lists.append(vkeys)
                ats.append(vat)
            if self.use_keywords:
                lists.append(kkeys)
                ats.append(kat)
            fused = _Fused.of(fuse(lists, self.weights, self.rrf_k), ats)
            if self.half_life_us is None:
                order = np.lexsort((fused.first, -fused.scores))
                scores = fused.scores[order]
                break
            # log space: a decay of 0.5 ** (a year / an hour) underflows, yet still ranks
            logs = np.log(fused.scores) + self._log_decay(fused.at)
            order = np.lexsort((fused.first, -fused.at, -logs))
            if full:
                scores = np.exp(logs[order])
                break
            mores = [vector_more] if self.use_vectors else []
            if self.use_keywords:
                mores.append(keyword_more)
            unseen = sum(w for w, more in zip(self.weights, mores, strict=True) if more)
            if unseen == 0:
                scores = np.exp(logs[order])
                break
            if newest_log_decay is None:
                newest_log_decay = float(self._log_decay(np.array([self._newest_at()], dtype=np.int64))[0])
            if len(order) < self.top_k:
                depth *= 4
                continue
            # an unseen episode scores at most unseen / (k + depth + 1) / best, decayed as the newest
            kth = float(logs[order[self.top_k - 1]]) - newest_log_decay
            if kth >= math.log(unseen / (self.rrf_k + depth + 1) / best):
                scores = np.exp(logs[order])
                break
            # the k-th score only grows with depth, so this depth is always enough
            log_needed = math.log(unseen / best) - kth  # log(k + depth + 1) that would do
            if log_needed > math.log(self.rrf_k + MAX_DEPTH + 1):
                depth = MAX_DEPTH + 1
            else:
                needed = math.ceil(math.exp(log_needed)) - self.rrf_k - 1
                depth = max(depth + 1, min(depth * 4, needed))
        top = order[: self.top_k]
        return self._hits(fused, top, scores[: self.top_k], vsims)

    def _log_decay(self, at_us: _Ints) -> npt.NDArray[np.float64]:
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

    def _vector_list(self, depth: int, *, full: bool) -> tuple[_Keys, FloatArray, _Ints, bool]:
        empty = np.zeros(0, dtype=np.int64)
        if not self.use_vectors:
            return empty, np.zeros(0, dtype=np.float32), empty, False
        keys, sims, ats = [], [], []
        more = False
        for index, source in enumerate(self.sources):
            if source.ranking is None:
                continue
            size = len(source.ranking) if full else depth
            ids, scores, at = source.ranking.top(size)
            more = more or len(source.ranking) > size
            keys.append((np.int64(index) << _SHIFT) | ids)
            sims.append(scores)
            ats.append(at)
        key = np.concatenate(keys) if keys else empty
        sim = np.concatenate(sims) if sims else np.zeros(0, dtype=np.float32)
        at_all = np.concatenate(ats) if ats else empty
        if len(keys) > 1:
            keep = self._unshadowed(key)
            key, sim, at_all = key[keep], sim[keep], at_all[keep]
            order = np.argsort(-sim, kind="stable")  # source order breaks ties
            if not full and len(order) > depth:
                order, more = order[:depth], True
            key, sim, at_all = key[order], sim[order], at_all[order]
        return key, sim, at_all, more

    def _keyword_list(self, depth: int) -> tuple[_Keys, _Ints, bool]:
        empty = np.zeros(0, dtype=np.int64)
        if not self.use_keywords:
            return empty, empty, False
        fetched = [self._source_keywords(index, depth) for index in range(len(self.sources))]
        more = any(len(sub[0]) > depth or len(sub[0]) >= limit for limit, lists in fetched for sub in lists)
        per_source = [[sub.cut(depth) for sub in lists] for _, lists in fetched]
        count = max((len(lists) for lists in per_source), default=0)
        subkeys: list[_Keys] = []
        subats: list[_Ints] = []
        for n in range(count):
            parts = [
                (index, lists[n])
                for index, lists in enumerate(per_source)
                if n < len(lists) and len(lists[n].ids)
            ]
            if not parts:
                subkeys.append(empty)
                subats.append(empty)
                continue
            key = np.concatenate([(np.int64(i) << _SHIFT) | ranked.ids for i, ranked in parts])
            score = np.concatenate([ranked.scores for _, ranked in parts])
            at = np.concatenate([ranked.at for _, ranked in parts])
            if len(parts) > 1:
                keep = self._unshadowed(key)
                key, score, at = key[keep], score[keep], at[keep]
                order = np.argsort(-score, kind="stable")
                if len(order) > depth:
                    order, more = order[:depth], True
                key, at = key[order], at[order]
            subkeys.append(key.astype(np.int64))
            subats.append(at)
        if len(subkeys) == 1:
            return subkeys[0], subats[0], more
        fused = _Fused.of(fuse(subkeys, [1.0] * len(subkeys), PLAIN_RRF_K), subats)
        order = np.lexsort((fused.first, -fused.scores))[:depth]
        return fused.keys[order], fused.at[order], more

    def _source_keywords(self, index: int, depth: int) -> tuple[int, list[_Ranked]]:
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
            lists = [_with_times(source, ids, scores) for ids, scores in found]
        except MemstrataError as exc:
            if source.label is None:
                raise
            self.memory._archive_unusable(source.label, f"its full-text index failed: {exc}")
            lists = []
        self.keyword_cache[index] = (limit, lists)
        return limit, lists

    def _unshadowed(self, keys: _Keys) -> npt.NDArray[np.bool_]:
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
        self, fused: _Fused, top: _Ints, scores: npt.NDArray[np.float64], similarities: FloatArray
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
            sim = float(similarities[vrank - 1]) if vrank else None
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


_Keys = npt.NDArray[np.int64]
_Ints = npt.NDArray[np.int64]
_SHIFT = 40  # an episode key is ``source << 40 | id``
_MASK = (1 << _SHIFT) - 1


class _Ranked(NamedTuple):
    """A keyword sub-list of one source: episode ids best first, their scores and times."""

    ids: _Keys
    scores: npt.NDArray[np.float64]
    at: _Ints

    def cut(self, depth: int) -> _Ranked:
        return _Ranked(self.ids[:depth], self.scores[:depth], self.at[:depth])


def _with_times(source: _Source, ids: _Keys, scores: npt.NDArray[np.float64]) -> _Ranked:
    """Ranked episodes with their times (``at_us``): from the vector mirror for the episodes it
    holds (a recency-decayed search ranks thousands), from the table for the others; one
    removed meanwhile is dropped."""
    ids = np.asarray(ids, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float64)
    if source.matrix is not None:
        at, known = source.matrix.times(ids)
    else:
        at, known = np.zeros(len(ids), dtype=np.int64), np.zeros(len(ids), dtype=bool)
    missing = np.flatnonzero(~known)
    if len(missing):
        asked = ids[missing].tolist()
        found = dict(query_in(source.db, "SELECT id, at_us FROM episodes WHERE id IN", asked))
        at[missing] = [found.get(i, 0) for i in asked]
        known[missing] = [i in found for i in asked]
        ids, scores, at = ids[known], scores[known], at[known]
    return _Ranked(ids, scores, at)


@dataclass(slots=True)
class _Fused:
    """:func:`storage.fuse`'s result with each key's episode time (for recency decay)."""

    keys: _Keys  # distinct keys
    scores: npt.NDArray[np.float64]  # fused, normalised to 0..1
    first: _Ints  # first appearance across the lists (ties keep it)
    at: _Ints
    ranks: list[_Ints]  # 1-based rank in each list, 0 where absent

    @classmethod
    def of(cls, fused: FusedArrays, ats: Sequence[_Ints]) -> _Fused:
        every = np.concatenate(ats) if ats else np.zeros(0, dtype=np.int64)
        at = every[fused.first] if len(every) else np.zeros(0, dtype=np.int64)
        return cls(fused.keys, fused.scores, fused.first, at.astype(np.int64), fused.ranks)
