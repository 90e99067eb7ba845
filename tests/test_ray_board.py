"""The journaled blackboard of Ray hosts, without Ray: every change is on disk when it is answered.

A second runtime opened on the same data dir while the first still runs (and so never saved
anything on stop) sees what a host restarted after a crash sees: the values, the version count
of a deleted key, and the relays of subscribers in other processes under the ids they hold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memstrata.actors._clock import SystemClock
from memstrata.actors._ray_board import JournaledBoardSupervisor, RelaySubscribe, SavedRelays
from memstrata.actors._runtime import Runtime
from memstrata.actors._store_factory import LayerStores
from memstrata.config import ActorsConfig, Config
from memstrata.messages import (
    DeleteSignal,
    PublishSignal,
    QuerySignal,
    SignalSubscribed,
    SubscribeSignal,
    UnsubscribeSignal,
)

SESSION = "s1"


def _runtime(data_dir: Path) -> Runtime:
    """A runtime whose boards are journaled, as a Ray host's is."""
    actors = dataclasses.replace(ActorsConfig(), blackboard_snapshot=True)
    runtime = Runtime(
        Config(data_dir=data_dir, actors=actors), embedder=None, clock=SystemClock(), stores=LayerStores()
    )
    plain, runtime.supervisors["blackboard"] = (
        runtime.supervisors["blackboard"],
        JournaledBoardSupervisor.start(runtime),
    )
    plain.stop()
    return runtime


def _ask(runtime: Runtime, message: Any) -> Any:
    return runtime.request("blackboard", SESSION, message).result(timeout=30)


@pytest.fixture
def first(data_dir: Path) -> Iterator[Runtime]:
    runtime = _runtime(data_dir)
    try:
        yield runtime
    finally:
        runtime.stop(10)


def test_a_second_opening_finds_values_versions_and_relays(first: Runtime, data_dir: Path) -> None:
    assert _ask(first, PublishSignal("plan.step", "build", "p1", SESSION)).version == 1
    assert _ask(first, PublishSignal("plan.gone", "x", None, SESSION)).version == 1
    assert _ask(first, DeleteSignal("plan.gone", SESSION)).version == 2
    received: list[Any] = []
    subscribed = _ask(first, RelaySubscribe(SubscribeSignal("plan.*", SESSION), received.append, "r1"))
    assert isinstance(subscribed, SignalSubscribed)
    held = subscribed.subscription_id

    second = _runtime(data_dir)  # the first never stopped: nothing was saved by a snapshot
    try:
        value = _ask(second, QuerySignal("plan.step", SESSION))
        assert (value.value, value.publisher_id, value.version) == ("build", "p1", 1)
        assert not _ask(second, QuerySignal("plan.gone", SESSION)).found
        assert _ask(second, SavedRelays()) == [("r1", held, "plan.*")]
        again: list[Any] = []
        restored = _ask(second, RelaySubscribe(SubscribeSignal("plan.*", SESSION), again.append, "r1", held))
        assert restored.subscription_id == held
        # a new subscriber never gets an id a restored one holds
        other = _ask(second, RelaySubscribe(SubscribeSignal("other", SESSION), again.append, "r2"))
        assert other.subscription_id > held
        # the deleted key goes on with its versions
        assert _ask(second, PublishSignal("plan.gone", "back", None, SESSION)).version == 3
        assert _ask(second, UnsubscribeSignal(held, SESSION)).removed
        assert not _ask(second, UnsubscribeSignal(held, SESSION)).removed
    finally:
        second.stop(10)
    third = _runtime(data_dir)
    try:  # what the second changed is on disk too: the unsubscribed relay is gone
        assert _ask(third, SavedRelays()) == [("r2", other.subscription_id, "other")]
        assert _ask(third, QuerySignal("plan.gone", SESSION)).value == "back"
    finally:
        third.stop(10)
