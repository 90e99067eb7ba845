"""Pre-task prompts: one XML-escaped context of typed entries, then the task.

Shape (knowledge entries best first, then episodes, memory files and code, each best first)::

    <knowledge-context>
    <entry category="pitfall" relevance="0.87" taskId="t1">Avoid the Strategy pattern ...</entry>
    <entry source="episode" relevance="0.52" at="2025-01-01T10:00:00+00:00" title="Task t1 failed">...</entry>
    <entry source="file" path="memory/2026-11-20.md" lines="12-30" relevance="0.81">...</entry>
    <entry source="code" path="a.py" lines="1-9" relevance="0.40" codebase="shop" language="python">…</entry>
    </knowledge-context>
    <task>Refactor the payment module</task>

A knowledge entry (no ``source``) has ``category`` and ``relevance`` (the hit's normalised 0-1
score, two decimals) followed by the entry's tags in key order; the other sources say what they
are in ``source``. Everything is escaped: text and attribute values with
XML entities (newlines and tabs in attributes as character references), characters XML 1.0
cannot carry replaced by U+FFFD, and tag keys turned into valid XML names by encoding each
character that is not allowed as ``_xHHHH_`` (a key that collides with ``category`` or
``relevance`` gets a ``tag-`` prefix). The fallback prompt is the ``<task>`` element alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "build_prompt",
    "fallback_prompt",
    "xml_attr",
    "xml_name",
    "xml_text",
]

_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_NAME_START = re.compile(r"[A-Za-z_]")
_NAME_CHAR = re.compile(r"[A-Za-z0-9._-]")
_ESCAPE_LIKE = re.compile(r"_x[0-9A-Fa-f]{4,8}_")
# every attribute an entry of any kind states about itself: a tag of one of these names would
# make a knowledge entry read as an episode, a file chunk or code
_RESERVED = frozenset(
    {"category", "relevance", "source", "at", "title", "path", "lines", "codebase", "language"}
)


def _clean(text: str) -> str:
    return _INVALID_XML.sub("\ufffd", text)


def xml_text(text: str) -> str:
    """Escape element content."""
    return _clean(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def xml_attr(value: str) -> str:
    """Escape an attribute value (to be placed between double quotes)."""
    return (
        xml_text(value)
        .replace('"', "&quot;")
        .replace("\t", "&#9;")
        .replace("\n", "&#10;")
        .replace("\r", "&#13;")
    )


def xml_name(key: str) -> str:
    """A valid XML attribute name for ``key``: disallowed characters become ``_xHHHH_``."""
    out: list[str] = []
    for index, char in enumerate(key):
        allowed = _NAME_START.fullmatch(char) if index == 0 else _NAME_CHAR.fullmatch(char)
        if char == "_" and _ESCAPE_LIKE.match(key, index):
            allowed = None  # escape an underscore that would read as an escape sequence
        out.append(char if allowed else f"_x{ord(char):04X}_")
    return "".join(out) or "_"


def _relevance(score: Any) -> str:
    try:
        value = float(score)
    except (TypeError, ValueError):
        value = 0.0
    if value != value:
        value = 0.0
    return f"{min(1.0, max(0.0, value)):.2f}"


def _attributes(pairs: Iterable[tuple[str, str]], tags: Mapping[str, str] | None) -> str:
    """The element's own attributes, then one per tag. A tag whose name is taken, is an
    attribute any kind of entry states (:data:`_RESERVED`) or begins with ``xml`` (XML's own,
    ``xmlns`` a namespace declaration) gets ``tag-`` prefixes until its name is free: every tag
    is shown, and no tag changes what the element is or seems to be."""
    pairs = list(pairs)
    parts = [f'{name}="{xml_attr(value)}"' for name, value in pairs]
    used = {name for name, _ in pairs}
    for key in sorted(tags or {}):
        name = xml_name(key)
        if name in _RESERVED or name.lower().startswith("xml"):
            name = f"tag-{name}"
        while name in used:
            name = f"tag-{name}"
        used.add(name)
        parts.append(f'{name}="{xml_attr(str(tags[key]))}"')  # type: ignore[index]
    return " ".join(parts)


def _entry(hit: Any) -> str:
    entry = hit.entry
    pairs = [("category", str(entry.category)), ("relevance", _relevance(hit.score))]
    return f"<entry {_attributes(pairs, entry.tags)}>{xml_text(str(entry.content))}</entry>"


def _episode(hit: Any) -> str:
    episode = hit.episode
    pairs = [("source", "episode"), ("relevance", _relevance(hit.score))]
    at = getattr(episode, "at", None)
    if at is not None:
        pairs.append(("at", at.isoformat() if hasattr(at, "isoformat") else str(at)))
    title = getattr(episode, "title", None)
    if title:
        pairs.append(("title", str(title)))
    return f"<entry {_attributes(pairs, None)}>{xml_text(str(episode.content))}</entry>"


def _file(chunk: Any) -> str:
    """A memory-file or code chunk (a :class:`FileContext`)."""
    pairs = [
        ("source", str(chunk.source)),
        ("path", str(chunk.path)),
        ("lines", f"{int(chunk.start_line)}-{int(chunk.end_line)}"),
        ("relevance", _relevance(chunk.score)),
    ]
    if chunk.origin:
        pairs.append(("codebase", str(chunk.origin)))
    if chunk.language and chunk.source == "code":
        pairs.append(("language", str(chunk.language)))
    return f"<entry {_attributes(pairs, None)}>{xml_text(str(chunk.text))}</entry>"


def fallback_prompt(description: str) -> str:
    """The prompt when no knowledge could be given: the full task description, escaped."""
    return f"<task>{xml_text(description)}</task>"


def build_prompt(
    description: str, hits: Sequence[Any], episodes: Sequence[Any] = (), files: Sequence[Any] = ()
) -> str:
    """One context (knowledge hits, episodes, then memory-file and code chunks), then the task."""
    lines = [
        "<knowledge-context>",
        *(_entry(h) for h in hits),
        *(_episode(e) for e in episodes),
        *(_file(f) for f in files),
        "</knowledge-context>",
        fallback_prompt(description),
    ]
    return "\n".join(lines)
