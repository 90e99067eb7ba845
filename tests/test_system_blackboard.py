"""Blackboard through the facade: pub/sub semantics, ordering, failures, snapshots."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memstrata import Config, MemorySystem
from memstrata.config import ActorsConfig
from memstrata.errors import InvalidInputError, MemstrataError
from memstrata.messages import (
    ListSignals,
    PublishSignal,
    Signal,
    SignalList,
    SignalSubscribed,
    SubscribeSignal,
    UnsubscribeSignal,
)
from tests._support import eventually, fail_once, in_threads
from tests.fakes import FakeEmbedder


@pytest.fixture
def system(data_dir: Path) -> Iterator[MemorySystem]:
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as running:
        yield running


class Recorder:
    def __init__(self) -> None:
        self.signals: list[Signal] = []
        self.threads: set[int] = set()
        self.lock = threading.Lock()

    def __call__(self, signal: Signal) -> None:
        with self.lock:
            self.signals.append(signal)
            self.threads.add(threading.get_ident())

    def pairs(self) -> list[tuple[str, Any]]:
        with self.lock:
            return [(s.key, s.value) for s in self.signals]


def test_publish_get_list(system: MemorySystem) -> None:
    board = system.blackboard("s1")
    board.publish("agent:b:status", "idle")
    board.publish("agent:a:status", {"state": "busy", "task": "t1"}, publisher="a")
    board.publish("plan", [1, 2, 3])
    assert board.get("agent:a:status") == {"state": "busy", "task": "t1"}
    assert board.get("missing", "none") == "none"
    assert board.list() == ["agent:a:status", "agent:b:status", "plan"]
    assert board.list("agent:") == ["agent:a:status", "agent:b:status"]
    signal = board.signal("agent:a:status")
    assert (signal.publisher_id, signal.version, signal.found) == ("a", 1, True)
    assert board.publish("plan", [4], wait=True) == 2
    assert system.blackboard("other").list() == []  # sessions are separate


def test_a_new_subscriber_gets_current_values_at_once(system: MemorySystem) -> None:
    board = system.blackboard("s1")
    board.publish("agent:a:status", "busy")
    board.publish("agent:b:status", "idle")
    board.publish("unrelated", 1)
    prefix, exact = Recorder(), Recorder()
    board.subscribe("agent:*", prefix)
    board.subscribe("agent:b:status", exact)
    assert system.wait_idle(5)
    assert prefix.pairs() == [("agent:a:status", "busy"), ("agent:b:status", "idle")]
    assert exact.pairs() == [("agent:b:status", "idle")]
    board.publish("agent:b:status", "busy")
    board.publish("agent:c:status", "new")
    board.publish("unrelated", 2)
    assert system.wait_idle(5)
    assert prefix.pairs()[2:] == [("agent:b:status", "busy"), ("agent:c:status", "new")]
    assert exact.pairs() == [("agent:b:status", "idle"), ("agent:b:status", "busy")]


def test_per_publisher_order_is_preserved(system: MemorySystem) -> None:
    board = system.blackboard("s1")
    everything = Recorder()
    board.subscribe("*", everything)
    publishers = 6
    count = 150

    def publish(p: int) -> None:
        for i in range(count):
            board.publish(f"counter:{p}", i, publisher=f"p{p}")

    in_threads(publish, range(publishers), 30)
    assert system.wait_idle(10)
    by_publisher: dict[str, list[int]] = {}
    for signal in everything.signals:
        by_publisher.setdefault(str(signal.publisher_id), []).append(signal.value)
    assert by_publisher == {f"p{p}": list(range(count)) for p in range(publishers)}
    versions = [s.version for s in everything.signals if s.key == "counter:0"]
    assert versions == list(range(1, count + 1))


def test_callbacks_run_on_a_delivery_thread(system: MemorySystem) -> None:
    board = system.blackboard("s1")
    recorder = Recorder()
    board.subscribe("k", recorder)
    board.publish("k", 1)
    assert system.wait_idle(5)
    assert recorder.threads and threading.get_ident() not in recorder.threads


def test_a_value_changed_after_publish_returns_is_published_as_it_was(system: MemorySystem) -> None:
    """publish() returns before the board stores the value: what it stores and delivers is the
    value at the call, not the caller's object as it is later."""
    board = system.blackboard("s1")
    seen = Recorder()
    board.subscribe("state", seen)
    state: dict[str, Any] = {"step": 0, "log": []}
    for step in range(1, 6):
        state["step"] = step
        state["log"].append(step)
        board.publish("state", state)
    state["step"] = "MUTATED"
    state["log"].append({1, 2})  # not JSON: were the value read later, the publish would be lost
    assert system.wait_idle(5)
    assert [v["step"] for _, v in seen.pairs()] == [1, 2, 3, 4, 5]
    assert board.get("state") == {"step": 5, "log": [1, 2, 3, 4, 5]}


