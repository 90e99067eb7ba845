"""What an episodic store accepts: argument checks, defaults and an episode ready to write.

Shared by the store's writes, searches, archives and retention, so each argument is refused
with the same one-line error wherever it is given.
"""

from __future__ import annotations

import enum
import os
import uuid as uuidlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from memstrata.core.errors import InvalidInputError
from memstrata.storage import FloatArray, identifier_words

__all__ = ["DEFAULT"]

_RECORD_KEYS = frozenset({"content", "title", "task_run_id", "tags", "kind", "at", "vector"})


class _Default(enum.Enum):
    DEFAULT = "default"

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT = _Default.DEFAULT
"""``search(recency_half_life=DEFAULT)``: use the store's configured half-life."""


@dataclass(slots=True)
class _Item:
    uuid: str
    at_us: int
    kind: str
    task_run_id: str | None
    title: str | None
    content: str
    tags: str
    recorded_us: int
    vector: FloatArray | None = None  # given by the caller; computed from the text when None

    def row(self, ident: int) -> tuple[Any, ...]:
        return (
            ident,
            self.uuid,
            self.at_us,
            self.kind,
            self.task_run_id,
            self.title,
            self.content,
            self.tags,
            self.recorded_us,
            identifier_words(f"{self.title or ''} {self.content}"),
        )


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _random_uuid() -> str:
    return str(uuidlib.uuid4())


def _positive_timedelta(value: object, name: str) -> timedelta:
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise InvalidInputError(f"{name} must be a positive datetime.timedelta, got {value!r}")
    return value


def _span_or_configured(value: object, configured_s: float | None, name: str) -> timedelta | None:
    """``value`` when given (a positive timedelta), else the configured seconds (0 or None: none)."""
    if value is not None:
        return _positive_timedelta(value, name)
    return timedelta(seconds=configured_s) if configured_s else None


def _optional_count(value: object, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{name} must be a non-negative integer or None, got {value!r}")
    return value


def _path_arg(value: object, name: str) -> Path:
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise InvalidInputError(f"{name} must be a file path, got {value!r}")
    return Path(os.fspath(value)).expanduser().absolute()
