"""``Activity``: work in flight counted in all and by owner, so retiring one agent waits for
that agent's work only, and stopping the system for everyone's."""

from __future__ import annotations

import threading

from memstrata.actors._base import owner_of
from memstrata.actors._concurrency import Activity


def test_an_owner_is_idle_while_another_owner_works() -> None:
    activity = Activity()
    activity.begin("a1")
    activity.begin("b1", 2)
    assert activity.in_flight == 3
    assert not activity.wait_idle(0, owner="a1")
    activity.done("a1")
    assert activity.wait_idle(0, owner="a1")
    assert not activity.wait_idle(0)  # b1's work is still in flight
    assert not activity.wait_idle(0, owner="b1")
    activity.done("b1", 2)
    assert activity.wait_idle(0) and activity.wait_idle(0, owner="b1")


def test_a_waiter_for_one_owner_wakes_when_that_owner_is_done() -> None:
    activity = Activity()
    activity.begin("a1")
    activity.begin("b1")
    waiting = threading.Event()
    answers: list[bool] = []

    def wait() -> None:
        waiting.set()
        answers.append(activity.wait_idle(60, owner="a1"))

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert waiting.wait(30)
    activity.done("a1")
    waiter.join(30)
    assert answers == [True] and activity.in_flight == 1


def test_done_more_than_begun_leaves_no_negative_count() -> None:
    activity = Activity()
    activity.done("a1")
    activity.begin("a1")
    assert activity.in_flight == 1 and not activity.wait_idle(0, owner="a1")


def test_the_owner_of_an_actor_is_what_retire_stops_together() -> None:
    assert owner_of("knowledge", "a1") == owner_of("agent", "a1") == owner_of("working", "a1") == "a1"
    assert owner_of("blackboard", "s1") == "session:s1"
    assert owner_of("codebase", "repo") == "codebase:repo"
