"""Chunkers: split a file's text into overlapping chunks with exact 1-based line ranges.

Every chunker is a pure function of the text. It first cuts the text into *segments* (a line, a
whole code fence, a whole Python definition, a sentence of a very long line) that are never split
further, gives each boundary between segments a score (a Markdown heading or a top-level ``def``
is a better place to cut than the middle of a paragraph), then packs segments greedily into
chunks of at most ``tokens`` tokens, cutting at the best-scored boundary of the last window. When
a cut falls inside a section or a function, the next chunk repeats up to ``overlap`` tokens of
whole segments before it; a cut at a heading or a top-level definition needs no overlap.

Offsets and line numbers refer to the text with newlines normalised (``\\r\\n`` and ``\\r`` become
``\\n``), which is also how :meth:`MemoryFiles.get` numbers lines. A chunk made of whole lines has
exactly the text of its lines; only a single line longer than the budget is cut inside the line
(at a sentence end, else at a space, else anywhere), and then ``start_line == end_line``.

Tokens are counted with the embedder's tokenizer when it has ``count_tokens``, else estimated as
``ceil(chars / 4)``. Each segment also costs at least ``chars / 8`` tokens, so a chunk never
exceeds about ``8 * tokens`` characters even where the tokenizer sees almost nothing (whitespace).
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

__all__ = [
    "CHUNKER_VERSION",
    "ESTIMATE_NAME",
    "Chunk",
    "TokenCounter",
    "chunk_code",
    "chunk_file",
    "chunk_markdown",
    "chunk_python",
    "chunker_for",
    "estimate_tokens",
    "language_for",
    "model_token_counter",
    "normalize_newlines",
    "split_lines",
]

# Bump whenever chunk boundaries may change for the same input: stores purge and rebuild.
CHUNKER_VERSION = 1
ESTIMATE_NAME = "chars/4"

TokenCounter = Callable[[str], int]

# Boundary scores: a chunk is cut before the segment with the best score in the last window.
_H = {1: 100, 2: 92, 3: 86, 4: 80, 5: 76, 6: 72}
_RULE = 60
_PARAGRAPH = 50
_LIST_ITEM = 40
_SENTENCE = 30
_LINE = 10
_FENCE_LINE = 3
_PIECE_SENTENCE = 4
_PIECE_WORD = 2
_PIECE_CHAR = 1
_PY_TOP_DEF = 100
_PY_TOP_STMT = 70
_PY_DEF = 55
_PY_STMT = 40
_PY_LINE = 5
_MIN_FILL = 4  # a cut leaves the chunk at least budget // _MIN_FILL tokens when it can
_MAX_CHARS_PER_TOKEN = 8
_MODEL_PIECE_CHARS = 200  # tokenizers may truncate (e.g. at 256 tokens): count long text in pieces


@dataclass(frozen=True, slots=True)
class Chunk:
    """A chunk of a file: ``text == source[start_char:end_char]`` of the normalised source."""

    start_line: int  # 1-based, inclusive
    end_line: int  # 1-based, inclusive
    text: str
    start_char: int
    end_char: int


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


def estimate_tokens(text: str) -> int:
    """The stated estimate when no tokenizer is available: one token per four characters."""
    return (len(text) + 3) // 4


def model_token_counter(count_tokens: Callable[[str], int]) -> TokenCounter:
    """Wrap a tokenizer's counter so long text is counted in pieces (tokenizers truncate)."""

    def count(text: str) -> int:
        if len(text) <= _MODEL_PIECE_CHARS:
            return int(count_tokens(text))
        return sum(
            int(count_tokens(text[i : i + _MODEL_PIECE_CHARS]))
            for i in range(0, len(text), _MODEL_PIECE_CHARS)
        )

    return count


def normalize_newlines(text: str) -> str:
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


def split_lines(text: str) -> list[str]:
    """Lines of normalised ``text`` without their newlines; a final newline adds no empty line."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


# -- languages ---------------------------------------------------------------------------------

_LANGUAGES = {
    ".py": "python", ".pyi": "python", ".rs": "rust", ".ts": "typescript", ".tsx": "typescript",
    ".js": "javascript", ".jsx": "javascript", ".mjs": "javascript", ".cjs": "javascript",
    ".cs": "csharp", ".go": "go", ".java": "java", ".kt": "kotlin", ".c": "c", ".h": "c",
    ".cc": "cpp", ".cpp": "cpp", ".hpp": "cpp", ".rb": "ruby", ".php": "php", ".swift": "swift",
    ".sh": "shell", ".bash": "shell", ".sql": "sql", ".md": "markdown", ".markdown": "markdown",
    ".rst": "text", ".txt": "text", ".toml": "toml", ".json": "json", ".yaml": "yaml", ".yml": "yaml",
    ".html": "html", ".css": "css", ".scss": "css", ".xml": "xml", ".lua": "lua", ".scala": "scala",
}  # fmt: skip


def language_for(path: str) -> str:
    """The language name stored with a file's chunks (``python``, ``markdown``, ``rust``, ...)."""
    suffix = PurePosixPath(path).suffix.lower()
    return _LANGUAGES.get(suffix, suffix.lstrip(".") or "text")


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


def _check(tokens: int, overlap: int) -> None:
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 8:
        from memstrata.errors import InvalidInputError

        raise InvalidInputError(f"tokens must be an integer >= 8, got {tokens!r}")
    if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap < tokens:
        from memstrata.errors import InvalidInputError

        raise InvalidInputError(f"overlap must be an integer in [0, tokens), got {overlap!r}")


