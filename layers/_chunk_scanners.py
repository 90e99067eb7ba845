"""Files nested deeper than their grammar's external scanner can hold, kept from its parser.

Two grammar wheels write their scanner state past tree-sitter's 1024-byte serialization buffer
when a file nests deeply enough, which kills the process (SIGSEGV) rather than raising:

* tree-sitter-yaml 0.7 stores 4 bytes per open block (a block mapping, a sequence, an explicit
  key or value, a block scalar) and crashes at 254 open blocks (upstream
  tree-sitter-grammars/tree-sitter-yaml#48). Flow collections (``[[[``, ``{a: {``) keep no
  scanner state and are safe at any depth.
* tree-sitter-python 0.25 stores 2 bytes per indentation level after one byte per open string
  and overruns the buffer by one byte when that count is odd: inside a string, from 384
  (255 strings open) to 511 (one open) indentation levels.

:func:`scanner_overflow` bounds that depth from above in one pass over the text, and a file whose
bound reaches the limit, well below the crash, is cut by its language's fallback chunker: still
indexed and searchable, without symbols. The other grammars the chunker uses cap what they store
(Markdown, GDScript, C#) or keep no nesting in their scanner state.
"""

from __future__ import annotations

import re

from ._chunk_grammars import GRAMMARS

__all__ = ["PYTHON_LIMIT", "YAML_LIMIT", "python_levels", "scanner_overflow", "yaml_blocks"]

YAML_LIMIT = 200  # open blocks; the scanner crashes at 254
PYTHON_LIMIT = 300  # distinct indentation widths; the scanner crashes from 384 levels

# A YAML indicator that opens a block: `-`, `?` or `:` followed by a blank, a NUL or the line's end.
_INDICATOR = re.compile(r"[-?:](?=[ \t\0]|$)")
_BLOCK_SCALAR = re.compile(r"(?:^|[ \t])[|>][0-9+-]*[ \t]*(?:#.*)?$")
_INDICATOR_PAIRS = tuple(mark + after for mark in "-?:" for after in " \t\n\0")
_COLUMNS = 0x10000  # the YAML scanner keeps columns in 16 bits: longer lines wrap around
# A Python line start: the blanks, form feeds and backslash-newlines its indentation is counted over.
_PY_INDENT = re.compile(r"\n((?:[ \t\f]|\\\n)*)")


def scanner_overflow(suffix: str, text: str) -> str | None:
    """Why a file with extension ``suffix`` and ``text`` (newlines normalised) must not reach
    its grammar's parser, or ``None`` when it is safe to parse."""
    spec = GRAMMARS.get(suffix.lower())
    grammar = spec[0] if spec is not None else ""
    if grammar == "tree_sitter_yaml":
        blocks = yaml_blocks(text)
        if blocks >= YAML_LIMIT:
            return f"YAML nested up to {blocks} blocks deep (its parser is safe below {YAML_LIMIT})"
    elif grammar == "tree_sitter_python":
        levels = python_levels(text)
        if levels >= PYTHON_LIMIT:
            return f"Python with {levels} indentation widths (its parser is safe below {PYTHON_LIMIT} levels)"
    return None


def python_levels(text: str) -> int:
    """An upper bound of the indentation levels tree-sitter-python's scanner holds at once:
    its stack only grows by a width wider than its top, so it never holds more levels than the
    text has distinct indentation widths (a space 1, a tab 8, a form feed starting again)."""
    widths = {_python_width(run) for run in set(_PY_INDENT.findall(text))}
    widths.discard(0)
    return len(widths)


def _python_width(run: str) -> int:
    """The indentation tree-sitter-python's scanner counts for a line start's blanks."""
    after_feed = run.rsplit("\f", 1)[-1]
    return after_feed.count(" ") + 8 * after_feed.count("\t")


def yaml_blocks(text: str) -> int:
    """An upper bound of the blocks tree-sitter-yaml's scanner holds open at once.

    Each block its scanner opens follows an indicator (``- ``, ``? ``, ``: ``) or a block scalar
    header (``|``, ``>``), so a text with few of them needs no more. Otherwise the scanner's
    stack of ``(column, kind)`` is replayed line by line: a line closes the blocks its
    indentation ends, its leading indicators and its first key open one each, and every other
    indicator on it is counted as opening one too (the parser, recovering from an error, may
    open them), so the result is never below the scanner's own depth.
    """
    possible = sum(text.count(pair) for pair in _INDICATOR_PAIRS) + text.count("|") + text.count(">")
    if possible + 1 < YAML_LIMIT:
        return possible + 1  # the `+ 1`: an indicator ending the text
    columns, sequences = [-1], [False]
    deepest = 1
    for line in text.split("\n"):
        body = line.lstrip(" \t")
        if not body or body[0] == "#":
            continue
        indent = len(line) - len(body)
        _close_blocks(columns, sequences, _column(indent), body)
        _open_blocks(columns, sequences, indent, body)
        deepest = max(deepest, len(columns))
    return deepest - 1


def _column(index: int) -> int:
    """A column as the YAML scanner's 16-bit counter holds it."""
    return index if index < _COLUMNS // 2 else (index + _COLUMNS // 2) % _COLUMNS - _COLUMNS // 2


def _close_blocks(columns: list[int], sequences: list[bool], column: int, body: str) -> None:
    """Pop what the scanner pops at a line starting at ``column``: a block whose parent starts at
    or right of it, except a sequence sharing its parent's column that this line continues."""
    while len(columns) > 1 and column <= columns[-1]:
        if columns[-1] == columns[-2] and sequences[-1]:
            if column == columns[-1] and body[0] == "-" and body[1:2] in ("", " ", "\t", "\0"):
                return
        elif column > columns[-2]:
            return
        columns.pop()
        sequences.pop()


def _open_blocks(columns: list[int], sequences: list[bool], indent: int, body: str) -> None:
    """Push a block for each indicator of the line (``body`` starts at column ``indent``)."""
    node = 0  # where the line's first node starts, after its leading indicators
    keyed = False
    for found in _INDICATOR.finditer(body):
        at = found.start()
        mark = body[at]
        column = _column(indent + at)
        if at == node:  # `- - x`, `? k`, `: v`: one block each, the first only on a new column
            if at or column != columns[-1] or (mark == "-" and not sequences[-1]):
                columns.append(column)
                sequences.append(mark == "-")
            node = len(body) - len(body[at + 1 :].lstrip(" \t"))
        elif mark == ":" and not keyed:  # the line's key opens a mapping at its own column
            keyed = True
            if _column(indent + node) != columns[-1]:
                columns.append(_column(indent + node))
                sequences.append(False)
        else:
            columns.append(column)
            sequences.append(mark == "-")
    if ("|" in body or ">" in body) and _BLOCK_SCALAR.search(body) is not None:
        columns.append(columns[-1])
        sequences.append(False)
