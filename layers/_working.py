"""Working memory: one agent's scratch space for the task at hand.

A plain in-memory key-value map with optional time-to-live. Values must be JSON-serialisable
(they travel in messages) and are stored as encoded bytes, so a caller that mutates a value after
setting it, or mutates what ``get`` returned, never changes what is stored. Time comes from an
injectable monotonic clock so simulations can expire entries without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from memstrata.errors import InvalidInputError

__all__ = ["WorkingMemory"]

_MAX_KEY_CHARS = 1024


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key or len(key) > _MAX_KEY_CHARS:
        raise InvalidInputError(
            f"working memory key must be a non-empty string of at most {_MAX_KEY_CHARS} characters, "
            f"got {key!r:.80}"
        )
    return key


class WorkingMemory:
    """Key-value scratch space with optional TTL (not thread-safe: its actor serialises access)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_items: int | None = None,
        max_value_bytes: int | None = None,
    ) -> None:
        self._clock = clock
        self._max_items = max_items
        self._max_value_bytes = max_value_bytes
        self._items: dict[str, tuple[bytes, float | None]] = {}  # key -> (json, expires_at)

    def set(self, key: str, value: Any, *, ttl_s: float | None = None) -> None:
        """Store ``value`` under ``key``; it disappears ``ttl_s`` seconds later when given."""
        _check_key(key)
        if ttl_s is not None and (
            isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not ttl_s >= 0
        ):
            raise InvalidInputError(f"ttl_s must be a number >= 0 or None, got {ttl_s!r}")
        try:
            data = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
        except (TypeError, orjson.JSONEncodeError) as exc:
            raise InvalidInputError(
                f"working memory value for {key!r} must be JSON-serialisable: {exc}"
            ) from exc
        if self._max_value_bytes is not None and len(data) > self._max_value_bytes:
            raise InvalidInputError(
                f"working memory value for {key!r} is {len(data)} bytes, more than the limit of "
                f"{self._max_value_bytes}"
            )
        self.purge_expired()
        if self._max_items is not None and key not in self._items and len(self._items) >= self._max_items:
            raise InvalidInputError(f"working memory is full ({self._max_items} keys); clear some keys first")
        expires = None if ttl_s is None else self._clock() + float(ttl_s)
        self._items[key] = (data, expires)

    def _live(self, key: str) -> bytes | None:
        item = self._items.get(key)
        if item is None:
            return None
        data, expires = item
        if expires is not None and self._clock() >= expires:
            del self._items[key]
            return None
        return data

    def get(self, key: str, default: Any = None) -> Any:
        """A fresh copy of the value under ``key``, or ``default`` when missing or expired."""
        _check_key(key)
        data = self._live(key)
        return default if data is None else orjson.loads(data)

    def contains(self, key: str) -> bool:
        _check_key(key)
        return self._live(key) is not None

    __contains__ = contains

    def delete(self, key: str) -> bool:
        """Remove ``key``; True when it was there (and not expired)."""
        _check_key(key)
        present = self._live(key) is not None
        self._items.pop(key, None)
        return present

    def clear(self) -> int:
        """Remove everything; returns how many live keys there were."""
        live = len(self)
        self._items.clear()
        return live

    def purge_expired(self) -> int:
        now = self._clock()
        dead = [k for k, (_, exp) in self._items.items() if exp is not None and now >= exp]
        for key in dead:
            del self._items[key]
        return len(dead)

    def keys(self) -> list[str]:
        """Live keys, sorted."""
        self.purge_expired()
        return sorted(self._items)

    def items(self) -> dict[str, Any]:
        """Copies of every live value by key."""
        self.purge_expired()
        return {k: orjson.loads(self._items[k][0]) for k in sorted(self._items)}

    def __len__(self) -> int:
        self.purge_expired()
        return len(self._items)
