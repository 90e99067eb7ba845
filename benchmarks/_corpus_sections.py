"""A retrieval corpus of titled sections: the Python language reference that ships with Python
(``pydoc_data.topics``, the text ``help()`` shows) and the README of every installed package
(its ``Description`` metadata). The query is a section's title, the relevant document the prose of
that section: short, terse queries, unlike the sentence-long docstring summaries.

Only prose paragraphs are kept (tables, code blocks, grammar and images are dropped), headings
that are version numbers (changelogs) are skipped, and so is memstrata's own README.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Iterator

from _corpus_docstrings import DOC_CHARS, Corpus, cut_at_word, sample_corpus, unique_pairs

__all__ = ["sections_corpus"]

_RST_TITLE = re.compile(r"^([^\n]+)\n([*=\-~^\"'#+]{3,})[ \t]*$", re.M)
_MD_TITLE = re.compile(r"^(#{1,4})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
_VERSION = re.compile(r"\d+\.\d+")
_NOT_PROSE = ("```", "|", "+-", ">>>", "..", "<", "![", "[!", "$ ", "::")


def _rst_sections(text: str) -> Iterator[tuple[str, str]]:
    marks = list(_RST_TITLE.finditer(text))
    for i, m in enumerate(marks):
        title = m.group(1).strip()
        if len(m.group(2).strip()) < 0.7 * len(title):
            continue
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        yield title, text[m.end() : end]


def _md_sections(text: str) -> Iterator[tuple[str, str]]:
    marks = list(_MD_TITLE.finditer(text))
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        yield m.group(2).strip(), text[m.end() : end]


def _prose(body: str) -> str:
    kept = []
    for paragraph in re.split(r"\n\s*\n", body):
        if not paragraph.strip() or paragraph[:1].isspace() or paragraph.strip().startswith(_NOT_PROSE):
            continue
        kept.append(" ".join(paragraph.split()))
    return " ".join(kept)


def _sources() -> Iterator[tuple[str, str]]:
    from pydoc_data.topics import topics

    for text in topics.values():
        yield from _rst_sections(text)
    for dist in sorted(importlib.metadata.distributions(), key=lambda d: str(d.metadata["Name"])):
        name = str(dist.metadata["Name"] or "")
        if name.lower() == "memstrata":
            continue
        meta = dist.metadata
        text = (meta.get_payload() if hasattr(meta, "get_payload") else None) or meta["Description"] or ""  # type: ignore[attr-defined]
        markdown = "markdown" in str(meta["Description-Content-Type"] or "").lower()
        yield from (_md_sections(str(text)) if markdown else _rst_sections(str(text)))


def sections_corpus(n_docs: int, n_queries: int, seed: int = 13) -> Corpus:
    pairs: list[tuple[str, str]] = []
    for title, body in _sources():
        text = _prose(body)
        title = " ".join(title.split())
        words = re.findall(r"[^\W\d_]{2,}", title)
        if len(text.split()) < 15 or not 2 <= len(words) <= 15 or _VERSION.search(title):
            continue
        pairs.append((title, cut_at_word(text, DOC_CHARS)))
    # sorted first, so the sample does not depend on the order the sections were read in
    return sample_corpus("sections", sorted(unique_pairs(pairs)), n_docs, n_queries, seed)
