"""Segments and greedy packing: how every chunker turns its segments into chunks.

A chunker first cuts the text into *segments* (a line, a whole code fence, a whole definition, a
sentence of a very long line) that are never split further, gives each boundary between segments
a score (a Markdown heading or a top-level ``def`` is a better place to cut than the middle of a
paragraph), then packs segments greedily into chunks of at most ``tokens`` tokens, cutting at the
best-scored boundary of the last window. When a cut falls inside a section or a function, the next
chunk repeats up to ``overlap`` tokens of whole segments before it; a cut at a heading or a
top-level definition needs no overlap.

Only a single line longer than the budget is cut inside the line (at a sentence end, else at a
space, else anywhere). Each segment costs at least ``chars / 8`` tokens, so a chunk never exceeds
about ``8 * tokens`` characters even where the tokenizer sees almost nothing (whitespace).
Separate from the chunkers, which only decide segments and scores.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ._chunk import Chunk, TokenCounter, _check, estimate_tokens, normalize_newlines, split_lines

# Boundary scores of the pieces of one over-budget line (same scale as the chunkers' scores).
_PIECE_SENTENCE = 4
_PIECE_WORD = 2
_PIECE_CHAR = 1
_MIN_FILL = 4  # a cut leaves the chunk at least budget // _MIN_FILL tokens when it can
_MAX_CHARS_PER_TOKEN = 8


@dataclass(slots=True)
class _Seg:
    start: int  # char offsets in the normalised text
    end: int
    line: int  # first and last line, 1-based
    last: int
    tokens: int
    score: int  # how good a cut *before* this segment is
    hard: bool  # a cut before it needs no overlap (heading, top-level definition)
    blank: bool


# -- line cost and long lines ------------------------------------------------------------------


class _Cost:
    """Token cost of pieces of text, cached per chunking call (code repeats many short lines)."""

    def __init__(self, count: TokenCounter) -> None:
        self.count = count
        self.cache: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        cached = self.cache.get(text)
        if cached is not None:
            return cached
        floor = len(text) // _MAX_CHARS_PER_TOKEN
        value = max(1, floor, self.count(text + "\n"))  # the newline: estimates of joined lines add up
        if len(text) <= 160:
            self.cache[text] = value
        return value

    def over(self, text: str, budget: int) -> bool:
        """Whether ``text`` costs more than ``budget`` (cheap for very long text)."""
        if len(text) // _MAX_CHARS_PER_TOKEN > budget:
            return True
        return self(text) > budget


_SENTENCE_END = re.compile(r"(?<=[.!?;:。！？])[\"')\]]*\s+")


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _split_long(text: str, start: int, end: int, budget: int, cost: _Cost) -> list[tuple[int, int, int, int]]:
    """Cut one over-budget line into pieces within ``budget``: ``(start, end, tokens, score)``.

    Sentence ends first, then runs of about ``2 * budget`` characters cut at a space, else
    anywhere; a run still over budget is halved. Pieces are trimmed of surrounding whitespace.
    """
    pieces: list[tuple[int, int, int, int]] = []
    bounds = [start]
    bounds.extend(m.end() for m in _SENTENCE_END.finditer(text, start, end) if start < m.end() < end)
    bounds.append(end)
    for k in range(len(bounds) - 1):
        _runs(
            text,
            bounds[k],
            bounds[k + 1],
            budget,
            cost,
            _PIECE_SENTENCE if k else _PIECE_CHAR,
            budget * 2,
            pieces,
        )
    return pieces


def _runs(
    text: str,
    start: int,
    end: int,
    budget: int,
    cost: _Cost,
    lead: int,
    target: int,
    out: list[tuple[int, int, int, int]],
) -> None:
    start, end = _trim(text, start, end)
    if start >= end:
        return
    piece = text[start:end]
    if not cost.over(piece, budget):
        out.append((start, end, cost(piece), lead))
        return
    target = max(1, min(target, (end - start) // 2))  # at least two runs: always progresses
    pos, boundary = start, lead
    while pos < end:
        limit = pos + target
        if limit >= end:
            cut, kind = end, _PIECE_CHAR
        else:
            space = max(text.rfind(" ", pos + 1, limit + 1), text.rfind("\t", pos + 1, limit + 1))
            cut, kind = (space, _PIECE_WORD) if space > pos else (limit, _PIECE_CHAR)
        _runs(text, pos, cut, budget, cost, boundary, max(1, target // 2), out)
        pos, boundary = cut, kind


def _line_segments(
    text: str, start: int, end: int, lineno: int, score: int, hard: bool, budget: int, cost: _Cost
) -> list[_Seg]:
    """One segment for a line, or several pieces when the line alone exceeds the budget."""
    line = text[start:end]
    if not line.strip():
        return [_Seg(start, end, lineno, lineno, 1, score, hard, True)]
    if not cost.over(line, budget):
        return [_Seg(start, end, lineno, lineno, cost(line), score, hard, False)]
    pieces = _split_long(text, start, end, budget, cost)
    segs = [_Seg(s, e, lineno, lineno, t, sc, False, False) for s, e, t, sc in pieces]
    if segs:
        segs[0].score, segs[0].hard = score, hard
    return segs


# -- packing -----------------------------------------------------------------------------------


def _pack(text: str, segs: Sequence[_Seg], budget: int, overlap: int) -> list[Chunk]:
    """Greedy packing with the best-scored cut in each window and whole-segment overlap.

    ``fresh`` is the first segment the previous chunk did not hold: each chunk takes at least
    ``budget // 4`` tokens of new content when it can, so overlap never makes chunks crawl.
    """
    chunks: list[Chunk] = []
    n = len(segs)
    min_fill = max(1, budget // _MIN_FILL)
    i = fresh = 0
    while i < n:
        while fresh < n and segs[fresh].blank:
            fresh += 1
        if fresh >= n:
            break
        i = min(i, fresh)
        j = _fit(segs, i, budget)
        if j <= fresh and i < fresh:  # the overlap leaves no room for new content: drop it
            i = fresh
            j = _fit(segs, i, budget)
        if j <= fresh:  # one segment over the budget (segments are split before, so only by rounding)
            j = fresh + 1
        end = n if j >= n else _best_cut(segs, fresh, j, min_fill)
        chunk = _make_chunk(text, segs, i, end)
        if chunk is not None:
            chunks.append(chunk)
        if end >= n:
            break
        nxt = end
        if overlap > 0 and not segs[end].hard:
            acc, limit = 0, min(overlap, budget - min_fill)  # leave room for new content
            first = i
            while segs[first].blank:
                first += 1
            while nxt - 1 > first:
                cost = segs[nxt - 1].tokens
                if acc + cost > limit:
                    break
                acc += cost
                nxt -= 1
                if segs[nxt].hard:
                    break
        i, fresh = nxt, end
    return chunks


def _fit(segs: Sequence[_Seg], i: int, budget: int) -> int:
    """The end of the longest run of segments from ``i`` within ``budget``."""
    total, j = 0, i
    while j < len(segs) and total + segs[j].tokens <= budget:
        total += segs[j].tokens
        j += 1
    return j


def _best_cut(segs: Sequence[_Seg], fresh: int, j: int, min_fill: int) -> int:
    """Index ``k`` in ``(fresh, j]`` to cut before: best score, then latest, keeping at least
    ``min_fill`` tokens of new content when the window allows it."""
    best_k, best_key = j, (-1, -1)
    fallback_k, fallback_key = j, (-1, -1)
    fill = 0
    for k in range(fresh + 1, j + 1):
        fill += segs[k - 1].tokens
        if k == len(segs):
            break
        key = (segs[k].score, k)
        if fill >= min_fill and key > best_key:
            best_k, best_key = k, key
        if key > fallback_key:
            fallback_k, fallback_key = k, key
    return best_k if best_key[0] >= 0 else fallback_k


def _make_chunk(text: str, segs: Sequence[_Seg], i: int, end: int) -> Chunk | None:
    while i < end and segs[i].blank:
        i += 1
    while end > i and segs[end - 1].blank:
        end -= 1
    if i >= end:
        return None
    first, last = segs[i], segs[end - 1]
    body = text[first.start : last.end]
    if not body.strip():
        return None
    return Chunk(first.line, last.last, body, first.start, last.end)


def _line_offsets(text: str) -> list[tuple[int, int]]:
    """(start, end) char offsets of each line of normalised ``text``."""
    offsets = []
    pos = 0
    for line in split_lines(text):
        offsets.append((pos, pos + len(line)))
        pos += len(line) + 1
    return offsets


def _prepare(
    text: str, tokens: int, overlap: int, count: TokenCounter | None
) -> tuple[str, _Cost, list[str], list[tuple[int, int]]]:
    """A line chunker's start: the budget checked, then the normalised text, its token cost,
    its lines and their offsets."""
    _check(tokens, overlap)
    text = normalize_newlines(text)
    return text, _Cost(count or estimate_tokens), split_lines(text), _line_offsets(text)


class _LineSegmenter:
    """What the syntax-tree segmenters share: the text's lines, their costs, the segments so far."""

    def __init__(self, text: str, budget: int, cost: _Cost) -> None:
        self.text = text
        self.lines = split_lines(text)
        self.offsets = _line_offsets(text)
        self.budget = budget
        self.cost = cost
        self.line_cost = [cost(line) if line.strip() else 1 for line in self.lines]
        self.segs: list[_Seg] = []

    def _range_cost(self, lo: int, hi: int) -> int:
        return sum(self.line_cost[lo - 1 : hi])

    def _whole(self, lo: int, hi: int, score: int, hard: bool) -> bool:
        """Lines ``lo..hi`` as one segment if they fit the budget (then True), else nothing."""
        cost = self._range_cost(lo, hi)
        if cost > self.budget:
            return False
        s, e = self.offsets[lo - 1][0], self.offsets[hi - 1][1]
        self.segs.append(_Seg(s, e, lo, hi, cost, score, hard, not self.text[s:e].strip()))
        return True

    def _lines(self, lo: int, hi: int, first_score: int, first_hard: bool, score: int) -> None:
        """Lines ``lo..hi`` one by one: the first scored ``first_score``, the others ``score``."""
        for n in range(lo, hi + 1):
            s, e = self.offsets[n - 1]
            first = n == lo
            self.segs.extend(
                _line_segments(
                    self.text,
                    s,
                    e,
                    n,
                    first_score if first else score,
                    first_hard and first,
                    self.budget,
                    self.cost,
                )
            )
