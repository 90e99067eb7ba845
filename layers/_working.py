"""Working memory: one agent's scratch space, one per task plus an agent-wide one.

A plain in-memory key-value map with optional time-to-live. Keys live in a *space*: the space of
one task (``task_id``) or the agent-wide space (``task_id=None``), so two tasks of the same agent
running at once never see or clear each other's keys, and ending a task clears only its own
space. Values must be JSON-serialisable (they travel in messages) and are stored as encoded bytes,
so a caller that mutates a value after setting it, or mutates what ``get`` returned, never changes
what is stored. Time comes from an injectable monotonic clock so simulations can expire entries
without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from fractions import Fraction
from typing import Any, NamedTuple

import orjson

from memstrata.core.errors import InvalidInputError
from memstrata.core.validation import check_json_value, check_key, check_task_id, check_ttl

__all__ = ["NS_PER_S", "WorkingItem", "WorkingMemory", "seconds_to_ns"]

NS_PER_S = 1_000_000_000

_Slot = tuple[str | None, str]  # (task_id or None for the agent-wide space, key)


class WorkingItem(NamedTuple):
    """One live key: its space, value and, when it expires, the seconds left."""

    task_id: str | None
    key: str
    value: Any
    expires_in_s: float | None


def seconds_to_ns(seconds: float) -> int:
    """``seconds`` as whole nanoseconds, rounded from the float's exact value, so that times
    written as decimals (0.1 + 0.7 and 0.8) add up as the decimals do: expiry exactly at a
    boundary does not depend on how a manual clock's steps were split."""
    return round(Fraction(seconds) * NS_PER_S)


def _task(task_id: object) -> str | None:
    return check_task_id(task_id, "task_id", optional=True)


class WorkingMemory:
    """Key-value scratch spaces with optional TTL (not thread-safe: its actor serialises access).

    ``max_items`` bounds the live keys of all spaces together.
    """

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
        self._items: dict[_Slot, tuple[bytes, int | None]] = {}  # slot -> (json, expires at, in ns)

    def set(self, key: str, value: Any, *, ttl_s: float | None = None, task_id: str | None = None) -> None:
        """Store ``value`` under ``key`` in the space of ``task_id`` (``None``: agent-wide); it
        disappears ``ttl_s`` seconds later when given."""
        check_key(key, "working memory key")
        ttl = check_ttl(ttl_s, "ttl_s")
        slot = (_task(task_id), key)
        data = check_json_value(value, f"working memory value for key {key!r}")
        if self._max_value_bytes is not None and len(data) > self._max_value_bytes:
            raise InvalidInputError(
                f"working memory value for {key!r} is {len(data)} bytes, more than the limit of "
                f"{self._max_value_bytes}"
            )
        self.purge_expired()
        if self._max_items is not None and slot not in self._items and len(self._items) >= self._max_items:
            raise InvalidInputError(f"working memory is full ({self._max_items} keys); clear some keys first")
        # a positive ttl keeps the key for at least a nanosecond, however small it is
        expires = None if ttl is None else self._now_ns() + max(1, seconds_to_ns(ttl))
        self._items[slot] = (data, expires)

    def _now_ns(self) -> int:
        """The clock's time in whole nanoseconds: expiry is compared exactly, never in floats."""
        return seconds_to_ns(self._clock())

    def _live(self, slot: _Slot) -> bytes | None:
        item = self._items.get(slot)
        if item is None:
            return None
        data, expires = item
        if expires is not None and self._now_ns() >= expires:
            del self._items[slot]
            return None
        return data

    def get(self, key: str, default: Any = None, *, task_id: str | None = None) -> Any:
        """A fresh copy of the value under ``key`` in that space, or ``default`` when missing or
        expired (a task's space does not fall back to the agent-wide one: they are apart)."""
        check_key(key, "working memory key")
        data = self._live((_task(task_id), key))
        return default if data is None else orjson.loads(data)

    def contains(self, key: str, *, task_id: str | None = None) -> bool:
        check_key(key, "working memory key")
        return self._live((_task(task_id), key)) is not None

    def __contains__(self, key: object) -> bool:
        return self.contains(key)  # type: ignore[arg-type]

    def delete(self, key: str, *, task_id: str | None = None) -> bool:
        """Remove ``key`` from that space; True when it was there (and not expired)."""
        check_key(key, "working memory key")
        slot = (_task(task_id), key)
        present = self._live(slot) is not None
        self._items.pop(slot, None)
        return present

    def clear(self, *, task_id: str | None = None) -> int:
        """Remove every key of one space (``None``: the agent-wide one); returns how many live
        keys there were. The other spaces keep theirs."""
        space = _task(task_id)
        self.purge_expired()
        doomed = [slot for slot in self._items if slot[0] == space]
        for slot in doomed:
            del self._items[slot]
        return len(doomed)

    def clear_all(self) -> int:
        """Remove every key of every space; returns how many live keys there were."""
        live = len(self)
        self._items.clear()
        return live

    def purge_expired(self) -> int:
        now = self._now_ns()
        dead = [k for k, (_, exp) in self._items.items() if exp is not None and now >= exp]
        for slot in dead:
            del self._items[slot]
        return len(dead)

    def keys(self, *, task_id: str | None = None) -> list[str]:
        """Live keys of one space, sorted."""
        space = _task(task_id)
        self.purge_expired()
        return sorted(key for task, key in self._items if task == space)

    def items(self, *, task_id: str | None = None) -> dict[str, Any]:
        """Copies of every live value of one space, by key."""
        space = _task(task_id)
        self.purge_expired()
        return {key: orjson.loads(self._items[(space, key)][0]) for key in self.keys(task_id=space)}

    def tasks(self) -> list[str]:
        """The tasks that hold live keys, sorted."""
        self.purge_expired()
        return sorted({task for task, _ in self._items if task is not None})

    def entries(self) -> list[WorkingItem]:
        """Every live key of every space (agent-wide first, then by task and key)."""
        self.purge_expired()
        now = self._now_ns()
        out = []
        for task, key in sorted(self._items, key=lambda slot: (slot[0] is not None, slot[0] or "", slot[1])):
            data, expires = self._items[(task, key)]
            # a live key has time left: never rounded down to 0, which no write accepts
            left = None if expires is None else max(round((expires - now) / NS_PER_S, 6), 1e-6)
            out.append(WorkingItem(task, key, orjson.loads(data), left))
        return out

    def __len__(self) -> int:
        """Live keys of all spaces."""
        self.purge_expired()
        return len(self._items)
