"""Argument checks shared by the layers: one rule per kind of value, one clear message per mistake.

Every check returns the normalised value or raises :class:`InvalidInputError` (a ``ValueError``)
whose message names the argument. Free text (content, tag values, authors) is kept as given
except for lone UTF-16 surrogates, which UTF-8 (and so SQLite) cannot store: they become U+FFFD.
Identifiers (categories, scopes) are never rewritten that way; a bad one is rejected.

This module is stable: other layers import it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from memstrata.errors import InvalidInputError

__all__ = [
    "CATEGORY_PATTERN",
    "MAX_AUTHOR_CHARS",
    "MAX_SCOPE_CHARS",
    "MAX_TAGS",
    "MAX_TAG_KEY_CHARS",
    "MAX_TAG_VALUE_CHARS",
    "check_author",
    "check_category",
    "check_content",
    "check_id",
    "check_int",
    "check_min_score",
    "check_scope",
    "check_tags",
    "clean_text",
    "scope_ancestors",
    "scope_subtree_sql",
]

CATEGORY_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
MAX_TAGS = 64
MAX_TAG_KEY_CHARS = 128
MAX_TAG_VALUE_CHARS = 1024
MAX_SCOPE_CHARS = 1024
MAX_AUTHOR_CHARS = 256

_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (everything else unchanged)."""
    return _SURROGATE.sub("\ufffd", text)


def check_content(content: object, *, max_bytes: int, name: str = "content") -> str:
    """Non-empty text of at most ``max_bytes`` UTF-8 bytes; lone surrogates become U+FFFD."""
    if not isinstance(content, str):
        raise InvalidInputError(f"{name} must be a str, got {type(content).__name__}")
    if not content.strip():
        raise InvalidInputError(f"{name} must not be empty or only whitespace")
    # cheap bound first: a str of n code points takes at least n bytes
    if len(content) > max_bytes:
        raise InvalidInputError(
            f"{name} is {len(content):,} characters, over the limit of {max_bytes:,} bytes "
            "(max_content_bytes)"
        )
    cleaned = clean_text(content)
    size = len(cleaned.encode("utf-8"))
    if size > max_bytes:
        raise InvalidInputError(
            f"{name} is {size:,} bytes of UTF-8, over the limit of {max_bytes:,} bytes (max_content_bytes)"
        )
    return cleaned


def check_category(category: object, *, name: str = "category") -> str:
    """A category: 1-64 of ``a-z 0-9 _ -``, starting with a letter or digit (``planning-pitfall``)."""
    if not isinstance(category, str) or CATEGORY_PATTERN.fullmatch(category) is None:
        raise InvalidInputError(
            f"{name} {_show(category)} is not valid: use 1-64 characters from a-z, 0-9, '_' and '-', "
            "starting with a letter or digit (e.g. 'pitfall', 'planning-pitfall')"
        )
    return category


def check_tags(tags: object, *, name: str = "tags") -> dict[str, str]:
    """``dict[str, str]`` (a list of strings means bare tags, each with value ``""``), keys sorted.

    Keys are 1-128 characters without control characters; values at most 1024 characters.
    """
    if tags is None:
        return {}
    items: Iterable[tuple[object, object]]
    if isinstance(tags, Mapping):
        items = tags.items()
    elif isinstance(tags, list | tuple | set | frozenset):
        items = ((t, "") for t in tags)
    else:
        raise InvalidInputError(f"{name} must be a dict of str to str, got {type(tags).__name__}")
    result: dict[str, str] = {}
    for key, value in items:
        if not isinstance(key, str):
            raise InvalidInputError(f"{name} keys must be str, got {type(key).__name__} {_show(key)}")
        if not isinstance(value, str):
            raise InvalidInputError(
                f"{name}[{_show(key)}] must be a str, got {type(value).__name__} (use '' for a bare tag)"
            )
        key = clean_text(key)
        if not key.strip() or len(key) > MAX_TAG_KEY_CHARS or _CONTROL.search(key):
            raise InvalidInputError(
                f"{name} key {_show(key)} must be 1-{MAX_TAG_KEY_CHARS} characters without control characters"
            )
        if len(value) > MAX_TAG_VALUE_CHARS:
            raise InvalidInputError(
                f"{name}[{_show(key)}] is {len(value)} characters, over the limit of {MAX_TAG_VALUE_CHARS}"
            )
        result[key] = clean_text(value)
    if len(result) > MAX_TAGS:
        raise InvalidInputError(f"{name} has {len(result)} keys, over the limit of {MAX_TAGS}")
    return dict(sorted(result.items()))


