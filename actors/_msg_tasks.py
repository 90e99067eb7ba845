"""Messages of the task lifecycle: assign a task, get its prompt, write its outcome back."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from ._codec import Message
from ._msg_fields import Many, OptAgentId, OptCategory, OptQuery, OptScope, OptTopK, Tags, TaskId, Text

if typing.TYPE_CHECKING:
    from memstrata.layers import EpisodeHit, KnowledgeHit


class TaskAssigned(Message):
    """A task for an agent: answered with a :class:`TaskPrompt` built from its knowledge.

    ``agent_id`` may be left out when the message is sent through an agent handle
    (``system.agent(id).ask(msg)``); ``query`` defaults to the description.
    """

    task_id: TaskId
    description: Text
    agent_id: OptAgentId = None
    query: OptQuery = None
    category: OptCategory = None
    tags: Tags = None
    scope: OptScope = None
    top_k: OptTopK = None


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


class TaskPrompt(Message):
    """The prompt for a task: knowledge context + task, or the fallback (task only) and why."""

    text: str
    hits: Many[KnowledgeHit] = ()
    fallback: bool = False
    reason: str | None = None
    agent_id: str = ""
    task_id: str = ""
    episodes: Many[EpisodeHit] = ()
    files: Many[FileContext] = ()  # memory-file and code chunks, in prompt order


class TaskCompleted(Message):
    """Write-back: the summary becomes an ``outcome`` entry and an episode (durable when acked)."""

    task_id: TaskId
    summary: Text
    agent_id: OptAgentId = None


class TaskFailed(Message):
    """Write-back: the reason becomes a ``pitfall`` entry and an episode (durable when acked)."""

    task_id: TaskId
    reason: Text
    agent_id: OptAgentId = None


class WriteBackQueued(Message):
    """The write-back is in the agent's outbox (committed): it survives a crash from here on."""

    agent_id: str
    task_id: str
    outbox_id: int
