"""Retrieval under load and under faults; supervision: restarts, crash loops, degraded agents."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from memstrata import Config, MemorySystem
from memstrata.actors import LayerStores
from memstrata.config import ActorsConfig, AgentConfig, StorageConfig
from memstrata.errors import ActorCrashedError, AgentDegradedError, DatabaseBusyError, StorageError
from memstrata.messages import ListKnowledge, TaskAssigned, TaskPrompt
from memstrata.storage import Embedder, open_database
from memstrata.testing import ManualClock
from tests._support import in_threads
from tests.fakes import FakeEmbedder

MARGIN_S = 1.5  # what "within the timeout plus a small margin" allows on a shared 2-core machine


class Faults:
    """What the stores of one agent (or every agent, ``agent=None``) should do wrong."""

    def __init__(self) -> None:
        self.agent: str | None = None
        self.crash_searches = 0  # the next N searches raise RuntimeError
        self.raise_on_search: BaseException | None = None  # every search raises this
        self.gate: threading.Event | None = None  # searches wait for it
        self.entered = threading.Event()  # set by the first search that met the gate
        self.episodes_searched = threading.Event()  # set by every episode search
        self.fail_opens = 0  # the next N opens raise RuntimeError (a bug, not a storage error)
        self.opens = 0
        self.open_gate: threading.Event | None = None  # opens wait for it
        self.lock = threading.Lock()

    def applies(self, path: Path) -> bool:
        return self.agent is None or path.stem == self.agent

    def before_search(self) -> None:
        with self.lock:
            crash = self.crash_searches > 0
            if crash:
                self.crash_searches -= 1
        if crash:
            raise RuntimeError("injected crash")
        if self.raise_on_search is not None:
            raise self.raise_on_search
        if self.gate is not None:
            self.entered.set()
            self.gate.wait(30)


class FaultyKnowledge:
    def __init__(self, inner: Any, faults: Faults) -> None:
        self._inner = inner
        self._faults = faults

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def search(self, *args: Any, **kwargs: Any) -> Any:
        self._faults.before_search()
        return self._inner.search(*args, **kwargs)


class FaultyStores(LayerStores):
    def __init__(self, faults: Faults) -> None:
        self.faults = faults

    def open_knowledge(self, path: Path, embedder: Embedder | None, config: Config) -> Any:
        if self.faults.applies(path):
            with self.faults.lock:
                self.faults.opens += 1
                fail = self.faults.fail_opens > 0
                self.faults.fail_opens -= int(fail)
            if self.faults.open_gate is not None:
                self.faults.open_gate.wait(30)
            if fail:
                raise RuntimeError(f"injected open crash of {path}")
        store = super().open_knowledge(path, embedder, config)
        return FaultyKnowledge(store, self.faults) if self.faults.applies(path) else store

    def open_episodic(
        self, path: Path, embedder: Embedder | None, config: Config, clock: Callable[[], datetime]
    ) -> Any:
        layer = super().open_episodic(path, embedder, config, clock)
        search, searched = layer.search, self.faults.episodes_searched

        def noted(*args: Any, **kwargs: Any) -> Any:
            searched.set()
            return search(*args, **kwargs)

        layer.search = noted
        return layer


@pytest.fixture
def faults() -> Faults:
    return Faults()


def start(
    data_dir: Path,
    faults: Faults,
    *,
    embedder: Any = None,
    timeout_s: float = 5.0,
    clock: ManualClock | None = None,
    **actors: Any,
) -> MemorySystem:
    config = Config(
        data_dir=data_dir,
        agent=AgentConfig(retrieval_timeout_s=timeout_s),
        actors=dataclasses.replace(ActorsConfig(), **actors),
    )
    return MemorySystem.start(
        config, embedder=embedder or FakeEmbedder(), stores=FaultyStores(faults), clock=clock
    )


@pytest.fixture
def system(data_dir: Path, faults: Faults) -> Iterator[MemorySystem]:
    running = start(data_dir, faults)
    yield running
    if faults.gate is not None:
        faults.gate.set()
    running.stop()


TOPICS = ["payment", "billing", "search", "auth", "cache", "queue", "deploy", "logging"]


def test_sixteen_agents_retrieving_at_once_none_falls_back(system: MemorySystem) -> None:
    agents = [system.agent(f"agent-{i}") for i in range(16)]
    for i, agent in enumerate(agents):
        topic = TOPICS[i % len(TOPICS)]
        agent.store_knowledge(f"the {topic} module breaks when the config is stale", category="pitfall")
        agent.store_knowledge(f"restart the {topic} worker after a schema change", category="pattern")
    barrier = threading.Barrier(16)
    prompts: list[Any] = [None] * 16

    def run(i: int) -> None:
        barrier.wait(10)
        prompts[i] = agents[i].begin_task(f"t{i}", f"fix the {TOPICS[i % len(TOPICS)]} module config")

    in_threads(run, range(16), 30)
    assert all(p is not None and not p.fallback for p in prompts), [p.reason for p in prompts if p]
    for i, prompt in enumerate(prompts):
        assert TOPICS[i % len(TOPICS)] in prompt.text
        assert prompt.task_id == f"t{i}" and prompt.agent_id == f"agent-{i}"


class GatedQueries(FakeEmbedder):
    """Documents embed normally; queries hang until released (a model stuck on a query)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        self.gate.wait(30)
        return super().embed_query(text)


