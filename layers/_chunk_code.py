"""Source code chunked along its syntax tree (tree-sitter grammars shipped as wheels).

A definition (function, class, ``impl``, struct, interface, method ...) with the comments,
attributes and decorators directly above it is one segment when it fits the budget; a larger
one is cut between its children, recursively (a class between its methods, a function between
its statements), so no definition is cut mid-body when it fits. Segments are then packed like
every other chunker's (see :mod:`._chunk_pack`): small neighbours share a chunk up to the budget,
and the best-scored boundary in each window wins (a top-level definition first).

Each chunk keeps the file's exact text and 1-based line range, plus two fields for search:

* ``symbol``: the qualified name of the first definition the chunk starts (``Client.send``), or
  of the definition it is a part of;
* ``signature``: the header lines (``class Client:``, ``impl Drop for Conn {``) of the
  definitions that enclose the chunk without being wholly inside it, outermost first.

What the model sees for a chunk and its extra keyword text come from :mod:`._chunk_words`
(:func:`embedding_text`, :func:`keyword_words`, re-exported here).

Grammars load lazily; a language without one, a file the parser gives up on, or one nested
deeper than its grammar's scanner can hold (:mod:`._chunk_scanners`) returns ``None`` from
:func:`chunk_syntax` and the caller falls back to the language's other chunker.
"""

from __future__ import annotations

import bisect
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ._chunk import Chunk, TokenCounter, _check, estimate_tokens, normalize_newlines
from ._chunk_grammars import (
    BODY_TYPES,
    DEFINITIONS,
    FUNCTION_VALUES,
    GRAMMARS,
    LEADING,
    NAME_FIELDS,
    NAME_LEAVES,
    WRAPPERS,
    Profile,
    grammar_for,
    profile_for,
)
from ._chunk_pack import _Cost, _line_segments, _LineSegmenter, _pack
from ._chunk_scanners import scanner_overflow
from ._chunk_words import embedding_text, keyword_words, split_identifier

__all__ = ["GRAMMARS", "chunk_syntax", "embedding_text", "grammar_for", "keyword_words", "split_identifier"]

log = logging.getLogger("memstrata.files")

# Boundary scores, on the same scale as the other chunkers'.
_TOP_DEF = 100
_TOP_STMT = 70
_DEF = 55
_STMT = 40
_LINE = 5
_CLOSE = 2  # a closing brace line: never a good place to start a chunk
_MAX_DEPTH = 60  # deeper nesting is cut at lines
_HEADER_LINES = 3
_HEADER_CHARS = 240
# Markdown: a section by its heading level (as the line-aware Markdown chunker scores headings),
# then blocks, then list items.
_SECTION = {1: 100, 2: 92, 3: 86, 4: 80, 5: 76, 6: 72}
_BLOCK = 50
_ITEM = 40
_SENTENCE = 30
_ENDS_SENTENCE = re.compile(r"[.!?:;。！？][\"')\]*_]*[ \t]*$")


# -- syntax tree -> segments -------------------------------------------------------------------


@dataclass(slots=True)
class _Def:
    first: int  # 1-based lines: with the comments above it, its own first line, its last line
    start: int
    end: int
    name: str  # qualified
    header: str


def _end_row(node: Any) -> int:
    """0-based last row that holds text of ``node``."""
    row, column = node.end_point
    return max(int(node.start_point[0]), int(row) - 1 if column == 0 else int(row))


def _is_comment(node: Any) -> bool:
    return "comment" in node.type


def _definition(node: Any, definitions: frozenset[str] = DEFINITIONS) -> Any | None:
    """The definition ``node`` stands for (itself, or inside an export / const wrapper)."""
    kind = node.type
    if kind in definitions:
        return node
    if kind in WRAPPERS or kind == "expression_statement":
        for child in node.named_children:
            if child.type in definitions:
                return child
            if child.type in ("variable_declarator", "assignment_expression", "init_declarator"):
                value = child.child_by_field_name("value") or child.child_by_field_name("right")
                if value is not None and value.type in FUNCTION_VALUES:
                    return child
    return None


_HEADING_MARKS = re.compile(r"^\s*#{1,6}\s*|\s*#+\s*$")


def _key_name(node: Any, source: bytes) -> str:
    """The name of a keyed node: a JSON/TOML/YAML key (quotes dropped), a Markdown heading's text."""
    key = node.child_by_field_name("key") or (node.named_children[0] if node.named_children else None)
    if key is None:
        return ""
    text = source[key.start_byte : key.end_byte].decode("utf-8", "replace")
    if node.type == "section":
        if key.type not in ("atx_heading", "setext_heading"):
            return ""  # the text before a document's first heading: no name
        text = _HEADING_MARKS.sub("", text.strip().split("\n", 1)[0])
    elif node.type in ("table", "table_array_element"):
        text = text.strip("[]")
    return " ".join(text.replace('"', "").replace("'", "").split())[:120]


