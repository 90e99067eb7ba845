"""The chunk record and the token budget every chunker shares.

A :class:`Chunk` is a piece of a file with its exact 1-based line range and character offsets.
Offsets and line numbers refer to the text with newlines normalised (``\\r\\n`` and ``\\r`` become
``\\n``), which is also how :meth:`MemoryFiles.get` numbers lines. A chunk made of whole lines has
exactly the text of its lines; only a single line longer than the budget is cut inside the line,
and then ``start_line == end_line``.

Tokens are counted with the embedder's tokenizer when it has ``count_tokens``, else estimated as
``ceil(chars / 4)``. Kept apart from the chunkers so that every chunker, the packing and the
callers (sync, file reads) depend on this one small module and not on each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "CHUNKER_VERSION",
    "ESTIMATE_NAME",
    "Chunk",
    "TokenCounter",
    "estimate_tokens",
    "model_token_counter",
    "normalize_newlines",
    "split_lines",
]

# Bump whenever chunk boundaries (or the text indexed or embedded per chunk) may change for the
# same input: stores purge and rebuild. 2: code chunked by syntax tree, embedded with its path and
# enclosing signature, keyword text with split identifiers. 3: Markdown, JSON, TOML, YAML and
# GDScript by syntax tree too (Markdown embedded with its heading trail); code embedded with
# its path and symbol as words instead of the raw path. 4: code embedded with the names of every
# definition the chunk holds.
CHUNKER_VERSION = 4
ESTIMATE_NAME = "chars/4"

TokenCounter = Callable[[str], int]

_MODEL_PIECE_CHARS = 200  # tokenizers may truncate (e.g. at 256 tokens): count long text in pieces


@dataclass(frozen=True, slots=True)
class Chunk:
    """A chunk of a file: ``text == source[start_char:end_char]`` of the normalised source."""

    start_line: int  # 1-based, inclusive
    end_line: int  # 1-based, inclusive
    text: str
    start_char: int
    end_char: int
    symbol: str = ""  # code: qualified name of the definition the chunk starts or is part of
    signature: str = ""  # code: header lines of the definitions enclosing the chunk
    names: tuple[str, ...] = ()  # code: the definitions starting inside the chunk, in order


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


def _check(tokens: int, overlap: int) -> None:
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 8:
        from memstrata.core.errors import InvalidInputError

        raise InvalidInputError(f"tokens must be an integer >= 8, got {tokens!r}")
    if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap < tokens:
        from memstrata.core.errors import InvalidInputError

        raise InvalidInputError(f"overlap must be an integer in [0, tokens), got {overlap!r}")
