"""Messages for episodic memory: record, search, list, get and delete episodes, archive and
restore them, commit the store."""

from __future__ import annotations

import datetime as _dt
import typing
from dataclasses import dataclass

from memstrata.core.constants import MAX_TITLE_CHARS
from memstrata.core.errors import InvalidInputError
from memstrata.core.validation import (
    check_agent_id,
    check_bool,
    check_category,
    check_datetime,
    check_int,
    check_optional_text,
    check_tags,
    check_task_id,
    check_text,
    check_top_k,
)

from ._codec import Message, set_field

if typing.TYPE_CHECKING:
    from memstrata.layers import Episode, EpisodeHit


__all__ = [
    "ArchiveEpisodes",
    "CommitMemory",
    "DeleteEpisode",
    "EpisodeDeleted",
    "EpisodeItem",
    "EpisodeList",
    "EpisodesArchived",
    "EpisodesRestored",
    "GetEpisode",
    "ListEpisodes",
    "MemoryCommitted",
    "MemorySearchResult",
    "MemoryStored",
    "RestoreEpisodes",
    "SearchMemory",
    "StoreMemory",
]


@dataclass(frozen=True, slots=True)
class StoreMemory(Message):
    """Record an episode in ``agent_id``'s episodic memory (``at`` defaults to the system clock)."""

    agent_id: str
    task_run_id: str | None
    content: str
    title: str | None = None
    tags: dict[str, str] | None = None
    kind: str = "note"
    at: _dt.datetime | None = None

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "StoreMemory.agent_id")
        if self.task_run_id is not None:
            check_task_id(self.task_run_id, "StoreMemory.task_run_id")
        check_text(self.content, "StoreMemory.content")
        check_optional_text(self.title, "StoreMemory.title", max_chars=MAX_TITLE_CHARS)
        set_field(self, "tags", None if self.tags is None else check_tags(self.tags, "StoreMemory.tags"))
        check_category(self.kind, "StoreMemory.kind")
        set_field(self, "at", check_datetime(self.at, "StoreMemory.at"))


@dataclass(frozen=True, slots=True)
class MemoryStored(Message):
    agent_id: str
    episode_id: int


@dataclass(frozen=True, slots=True)
class SearchMemory(Message):
    """Hybrid search of ``agent_id``'s episodes, optionally within a task run or a time range."""

    agent_id: str
    query: str
    task_run_id: str | None = None
    top_k: int = 10
    since: _dt.datetime | None = None
    until: _dt.datetime | None = None

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "SearchMemory.agent_id")
        check_text(self.query, "SearchMemory.query", allow_empty=True)
        if self.task_run_id is not None:
            check_task_id(self.task_run_id, "SearchMemory.task_run_id")
        check_top_k(self.top_k, "SearchMemory.top_k")
        set_field(self, "since", check_datetime(self.since, "SearchMemory.since"))
        set_field(self, "until", check_datetime(self.until, "SearchMemory.until"))


@dataclass(frozen=True, slots=True)
class MemorySearchResult(Message):
    agent_id: str
    task_run_id: str | None
    hits: tuple[EpisodeHit, ...] = ()

    def __post_init__(self) -> None:
        set_field(self, "hits", tuple(self.hits))


@dataclass(frozen=True, slots=True)
class CommitMemory(Message):
    """Flush ``agent_id``'s episodic memory (and apply its retention policy)."""

    agent_id: str

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "CommitMemory.agent_id")


@dataclass(frozen=True, slots=True)
class MemoryCommitted(Message):
    agent_id: str


@dataclass(frozen=True, slots=True)
class ListEpisodes(Message):
    """The timeline of ``agent_id``'s live episodes (``since`` inclusive, ``until`` exclusive),
    newest first unless ``newest_first`` is false, a page of ``limit`` after ``offset``."""

    agent_id: str
    task_run_id: str | None = None
    since: _dt.datetime | None = None
    until: _dt.datetime | None = None
    limit: int = 100
    offset: int = 0
    newest_first: bool = True

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "ListEpisodes.agent_id")
        if self.task_run_id is not None:
            check_task_id(self.task_run_id, "ListEpisodes.task_run_id")
        set_field(self, "since", check_datetime(self.since, "ListEpisodes.since"))
        set_field(self, "until", check_datetime(self.until, "ListEpisodes.until"))
        check_int(self.limit, "ListEpisodes.limit", 0, 10_000)
        check_int(self.offset, "ListEpisodes.offset", 0, 2**62)
        check_bool(self.newest_first, "ListEpisodes.newest_first")


@dataclass(frozen=True, slots=True)
class EpisodeList(Message):
    agent_id: str
    episodes: tuple[Episode, ...] = ()

    def __post_init__(self) -> None:
        set_field(self, "episodes", tuple(self.episodes))


@dataclass(frozen=True, slots=True)
class GetEpisode(Message):
    agent_id: str
    episode_id: int

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "GetEpisode.agent_id")
        check_int(self.episode_id, "GetEpisode.episode_id", 1, 2**62)


@dataclass(frozen=True, slots=True)
class EpisodeItem(Message):
    """The answer to :class:`GetEpisode`: the live episode, or ``None``."""

    agent_id: str
    episode: Episode | None = None


@dataclass(frozen=True, slots=True)
class DeleteEpisode(Message):
    """Delete a live episode for good (its vector, text index and neighbours' context too)."""

    agent_id: str
    episode_id: int

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "DeleteEpisode.agent_id")
        check_int(self.episode_id, "DeleteEpisode.episode_id", 1, 2**62)


@dataclass(frozen=True, slots=True)
class EpisodeDeleted(Message):
    agent_id: str
    episode_id: int
    deleted: bool


@dataclass(frozen=True, slots=True)
class ArchiveEpisodes(Message):
    """Move ``agent_id``'s episodes older than ``before`` (and/or of ``task_run_id``; all when
    neither is given) into one new archive file at ``path`` (:class:`RestoreEpisodes` brings
    them back)."""

    agent_id: str
    path: str
    before: _dt.datetime | None = None
    task_run_id: str | None = None

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "ArchiveEpisodes.agent_id")
        _check_path(self.path, "ArchiveEpisodes.path")
        set_field(self, "before", check_datetime(self.before, "ArchiveEpisodes.before"))
        if self.task_run_id is not None:
            check_task_id(self.task_run_id, "ArchiveEpisodes.task_run_id")


@dataclass(frozen=True, slots=True)
class EpisodesArchived(Message):
    agent_id: str
    path: str
    archived: int


@dataclass(frozen=True, slots=True)
class RestoreEpisodes(Message):
    """Bring the episodes of the archive file at ``path`` back (idempotent: matched by uuid)."""

    agent_id: str
    path: str

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "RestoreEpisodes.agent_id")
        _check_path(self.path, "RestoreEpisodes.path")


@dataclass(frozen=True, slots=True)
class EpisodesRestored(Message):
    agent_id: str
    path: str
    restored: int


def _check_path(value: object, name: str) -> str:
    """A file path as text: non-empty, at most 4096 characters, no NUL."""
    text = check_text(value, name)
    if len(text) > 4096 or "\x00" in text:
        raise InvalidInputError(f"{name} must be a file path of at most 4096 characters without NUL")
    return text