def test_object_keys_must_be_text_so_none_collide(system: MemorySystem) -> None:
    board = system.blackboard("s1")
    with pytest.raises(
        InvalidInputError, match=r"PublishSignal.value for key 'k' must have text object keys"
    ):
        board.publish("k", {1: "int key", "1": "str key"})
    with pytest.raises(InvalidInputError, match=r"SetWorkingMemory.value must have text .* in value\['a'\]"):
        system.agent("a1").set_working("plan", {"a": {True: "yes", "true": "also"}})
    assert system.wait_idle(5) and board.get("k") is None

    class Field(enum.StrEnum):  # a str subclass is text: written as its value
        NAME = "name"

    board.publish("k", {Field.NAME: "ada"}, wait=True)
    assert board.get("k") == {"name": "ada"}


_RAISED = [ValueError("subscriber bug"), asyncio.CancelledError("bridge gone"), SystemExit(3)]


@pytest.mark.parametrize("error", _RAISED)
def test_a_raising_subscriber_is_removed_without_harming_others(
    system: MemorySystem, error: BaseException
) -> None:
    """Whatever a callback raises (a cancelled asyncio bridge raises a BaseException), the
    delivery thread removes it and goes on serving the others."""
    board = system.blackboard("s1")
    good = Recorder()
    calls = []

    def bad(signal: Signal) -> None:
        calls.append(signal.value)
        raise error

    kept = board.subscribe("k", good)
    removed = board.subscribe("k", bad)
    assert removed.active
    for i in range(5):
        board.publish("k", i)
    assert system.wait_idle(5)
    assert [v for _, v in good.pairs()] == [0, 1, 2, 3, 4]
    assert calls == [0]
    assert kept.active and not removed.active  # the board removed it: the handle says so
    assert removed.unsubscribe() is False
    status = system.status()
    assert status["blackboard_subscriber_errors"] == 1
    assert status["blackboards"]["s1"]["subscribers"] == 1
    assert type(error).__name__ in status["blackboards"]["s1"]["last_subscriber_error"]


