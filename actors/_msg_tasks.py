"""Messages of the task lifecycle: assign a task, get its prompt, write its outcome back."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from memstrata.core.validation import (
    check_agent_id,
    check_category,
    check_scope,
    check_tags,
    check_task_id,
    check_text,
    check_top_k,
)

from ._codec import Message, set_field

if typing.TYPE_CHECKING:
    from memstrata.layers import EpisodeHit, KnowledgeHit


__all__ = [
    "FileContext",
    "TaskAssigned",
    "TaskCompleted",
    "TaskFailed",
    "TaskPrompt",
    "WriteBackQueued",
]


@dataclass(frozen=True, slots=True)
class TaskAssigned(Message):
    """A task for an agent: answered with a :class:`TaskPrompt` built from its knowledge.

    ``agent_id`` may be left out when the message is sent through an agent handle
    (``system.agent(id).ask(msg)``); ``query`` defaults to the description.
    """

    task_id: str
    description: str
    agent_id: str | None = None
    query: str | None = None
    category: str | None = None
    tags: dict[str, str] | None = None
    scope: str | None = None
    top_k: int | None = None

    def __post_init__(self) -> None:
        check_task_id(self.task_id, "TaskAssigned.task_id")
        check_text(self.description, "TaskAssigned.description")
        if self.agent_id is not None:
            check_agent_id(self.agent_id, "TaskAssigned.agent_id")
        if self.query is not None:
            check_text(self.query, "TaskAssigned.query", allow_empty=True)
        if self.category is not None:
            check_category(self.category, "TaskAssigned.category")
        set_field(self, "tags", None if self.tags is None else check_tags(self.tags, "TaskAssigned.tags"))
        if self.scope is not None:
            set_field(self, "scope", check_scope(self.scope, "TaskAssigned.scope"))
        if self.top_k is not None:
            check_top_k(self.top_k, "TaskAssigned.top_k")


@dataclass(frozen=True, slots=True)
class FileContext:
    """A chunk of a memory file (``source="file"``, from the agent's workspace) or of a codebase
    (``source="code"``, ``origin`` = the codebase's name) put in a task's prompt. ``path`` is
    relative to its root; lines are 1-based and inclusive; ``score`` is the hybrid 0-1 score."""

    source: str
    path: str
    start_line: int
    end_line: int
    score: float
    text: str
    language: str | None = None
    origin: str = ""


@dataclass(frozen=True, slots=True)
class TaskPrompt(Message):
    """The prompt for a task: knowledge context + task, or the fallback (task only) and why."""

    text: str
    hits: tuple[KnowledgeHit, ...] = ()
    fallback: bool = False
    reason: str | None = None
    agent_id: str = ""
    task_id: str = ""
    episodes: tuple[EpisodeHit, ...] = ()
    files: tuple[FileContext, ...] = ()  # memory-file and code chunks, in prompt order

    def __post_init__(self) -> None:
        set_field(self, "hits", tuple(self.hits))
        set_field(self, "episodes", tuple(self.episodes))
        set_field(self, "files", tuple(self.files))


@dataclass(frozen=True, slots=True)
class TaskCompleted(Message):
    """Write-back: the summary becomes an ``outcome`` entry and an episode (durable when acked)."""

    task_id: str
    summary: str
    agent_id: str | None = None

    def __post_init__(self) -> None:
        check_task_id(self.task_id, "TaskCompleted.task_id")
        check_text(self.summary, "TaskCompleted.summary")
        if self.agent_id is not None:
            check_agent_id(self.agent_id, "TaskCompleted.agent_id")


@dataclass(frozen=True, slots=True)
class TaskFailed(Message):
    """Write-back: the reason becomes a ``pitfall`` entry and an episode (durable when acked)."""

    task_id: str
    reason: str
    agent_id: str | None = None

    def __post_init__(self) -> None:
        check_task_id(self.task_id, "TaskFailed.task_id")
        check_text(self.reason, "TaskFailed.reason")
        if self.agent_id is not None:
            check_agent_id(self.agent_id, "TaskFailed.agent_id")


@dataclass(frozen=True, slots=True)
class WriteBackQueued(Message):
    """The write-back is in the agent's outbox (committed): it survives a crash from here on."""

    agent_id: str
    task_id: str
    outbox_id: int
