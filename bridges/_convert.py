"""Layer results as plain JSON objects, one shape per kind, shared by the CLI, ``serve`` and MCP."""

from __future__ import annotations

from typing import Any

from ._json import to_jsonable

__all__ = ["episode", "episode_hit", "knowledge_entry", "knowledge_hit", "plain", "task_prompt"]


def plain(value: Any) -> Any:
    return to_jsonable(value)


def _flatten(hit: Any, inner: str) -> dict[str, Any]:
    data = to_jsonable(hit)
    if not isinstance(data, dict):
        return {"value": data}
    nested = data.pop(inner, None)
    if isinstance(nested, dict):
        return {**nested, **data}
    return data


def knowledge_entry(entry: Any) -> dict[str, Any]:
    data = to_jsonable(entry)
    return data if isinstance(data, dict) else {"value": data}


def knowledge_hit(hit: Any) -> dict[str, Any]:
    """``{id, content, category, tags, scope, ..., score, match_type, similarity, ...}``."""
    return _flatten(hit, "entry")


def episode(value: Any) -> dict[str, Any]:
    data = to_jsonable(value)
    return data if isinstance(data, dict) else {"value": data}


def episode_hit(hit: Any) -> dict[str, Any]:
    return _flatten(hit, "episode")


def task_prompt(prompt: Any) -> dict[str, Any]:
    """A TaskPrompt with its hits flattened like :func:`knowledge_hit`."""
    data = to_jsonable(prompt)
    if not isinstance(data, dict):
        return {"text": str(prompt)}
    hits = getattr(prompt, "hits", None)
    if hits is not None:
        data["hits"] = [knowledge_hit(h) for h in hits]
    return data
