"""Write-back steps step aside while other agents' pre-task retrievals are in flight.

A retrieval is held in flight by its agent's knowledge store, whose search waits at a gate the
test opens; what the other actors do meanwhile is recorded in order. The bound on a step's wait
(``actors.writeback_yield_s``) is set far above what a test takes, so nothing here depends on
timing: a step that waits waits until the retrieval answers, or until what releases it happens.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memstrata import Config, MemorySystem
from memstrata.actors import BatchingEmbedder, LayerStores
from memstrata.actors._foreground import Foreground
from memstrata.config import ActorsConfig, AgentConfig
from memstrata.layers import KnowledgeStore
from memstrata.storage import Embedder
from tests._support import wait_until
from tests.fakes import FakeEmbedder

LONG_S = 60.0  # a step's bound, far above any test's own time


class GatedSearch(LayerStores):
    """Agent ``reader``'s knowledge searches wait at ``gate`` once ``armed``; what the stores
    do is logged in order (``reader searched``, ``<agent> stored``)."""

    def __init__(self) -> None:
        self.armed = False
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.log: list[str] = []

    def open_knowledge(self, path: Path, embedder: Embedder | None, config: Config) -> Any:
        stores, owner = self, path.stem

        class Knowledge(KnowledgeStore):
            def search(self, query: str, **kwargs: Any) -> Any:
                if owner == "reader" and stores.armed:
                    stores.entered.set()
                    assert stores.gate.wait(LONG_S)
                    stores.log.append("reader searched")
                return super().search(query, **kwargs)

            def add_many(self, items: Any, **kwargs: Any) -> list[int]:
                stores.log.append(f"{owner} stored")
                return super().add_many(items, **kwargs)

        defer = isinstance(embedder, BatchingEmbedder)
        return Knowledge.open(path, embedder, config=config, defer_vectors=defer)


@pytest.fixture
def gated(data_dir: Path) -> Iterator[tuple[MemorySystem, GatedSearch]]:
    """A system whose ``reader`` and ``writer`` have their knowledge stores open (the writer's
    episodes too), with a retrieval of ``reader`` held in flight (its deadline far away too);
    the gate opens on the way out."""
    stores = GatedSearch()
    config = Config(
        data_dir=data_dir,
        actors=ActorsConfig(writeback_yield_s=LONG_S),
        agents={"reader": AgentConfig(retrieval_timeout_s=LONG_S)},
    )
    with MemorySystem.start(config, embedder=FakeEmbedder(), stores=stores) as system:
        system.agent("reader").store_knowledge("warm the cache before the release", category="pattern")
        system.agent("writer").complete_task("w0", "opened the writer's stores")
        assert system.wait_idle(10)
        stores.log.clear()
        stores.armed = True
        reader = threading.Thread(target=lambda: system.agent("reader").begin_task("r1", "warm the cache"))
        reader.start()
        try:
            assert stores.entered.wait(10)  # the reader's retrieval is in flight
            yield system, stores
        finally:
            stores.gate.set()
            reader.join(20)


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    done: list[Any] = []
    thread = threading.Thread(target=lambda: done.append(call()))
    thread.start()
    return thread, done


def _stepping_aside(system: MemorySystem) -> Callable[[], bool]:
    foreground = getattr(system._runtime, "foreground", None)
    return lambda: foreground is not None and foreground.yields > 0


def test_another_agents_write_back_waits_for_the_retrieval_then_is_stored(
    gated: tuple[MemorySystem, GatedSearch],
) -> None:
    system, stores = gated
    thread, done = _in_thread(lambda: system.agent("writer").complete_task("w1", "rotated the signing keys"))
    wait_until(lambda: _stepping_aside(system)() or bool(stores.log))
    stores.gate.set()
    thread.join(20)
    assert done and done[0].task_id == "w1"
    assert system.wait_idle(10)
    assert stores.log == ["reader searched", "writer stored"]
    contents = {e.content for e in system.agent("writer").list_knowledge(limit=10)}
    assert "rotated the signing keys" in contents  # late, never lost


def test_a_retrieval_of_the_waiting_agent_itself_is_not_held_back(
    gated: tuple[MemorySystem, GatedSearch],
) -> None:
    """The writer's outcome waits in its agent's actor; the writer's own task begins meanwhile:
    its request wakes the actor, which records the outcome and answers with it, while the
    reader's retrieval is still in flight."""
    system, stores = gated
    writer = system.agent("writer")
    thread, done = _in_thread(lambda: writer.complete_task("w1", "rotated the signing keys"))
    wait_until(_stepping_aside(system))
    prompt = writer.begin_task("w2", "rotate the signing keys")
    assert not prompt.fallback and prompt.reason is None
    assert "rotated the signing keys" in prompt.text  # its own write-back went first
    assert not stores.gate.is_set() and "reader searched" not in stores.log
    thread.join(20)
    assert done and done[0].task_id == "w1"


