"""The line-aware chunker for any source language without a syntax tree (and the fallback of the others).

Cuts are preferred at blank lines before unindented code, then at shallow indentation; never just
before a closing bracket. Packing is :mod:`._chunk_pack`'s.
"""

from __future__ import annotations

import re

from ._chunk import Chunk, TokenCounter
from ._chunk_pack import _line_segments, _pack, _prepare, _Seg

__all__ = ["chunk_code"]

_CLOSER = re.compile(r"^\s*(?:[}\])]|end\b|</)")


def _indent(line: str) -> int:
    width = 0
    for char in line:
        if char == " ":
            width += 1
        elif char == "\t":
            width += 4
        else:
            break
    return width


def chunk_code(
    text: str, *, tokens: int = 400, overlap: int = 80, count: TokenCounter | None = None
) -> list[Chunk]:
    """Any source language, line-aware: prefer cuts at blank lines before unindented code, then
    at shallow indentation; never just before a closing bracket."""
    text, cost, lines, offsets = _prepare(text, tokens, overlap, count)
    segs: list[_Seg] = []
    prev_blank = True
    for i, line in enumerate(lines):
        start, end = offsets[i]
        if not line.strip():
            segs.append(_Seg(start, end, i + 1, i + 1, 1, 30, False, True))
            prev_blank = True
            continue
        depth = min(_indent(line) // 2, 10)
        if _CLOSER.match(line):
            score = 2
        elif depth == 0:
            score = 60 if prev_blank else 35
        else:
            score = max(6, (28 if prev_blank else 24) - depth * 2)
        segs.extend(_line_segments(text, start, end, i + 1, score, False, tokens, cost))
        prev_blank = False
    return _pack(text, segs, tokens, overlap)
