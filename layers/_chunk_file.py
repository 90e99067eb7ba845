"""Chunk a file: its language from its extension, the chunker for that language, and the text
embedded and indexed by keywords for each chunk.

The entry point of the chunker family (:mod:`._chunk_code`, :mod:`._chunk_markdown`,
:mod:`._chunk_python`, :mod:`._chunk_lines`); it imports them, none imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import PurePosixPath

from ._chunk import Chunk, TokenCounter
from ._chunk_code import chunk_syntax
from ._chunk_lines import chunk_code
from ._chunk_markdown import chunk_markdown
from ._chunk_python import chunk_python
from ._chunk_words import embedding_text, keyword_words

__all__ = [
    "chunk_embedding_text",
    "chunk_file",
    "chunk_keyword_text",
    "chunker_for",
    "language_for",
    "language_names",
]

_LANGUAGES = {
    ".py": "python", ".pyi": "python", ".rs": "rust", ".ts": "typescript", ".tsx": "typescript",
    ".js": "javascript", ".jsx": "javascript", ".mjs": "javascript", ".cjs": "javascript",
    ".cs": "csharp", ".go": "go", ".java": "java", ".kt": "kotlin", ".c": "c", ".h": "c",
    ".cc": "cpp", ".cpp": "cpp", ".hpp": "cpp", ".cxx": "cpp", ".hh": "cpp", ".hxx": "cpp",
    ".mts": "typescript", ".cts": "typescript", ".rb": "ruby", ".php": "php", ".swift": "swift",
    ".sh": "shell", ".bash": "shell", ".sql": "sql", ".md": "markdown", ".markdown": "markdown",
    ".rst": "text", ".txt": "text", ".toml": "toml", ".json": "json", ".yaml": "yaml", ".yml": "yaml",
    ".html": "html", ".css": "css", ".scss": "css", ".xml": "xml", ".lua": "lua", ".scala": "scala",
    ".gd": "gdscript",
}  # fmt: skip


def language_for(path: str) -> str:
    """The language name stored with a file's chunks (``python``, ``markdown``, ``rust``, ...)."""
    suffix = PurePosixPath(path).suffix.lower()
    return _LANGUAGES.get(suffix, suffix.lstrip(".") or "text")


_ALIASES = {"c#": "csharp"}


def language_names(extensions: Iterable[str] = ()) -> dict[str, str]:
    """Every spelling a language filter accepts, lowercased, mapped to the name chunks are
    stored with: the names themselves, file extensions without their dot (``py``) and aliases
    (``c#``). ``extensions`` adds the configured ones this module has no name for: their
    chunks are stored under the extension itself, so those names exist too."""
    names = {language: language for language in (*_LANGUAGES.values(), "text")}
    for extension in (*_LANGUAGES, *extensions):
        bare = extension.strip().lower().lstrip(".")
        if bare:
            language = language_for(f"x.{bare}")
            names[bare] = language
            names.setdefault(language, language)
    names.update(_ALIASES)
    return names


Chunker = Callable[..., list[Chunk]]
_PROSE = {"markdown", "text"}  # keyword text as prose; without a grammar, the paragraph chunker


def chunker_for(language: str) -> Chunker:
    if language == "python":
        return chunk_python
    if language in _PROSE:
        return chunk_markdown
    return chunk_code


def chunk_file(
    path: str, text: str, *, tokens: int = 400, overlap: int = 80, count: TokenCounter | None = None
) -> tuple[str, list[Chunk]]:
    """``(language, chunks)`` for a file, by its extension: a file with a tree-sitter grammar
    (source code, Markdown, JSON, TOML, YAML) by its syntax tree (:mod:`._chunk_code`), unless
    it nests too deep for its grammar's scanner (:mod:`._chunk_scanners`); other prose by
    headings and paragraphs, any other file (and those too deep) line-aware."""
    language = language_for(path)
    suffix = PurePosixPath(path).suffix
    chunks = chunk_syntax(text, suffix, tokens=tokens, overlap=overlap, count=count, path=path)
    if chunks is not None:
        return language, chunks
    return language, chunker_for(language)(text, tokens=tokens, overlap=overlap, count=count)


def chunk_embedding_text(path: str, language: str, chunk: Chunk) -> str:
    """The text embedded for a chunk: for source and data files the words of ``path`` and of
    the chunk's symbol, the enclosing definitions' signature lines and the chunk text (one per
    line, :func:`._chunk_words.embedding_text`); for Markdown the headings above the chunk, then
    its text; plain text as it is.

    Prose leaves the path out so a moved or copied note is not embedded again (the cache is
    keyed by the embedded text).
    """
    if language in _PROSE:
        return f"{chunk.signature}\n{chunk.text}" if chunk.signature else chunk.text
    return embedding_text(path, chunk)


def chunk_keyword_text(language: str, chunk: Chunk) -> str:
    """Extra keyword text for a chunk: identifiers split into words (``parseHttpHeader`` ->
    ``parse http header``) and, for code, the words of its symbol and of the names it defines."""
    if language in _PROSE:
        from memstrata.storage import identifier_words

        return identifier_words(chunk.text)
    return keyword_words(chunk.text, chunk.symbol, chunk.names)
