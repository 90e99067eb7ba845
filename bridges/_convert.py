"""Layer results as plain JSON objects, one shape per kind, shared by the CLI, ``serve`` and MCP."""

from __future__ import annotations

import dataclasses
from typing import Any

from ._json import to_jsonable

__all__ = ["episode", "episode_hit", "knowledge_entry", "knowledge_hit", "plain", "task_prompt"]


def plain(value: Any) -> Any:
    return to_jsonable(value)


_NAMES: dict[type, tuple[str, ...]] = {}


def _names(cls: type) -> tuple[str, ...]:
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _object(value: Any) -> dict[str, Any]:
    """A value as one JSON object (anything else is wrapped as ``{"value": ...}``)."""
    data = to_jsonable(value)
    return data if isinstance(data, dict) else {"value": data}


def _shallow(value: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict, values untouched: orjson writes them (datetimes included)."""
    return {name: getattr(value, name) for name in _names(type(value))}


def _flatten(hit: Any, inner: str) -> dict[str, Any]:
    """A hit as one flat object: the inner record's fields, then the hit's own (score, ...).

    Shallow on purpose: this runs for every hit of every response, and orjson serialises the
    remaining values (dicts, tuples, datetimes) natively, far faster than a Python walk.
    """
    if not (dataclasses.is_dataclass(hit) and not isinstance(hit, type)):
        return _object(hit)
    data = _shallow(hit)
    nested = data.pop(inner, None)
    if dataclasses.is_dataclass(nested) and not isinstance(nested, type):
        return {**_shallow(nested), **data}
    return data


def knowledge_entry(entry: Any) -> dict[str, Any]:
    return _object(entry)


def knowledge_hit(hit: Any) -> dict[str, Any]:
    """``{id, content, category, tags, scope, ..., score, match_type, similarity, ...}``."""
    return _flatten(hit, "entry")


def episode(value: Any) -> dict[str, Any]:
    return _object(value)


def episode_hit(hit: Any) -> dict[str, Any]:
    return _flatten(hit, "episode")


def task_prompt(prompt: Any) -> dict[str, Any]:
    """A TaskPrompt with its knowledge hits and episodes flattened like the search results."""
    if not (dataclasses.is_dataclass(prompt) and not isinstance(prompt, type)):
        return {"text": str(prompt)}
    data = _shallow(prompt)
    data["hits"] = [knowledge_hit(h) for h in data.get("hits") or ()]
    if "episodes" in data:
        data["episodes"] = [episode_hit(e) for e in data["episodes"] or ()]
    return data