def test_slow_embedder_falls_back_within_the_timeout(data_dir: Path, faults: Faults) -> None:
    embedder = GatedQueries()
    system = start(data_dir, faults, embedder=embedder, timeout_s=0.3)
    try:
        agent = system.agent("a1")
        agent.store_knowledge("payment retries need idempotency keys", category="pitfall")
        description = "Make payment retries safe <with> idempotency & backoff"
        started = time.monotonic()
        prompt = agent.begin_task("t1", description)
        elapsed = time.monotonic() - started
        # the keyword ranking makes the prompt within the same budget, and the reason says so
        assert not prompt.fallback and "payment retries need idempotency keys" in prompt.text
        assert prompt.reason is not None and prompt.reason.startswith("degraded: keyword-only: model")
        assert "<task>Make payment retries safe &lt;with&gt; idempotency &amp; backoff</task>" in prompt.text
        assert elapsed < 0.3 + MARGIN_S
        # the agent's mailbox is not blocked by its stuck store: a write-back is acknowledged
        started = time.monotonic()
        agent.complete_task("t1", "made retries idempotent")
        assert time.monotonic() - started < MARGIN_S
        second = agent.begin_task("t2", "another payment task")
        assert not second.fallback and second.reason.startswith("degraded: keyword-only")  # type: ignore[union-attr]
    finally:
        embedder.gate.set()
    assert system.wait_idle(10)
    assert any(
        h.entry.content == "made retries idempotent" for h in agent.query_knowledge("retries idempotent")
    )
    system.stop()


def test_stuck_store_falls_back_in_time_and_recovers(data_dir: Path, faults: Faults) -> None:
    system = start(data_dir, faults, timeout_s=0.5)
    try:
        agent = system.agent("a1")
        agent.store_knowledge("cache invalidation needs versioned keys", category="pattern")
        faults.gate = threading.Event()
        started = time.monotonic()
        prompt = system.ask(TaskAssigned("t1", "cache invalidation", agent_id="a1"))  # the raw message
        assert isinstance(prompt, TaskPrompt)
        assert prompt.fallback and prompt.reason is not None and prompt.reason.startswith("timeout:")
        assert time.monotonic() - started < 0.5 + MARGIN_S
        faults.gate.set()
        faults.gate = None
        assert system.wait_idle(10)
        assert not agent.begin_task("t2", "cache invalidation").fallback
    finally:
        if faults.gate is not None:
            faults.gate.set()
        system.stop()


def test_raising_store_falls_back_with_the_reason(system: MemorySystem, faults: Faults) -> None:
    agent = system.agent("a1")
    agent.store_knowledge("queue consumers must ack after commit", category="pitfall")
    faults.raise_on_search = StorageError("disk I/O error")
    prompt = agent.begin_task("t1", "queue consumers")
    assert prompt.fallback
    assert prompt.reason is not None and prompt.reason.startswith("error:")
    assert "disk I/O error" in prompt.reason
    assert prompt.text == "<task>queue consumers</task>"


def test_no_knowledge_falls_back_with_no_hits(system: MemorySystem) -> None:
    prompt = system.agent("newcomer").begin_task("t1", "anything at all")
    assert prompt.fallback and prompt.reason is not None and prompt.reason.startswith("no-hits:")
    assert prompt.hits == ()


