"""The Python chunker by the standard library's ``ast``: definitions stay whole when they fit.

Used when no tree-sitter grammar is available (:mod:`._chunk_code` is tried first); source that
does not parse falls back to the line-aware chunker of :mod:`._chunk_lines`.
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Sequence

from ._chunk import Chunk, TokenCounter, _check, estimate_tokens, normalize_newlines
from ._chunk_lines import chunk_code
from ._chunk_pack import _Cost, _line_segments, _LineSegmenter, _pack

__all__ = ["chunk_python"]

# Boundary scores, on the same scale as the other chunkers'.
_PY_TOP_DEF = 100
_PY_TOP_STMT = 70
_PY_DEF = 55
_PY_STMT = 40
_PY_LINE = 5


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


class _PySegmenter(_LineSegmenter):
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
        if self._whole(lo, hi, score, hard):
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