def _name(node: Any, source: bytes, depth: int = 0) -> str:
    if depth > 6:
        return ""
    if node.type in NAME_LEAVES:
        return source[node.start_byte : node.end_byte].decode("utf-8", "replace")
    if node.type == "decorated_definition":
        inner = node.child_by_field_name("definition")
        return _name(inner, source, depth + 1) if inner is not None else ""
    for field in NAME_FIELDS:
        child = node.child_by_field_name(field)
        if child is not None:
            found = _name(child, source, depth + 1)
            if found:
                return found
    for child in node.named_children:
        if child.type in ("variable_declarator", "type_spec", "init_declarator", "function_declarator",
                          "pointer_declarator", "left"):  # fmt: skip
            found = _name(child, source, depth + 1)
            if found:
                return found
    for child in node.named_children:  # e.g. `name: Type` where the grammar has no field
        if child.type in ("identifier", "type_identifier", "name"):
            return source[child.start_byte : child.end_byte].decode("utf-8", "replace")
    return ""


def _body(node: Any) -> Any | None:
    if node.type == "decorated_definition":
        inner = node.child_by_field_name("definition")
        return _body(inner) if inner is not None else None
    body = node.child_by_field_name("body")
    if body is not None:
        return body
    for child in reversed(node.named_children):
        if child.type in BODY_TYPES:
            return child
        if child.type in DEFINITIONS or child.type in FUNCTION_VALUES or child.type == "variable_declarator":
            return _body(child)
    return None


