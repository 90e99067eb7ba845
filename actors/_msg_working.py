"""Messages for one agent's working memory: set, get and clear keys of a task's space or of
the agent-wide one (``task_id=None``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memstrata.core.validation import (
    check_agent_id,
    check_json_value,
    check_key,
    check_number,
    check_task_id,
)

from ._codec import Message

__all__ = [
    "ClearWorkingMemory",
    "GetWorkingMemory",
    "SetWorkingMemory",
    "WorkingMemoryCleared",
    "WorkingMemoryValue",
]


@dataclass(frozen=True, slots=True)
class SetWorkingMemory(Message):
    """Set a key in ``agent_id``'s working memory, in the space of ``task_id`` (``None``: the
    agent-wide space); ``ttl_s`` makes it expire."""

    agent_id: str
    key: str
    value: Any
    ttl_s: float | None = None
    task_id: str | None = None

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "SetWorkingMemory.agent_id")
        check_key(self.key, "SetWorkingMemory.key")
        check_json_value(self.value, "SetWorkingMemory.value")
        check_number(self.ttl_s, "SetWorkingMemory.ttl_s")
        check_task_id(self.task_id, "SetWorkingMemory.task_id", optional=True)


@dataclass(frozen=True, slots=True)
class GetWorkingMemory(Message):
    """Read a key of the space of ``task_id`` (``None``: the agent-wide space)."""

    agent_id: str
    key: str
    task_id: str | None = None

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "GetWorkingMemory.agent_id")
        check_key(self.key, "GetWorkingMemory.key")
        check_task_id(self.task_id, "GetWorkingMemory.task_id", optional=True)


@dataclass(frozen=True, slots=True)
class WorkingMemoryValue(Message):
    agent_id: str
    key: str
    value: Any = None
    found: bool = False
    task_id: str | None = None


@dataclass(frozen=True, slots=True)
class ClearWorkingMemory(Message):
    """Clear one space of ``agent_id``'s working memory (``task_id``'s, or the agent-wide one
    when ``None``), or only ``key`` in it. The other spaces keep their keys."""

    agent_id: str
    key: str | None = None
    task_id: str | None = None

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "ClearWorkingMemory.agent_id")
        if self.key is not None:
            check_key(self.key, "ClearWorkingMemory.key")
        check_task_id(self.task_id, "ClearWorkingMemory.task_id", optional=True)


@dataclass(frozen=True, slots=True)
class WorkingMemoryCleared(Message):
    agent_id: str
    removed: int