# -- Markdown ----------------------------------------------------------------------------------

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
    _check(tokens, overlap)
    text = normalize_newlines(text)
    cost = _Cost(count or estimate_tokens)
    lines = split_lines(text)
    offsets = _line_offsets(text)
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


# -- code (line-aware) -------------------------------------------------------------------------

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
    _check(tokens, overlap)
    text = normalize_newlines(text)
    cost = _Cost(count or estimate_tokens)
    lines = split_lines(text)
    offsets = _line_offsets(text)
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


# -- Python ------------------------------------------------------------------------------------


def _children(node: ast.AST) -> list[ast.AST]:
    """Statements nested in a compound statement (handlers and match cases included)."""
    out: list[ast.AST] = []
    for name in ("body", "orelse", "finalbody"):
        value = getattr(node, name, None)
        if isinstance(value, list):
            out.extend(v for v in value if isinstance(v, ast.stmt))
    for handler in getattr(node, "handlers", None) or []:
        out.append(handler)
    for case in getattr(node, "cases", None) or []:
        out.extend(case.body)
    return out


def _span(node: ast.AST) -> tuple[int, int]:
    start = int(getattr(node, "lineno", 1))
    for decorator in getattr(node, "decorator_list", None) or []:
        start = min(start, int(decorator.lineno))
    end = getattr(node, "end_lineno", None)
    return start, int(end if end is not None else start)


class _PySegmenter:
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

    def _lines(self, lo: int, hi: int, first_score: int, first_hard: bool, score: int) -> None:
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

    def block(self, nodes: Sequence[ast.AST], lo: int, hi: int, depth: int) -> None:
        """Segments covering lines ``lo..hi``; ``nodes`` are the statements inside that range."""
        spans: list[tuple[int, int, ast.AST | None]] = []
        for stmt in nodes:
            s, e = _span(stmt)
            s, e = max(s, lo), min(e, hi)
            if spans and s <= spans[-1][1]:  # statements sharing a line: kept together as lines
                spans[-1] = (spans[-1][0], max(spans[-1][1], e), None)
                continue
            spans.append((s, e, stmt))
        previous_end = lo - 1
        for index, (s, e, node) in enumerate(spans):
            while s - 1 > previous_end and self.lines[s - 2].lstrip().startswith("#"):
                s -= 1  # comments directly above a statement belong to it
            spans[index] = (s, e, node)
            previous_end = e
        line_score = _PY_LINE if depth else _PY_TOP_STMT
        cursor = lo
        for s, e, node in spans:
            if cursor < s:
                self._gap(cursor, s - 1, line_score, depth == 0)
            self.statement(node, s, e, depth)
            cursor = e + 1
        if cursor <= hi:
            self._gap(cursor, hi, line_score, depth == 0)

    def _gap(self, lo: int, hi: int, score: int, hard: bool) -> None:
        """Lines between statements: comments and blank lines."""
        for n in range(lo, hi + 1):
            s, e = self.offsets[n - 1]
            self.segs.extend(_line_segments(self.text, s, e, n, score, hard, self.budget, self.cost))

    def statement(self, node: ast.AST | None, lo: int, hi: int, depth: int) -> None:
        is_def = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        if depth == 0:
            score, hard = (_PY_TOP_DEF if is_def else _PY_TOP_STMT), True
        else:
            score, hard = max(12, (_PY_DEF if is_def else _PY_STMT) - 4 * (depth - 1)), False
        cost = self._range_cost(lo, hi)
        if cost <= self.budget:
            s, e = self.offsets[lo - 1][0], self.offsets[hi - 1][1]
            blank = not self.text[s:e].strip()
            self.segs.append(_Seg(s, e, lo, hi, cost, score, hard, blank))
            return
        first = len(self.segs)
        children = _children(node) if node is not None else []
        if children:
            self.block(children, lo, hi, depth + 1)
        else:
            self._lines(lo, hi, score, hard, _PY_LINE)
        if first < len(self.segs):
            self.segs[first].score, self.segs[first].hard = score, hard


def chunk_python(
    text: str, *, tokens: int = 400, overlap: int = 80, count: TokenCounter | None = None
) -> list[Chunk]:
    """Python by its syntax tree: a function or class (with decorators and the comments just
    above it) stays whole when it fits; a larger one is cut between its statements, recursively.
    Source that does not parse is chunked line-aware like any code."""
    _check(tokens, overlap)
    text = normalize_newlines(text)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return chunk_code(text, tokens=tokens, overlap=overlap, count=count)
    cost = _Cost(count or estimate_tokens)
    segmenter = _PySegmenter(text, tokens, cost)
    if not segmenter.lines:
        return []
    try:
        segmenter.block(tree.body, 1, len(segmenter.lines), 0)
    except RecursionError:
        return chunk_code(text, tokens=tokens, overlap=overlap, count=count)
    return _pack(text, segmenter.segs, tokens, overlap)


# -- dispatch ----------------------------------------------------------------------------------

Chunker = Callable[..., list[Chunk]]
_PROSE = {"markdown", "text"}


def chunker_for(language: str) -> Chunker:
    if language == "python":
        return chunk_python
    if language in _PROSE:
        return chunk_markdown
    return chunk_code


def chunk_file(
    path: str, text: str, *, tokens: int = 400, overlap: int = 80, count: TokenCounter | None = None
) -> tuple[str, list[Chunk]]:
    """``(language, chunks)`` for a file, by its extension."""
    language = language_for(path)
    return language, chunker_for(language)(text, tokens=tokens, overlap=overlap, count=count)
