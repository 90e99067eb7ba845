"""Strings as UTF-8 can carry them and as errors show them.

Python holds file names that are not UTF-8, and some JSON strings, with unpaired UTF-16
surrogates, which UTF-8 (so SQLite and JSON) cannot encode: :func:`has_lone_surrogate` finds
them and :func:`clean_text` repairs free text. An error shows the value it refuses cut to one
line (:func:`show`, :func:`fail`) and a path as printable UTF-8 (:func:`show_path`).
:mod:`memstrata.core.validation` builds its rules on these and is where callers import them.
"""

from __future__ import annotations

import os
import re

from memstrata.core.errors import InvalidInputError

__all__ = ["clean_text", "fail", "has_lone_surrogate", "show", "show_path"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def has_lone_surrogate(text: str) -> bool:
    """True when ``text`` holds a UTF-16 surrogate that UTF-8 cannot encode."""
    return _SURROGATE.search(text) is not None


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (everything else unchanged)."""
    return _SURROGATE.sub("\ufffd", text) if has_lone_surrogate(text) else text


def show(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters so one huge argument keeps its error one line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fail(name: str, what: str, value: object) -> InvalidInputError:
    """``InvalidInputError("{name} {what}, got {value!r}")`` (the value cut short)."""
    return InvalidInputError(f"{name} {what}, got {show(value)}")


def show_path(path: str) -> str:
    """``path`` as printable UTF-8 for reports and errors: bytes that are not UTF-8 (which Python
    holds as lone surrogates) become backslash escapes (``caf\\xe9.py``), the rest is kept."""
    if not has_lone_surrogate(path):
        return path
    try:
        raw = os.fsencode(path)
    except UnicodeEncodeError:  # a surrogate no file name decodes to: escape it as text
        return path.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")
