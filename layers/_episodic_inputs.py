"""What an episodic store accepts: argument checks, defaults and an episode ready to write.

Shared by the store's writes, searches, archives and retention, so each argument is refused
with the same one-line error wherever it is given.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from memstrata.core.errors import InvalidInputError
from memstrata.core.validation import check_path
from memstrata.storage import FloatArray, identifier_words

from ._episode_records import load_tags

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

    def digest(self) -> str:
        """What makes it the same episode as another under its uuid (see :func:`episode_digest`)."""
        fields = (self.at_us, self.kind, self.task_run_id, self.title, self.content, self.tags)
        return episode_digest((0, self.uuid, *fields, self.recorded_us))

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


def episode_digest(row: Sequence[Any]) -> str:
    """What makes an episode row (selected as ``EPISODE_COLUMNS``) *the same* as another with
    its uuid: its time, kind, task run, title, content and tags (as a mapping), what an export
    and an archive both carry; not its id nor when it was recorded. Two runs with the same seed
    draw the same uuids for different episodes, so a uuid alone does not say it."""
    _ident, _uuid, at_us, kind, run, title, content, tags, _recorded = row
    tag_map = load_tags(tags) if isinstance(tags, str) else dict(tags)
    payload = json.dumps([int(at_us), kind, run, title, content, sorted(tag_map.items())])
    return hashlib.blake2b(payload.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def renamed_uuid(uuid: str, digest: str) -> str:
    """The uuid a different episode arriving under ``uuid`` (held here) is kept under: a
    function of both, so doing the same twice gives the same uuid, found there the second time."""
    data = hashlib.blake2b(f"{uuid}\x00{digest}".encode(), digest_size=16).digest()
    return str(uuidlib.UUID(bytes=data, version=4))


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


def free_archive_path(folder: Path, stem: str, now: datetime) -> Path:
    """``{folder}/{stem}-{now}.sqlite``, or with ``-2``, ``-3``, ... when that name is taken (a
    manual clock gives archives one time): a name the same calls choose again in a replay. The
    one writer of a store's archives calls it, so two archives never pick one name."""
    stamp = now.astimezone(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    target, n = folder / f"{stem}-{stamp}.sqlite", 1
    while target.exists() or target.is_symlink():
        n += 1
        target = folder / f"{stem}-{stamp}-{n}.sqlite"
    return target


def _path_arg(value: object, name: str) -> Path:
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise InvalidInputError(f"{name} must be a file path, got {value!r}")
    return Path(check_path(value, name)).expanduser().absolute()
