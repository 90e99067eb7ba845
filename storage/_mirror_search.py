"""Searching a vector mirror (:class:`._vector_mirror.Mirror`) with its filters inside it.

From ``approximate_from`` rows, a mirror of unit rows with enough dimensions *sieves*: a search
whose filter allows enough rows (:meth:`MirrorSearch._sieves`) reads their sign codes
(:mod:`._sign_codes`) and scores only the nearest few thousand; a more selective filter scores
all its rows. A sieved mirror scores on its int8 rows (:mod:`._int8_rows`) and reads only the
best few again in float32, from the index file when it has them there (:mod:`._file_rows`): its
searches never walk the float32 matrix at large. Other mirrors (fewer dimensions, rows not of unit
length) scan inverted lists instead (:mod:`._ivf`), in float32; ``exact=True`` scores every
allowed row in float32.

A filter is equality on metadata columns (``where``, compared as integer codes) and half-open
ranges on integer columns (``ranges``, e.g. a time). The sorted rows are ordered by the group
column (under inverted lists: by list, then by group), so a filter on the group reads that
group's block (its block of each list): only the allowed rows. Other filters are masks; a mask
whose allowed rows form few runs (a time range over rows added in time order) is scanned run by
run, in place, and only a scattered one gathers its rows. No id list crosses from SQL on this path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from ._array_types import BoolArray, FloatArray, IntArray
from ._distinct import distinct
from ._ivf import Partition
from ._mirror_hits import Ranked, ScoredRows, VectorHit
from ._mirror_scoring import Found, MirrorScoring
from ._row_slices import group_mask, merged, runs, slice_rows
from ._sign_codes import candidates
from ._vector_kernels import dot, dot_each_row, dot_rows, unit_rows

__all__ = ["MirrorSearch", "Ranges"]

Ranges = Mapping[str, tuple[int | None, int | None]]  # column -> [low, high), None: unbounded

_EXACT_SHARE = 0.5  # a search that would scan more than this share of its rows scans them all
_CANDIDATE_LOOKUP_MAX = 2048  # up to this many candidate ids, look positions up one by one
_RUNS_MAX = 512  # a mask of at most this many runs of allowed rows is scanned run by run
# scattered allowed rows up to this share are gathered and scored; more, and every row is scored
# in place and the allowed ones kept: a gathered row costs ~3x a row scanned in place (measured
# at 50k and 200k x 384 on 2 cores, crossing at a share of 0.3-0.4)
_GATHER_SHARE = 0.35
_GAP_ROWS = 24  # rows between two slices to scan that cost less scanned than one more numpy call
# A filter allowing at least this share of the rows reads the sign codes, or fewer when scoring
# its rows costs more than the sieve: measured at 1M rows (2 cores), int8 scores cost 0.1-0.25 us
# a row (a block, scattered rows), sign codes 0.01 us a row they are read for, and the sieve's
# candidates ~2 ms. A 20 % category: 23 ms scored against 2 ms sieved, recall@10 1.0 both.
_SIGN_SHARE = 0.15
_SIGN_ROWS = 8192  # rows allowed from which a filter whose codes are read alone sieves


_Found = Found


def _empty() -> _Found:
    return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)


class MirrorSearch(MirrorScoring):
    """The search half of :class:`._vector_mirror.Mirror` (its base class)."""

    group: str | None
    rowids: IntArray
    alive: BoolArray
    codes: dict[str, npt.NDArray[np.int32]]
    ints: dict[str, IntArray]
    vocab: dict[str, dict[Any, int]]
    blocks: IntArray
    groups: int
    sorted_end: int
    dead: int
    partition: Partition | None

    def _check_blocks(self) -> None:
        raise NotImplementedError

    @property
    def grouped(self) -> bool:
        """True when the sorted rows are grouped by :attr:`group`'s codes."""
        return self.group is not None and self.groups > 1

    def search(
        self,
        query: FloatArray,
        k: int,
        where: Mapping[str, Any],
        candidates: IntArray | None,
        *,
        exact: bool = False,
        ranges: Ranges | None = None,
    ) -> list[VectorHit]:
        """Top ``k`` by cosine similarity among the rows ``where``, ``ranges`` and
        ``candidates`` allow, best first (see :meth:`rank`)."""
        return self.rank(query, k, where, candidates, exact=exact, ranges=ranges).hits()

    def rank(
        self,
        query: FloatArray,
        k: int,
        where: Mapping[str, Any],
        candidates: IntArray | None = None,
        *,
        exact: bool = False,
        ranges: Ranges | None = None,
    ) -> Ranked:
        """:meth:`search` as arrays. Under a partition, searches without ``candidates`` scan the
        lists nearest the query unless ``exact``."""
        query = self._unit_query(query)
        positions, _ = self._find(query, k, where, candidates, exact, dict(ranges or {}))
        positions, scores = self._reported(positions, query, self.rowids)
        return Ranked(self.rowids[positions], scores, positions)

    def scored(self, query: FloatArray, where: Mapping[str, Any], ranges: Ranges | None = None) -> ScoredRows:
        """Every live row ``where`` and ``ranges`` allow, with its exact similarity to ``query``
        (for a caller that ranks the same query ever deeper: see :class:`ScoredRows`)."""
        codes = self._codes_of(where)
        size = self.size
        if size == 0 or codes is None:
            return ScoredRows(self.rowids, *_empty())
        query = self._unit_query(query)
        positions, scores = self._replayable(query, self._match(codes, dict(ranges or {}), 0, size), size)
        return ScoredRows(self.rowids, positions, scores)

    def _replayable(
        self, query: FloatArray, valid: BoolArray | None, size: int
    ) -> tuple[IntArray, FloatArray]:
        """Positions of the rows ``valid`` allows and their similarities, each computed row by
        row by einsum: the same bits whatever the row's position, the batch it is in or the
        machine's load (BLAS, which the other scans may pick by timing, sums in another order),
        so a ranking read from them replays exactly."""
        if valid is None:
            return np.arange(size, dtype=np.int64), dot_each_row(self.matrix, [0], [size], query)
        starts, ends = runs(valid)
        if len(starts) <= _RUNS_MAX:  # in place, run by run (a time range)
            scores = dot_each_row(self.matrix, starts.tolist(), ends.tolist(), query)
            return slice_rows(starts.astype(np.int64), ends.astype(np.int64)), scores
        positions = np.flatnonzero(valid)
        if len(positions) < _GATHER_SHARE * size:  # scattered, and few enough to gather
            return positions, dot_rows(self.matrix, positions, query)  # einsum, block by block
        return positions, dot_each_row(self.matrix, [0], [size], query)[positions]

    def _unit_query(self, query: FloatArray) -> FloatArray:
        """The query as the rows are kept: L2-normalised in a mirror of unit rows."""
        return unit_rows(query.reshape(1, -1))[0] if self.unit else query.astype(np.float32, copy=False)

    def _exact_allowed(
        self, query: FloatArray, valid: BoolArray | None, size: int
    ) -> tuple[IntArray, FloatArray]:
        """Positions of the rows ``valid`` allows (all for ``None``) and their exact similarities
        (possibly a view of the scan's buffer, valid until the next scan): scanned in place when
        they form few runs, gathered when scattered and few, else every row scored and the
        allowed ones kept."""
        if valid is None:
            return np.arange(size, dtype=np.int64), dot(self.matrix[:size], query)
        starts, ends = runs(valid)
        if len(starts) <= _RUNS_MAX:  # in place, run by run (a time range, a group's tail)
            scores, positions = self._scan(query, starts.tolist(), ends.tolist())
            return positions, scores
        positions = np.flatnonzero(valid)
        if len(positions) < _GATHER_SHARE * size:  # scattered, and few enough to gather
            return positions, self._exact_scores(positions, query)
        return positions, dot(self.matrix[:size], query)[positions]

    def count(self, where: Mapping[str, Any], ranges: Ranges | None = None) -> int:
        """How many live rows ``where`` and ``ranges`` allow."""
        codes = self._codes_of(where)
        if codes is None:
            return 0
        valid = self._match(codes, dict(ranges or {}), 0, self.size)
        return self.size - self.dead if valid is None else int(np.count_nonzero(valid))

    def _find(
        self,
        query: FloatArray,
        k: int,
        where: Mapping[str, Any],
        candidates: IntArray | None,
        exact: bool,
        ranges: Ranges,
    ) -> _Found:
        """Positions of the best ``k`` (``query`` as the rows are kept: :meth:`_unit_query`)."""
        if self.size == 0 or k <= 0:
            return _empty()
        codes = self._codes_of(where)
        if codes is None:
            return _empty()
        if candidates is not None:
            return self._search_candidates(query, k, codes, ranges, candidates)
        self._check_blocks()
        if self.grouped and self.group in codes:
            group = codes.pop(self.group)
            return self._search_group(query, k, group, codes, ranges, exact)
        return self._search_masked(query, k, codes, ranges, exact)

    def _codes_of(self, where: Mapping[str, Any]) -> dict[str, int] | None:
        """``where`` as codes; ``None`` when a value is unknown (nothing can match)."""
        codes = {}
        for column, value in where.items():
            code = self.vocab[column].get(value)
            if code is None:
                return None
            codes[column] = code
        return codes

    def _match(self, codes: Mapping[str, int], ranges: Ranges, a: int, b: int) -> BoolArray | None:
        """Which rows of ``[a, b)`` are alive and pass ``codes`` and ``ranges``; ``None``: all."""
        valid: BoolArray | None = None

        def add(match: BoolArray) -> None:
            nonlocal valid
            valid = match if valid is None else np.logical_and(valid, match, out=valid)

        for column, code in codes.items():
            add(self.codes[column][a:b] == code)
        for column, (low, high) in ranges.items():
            values = self.ints[column][a:b]
            if low is not None:
                add(values >= low)
            if high is not None:
                add(values < high)
        if self.dead:
            alive = self.alive[a:b]
            add(alive.copy() if valid is None else alive)
        return valid

    def _probe_rows(self, part: Partition, k: int) -> float:
        raise NotImplementedError

    def _search_masked(
        self, query: FloatArray, k: int, codes: Mapping[str, int], ranges: Ranges, exact: bool
    ) -> _Found:
        """Unfiltered, or filtered by columns other than the group: a mask over every row."""
        size = self.size
        valid = self._match(codes, ranges, 0, size)
        allowed = size if valid is None else int(np.count_nonzero(valid))
        if allowed == 0:
            return _empty()
        k = min(k, allowed)
        part = self.partition
        if not exact and self._sieves(allowed, size):
            return self._search_signs(query, k, [0], [size], valid)
        if part is not None and not exact:
            # 1/f times more rows for a filter passing a share f of them: scaling less loses
            # recall on filters that follow topics (measured at 1M, f = 10%: recall@10 0.92 with
            # sqrt(1/f)), so a filter under ~20% scans its rows exactly
            rows = self._probe_rows(part, k) * (size / allowed)
            if rows < _EXACT_SHARE * size:
                found = self._search_lists(part, query, k, valid, rows)
                if found is not None:
                    return found
        if valid is None:
            return self._top(dot(self.matrix[:size], query), k, None)
        coarse = self._coarse(exact)
        if coarse is None:
            positions, scores = self._exact_allowed(query, valid, size)
            return self._top(scores, k, positions)
        # int8 rows: a sieved mirror comes here only for filters below its sieve's share
        starts, ends = runs(valid)
        if len(starts) <= _RUNS_MAX:
            scores, positions = self._scan(query, starts.tolist(), ends.tolist(), coarse)
            return self._best(query, k, scores, positions, True)
        return self._score_rows(query, k, np.flatnonzero(valid), exact)

    def _sieves(self, allowed: int, read: int) -> bool:
        """Whether a search that allows ``allowed`` rows sieves them by sign codes (reading the
        codes of ``read`` rows) rather than scoring them all."""
        return self.sieved and allowed >= min(_SIGN_SHARE * self.size, read // 20 + _SIGN_ROWS)

    def _search_signs(
        self, query: FloatArray, k: int, starts: list[int], ends: list[int], valid: BoolArray | None
    ) -> _Found:
        """Top ``k`` of the allowed rows of the slices ``starts[i]:ends[i]``: the nearest to the
        query by sign code, rescored exactly."""
        signs = self.sign_codes()
        assert signs is not None
        count = candidates(sum(ends) - sum(starts), k)
        return self._score_rows(query, k, signs.nearest(query, starts, ends, valid, count), False)

    def _search_group(
        self,
        query: FloatArray,
        k: int,
        group: int,
        codes: Mapping[str, int],
        ranges: Ranges,
        exact: bool,
    ) -> _Found:
        """Filtered by the group column: only that group's blocks (one per list) and the tail
        are scanned."""
        size, end = self.size, self.sorted_end
        part = self.partition
        lo, hi = self._group_blocks(group)
        keep = hi > lo
        lo, hi = lo[keep], hi[keep]
        grouped_rows = int((hi - lo).sum())
        assert self.group is not None
        tail = self.codes[self.group][end:size] == group
        rest = self._match(codes, ranges, end, size)
        if rest is not None:
            tail &= rest
        inner: BoolArray | None = None  # the group's sorted rows passing the rest, in block order
        inside = np.zeros(0, dtype=np.int64)
        if codes or ranges or self.dead:
            inside = slice_rows(lo, hi)
            inner = self._match_at(codes, ranges, inside)
        in_group = grouped_rows if inner is None else int(np.count_nonzero(inner))
        allowed = in_group + int(np.count_nonzero(tail))
        if allowed == 0:
            return _empty()
        k = min(k, allowed)
        if not exact and self._sieves(allowed, grouped_rows + size - end):
            # the group's blocks and the tail, rows the rest of the filter rejects masked
            starts, ends = lo.tolist(), hi.tolist()
            if size > end:
                starts.append(end)
                ends.append(size)
            return self._search_signs(query, k, starts, ends, group_mask(size, end, inside, inner, tail))
        if part is not None and not exact and in_group:
            # the allowed rows an unfiltered search scans (``_probe_rows``), found in
            # the group's own block of the lists nearest the query; 1/f more for the rest of
            # the filter
            rows = self._probe_rows(part, k) * (grouped_rows / in_group)
            if rows < _EXACT_SHARE * grouped_rows:
                valid = group_mask(size, end, inside, inner, tail)
                found = self._search_lists(part, query, k, valid, rows, group=group)
                if found is not None:
                    return found
        # every block of the group (one slice without a partition), plus the tail's allowed rows
        coarse = self._coarse(exact)
        if len(lo) == 1 and coarse is None:
            a, b = int(lo[0]), int(hi[0])
            scores, positions = dot(self.matrix[a:b], query), np.arange(a, b, dtype=np.int64)
        else:
            scores, positions = self._scan(query, lo.tolist(), hi.tolist(), coarse)
        if inner is not None:
            chosen = np.flatnonzero(inner)
            scores, positions = scores[chosen], positions[chosen]
        extra = np.flatnonzero(tail) + end
        if len(extra):
            more = dot_rows(self.matrix, extra, query) if coarse is None else coarse.scores_at(extra, query)
            scores = np.concatenate([scores, more])
            positions = np.concatenate([positions, extra])
        return self._best(query, k, scores, positions, coarse is not None)

    def _group_blocks(self, group: int) -> tuple[IntArray, IntArray]:
        """Starts and ends of ``group``'s block in each list (one list without a partition);
        empty for a value first seen after the rows were sorted (its rows are in the tail)."""
        groups = self.groups
        if group >= groups:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        blocks = self.blocks
        return blocks[group:-1:groups], blocks[group + 1 :: groups]

    def _match_at(self, codes: Mapping[str, int], ranges: Ranges, positions: IntArray) -> BoolArray | None:
        """Which rows at ``positions`` are alive and pass ``codes`` and ``ranges``; ``None``: all."""
        ok: BoolArray | None = None
        for column, code in codes.items():
            match = self.codes[column][positions] == code
            ok = match if ok is None else ok & match
        for column, (low, high) in ranges.items():
            values = self.ints[column][positions]
            if low is not None:
                ok = values >= low if ok is None else ok & (values >= low)
            if high is not None:
                ok = values < high if ok is None else ok & (values < high)
        if self.dead:
            alive = self.alive[positions]
            ok = alive if ok is None else ok & alive
        return ok

    def _search_candidates(
        self, query: FloatArray, k: int, codes: Mapping[str, int], ranges: Ranges, candidates: IntArray
    ) -> _Found:
        size = self.size
        if len(candidates) <= _CANDIDATE_LOOKUP_MAX:
            positions = self._lookup(distinct(candidates))
            positions = positions[positions >= 0]
            mask = self._match_at(codes, ranges, positions)
            if mask is not None:
                positions = positions[mask]
        else:
            valid = self.alive[:size] & np.isin(self.rowids[:size], candidates)
            rest = self._match(codes, ranges, 0, size)
            if rest is not None:
                valid &= rest
            positions = np.flatnonzero(valid)
        if len(positions) == 0:
            return _empty()
        k = min(k, len(positions))
        if len(positions) * 2 < size or self.sieved:
            return self._score_rows(query, k, positions, False)
        return self._top(dot(self.matrix[:size], query)[positions], k, positions)

    def _lookup(self, rowids: IntArray) -> IntArray:
        raise NotImplementedError

    def _spans(
        self, part: Partition, query: FloatArray, rows: float, group: int | None
    ) -> tuple[list[int], list[int]]:
        """Slices to scan: the lists nearest ``query`` until they hold ``rows`` rows (of
        ``group``: its block of each list; else each list whole, one slice), in storage order,
        and the tail. Whole lists are merged where adjacent or only ``_GAP_ROWS`` apart (the rows
        between, of other lists, are scored too: fewer, longer scans); a group's blocks are
        separated by the other groups' rows and are not merged."""
        groups = self.groups
        if group is None:
            lo_all, hi_all = self.blocks[:-1:groups], self.blocks[groups::groups]
            gap = _GAP_ROWS
        else:
            lo_all, hi_all = self._group_blocks(group)
            gap = 0
        scores = np.einsum("ij,j->i", part.centroids, query)
        ranked = np.argsort(-scores, kind="stable")
        count = min(len(ranked), int(np.searchsorted(np.cumsum((hi_all - lo_all)[ranked]), rows)) + 1)
        chosen = np.sort(ranked[:count])
        lo, hi = lo_all[chosen], hi_all[chosen]
        keep = hi > lo
        starts, ends = merged(lo[keep], hi[keep], gap)
        if self.size > self.sorted_end:
            if ends and ends[-1] == self.sorted_end:
                ends[-1] = self.size
            else:
                starts.append(self.sorted_end)
                ends.append(self.size)
        return starts, ends

    def _search_lists(
        self,
        part: Partition,
        query: FloatArray,
        k: int,
        valid: BoolArray | None,
        rows: float,
        *,
        group: int | None = None,
    ) -> _Found | None:
        """Top ``k`` among the rows of the lists nearest ``query`` (only ``group``'s blocks of
        them, when given) and the tail, scored exactly; ``None`` when those rows hold fewer than
        ``k`` allowed ones (the caller scans all)."""
        starts, ends = self._spans(part, query, rows, group)
        if sum(ends) - sum(starts) < k:
            return None
        scored, positions = self._scan(query, starts, ends)
        if valid is not None:
            ok = valid[positions]
            if int(np.count_nonzero(ok)) < k:
                return None
            scored[~ok] = -np.inf
        return self._top(scored, k, positions)