class _Segmenter(_LineSegmenter):
    """Walks the syntax tree once, emitting the segments the packer cuts between."""

    def __init__(self, text: str, source: bytes, budget: int, cost: _Cost, profile: Profile) -> None:
        super().__init__(text, budget, cost)
        self.source = source
        self.defs: list[_Def] = []
        self.names: list[tuple[int, str]] = []  # (line, name) of definitions inside whole segments
        self.profile = profile
        self.definitions = DEFINITIONS | profile.definitions

    def _name_of(self, definition: Any) -> str:
        if self.profile.key_named and definition.type in self.profile.definitions:
            return _key_name(definition, self.source)
        return _name(definition, self.source)

    def _inner_names(self, node: Any, depth: int) -> None:
        """Record the definitions nested in a node kept whole (the methods of a class that fits
        the budget): they name what the chunk holds, though no cut is made between them."""
        for child in node.named_children:
            if depth >= _MAX_DEPTH:
                return
            definition = _definition(child, self.definitions)
            if definition is not None:
                name = _name(definition, self.source)
                if name:
                    self.names.append((child.start_point[0] + 1, name))
            if child.named_children and not _is_comment(child):
                self._inner_names(child, depth + 1)

    def _score(self, node: Any | None, definition: Any | None, depth: int) -> tuple[int, bool]:
        """Boundary score of a cut before ``node``, and whether that cut needs no overlap."""
        if self.profile.sections:
            if definition is not None:  # a Markdown section: by heading level, always a clean cut
                heading = definition.named_children[0] if definition.named_children else None
                marker = (
                    heading.named_children[0].type if heading is not None and heading.named_children else ""
                )
                level = int(marker[5]) if marker.startswith("atx_h") and marker[5:6].isdigit() else 2
                return _SECTION[level], True
            if depth == 0:
                return _TOP_STMT, True
            kind = node.type if node is not None else ""
            return (_ITEM if kind in ("list_item", "list") else _BLOCK), False
        if depth == 0:
            return (_TOP_DEF if definition is not None else _TOP_STMT), True
        return max(12, (_DEF if definition is not None else _STMT) - 4 * (depth - 1)), False

    def _header(self, node: Any, start: int) -> str:
        """The definition's header lines: from its first line to where its body starts."""
        body = _body(node)
        last = start
        if body is not None:
            body_row = body.start_point[0] + 1
            line = self.lines[body_row - 1] if body_row - 1 < len(self.lines) else ""
            before = line.encode("utf-8", "surrogatepass")[: body.start_point[1]]  # columns are bytes
            only_body = not before.strip()
            last = body_row - 1 if only_body and body_row > start else body_row
        last = max(start, min(last, start + _HEADER_LINES - 1, len(self.lines)))
        header = "\n".join(line.rstrip() for line in self.lines[start - 1 : last])
        return header[:_HEADER_CHARS]

    def block(self, nodes: Sequence[Any], lo: int, hi: int, depth: int, scope: str) -> None:
        """Segments covering lines ``lo..hi``; ``nodes`` are the syntax nodes inside that range.

        Comments and attributes directly above a node (no blank line between) join its span. A
        node starting on the line where the previous span ends (``fn f() {`` then its body)
        starts one line later; one that ends there too is part of the previous span.
        """
        spans: list[tuple[int, int, Any | None, bool]] = []  # (first, last, node, clipped)
        pending: tuple[int, int] | None = None  # comments/attributes waiting for their node
        for node in nodes:
            s, e = max(node.start_point[0] + 1, lo), min(_end_row(node) + 1, hi)
            if s > e:  # no line of the range: a zero-width node past the last line (an ERROR at EOF)
                continue
            while e > s and not self.lines[e - 1].strip():  # blank lines a node swallowed (Markdown)
                e -= 1
            last = pending[1] if pending is not None else (spans[-1][1] if spans else lo - 1)
            clipped = False
            if s <= last:
                if e <= last:
                    continue
                s, clipped = last + 1, True
            if _is_comment(node) or node.type in LEADING:
                if pending is not None and s > pending[1] + 1:  # a blank line: the earlier ones stand alone
                    spans.append((pending[0], pending[1], None, False))
                    pending = None
                pending = (s, e) if pending is None else (pending[0], e)
                continue
            if pending is not None:
                if s <= pending[1] + 1 and not clipped:
                    s = pending[0]
                else:
                    spans.append((pending[0], pending[1], None, False))
                pending = None
            spans.append((s, e, node, clipped))
        if pending is not None:
            spans.append((pending[0], pending[1], None, False))
        cursor = lo
        for s, e, node, clipped in spans:
            if cursor < s:
                self._gap(cursor, s - 1, _LINE if depth else _TOP_STMT, depth == 0)
            self.statement(node, s, e, depth, scope, clipped)
            cursor = e + 1
        if cursor <= hi:
            self._gap(cursor, hi, _LINE if depth else _TOP_STMT, depth == 0)

    def _gap(self, lo: int, hi: int, score: int, hard: bool) -> None:
        """Lines no node starts on: blank lines, braces, stray comments."""
        for n in range(lo, hi + 1):
            s, e = self.offsets[n - 1]
            line = self.lines[n - 1].strip()
            line_score = _CLOSE if line[:1] in ("}", ")", "]") else score
            self.segs.extend(
                _line_segments(
                    self.text, s, e, n, line_score, hard and line_score == score, self.budget, self.cost
                )
            )

    def statement(
        self, node: Any | None, lo: int, hi: int, depth: int, scope: str, clipped: bool = False
    ) -> None:
        definition = _definition(node, self.definitions) if node is not None else None
        inner_scope = scope
        registered = False
        if definition is not None and not clipped:
            name = self._name_of(definition)
            if name:
                inner = definition
                if inner.type == "decorated_definition":
                    inner = inner.child_by_field_name("definition") or inner
                line = max(lo, inner.start_point[0] + 1)
                inner_scope = f"{scope}.{name}" if scope else name
                self.defs.append(_Def(lo, line, hi, inner_scope, self._header(definition, line)))
                registered = True
        score, hard = (_LINE, False) if clipped else self._score(node, definition, depth)
        if self._whole(lo, hi, score, hard):
            if node is not None and not self.profile.key_named:
                self._inner_names(node, depth)
            return
        first = len(self.segs)
        children = list(node.named_children) if node is not None and depth < _MAX_DEPTH else []
        only = children[0] if len(children) == 1 else None
        if (
            only is not None
            and node is not None
            and only.start_point[0] <= node.start_point[0]
            and _end_row(only) >= _end_row(node)
        ):
            if registered and _definition(only, self.definitions) is not None:
                self.defs.pop()  # the wrapped definition registers itself
                inner_scope = scope
            self.statement(only, lo, hi, depth, inner_scope, clipped)
        elif children:
            transparent = node is not None and node.type in self.profile.transparent
            self.block(children, lo, hi, depth if transparent else depth + 1, inner_scope)
        else:
            start = len(self.segs)
            self._lines(lo, hi, score, hard, _LINE)
            if self.profile.sections:  # inside a long Markdown paragraph: prefer sentence ends
                for prev, seg in zip(self.segs[start:], self.segs[start + 1 :], strict=False):
                    if seg.line > prev.last and _ENDS_SENTENCE.search(self.lines[prev.last - 1]):
                        seg.score = max(seg.score, _SENTENCE)
        if first < len(self.segs):
            self.segs[first].score, self.segs[first].hard = score, hard
        if node is not None:
            # no cut between a definition's comments, its header and its first body line
            body = _body(definition) if definition is not None else None
            if body is None and self.profile.sections and definition is not None:
                # a heading stays with the first block under it
                body = definition.named_children[1] if len(definition.named_children) > 1 else None
            guard = max(node.start_point[0], body.start_point[0] if body is not None else 0) + 1
            for seg in self.segs[first + 1 :]:
                if seg.line > guard:
                    break
                seg.score, seg.hard = min(seg.score, _LINE), False