def test_a_board_that_crashes_goes_on_with_its_values_versions_and_subscribers(
    system: MemorySystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The board is its state: a crash restarts the actor with the same one, so nothing is
    lost, versions go on, subscribers keep receiving and subscription ids never repeat."""
    from memstrata.errors import ActorCrashedError
    from memstrata.layers import BlackboardState

    board = system.blackboard("s1")
    old = Recorder()
    first = board.subscribe("agent:*", old)
    for value in ("v0", "v1", "v2"):
        board.publish("agent:a", value, wait=True)
    fail_once(monkeypatch, BlackboardState, "publish")
    with pytest.raises(ActorCrashedError, match="injected crash"):
        board.publish("agent:a", "boom", wait=True)
    assert system.status()["restarts"] == {"blackboard:s1": 1}
    assert board.publish("agent:a", "v3", wait=True) == 4
    assert board.list("agent:") == ["agent:a"]
    assert system.wait_idle(5)  # delivered before the old subscription goes
    assert [v for _, v in old.pairs()] == ["v0", "v1", "v2", "v3"]
    new = Recorder()
    second = board.subscribe("other:*", new)
    assert second.id != first.id
    assert first.unsubscribe() is True  # removes the old subscription only
    board.publish("other:x", 1, wait=True)
    assert system.wait_idle(5)
    assert new.pairs() == [("other:x", 1)] and second.active


def test_unsubscribe_stops_deliveries(system: MemorySystem) -> None:
    board = system.blackboard("s1")
    recorder = Recorder()
    with board.subscribe("k", recorder) as subscription:
        board.publish("k", 1)
        assert system.wait_idle(5)
    assert not subscription.active
    assert subscription.unsubscribe() is False
    board.publish("k", 2)
    assert system.wait_idle(5)
    assert recorder.pairs() == [("k", 1)]


def test_no_callback_starts_after_unsubscribe_returns_while_the_system_stops(data_dir: Path) -> None:
    """A stopping system delivers what is queued; a subscription ended meanwhile gets none of it."""
    system = MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder())
    board = system.blackboard("s1")
    entered, gate = threading.Event(), threading.Event()
    seen: list[Any] = []

    def held(signal: Signal) -> None:
        seen.append(signal.value)
        entered.set()
        assert gate.wait(30)

    subscription = board.subscribe("k", held)
    for n in range(4):
        board.publish("k", n)
    assert entered.wait(30)  # 0 is being delivered, 1-3 wait behind it
    stopper = threading.Thread(target=system.stop, kwargs={"timeout": 30})
    stopper.start()
    assert eventually(lambda: system.stopped)
    assert subscription.unsubscribe() is True
    gate.set()
    stopper.join(60)
    assert not stopper.is_alive()
    assert seen == [0]


def test_stop_or_wait_idle_from_a_callback_is_refused_at_once(data_dir: Path) -> None:
    """Either would wait for the callback calling it: a clear error instead of a stop that
    waits out its whole timeout and reports the board as late."""
    system = MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder())
    board = system.blackboard("s1")
    refused: dict[str, str] = {}

    def control(signal: Signal) -> None:
        for name, call in (("wait_idle", system.wait_idle), ("stop", system.stop)):
            try:
                call()
            except MemstrataError as exc:
                refused[name] = str(exc)

    board.subscribe("ctl:*", control)
    board.publish("ctl:shutdown", True)
    assert system.wait_idle(30)
    assert set(refused) == {"wait_idle", "stop"}
    assert refused["stop"].startswith("stop() cannot be called from a blackboard subscriber's callback")
    assert not system.stopped
    report = system.stop(timeout=30)
    assert report.drained and report.late == ()


def test_subscribers_get_their_own_copies(system: MemorySystem) -> None:
    board = system.blackboard("s1")
    seen: list[Any] = []

    def mutate(signal: Signal) -> None:
        signal.value.append("mutated")
        seen.append(signal.value)

    other = Recorder()
    board.subscribe("k", mutate)
    board.subscribe("k", other)
    board.publish("k", ["original"])
    assert system.wait_idle(5)
    assert other.pairs() == [("k", ["original"])]
    assert board.get("k") == ["original"]


@pytest.mark.parametrize("value", [object(), {1, 2}, b"bytes", {"f": len}])
def test_values_that_are_not_json_are_rejected(system: MemorySystem, value: Any) -> None:
    with pytest.raises(InvalidInputError, match="JSON"):
        system.blackboard("s1").publish("k", value)


@pytest.mark.parametrize("key", ["", "a*", "x" * 2000, "\ud800", 5])
def test_bad_keys_are_rejected(system: MemorySystem, key: Any) -> None:
    with pytest.raises(InvalidInputError):
        system.blackboard("s1").publish(key, 1)


def test_raw_blackboard_messages(system: MemorySystem) -> None:
    recorder = Recorder()
    subscribed = system.ask(SubscribeSignal("a:*", "s2"), callback=recorder)
    assert isinstance(subscribed, SignalSubscribed)
    system.tell(PublishSignal("a:1", {"x": 1}, "p", "s2"))
    assert system.wait_idle(5)
    assert recorder.pairs() == [("a:1", {"x": 1})]
    assert system.ask(ListSignals("a:", "s2")) == SignalList("s2", "a:", ("a:1",))
    assert system.ask(UnsubscribeSignal(subscribed.subscription_id, "s2")).removed is True
    with pytest.raises(InvalidInputError, match="callback"):
        system.ask(SubscribeSignal("a:*", "s2"))


def test_snapshot_on_stop_and_restore_on_start(data_dir: Path) -> None:
    config = Config(data_dir=data_dir, actors=dataclasses.replace(ActorsConfig(), blackboard_snapshot=True))
    with MemorySystem.start(config, embedder=FakeEmbedder()) as system:
        board = system.blackboard("s1")
        board.publish("plan", {"steps": ["a", "b"]}, publisher="planner")
        board.publish("plan", {"steps": ["a", "b", "c"]}, publisher="planner")
    assert (data_dir / "blackboard" / "s1.sqlite").is_file()
    with MemorySystem.start(config, embedder=FakeEmbedder()) as system:
        signal = system.blackboard("s1").signal("plan")
        assert (signal.value, signal.version, signal.publisher_id) == (
            {"steps": ["a", "b", "c"]},
            2,
            "planner",
        )
        system.blackboard("s1").delete("plan")  # version 3
    with MemorySystem.start(config, embedder=FakeEmbedder()) as system:
        assert system.blackboard("s1").publish("plan", "again", wait=True) == 4
    off = Config(data_dir=data_dir / "other")
    with MemorySystem.start(off, embedder=FakeEmbedder()) as system:
        system.blackboard("s1").publish("k", 1)
    assert not (data_dir / "other" / "blackboard").exists()


def test_a_coroutine_callback_is_refused_rather_than_never_run(system: MemorySystem) -> None:
    """The delivery thread calls callbacks; a coroutine function's call would only make a
    coroutine nobody awaits, so the subscription would look active and deliver nothing."""
    board = system.blackboard("s-async")

    async def on_change(signal: object) -> None:
        raise AssertionError("never awaited")

    class Handler:
        async def __call__(self, signal: object) -> None:
            raise AssertionError("never awaited")

    for callback in (on_change, Handler()):
        with pytest.raises(InvalidInputError, match="callback is a coroutine function"):
            board.subscribe("k*", callback)
    assert system.status()["blackboards"].get("s-async", {}).get("subscribers", 0) == 0