def check_scope(scope: object, *, name: str = "scope") -> str:
    """A normalised path-like scope: ``/`` or ``/a/b`` (no trailing slash, no empty segments).

    ``"src//auth/"`` becomes ``"/src/auth"``, ``"."`` segments are dropped, ``""`` is ``"/"``;
    ``".."`` segments, control characters and lone surrogates are rejected.
    """
    if not isinstance(scope, str):
        raise InvalidInputError(f"{name} must be a str like '/src/auth', got {type(scope).__name__}")
    if len(scope) > MAX_SCOPE_CHARS:
        raise InvalidInputError(f"{name} is {len(scope)} characters, over the limit of {MAX_SCOPE_CHARS}")
    if _CONTROL.search(scope) or _SURROGATE.search(scope):
        raise InvalidInputError(f"{name} {_show(scope)} contains control characters or lone surrogates")
    parts = [p for p in scope.strip().split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidInputError(f"{name} {_show(scope)} must not contain '..' segments")
    return "/" + "/".join(parts)


def scope_ancestors(scope: str) -> list[str]:
    """``"/src/auth"`` -> ``["/", "/src", "/src/auth"]`` (whole segments only)."""
    parts = [p for p in scope.split("/") if p]
    return ["/"] + ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def scope_subtree_sql(column: str, scope: str) -> tuple[str, tuple[str, ...]]:
    """SQL matching ``scope`` and its descendants, as index-friendly ranges (no LIKE escaping).

    ``'/src/auth'`` matches ``/src/auth`` and ``/src/auth/...`` but not ``/src/authz``;
    ``'0'`` is the character after ``'/'``, so the range holds exactly the ``/src/auth/`` prefix.
    """
    if scope == "/":
        return "1", ()
    return (
        f"({column} = ? OR ({column} >= ? AND {column} < ?))",
        (scope, scope + "/", scope + "0"),
    )


def check_author(author: object, *, name: str = "author") -> str | None:
    if author is None:
        return None
    if not isinstance(author, str):
        raise InvalidInputError(f"{name} must be a str or None, got {type(author).__name__}")
    if len(author) > MAX_AUTHOR_CHARS:
        raise InvalidInputError(f"{name} is {len(author)} characters, over the limit of {MAX_AUTHOR_CHARS}")
    return clean_text(author)


def check_int(value: object, name: str, minimum: int, maximum: int) -> int:
    """An ``int`` (not ``bool``) within ``minimum..maximum``."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidInputError(f"{name} must be an integer from {minimum} to {maximum}, got {_show(value)}")
    return value


_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


def check_id(value: object, *, name: str = "id") -> int:
    """A row id: an ``int`` SQLite can hold (a larger one could never name a row)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{name} must be an int, got {type(value).__name__} {_show(value)}")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise InvalidInputError(f"{name} must be a 64-bit integer (-2**63 to 2**63 - 1), got {_show(value)}")
    return value


def check_min_score(value: object, *, name: str = "min_score") -> float | None:
    """``None`` or a cosine similarity threshold in ``-1..1``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInputError(f"{name} must be a number from -1 to 1 or None, got {_show(value)}")
    if not -1.0 <= value <= 1.0:
        raise InvalidInputError(f"{name} must be a number from -1 to 1 or None, got {_show(value)}")
    return float(value)
