"""Messages for one agent's working memory: set, get and clear keys of a task's space or of
the agent-wide one (``task_id=None``)."""

from __future__ import annotations

from typing import Any

from ._codec import Message
from ._msg_fields import AgentId, JsonValue, Key, OptKey, Ttl, WorkingTaskId


class SetWorkingMemory(Message):
    """Set a key in ``agent_id``'s working memory, in the space of ``task_id`` (``None``: the
    agent-wide space); ``ttl_s`` makes it expire."""

    agent_id: AgentId
    key: Key
    value: JsonValue
    ttl_s: Ttl = None
    task_id: WorkingTaskId = None


class GetWorkingMemory(Message):
    """Read a key of the space of ``task_id`` (``None``: the agent-wide space)."""

    agent_id: AgentId
    key: Key
    task_id: WorkingTaskId = None


class WorkingMemoryValue(Message):
    agent_id: str
    key: str
    value: Any = None
    found: bool = False
    task_id: str | None = None


class ClearWorkingMemory(Message):
    """Clear one space of ``agent_id``'s working memory (``task_id``'s, or the agent-wide one
    when ``None``), or only ``key`` in it. The other spaces keep their keys."""

    agent_id: AgentId
    key: OptKey = None
    task_id: WorkingTaskId = None


class WorkingMemoryCleared(Message):
    agent_id: str
    removed: int
