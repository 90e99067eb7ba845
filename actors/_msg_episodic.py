"""Messages for episodic memory: record, search, list, get and delete episodes, archive and
restore them, commit the store."""

from __future__ import annotations

import typing
from typing import Annotated

from memstrata.core.validation import check_path, check_time_range

from ._codec import Message, Rule
from ._msg_fields import (
    AgentId,
    Category,
    Flag,
    Many,
    OptTaskId,
    PageSize,
    PageStart,
    Query,
    RowId,
    Tags,
    Text,
    Time,
    Title,
    TopK,
)

if typing.TYPE_CHECKING:
    from memstrata.layers import Episode, EpisodeHit


FilePath = Annotated[str, Rule(check_path)]
OptFilePath = Annotated[str | None, Rule(check_path, optional=True)]


class StoreMemory(Message):
    """Record an episode in ``agent_id``'s episodic memory (``at`` defaults to the system clock)."""

    agent_id: AgentId
    task_run_id: OptTaskId
    content: Text
    title: Title = None
    tags: Tags = None
    kind: Category = "note"
    at: Time = None


class MemoryStored(Message):
    agent_id: str
    episode_id: int


class SearchMemory(Message):
    """Hybrid search of ``agent_id``'s episodes, optionally within a task run or a time range."""

    agent_id: AgentId
    query: Query
    task_run_id: OptTaskId = None
    top_k: TopK = 10
    since: Time = None
    until: Time = None

    def _check(self) -> None:
        check_time_range(self.since, self.until)


class MemorySearchResult(Message):
    agent_id: str
    task_run_id: str | None
    hits: Many[EpisodeHit] = ()


class CommitMemory(Message):
    """Flush ``agent_id``'s episodic memory (and apply its retention policy)."""

    agent_id: AgentId


class MemoryCommitted(Message):
    agent_id: str


class ListEpisodes(Message):
    """The timeline of ``agent_id``'s live episodes (``since`` inclusive, ``until`` exclusive),
    newest first unless ``newest_first`` is false, a page of ``limit`` after ``offset``."""

    agent_id: AgentId
    task_run_id: OptTaskId = None
    since: Time = None
    until: Time = None
    limit: PageSize = 100
    offset: PageStart = 0
    newest_first: Flag = True

    def _check(self) -> None:
        check_time_range(self.since, self.until)


class EpisodeList(Message):
    agent_id: str
    episodes: Many[Episode] = ()


class GetEpisode(Message):
    agent_id: AgentId
    episode_id: RowId


class EpisodeItem(Message):
    """The answer to :class:`GetEpisode`: the live episode, or ``None``."""

    agent_id: str
    episode: Episode | None = None


class DeleteEpisode(Message):
    """Delete a live episode for good (its vector, text index and neighbours' context too)."""

    agent_id: AgentId
    episode_id: RowId


class EpisodeDeleted(Message):
    agent_id: str
    episode_id: int
    deleted: bool


class ArchiveEpisodes(Message):
    """Move ``agent_id``'s episodes older than ``before`` (and/or of ``task_run_id``; all when
    neither is given) into one new archive file at ``path`` (:class:`RestoreEpisodes` brings
    them back). ``path`` ``None``: ``{data_dir}/episodic/archives/{agent}-{time}.sqlite``, with
    ``-2``, ``-3``, ... when that name is taken, chosen by the actor that writes the archive."""

    agent_id: AgentId
    path: OptFilePath
    before: Time = None
    task_run_id: OptTaskId = None


class EpisodesArchived(Message):
    agent_id: str
    path: str
    archived: int


class RestoreEpisodes(Message):
    """Bring the episodes of the archive file at ``path`` back (idempotent: matched by uuid)."""

    agent_id: AgentId
    path: FilePath


class EpisodesRestored(Message):
    agent_id: str
    path: str
    restored: int