def test_crash_restarts_the_actor_and_later_queries_work(system: MemorySystem, faults: Faults) -> None:
    agent = system.agent("a1")
    agent.store_knowledge("auth tokens expire after an hour", category="pattern")
    faults.crash_searches = 1
    started = time.monotonic()
    with pytest.raises(ActorCrashedError, match="was restarted: RuntimeError: injected crash"):
        agent.query_knowledge("auth tokens")
    assert time.monotonic() - started < MARGIN_S  # fails fast, does not wait for the ask timeout
    hits = agent.query_knowledge("auth tokens")
    assert hits[0].entry.content == "auth tokens expire after an hour"
    status = system.status()
    assert status["restarts"] == {"knowledge:a1": 1}
    assert status["degraded"] == {}


def test_crash_loop_degrades_the_agent_until_revived(data_dir: Path, faults: Faults) -> None:
    faults.agent = "a1"
    system = start(data_dir, faults, max_restarts=3)
    try:
        a1, a2 = system.agent("a1"), system.agent("a2")
        a1.store_knowledge("logs rotate daily", category="pattern")
        a2.store_knowledge("logs rotate daily", category="pattern")
        faults.crash_searches = 100
        for _ in range(3):
            with pytest.raises(ActorCrashedError, match="was restarted"):
                a1.query_knowledge("logs")
        with pytest.raises(ActorCrashedError, match="a1 is degraded"):
            a1.query_knowledge("logs")
        with pytest.raises(AgentDegradedError):
            a1.query_knowledge("logs")
        with pytest.raises(AgentDegradedError):
            a1.store_knowledge("more")
        assert "a1" in system.status()["degraded"]
        assert system.status()["agents"]["a1"]["degraded"]
        # other agents are unaffected
        assert a2.query_knowledge("logs")[0].entry.content == "logs rotate daily"
        # a degraded agent still gets a prompt (the fallback) and its write-backs are kept
        prompt = a1.begin_task("t1", "logs")
        assert prompt.fallback and "degraded" in (prompt.reason or "")
        a1.complete_task("t1", "rotated the logs by hand")
        assert system.wait_idle(10)
        assert system.status()["agents"]["a1"]["agent"]["outbox_pending"] == 1
        # revived: the budget resets and the queued write-back is replayed
        faults.crash_searches = 0
        assert system.revive("a1") is True
        assert system.wait_idle(10)
        assert system.status()["agents"]["a1"]["agent"]["outbox_pending"] == 0
        contents = {h.entry.content for h in a1.query_knowledge("rotated logs", include_shared=False)}
        assert "rotated the logs by hand" in contents
    finally:
        system.stop()


def test_a_failed_open_is_retried(system: MemorySystem, faults: Faults) -> None:
    faults.fail_opens = 1
    assert system.agent("a1").store_knowledge("opened on the second try", category="pattern") > 0
    assert system.status()["restarts"] == {"knowledge:a1": 1}


def test_a_store_locked_at_open_is_a_busy_error_once_and_no_crash(
    data_dir: Path, faults: Faults, caplog: pytest.LogCaptureFixture
) -> None:
    """Another connection holds the write lock of a store that must be created (its migrations
    write): the request waiting for the open gets ``DatabaseBusyError`` as is, after one bound
    (the open is not repeated for it), nothing is logged as a crash nor restarted, and the next
    request opens the store again."""
    holder = open_database(data_dir / "knowledge" / "a1.sqlite")  # memstrata's driver: same locks
    holder.execute("BEGIN IMMEDIATE")
    faults.open_gate = threading.Event()
    config = Config(data_dir=data_dir, storage=StorageConfig(lock_timeout_s=0.5))
    try:
        with (
            caplog.at_level(logging.DEBUG, logger="memstrata"),
            MemorySystem.start(config, embedder=FakeEmbedder(), stores=FaultyStores(faults)) as system,
        ):
            answer = system._runtime.request("knowledge", "a1", ListKnowledge("a1"))  # the open waits
            faults.open_gate.set()
            with pytest.raises(DatabaseBusyError, match=r"stayed locked by another process .* 0\.5 s"):
                answer.result(30)
            assert faults.opens == 1
            assert system.status()["restarts"] == {}
            holder.execute("ROLLBACK")
            assert system.agent("a1").list_knowledge() == [] and faults.opens == 2
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    finally:
        holder.close()