def _annotate(chunks: list[Chunk], defs: list[_Def], inner: Sequence[tuple[int, str]] = ()) -> list[Chunk]:
    """Give each chunk its symbol and the headers of the definitions that enclose it.

    Each line knows the innermost definition holding it and each definition its parent, so a
    chunk's enclosing definitions are a walk up from its first line (linear in the file).
    """
    if not defs and not inner:
        return chunks
    inner = sorted(inner)
    inner_lines = [line for line, _ in inner]
    order = sorted(range(len(defs)), key=lambda i: (defs[i].first, -defs[i].end))
    last_line = max(max((d.end for d in defs), default=0), chunks[-1].end_line if chunks else 0)
    owner = [-1] * (last_line + 2)
    parent = [-1] * len(defs)
    for i in order:
        d = defs[i]
        p = owner[d.first]
        while p != -1 and defs[p].end < d.end:
            p = parent[p]
        parent[i] = p
        for line in range(d.first, d.end + 1):
            owner[line] = i
    by_start = sorted(range(len(defs)), key=lambda i: (defs[i].start, -defs[i].end))
    starts = [defs[i].start for i in by_start]
    out = []
    for chunk in chunks:
        lo, hi = chunk.start_line, chunk.end_line
        enclosing: list[_Def] = []
        p = owner[lo]
        while p != -1:
            d = defs[p]
            if d.first <= lo and hi <= d.end and not (lo <= d.start and d.end <= hi):
                enclosing.append(d)
            p = parent[p]
        enclosing.reverse()  # outermost first
        symbol = ""
        found: list[tuple[int, str]] = []  # (line, name) of the definitions starting in the chunk
        k = bisect.bisect_left(starts, lo)
        while k < len(by_start) and starts[k] <= hi:
            d = defs[by_start[k]]
            if d.end <= hi and not symbol:
                symbol = d.name
            found.append((d.start, d.name.rsplit(".", 1)[-1]))
            k += 1
        k = bisect.bisect_left(inner_lines, lo)
        while k < len(inner) and inner_lines[k] <= hi:
            found.append(inner[k])
            k += 1
        names = dict.fromkeys(name for _, name in sorted(found, key=lambda f: f[0]))
        if not symbol and enclosing:
            symbol = enclosing[-1].name
        # a header the chunk itself starts with is not repeated
        signature = "\n".join(d.header for d in enclosing if d.header and d.start < lo)
        out.append(replace(chunk, symbol=symbol, signature=signature, names=tuple(names)))
    return out


def chunk_syntax(
    text: str,
    suffix: str,
    *,
    tokens: int = 400,
    overlap: int = 80,
    count: TokenCounter | None = None,
    path: str = "",
) -> list[Chunk] | None:
    """Chunks of source ``text`` by its syntax tree, or ``None`` when ``suffix`` has no grammar
    or the file nests deeper than the grammar's scanner is safe with (logged, naming ``path``)."""
    _check(tokens, overlap)
    language = grammar_for(suffix)
    if language is None:
        return None
    from tree_sitter import Parser

    text = normalize_newlines(text)
    too_deep = scanner_overflow(suffix, text)
    if too_deep is not None:
        log.info("%s: %s, so chunked without its syntax tree", path or f"a {suffix} file", too_deep)
        return None
    source = text.encode("utf-8", "surrogatepass")  # rows are what matters, and they count b"\n"
    tree = Parser(language).parse(source)
    cost = _Cost(count or estimate_tokens)
    segmenter = _Segmenter(text, source, tokens, cost, profile_for(suffix))
    if not segmenter.lines:
        return []
    try:
        segmenter.block(tree.root_node.named_children, 1, len(segmenter.lines), 0, "")
    except RecursionError:
        return None
    return _annotate(_pack(text, segmenter.segs, tokens, overlap), segmenter.defs, segmenter.names)
