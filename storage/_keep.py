"""A filter as a mask over ids (:class:`Keep`): how the keyword side applies a filter that a
vector mirror's columns state, without listing every id it allows."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from ._array_types import BoolArray, IntArray

__all__ = ["Keep"]


class Keep:
    """Which of some ids a filter allows, decided without listing every allowed id (a mask
    read from a vector mirror's columns), and a ``key`` naming that filter: two with the same
    key allow the same ids while the database does not change, so the word index keeps the
    mask over every document of a filter asked again (``None``: never kept)."""

    __slots__ = ("allows", "key")

    def __init__(self, allows: Callable[[IntArray], BoolArray], key: Hashable | None = None) -> None:
        self.allows = allows
        self.key = key

    @staticmethod
    def key_of(*parts: Any) -> Hashable | None:
        """``parts`` as a key, or ``None`` when one of them cannot be a key (unhashable)."""
        try:
            hash(parts)
        except TypeError:
            return None
        return parts
