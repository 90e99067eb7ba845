"""The actors' mailbox: runs taken together, refusal once closed, and waiting in the actor's
thread while only messages that can wait arrive. Single-threaded: the waits' wake-ups are seen
on the event they set, never by timing."""

from __future__ import annotations

import threading
from typing import Any

import pykka
import pytest

from memstrata.actors._inbox import Inbox


def urgent(item: Any) -> bool:
    return item != "write-back"


class PutsWhileWaiting(threading.Event):
    """An event whose first ``wait`` runs ``during`` first: the puts of another thread, made
    while the reader is registered as waiting (``Inbox.wait`` waits on this event last)."""

    def __init__(self, during: Any) -> None:
        super().__init__()
        self.during = during
        self.waited = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waited += 1
        if self.waited == 1:
            self.during(self)
        return super().wait(0)


def test_a_message_that_can_wait_does_not_wake_the_reader_and_one_that_cannot_does() -> None:
    inbox = Inbox()
    seen: list[bool] = []

    def during(done: threading.Event) -> None:
        inbox.put("write-back")
        seen.append(done.is_set())
        inbox.put("search")
        seen.append(done.is_set())

    done = PutsWhileWaiting(during)
    inbox.wait(done, urgent, 60.0)
    assert seen == [False, True]
    assert list(inbox.queue) == ["write-back", "search"]  # both kept, in order


def test_the_reader_does_not_wait_when_a_message_that_cannot_wait_is_queued() -> None:
    inbox = Inbox()
    inbox.put("write-back")
    inbox.put("status")
    done = PutsWhileWaiting(lambda _: None)
    inbox.wait(done, urgent, 60.0)
    assert done.waited == 0


def test_the_wait_ends_with_its_event_and_leaves_no_watch_behind() -> None:
    inbox = Inbox()
    asked: list[Any] = []

    def counted(item: Any) -> bool:
        asked.append(item)
        return urgent(item)

    done = PutsWhileWaiting(lambda event: event.set())  # the answer comes while it waits
    inbox.wait(done, counted, 60.0)
    assert done.waited == 1
    inbox.put("search")  # nobody waits any more: the predicate is not asked
    assert asked == [] and list(inbox.queue) == ["search"]


def test_take_while_takes_the_accepted_run_at_the_head_only() -> None:
    inbox = Inbox()
    for item in ("write-back", "write-back", "search", "write-back"):
        inbox.put(item)
    assert inbox.take_while(lambda item: item == "write-back", 10) == ["write-back", "write-back"]
    assert inbox.take_while(lambda item: item == "write-back", 10) == []
    assert inbox.holds(lambda item: item == "search")


def test_a_closed_inbox_refuses_messages_and_returns_those_left() -> None:
    inbox = Inbox()
    inbox.put("write-back")
    assert inbox.close() == ["write-back"]
    with pytest.raises(pykka.ActorDeadError):
        inbox.put("search")
