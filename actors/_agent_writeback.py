"""The agent actor's write-back half (outbox, parts to the stores, retries): apart from its retrieval."""

from __future__ import annotations

import logging
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from memstrata.core.errors import AgentDegradedError, EmbeddingError, InvalidInputError, SystemStoppedError
from memstrata.core.validation import check_content

from ._base import MemoryActor
from ._delivery import deliver
from ._outbox import Outbox, OutboxRow
from ._store_messages import WriteBackEpisode, WriteBackKnowledge
from ._workspace import NoteOutcome
from .messages import (
    ClearWorkingMemory,
    StoreKnowledge,
    StoreMemory,
    TaskCompleted,
    WriteBackQueued,
)

__all__ = ["AgentWriteBack", "describe_error"]

log = logging.getLogger("memstrata.actors")


def describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True, slots=True)
class _PartAnswered:
    """Internal: one ``part`` of a request the agent actor sent out has its answer in ``future``
    (done), posted back to the actor's own mailbox; ``request_id`` is the request's id."""

    request_id: int
    part: str
    future: Future[Any]


@dataclass(frozen=True, slots=True)
class _WriteBackPart(_PartAnswered):
    """A part (``"knowledge"`` or ``"episode"``) of the outbox row ``request_id`` is answered."""


@dataclass(frozen=True, slots=True)
class _RetryWriteBack:
    row_id: int