def test_a_failing_shared_store_does_not_fail_the_agent(system: MemorySystem, faults: Faults) -> None:
    faults.agent = "shared"
    agent = system.agent("a1")
    agent.store_knowledge("own entry about deploys", category="pattern")
    agent.store_knowledge("shared entry about deploys", category="pattern", shared=True)
    faults.raise_on_search = StorageError("shared store unreadable")
    hits = agent.query_knowledge("deploys")
    assert [h.entry.content for h in hits] == ["own entry about deploys"]
    assert system.status()["shared_query_errors"] == 1
    prompt = agent.begin_task("t1", "deploys")
    assert not prompt.fallback
    assert prompt.reason is not None and prompt.reason.startswith("partial:") and "shared" in prompt.reason


def test_no_deadlock_under_mixed_concurrent_load(system: MemorySystem) -> None:
    board = system.blackboard("s1")
    seen: list[str] = []
    lock = threading.Lock()

    def echo(signal: Any) -> None:  # a subscriber that talks back to the board from its callback
        with lock:
            seen.append(signal.key)
        if signal.key.startswith("status:"):
            board.publish(f"echo:{signal.key}", signal.value)

    board.subscribe("status:*", echo)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            agent = system.agent(f"w{n % 4}")
            for i in range(15):
                agent.store_knowledge(f"note {n}-{i} about topic {i % 3}", category="pattern")
                agent.set_working(f"k{i}", i)
                agent.begin_task(f"t{n}-{i}", f"topic {i % 3}")
                if i % 4 == 0:
                    agent.fail_task(f"t{n}-{i}", f"failed on topic {i % 3}")
                else:
                    agent.complete_task(f"t{n}-{i}", f"done with topic {i % 3} by {n}")
                board.publish(f"status:w{n}", i, publisher=f"w{n}")
                agent.recall(f"topic {i % 3}")
        except BaseException as exc:
            errors.append(exc)

    in_threads(worker, range(8), 60)
    assert errors == []
    assert system.wait_idle(30)
    report = system.stop()
    assert report.drained and report.late == ()
    assert len([k for k in seen if k.startswith("status:")]) >= 8


def test_tasks_sequence_is_independent_of_sleeping(system: MemorySystem) -> None:
    """wait_idle is the only synchronisation the tests need: write-backs are visible after it."""
    agent = system.agent("a1")
    for i in range(20):
        agent.complete_task(f"t{i}", f"unique outcome number {i}")
    assert system.wait_idle(10)
    status = system.status()["agents"]["a1"]
    assert status["knowledge"]["count"] == 20
    assert status["episodic"]["count"] == 20
    assert status["agent"]["written_back"] == 20


def _own_shared_and_episode(agent: Any) -> None:
    """An entry of the agent's, a shared one and an episode, all found by "cache invalidation"."""
    agent.store_knowledge("cache invalidation needs versioned keys", category="pattern")
    agent.store_knowledge("cache keys carry the schema version", category="pattern", shared=True)
    agent.remember("invalidated the cache after the deploy")


def _begin_in_thread(agent: Any, answers: list[TaskPrompt]) -> threading.Thread:
    """``begin_task`` on a thread of its own, its prompt appended to ``answers``."""
    caller = threading.Thread(target=lambda: answers.append(agent.begin_task("t1", "cache invalidation")))
    caller.start()
    return caller


def test_the_small_searches_start_once_the_agents_store_has_answered(data_dir: Path, faults: Faults) -> None:
    faults.agent = "a1"  # only the agent's own store gets stuck; the shared one is fine
    system = start(data_dir, faults, timeout_s=0.5)
    try:
        agent = system.agent("a1")
        _own_shared_and_episode(agent)
        faults.gate = threading.Event()
        prompt = agent.begin_task("t1", "cache invalidation")
        assert prompt.fallback and prompt.reason is not None and prompt.reason.startswith("timeout:")
        assert "shared knowledge query not started" in prompt.reason, prompt.reason
        assert "episode search not started" in prompt.reason, prompt.reason
        faults.gate.set()
        faults.gate = None
        assert system.wait_idle(10)
        prompt = agent.begin_task("t2", "cache invalidation")
        assert not prompt.fallback and prompt.reason is None
        assert {h.entry.content for h in prompt.hits} >= {
            "cache invalidation needs versioned keys",
            "cache keys carry the schema version",
        }
        assert [e.episode.content for e in prompt.episodes] == ["invalidated the cache after the deploy"]
    finally:
        if faults.gate is not None:
            faults.gate.set()
        system.stop()


