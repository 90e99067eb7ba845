"""The texts an item's ``index`` paths read from its value, and the names of their vectors.

A path is ``"$"`` (the whole value), keys joined by dots (``"a.b"``), or LangGraph's path grammar
(``langgraph.store.base.embed``): ``[0]`` or ``[-1]`` (one element of a list), ``[*]`` and ``*``
(every element of a list, every value of an object), ``{a,b.c}`` (several fields). The grammar
reads the texts LangGraph's ``get_text_at_path`` reads, so the system's model embeds what
LangGraph's own stores embed; ``"$"`` and keys joined by dots read what they always read (a value
that is not text as compact JSON), so vectors stored before keep their texts.

A path of several texts has one vector per text, named ``"<path>.<n>"`` (as LangGraph's
``InMemoryStore`` names them), a path of one text a vector named as the path: the item store ranks
an item by its best vector, and finds each vector's text again from its name when another model
computes the vectors again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

__all__ = ["field_text", "named_texts", "path_texts", "texts_of_names"]

_NUMBERED = re.compile(r"(.+)\.(0|[1-9][0-9]*)", re.DOTALL)  # "<path>.<n>": one text of a path of several


def field_text(value: dict[str, Any], path: str) -> str | None:
    """The text at a dotted ``path`` of ``value`` (``"$"``: all of it); non-text as JSON."""
    found: Any = value
    if path != "$":
        for part in path.split("."):
            if not isinstance(found, dict) or part not in found:
                return None
            found = found[part]
    if found is None:
        return None
    return found if isinstance(found, str) else orjson.dumps(found).decode()


def _dotted(path: str) -> bool:
    """Whether ``path`` is ``"$"`` or keys joined by dots, none of them the grammar's."""
    return path == "$" or (
        "[" not in path and "{" not in path and all(k and k != "*" for k in path.split("."))
    )


def _closed(path: str, start: int, opening: str, closing: str) -> int:
    """Where the bracket opened at ``start`` closes (just past it; the end when it never does)."""
    depth, end = 0, start
    while end < len(path):
        depth += (path[end] == opening) - (path[end] == closing)
        end += 1
        if depth == 0:
            break
    return end


def _tokens(path: str) -> list[str]:
    """``path`` split as LangGraph's ``tokenize_path`` splits it: keys, ``[...]`` and ``{...}``."""
    tokens: list[str] = []
    key: list[str] = []
    at = 0
    while at < len(path):
        char = path[at]
        if char in "[{":
            if key:
                tokens.append("".join(key))
                key = []
            end = _closed(path, at, char, "]" if char == "[" else "}")
            tokens.append(path[at:end])
            at = end
            continue
        if char == "." and key:
            tokens.append("".join(key))
            key = []
        elif char != ".":
            key.append(char)
        at += 1
    if key:
        tokens.append("".join(key))
    return tokens


def _as_text(found: Any) -> list[str]:
    """A value reached by a path, as LangGraph's text: JSON for a list or an object."""
    if isinstance(found, str | int | float | bool):
        return [str(found)]
    if isinstance(found, list | dict):
        return [json.dumps(found, sort_keys=True, ensure_ascii=False)]
    return []


def _element(found: Any, token: str) -> list[Any]:
    """The elements of a list that ``[n]`` or ``[*]`` picks (none when it is not a list)."""
    if not isinstance(found, list):
        return []
    index = token[1:-1]
    if index == "*":
        return found
    try:
        at = int(index)
    except ValueError:
        return []
    at = at + len(found) if at < 0 else at
    return [found[at]] if 0 <= at < len(found) else []


def _fields(found: Any, token: str) -> list[str]:
    """The texts of the fields ``{a,b.c}`` names (keys of objects only, as LangGraph reads them)."""
    if not isinstance(found, dict):
        return []
    texts: list[str] = []
    for field in token[1:-1].split(","):
        keys = _tokens(field.strip())
        if not keys:
            continue
        reached: Any = found
        for key in keys:
            reached = reached.get(key) if isinstance(reached, dict) else None
        texts += _as_text(reached)
    return texts


def _grammar_texts(found: Any, tokens: Sequence[str]) -> list[str]:
    """The texts the ``tokens`` of a path reach from ``found``, as LangGraph reads them."""
    if not tokens:
        return _as_text(found)
    token, rest = tokens[0], tokens[1:]
    if token.startswith("{") and token.endswith("}"):
        return _fields(found, token)  # LangGraph reads nothing after a set of fields
    reached: Iterable[Any]
    if token.startswith("[") and token.endswith("]"):
        reached = _element(found, token)
    elif token == "*":
        reached = found.values() if isinstance(found, dict) else found if isinstance(found, list) else ()
    else:
        reached = [found[token]] if isinstance(found, dict) and token in found else []
    return [text for each in reached for text in _grammar_texts(each, rest)]


def path_texts(value: dict[str, Any], path: str) -> list[str]:
    """The texts ``path`` reads from ``value``: none, one, or (grammar paths) several."""
    if _dotted(path):
        text = field_text(value, path)
        return [] if text is None else [text]
    return _grammar_texts(value, _tokens(path))


def named_texts(value: dict[str, Any], paths: Iterable[str]) -> dict[str, str]:
    """The texts of ``paths`` under their vectors' names (see the module)."""
    named: dict[str, str] = {}
    for path in paths:
        texts = path_texts(value, path)
        for n, text in enumerate(texts):
            named[f"{path}.{n}" if len(texts) > 1 else path] = text
    return named


def texts_of_names(value: dict[str, Any], names: Sequence[str]) -> dict[str, str]:
    """The text each vector name of an item stands for, read again from ``value``; a name whose
    text is gone is left out. ``"<path>.<n>"`` is the n-th text of ``<path>`` when ``<path>``
    reads several and the item holds a vector for each; else the name is a path of one text."""
    held = set(names)
    read: dict[str, list[str]] = {}  # a path's texts, read once for all its names
    found: dict[str, str] = {}
    for name in names:
        numbered = None if _dotted(name) else _NUMBERED.fullmatch(name)
        if numbered is not None:
            path, n = numbered[1], int(numbered[2])
            if path not in read:
                read[path] = path_texts(value, path)
            texts = read[path]
            if len(texts) > max(n, 1) and all(f"{path}.{k}" in held for k in range(len(texts))):
                found[name] = texts[n]
                continue
        texts = path_texts(value, name)
        if len(texts) == 1:
            found[name] = texts[0]
    return found
