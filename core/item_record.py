"""The shape of one stored item, defined once: the item layer returns it and the actors' protocol
carries it as is (``StoredItem``), so neither converts to a copy of the other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ItemRecord"]


@dataclass(frozen=True, slots=True)
class ItemRecord:
    """One item; ``score`` is the best indexed field's cosine similarity when a query ranked it."""

    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    created_at: float
    updated_at: float
    score: float | None = None
    expires_at: float | None = None