def test_the_small_searches_run_one_after_another(data_dir: Path, faults: Faults) -> None:
    """Searched side by side in one process they convoy on the GIL: the episode search waits for
    the shared store's, and a stuck shared store leaves it not started at the deadline."""
    faults.agent = "shared"  # only the shared store gets stuck
    clock = ManualClock()
    system = start(data_dir, faults, clock=clock)
    try:
        agent = system.agent("a1")
        _own_shared_and_episode(agent)
        assert system.wait_idle(10)
        faults.gate = threading.Event()
        answers: list[TaskPrompt] = []
        caller = _begin_in_thread(agent, answers)
        assert faults.entered.wait(10)  # the agent's store has answered; the shared one is stuck
        clock.advance(5.1)  # past the retrieval budget
        caller.join(10)
        assert answers, "begin_task did not return"
        prompt = answers[0]
        assert not prompt.fallback
        assert [h.entry.content for h in prompt.hits] == ["cache invalidation needs versioned keys"]
        assert prompt.episodes == ()
        assert prompt.reason == (
            "partial: shared knowledge query timed out after 5 s; "
            "episode search not started: the shared knowledge query had not answered"
        )
    finally:
        if faults.gate is not None:
            faults.gate.set()
        system.stop()


def test_a_search_hosted_in_another_process_goes_out_with_the_local_ones(
    data_dir: Path, faults: Faults, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store on a host of its own (on Ray, with ``cluster.group = "layer"``) shares no GIL with
    the agent: its search goes out at once, not after the local one in flight (here the runtime
    is told the episodic store is remote, and the shared store's search is held)."""
    faults.agent = "shared"
    system = start(data_dir, faults, clock=ManualClock())  # no deadline unless the test moves it
    try:
        monkeypatch.setattr(system._runtime, "hosted_here", lambda kind, key: kind != "episodic")
        agent = system.agent("a1")
        _own_shared_and_episode(agent)
        assert system.wait_idle(10)
        faults.gate = threading.Event()
        faults.episodes_searched.clear()
        answers: list[TaskPrompt] = []
        caller = _begin_in_thread(agent, answers)
        assert faults.entered.wait(10)  # the shared store holds its search
        assert faults.episodes_searched.wait(10)  # the remote episodic store was asked all the same
        faults.gate.set()
        caller.join(10)
        assert answers, "begin_task did not return"
        prompt = answers[0]
        assert prompt.reason is None
        assert [e.episode.content for e in prompt.episodes] == ["invalidated the cache after the deploy"]
    finally:
        if faults.gate is not None:
            faults.gate.set()
        system.stop()


def test_status_waits_for_each_actor_as_long_as_it_is_told(data_dir: Path, faults: Faults) -> None:
    """An actor busy past the bound shows as busy rather than hold up the report; with a bound
    long enough the report waits for its own state."""
    faults.agent = "a1"
    system = start(data_dir, faults)
    try:
        agent = system.agent("a1")
        agent.store_knowledge("the staging database is rebuilt nightly", category="fact")
        assert system.wait_idle(10)
        faults.gate = threading.Event()
        searcher = threading.Thread(target=lambda: agent.query_knowledge("staging database"))
        searcher.start()
        assert faults.entered.wait(10)  # the knowledge actor is held inside the search
        busy = system.status(timeout=0)["agents"]["a1"]["knowledge"]
        assert busy == {"error": "busy: no answer within the status timeout"}
        reports: list[dict[str, Any]] = []
        asker = threading.Thread(target=lambda: reports.append(system.status(timeout=60)))
        asker.start()
        faults.gate.set()  # the search ends, then the actor answers the status asked meanwhile
        asker.join(60)
        searcher.join(60)
        assert reports and reports[0]["agents"]["a1"]["knowledge"]["count"] == 1
    finally:
        if faults.gate is not None:
            faults.gate.set()
        system.stop()