class AgentWriteBack(MemoryActor):
    """The write-back part of :class:`AgentActor` (which owns ``outbox/{agent}.sqlite``)."""

    counters: Counter[str]
    _inflight: dict[int, set[str]]
    _tasks: dict[str, str]

    def _checked_outcome(self, kind: str, text: str) -> str:
        """The outcome's text as the stores will keep it (lone surrogates become U+FFFD), or the
        error they would give: the one rule (:func:`check_content`), checked before the outbox
        acknowledges, so nothing acknowledged is refused by a store later."""
        name = "TaskCompleted.summary" if kind == "completed" else "TaskFailed.reason"
        return check_content(text, name, max_bytes=self.runtime.config.max_content_bytes)

    def _write_back(self, kind: str, task_id: str, text: str) -> WriteBackQueued:
        text = self._checked_outcome(kind, text)
        outbox: Outbox = self.layer
        at = self.runtime.clock.now()
        row_id = outbox.append(kind, task_id, text, at)  # committed: durable from here on
        self._queued([OutboxRow(row_id, kind, task_id, text, at, False, False, 0)])
        return WriteBackQueued(self.key, task_id, row_id)

    def _write_back_many(self, messages: list[Any]) -> list[Any]:
        """Group commit: every outcome waiting in the mailbox is appended in one transaction."""
        results: list[Any] = [None] * len(messages)
        accepted: list[tuple[int, str, str, str]] = []
        for index, message in enumerate(messages):
            kind = "completed" if isinstance(message, TaskCompleted) else "failed"
            raw = message.summary if isinstance(message, TaskCompleted) else message.reason
            try:
                accepted.append((index, kind, message.task_id, self._checked_outcome(kind, raw)))
            except InvalidInputError as exc:
                results[index] = exc
        if not accepted:
            return results
        at = self.runtime.clock.now()
        outbox: Outbox = self.layer
        ids = outbox.append_many([(kind, task_id, text, at) for _, kind, task_id, text in accepted])
        rows = [
            OutboxRow(row_id, kind, task_id, text, at, False, False, 0)
            for row_id, (_, kind, task_id, text) in zip(ids, accepted, strict=True)
        ]  # committed: durable from here on
        self._queued(rows)
        for row, (index, _, task_id, _) in zip(rows, accepted, strict=True):
            results[index] = WriteBackQueued(self.key, task_id, row.id)
        return results

    def _queued(self, rows: list[OutboxRow]) -> None:
        """Rows just committed to the outbox: forget their tasks, send their parts on (and, for
        a ``rw`` workspace, their outcome to its daily memory file)."""
        notes = self.runtime.workspace_of(self.key) is not None and (
            self.runtime.config.for_agent(self.key).workspace_access == "rw"
        )
        outbox: Outbox = self.layer
        repeats = outbox.take_repeats([row.id for row in rows])  # retries: nothing new happened
        for row in rows:
            self._tasks.pop(row.task_id, None)
            self.counters[f"tasks_{row.kind}"] += 1
            repeat = row.id in repeats
            # a retry's episode is stored once, as a replay's is (its knowledge dedups by content)
            self._dispatch(row, replay=repeat)
            if notes and not repeat:
                try:
                    note = NoteOutcome(row.task_id, row.kind, row.text, row.at)
                    self.runtime.post(self.runtime.ref("workspace", self.key), note, owner=self.owner)
                except Exception as exc:  # the outcome is stored; only its note is missing
                    log.warning("agent %s: daily memory note not written: %s", self.key, exc)
        if self.runtime.config.for_agent(self.key).clear_working_memory_on_task_end and self._has_working():
            for task_id in dict.fromkeys(row.task_id for row in rows):
                # only the ended tasks' spaces: concurrent tasks keep theirs
                clear = ClearWorkingMemory(self.key, task_id=task_id)
                try:  # a retired agent's actor starts again, to clear the values it kept
                    deliver(self.runtime, "working", self.key, clear)
                except Exception as exc:  # the outcome is stored; only the clear is missing
                    log.warning("agent %s: working memory of task %r not cleared: %s", self.key, task_id, exc)

    def _has_working(self) -> bool:
        """Whether the agent has working memory: an actor running, or the values a retired
        one left (they outlive it, see :class:`WorkingMemoryActor`)."""
        kept: dict[str, Any] = getattr(self.runtime, "working_memories", {})
        return self.key in kept or self.runtime.existing("working", self.key) is not None

    def _new_run(self, task_id: str) -> None:
        """The task is begun (again): its next outcome is news, even if it repeats an earlier one."""
        outbox: Outbox | None = self.layer
        if outbox is None:
            return
        try:
            outbox.forget_task(task_id)
        except Exception as exc:  # the prompt still goes out; a repeat would count as a retry
            log.warning("agent %s: earlier outcomes of task %r not forgotten: %s", self.key, task_id, exc)

    def _part_message(self, row: OutboxRow, part: str, replay: bool) -> Any:
        completed = row.kind == "completed"
        if part == "knowledge":
            category = "outcome" if completed else "pitfall"
            tags = {"taskId": row.task_id}
            entry = StoreKnowledge(self.key, row.text, category, tags, author=self.key, at=row.at)
            return WriteBackKnowledge(entry)
        episode = StoreMemory(
            self.key,
            row.task_id,
            row.text,
            title=f"Task {row.task_id} {'completed' if completed else 'failed'}",
            tags={"taskId": row.task_id, "outcome": row.kind},
            kind="task",
            at=row.at,
        )
        return WriteBackEpisode(episode, once=replay)

    def _dispatch(self, row: OutboxRow, *, replay: bool) -> None:
        inflight = self._inflight.setdefault(row.id, set())
        for part in row.pending_parts():
            if part in inflight:
                continue
            kind = "knowledge" if part == "knowledge" else "episodic"
            try:
                future = self.runtime.request(kind, self.key, self._part_message(row, part, replay))
            except Exception as exc:
                self._part_failed(row.id, part, exc)
                continue
            inflight.add(part)
            self._post_when_done(future, _WriteBackPart, row.id, part)
        if not inflight:
            self._inflight.pop(row.id, None)

    def _post_when_done(
        self, future: Future[Any], answered: type[_PartAnswered], request_id: int, part: str
    ) -> None:
        """Once ``future`` is done, post it to this actor as ``answered(request_id, part, future)``:
        its answer is then handled in the actor's thread, never in the one that completed it."""
        me, owner = self.actor_ref, self.owner
        future.add_done_callback(
            lambda done: self.runtime.post(me, answered(request_id, part, done), owner=owner)
        )

    def _write_back_parts(self, messages: list[_WriteBackPart]) -> None:
        """Stored parts of many rows, marked done in one transaction (a failure leaves each
        message to be handled alone). The parts leave the in-flight set first: should marking
        them fail for good (a crash), a replay sends them again (deduplicated), rather than
        skipping a part no answer will ever come for again."""
        for message in messages:
            inflight = self._inflight.get(message.request_id)
            if inflight is not None:
                inflight.discard(message.part)
                if not inflight:
                    del self._inflight[message.request_id]
        stored = [(m.request_id, m.part) for m in messages if m.future.exception() is None]
        finished = self.layer.mark_done_many(stored)
        self.counters["written_back"] += len(finished)
        for message in messages:
            error = message.future.exception()
            if error is not None:
                self._part_failed(message.request_id, message.part, error)

    def _write_back_part(self, message: _WriteBackPart) -> None:
        self._write_back_parts([message])

    def _part_failed(self, row_id: int, part: str, error: BaseException) -> None:
        outbox: Outbox = self.layer
        text = f"{part}: {describe_error(error)}"
        if isinstance(error, InvalidInputError) and not isinstance(error, EmbeddingError):
            # can never succeed: kept and reported. A model's fault never lands here: the part
            # is stored with its vector pending (see ModelFaultError)
            outbox.record_failure(row_id, text, dead=True)
            self.counters["dead_letters"] += 1
            log.error("write-back %s of agent %s rejected: %s", row_id, self.key, text)
            return
        outbox.record_failure(row_id, text)
        if isinstance(error, AgentDegradedError | SystemStoppedError):
            return  # stays in the outbox until the agent is revived or the system restarts
        row = outbox.get(row_id)
        retries = int(self.runtime.config_actors("writeback_retries"))
        if row is None or row.attempts > retries:
            self.counters["writeback_deferred"] += 1
            return
        self.counters["writeback_retries"] += 1
        delay = 0.05 * (2 ** (row.attempts - 1))
        self.runtime.activity.begin(self.owner)  # a retry due later is work in flight

        def fire(me: Any = self.actor_ref) -> None:
            try:
                self.runtime.post(me, _RetryWriteBack(row_id), owner=self.owner)
            finally:
                self.runtime.activity.done(self.owner)

        self.runtime.scheduler.call_later(delay, fire)
