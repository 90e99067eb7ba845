"""The Markdown (and prose) chunker: headings first, then paragraphs and list items, then sentences.

One chunker per module: each decides only its segments and boundary scores, and leaves the packing
to :mod:`._chunk_pack`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ._chunk import Chunk, TokenCounter
from ._chunk_pack import _line_segments, _pack, _prepare, _Seg

__all__ = ["chunk_markdown"]

# Boundary scores: a chunk is cut before the segment with the best score in the last window.
_H = {1: 100, 2: 92, 3: 86, 4: 80, 5: 76, 6: 72}
_RULE = 60
_PARAGRAPH = 50
_LIST_ITEM = 40
_SENTENCE = 30
_LINE = 10
_FENCE_LINE = 3


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]|$)")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_RULE_LINE = re.compile(r"^ {0,3}(?:(?:\*[ \t]*){3,}|(?:-[ \t]*){3,}|(?:_[ \t]*){3,})$")
_LIST = re.compile(r"^[ \t]*(?:[-*+]|\d{1,9}[.)])(?:[ \t]|$)")
_ENDS_SENTENCE = re.compile(r"[.!?:;。！？][\"')\]*_]*[ \t]*$")


def _fence_end(lines: Sequence[str], i: int, marker: str) -> int:
    """Index of the line closing the fence opened at ``i`` (the last line when unclosed)."""
    char, length = marker[0], len(marker)
    closing = re.compile(r"^ {0,3}" + re.escape(char) + "{" + str(length) + r",}[ \t]*$")
    for j in range(i + 1, len(lines)):
        if closing.match(lines[j]):
            return j
    return len(lines) - 1


def chunk_markdown(
    text: str, *, tokens: int = 400, overlap: int = 80, count: TokenCounter | None = None
) -> list[Chunk]:
    """Markdown (and prose): headings first, then paragraphs and list items, then sentences.

    A code fence is one segment, never cut, when it fits the budget; a larger fence is cut at
    line boundaries (its lines are the worst-scored boundaries, so only when nothing else fits).
    """
    text, cost, lines, offsets = _prepare(text, tokens, overlap, count)
    segs: list[_Seg] = []
    prev_blank, prev_sentence = True, False
    i = 0
    while i < len(lines):
        line = lines[i]
        start, end = offsets[i]
        fence = _FENCE.match(line)
        if fence:
            j = _fence_end(lines, i, fence.group(1))
            while j > i and not lines[j].strip():  # an unclosed fence: trailing blank lines are not code
                j -= 1
            score = _PARAGRAPH if prev_blank else _LIST_ITEM
            whole_start, whole_end = start, offsets[j][1]
            if not cost.over(text[whole_start:whole_end], tokens):
                whole = text[whole_start:whole_end]
                segs.append(_Seg(whole_start, whole_end, i + 1, j + 1, cost(whole), score, False, False))
            else:
                for k in range(i, j + 1):
                    s, e = offsets[k]
                    segs.extend(
                        _line_segments(
                            text, s, e, k + 1, score if k == i else _FENCE_LINE, False, tokens, cost
                        )
                    )
            i = j + 1
            prev_blank, prev_sentence = False, True
            continue
        stripped = line.strip()
        if not stripped:
            segs.append(_Seg(start, end, i + 1, i + 1, 1, _PARAGRAPH, False, True))
            prev_blank = True
            i += 1
            continue
        heading = _ATX.match(line)
        if heading:
            level = len(heading.group(1))
            segs.extend(_line_segments(text, start, end, i + 1, _H[level], True, tokens, cost))
            prev_blank, prev_sentence = False, True
            i += 1
            continue
        if prev_blank and i + 1 < len(lines) and _SETEXT.match(lines[i + 1]) and not _LIST.match(line):
            level = 1 if lines[i + 1].strip().startswith("=") else 2
            segs.extend(_line_segments(text, start, end, i + 1, _H[level], True, tokens, cost))
            s, e = offsets[i + 1]
            segs.extend(_line_segments(text, s, e, i + 2, 0, False, tokens, cost))
            prev_blank, prev_sentence = False, True
            i += 2
            continue
        if _RULE_LINE.match(line):
            score = _RULE
        elif _LIST.match(line):
            score = _LIST_ITEM
        elif prev_blank:
            score = _PARAGRAPH
        elif prev_sentence:
            score = _SENTENCE
        else:
            score = _LINE
        segs.extend(_line_segments(text, start, end, i + 1, score, False, tokens, cost))
        prev_blank, prev_sentence = False, bool(_ENDS_SENTENCE.search(line))
        i += 1
    return _pack(text, segs, tokens, overlap)
