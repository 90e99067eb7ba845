"""WorkingMemoryActor: the in-process working memory behind a mailbox; one store actor per module."""

from __future__ import annotations

from typing import Any

from ._base import MemoryActor
from ._store_messages import ExportRecords, ImportRecords
from .messages import (
    ClearWorkingMemory,
    GetWorkingMemory,
    SetWorkingMemory,
    WorkingMemoryCleared,
    WorkingMemoryValue,
)

__all__ = ["WorkingMemoryActor"]


class WorkingMemoryActor(MemoryActor):
    """One agent's working memory (in memory only). The memory outlives the actor: a crash, or
    the agent retired and used again, goes on with the same values; it ends with the system."""

    kind = "working"

    def open_layer(self) -> Any:
        from memstrata.layers import WorkingMemory

        kept: dict[str, Any] | None = getattr(self.runtime, "working_memories", None)
        if kept is not None and self.key in kept:
            return kept[self.key]
        layer = WorkingMemory(
            clock=self.runtime.clock.monotonic, max_value_bytes=self.runtime.config.max_content_bytes
        )
        if kept is not None:
            kept[self.key] = layer
        return layer

    def close_layer(self, layer: Any) -> None:
        """Nothing to close: the values stay for the actor that follows (see the class)."""

    def handle(self, message: Any) -> Any:
        layer = self.layer
        if isinstance(message, ExportRecords):
            return self._export()
        if isinstance(message, ImportRecords):
            for record in message.records:
                layer.set(
                    record["key"],
                    record["value"],
                    ttl_s=record.get("expires_in_s"),
                    task_id=record.get("task_id"),
                )
            return len(message.records)
        if isinstance(message, SetWorkingMemory):
            task = message.task_id or None
            layer.set(message.key, message.value, ttl_s=message.ttl_s, task_id=task)
            value = layer.get(message.key, task_id=task)
            return WorkingMemoryValue(self.key, message.key, value, True, task)
        if isinstance(message, GetWorkingMemory):
            task = message.task_id or None
            found = layer.contains(message.key, task_id=task)
            value = layer.get(message.key, task_id=task) if found else None
            return WorkingMemoryValue(self.key, message.key, value, found, task)
        if isinstance(message, ClearWorkingMemory):
            task = message.task_id or None
            if message.key is None:
                removed = layer.clear(task_id=task)
            else:
                removed = int(layer.delete(message.key, task_id=task))
            return WorkingMemoryCleared(self.key, removed)
        return super().handle(message)

    def status(self) -> dict[str, Any]:
        base = super().status()
        if self.layer is not None:
            base["count"] = len(self.layer)
        return base

    def _export(self) -> list[dict[str, Any]]:
        """Live keys with their values and, for those that expire, the seconds left."""
        out = []
        for item in self.layer.entries():
            record = {
                "kind": "working",
                "agent": self.key,
                "key": item.key,
                "value": item.value,
                "expires_in_s": item.expires_in_s,
            }
            if item.task_id is not None:  # a task's space (the agent-wide space has no field)
                record["task_id"] = item.task_id
            out.append(record)
        return out