def test_with_no_bound_write_backs_never_wait(data_dir: Path) -> None:
    stores = GatedSearch()
    config = Config(data_dir=data_dir, actors=ActorsConfig(writeback_yield_s=0))
    with MemorySystem.start(config, embedder=FakeEmbedder(), stores=stores) as system:
        system.agent("reader").store_knowledge("warm the cache before the release", category="pattern")
        assert system.wait_idle(10)
        stores.armed = True
        reader, _ = _in_thread(lambda: system.agent("reader").begin_task("r1", "warm the cache"))
        try:
            assert stores.entered.wait(10)
            system.agent("writer").complete_task("w1", "rotated the signing keys")
            wait_until(lambda: "writer stored" in stores.log)
            assert system._runtime.foreground.yields == 0
        finally:
            stores.gate.set()
            reader.join(20)


# -- the foreground itself ----------------------------------------------------------------------

A, B = ("knowledge", "a"), ("knowledge", "b")


def _waiting(foreground: Foreground, urgent: Callable[[], bool] = lambda: False) -> threading.Thread:
    """A thread yielding for actor ``A`` (bound far away), counted as waiting once it waits."""
    thread = threading.Thread(target=foreground.yield_to, args=(A, LONG_S, urgent))
    thread.start()
    wait_until(lambda: foreground._waiting == 1)
    return thread


def _released(thread: threading.Thread) -> bool:
    thread.join(20)
    return not thread.is_alive()


def test_nothing_waits_without_a_retrieval_that_does_not_need_it() -> None:
    foreground = Foreground()
    assert not foreground.yield_to(A, LONG_S, lambda: False)  # none in flight
    token = foreground.enter([A], 5.0)
    assert not foreground.yield_to(A, LONG_S, lambda: False)  # one needs it
    foreground.enter([B], 5.0)
    assert not foreground.yield_to(A, LONG_S, lambda: False)  # one of the two needs it
    foreground.leave(token)
    assert not foreground.yield_to(A, LONG_S, lambda: True)  # a message that is not a step waits
    foreground.enter([B], 0.0)
    assert foreground.yields == 0


def test_a_retrieval_past_its_deadline_holds_nothing_back() -> None:
    foreground = Foreground()
    foreground.enter([B], 0.0)  # its agent's actor crashed before answering
    assert not foreground.yield_to(A, LONG_S, lambda: False)


def test_a_waiting_actor_is_released_by_the_answer() -> None:
    foreground = Foreground()
    token = foreground.enter([B], LONG_S)
    thread = _waiting(foreground)
    foreground.leave(token)
    assert _released(thread) and foreground.yields == 1


def test_a_waiting_actor_is_released_by_a_retrieval_that_needs_it() -> None:
    foreground = Foreground()
    foreground.enter([B], LONG_S)
    thread = _waiting(foreground)
    foreground.enter([A], LONG_S)
    assert _released(thread)


def test_a_waiting_actor_is_released_by_a_message_for_it_and_by_the_stop() -> None:
    foreground = Foreground()
    foreground.enter([B], LONG_S)
    arrived = threading.Event()
    thread = _waiting(foreground, arrived.is_set)
    arrived.set()
    foreground.poke()
    assert _released(thread)
    thread = _waiting(foreground)
    foreground.close()
    assert _released(thread)
    assert not foreground.yield_to(A, LONG_S, lambda: False)
