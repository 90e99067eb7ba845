"""The candidate lists of an episodic search: one source's keyword sub-list with its times, a
source's best vectors, and how much of a merged or fused list no unread entry can still enter
(what lets a recency-decayed search stop early and still rank as the full-depth lists would)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from memstrata.storage import PLAIN_RRF_K, FloatArray, FusedArrays, IntArray, best_score

from ._episode_records import query_in
from ._episode_vectors import EpisodeRanking
from ._episodic_state import _Source

__all__ = ["MARGIN", "Fused", "Ranked", "fused_prefix", "settled", "source_top", "with_times"]

Keys = IntArray  # episode keys: ``source << 40 | id``
MARGIN = 1e-9  # log-space slack: a bound this close to the k-th counts as reaching it (rounding)


class Ranked(NamedTuple):
    """A keyword sub-list of one source: episode ids best first, their scores and times."""

    ids: Keys
    scores: npt.NDArray[np.float64]
    at: IntArray

    def cut(self, depth: int) -> Ranked:
        return Ranked(self.ids[:depth], self.scores[:depth], self.at[:depth])


def with_times(source: _Source, ids: Keys, scores: npt.NDArray[np.float64]) -> Ranked:
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
    return Ranked(ids, scores, at)


def source_top(ranking: EpisodeRanking, size: int, *, exact: bool) -> tuple[Keys, FloatArray, IntArray, bool]:
    """One source's best ``size`` vectors and whether it holds more. ``exact``: read past a group
    of equal similarities that the cut splits, so the cut keeps the members the full ranking puts
    first (a plain top ``size`` keeps an arbitrary part of it, and ranks would change with depth)."""
    total = len(ranking)
    if not exact or size <= 0 or size >= total:
        ids, sims, at = ranking.top(size)
        return ids, sims, at, total > size
    reach = size + 1
    while True:
        ids, sims, at = ranking.top(reach)
        if reach >= total or sims[-1] < sims[size - 1]:
            return ids[:size], sims[:size], at[:size], True
        reach = min(total, 2 * reach)


def settled(scores: npt.NDArray[Any], sources: IntArray, frontier: list[tuple[int, float]]) -> int:
    """How much of a merged list (best first, ties in source order) no unread entry can enter:
    a source not read to its end may still hold entries scoring as its last one read
    (``frontier``), and one of those ties ahead of an entry of a later source."""
    ok = np.ones(len(scores), dtype=bool)
    for source, last in frontier:
        ok &= (scores > last) | ((scores == last) & (sources <= source))
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if len(bad) else len(scores)


def fused_prefix(fused: Fused, order: IntArray, lists: list[Keys], going: list[bool]) -> int:
    """How much of the RRF of keyword sub-lists (``order``: best first) is that of the sub-lists
    read to their end: an entry counts if its score is whole (it is in every sub-list that goes
    on) and beats what any later entry, or one in no sub-list, could still gain."""
    best = best_score([1.0] * len(lists), PLAIN_RRF_K)
    gaps = [
        1.0 / (PLAIN_RRF_K + len(keys) + 1) / best if more else 0.0
        for keys, more in zip(lists, going, strict=True)
    ]
    if not any(gaps):
        return len(order)
    missing = np.zeros(len(fused.keys), dtype=np.float64)
    for gap, ranks in zip(gaps, fused.ranks, strict=True):
        if gap:
            missing += (ranks == 0) * gap
    scores = fused.scores[order]
    later = np.where(missing[order] > 0, scores + missing[order], 0.0)
    # the best bound among the entries after each one (ties among whole scores rank exactly)
    after = np.maximum.accumulate(later[::-1])[::-1]
    after = np.append(after[1:], 0.0)
    ok = (missing[order] == 0) & (scores * (1 - MARGIN) > np.maximum(after, sum(gaps)))
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if len(bad) else len(order)


@dataclass(slots=True)
class Fused:
    """:func:`storage.fuse`'s result with each key's episode time (for recency decay)."""

    keys: Keys  # distinct keys
    scores: npt.NDArray[np.float64]  # fused, normalised to 0..1
    first: IntArray  # first appearance across the lists (ties keep it)
    at: IntArray
    ranks: list[IntArray]  # 1-based rank in each list, 0 where absent

    @classmethod
    def of(cls, fused: FusedArrays, ats: Sequence[IntArray]) -> Fused:
        every = np.concatenate(ats) if ats else np.zeros(0, dtype=np.int64)
        at = every[fused.first] if len(every) else np.zeros(0, dtype=np.int64)
        return cls(fused.keys, fused.scores, fused.first, at.astype(np.int64), fused.ranks)
