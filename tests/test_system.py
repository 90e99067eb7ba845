"""The facade: agents, knowledge, episodes, working memory, tasks, raw messages, status, stop."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from memstrata import Config, MemorySystem
from memstrata.actors import BatchingEmbedder, ManualClock
from memstrata.config import AgentConfig
from memstrata.core.constants import MAX_TOP_K
from memstrata.errors import InvalidInputError, RequestTimeoutError, SystemStoppedError
from memstrata.layers import EpisodeHit, KnowledgeHit, KnowledgeStore
from memstrata.messages import (
    GetKnowledge,
    GetWorkingMemory,
    KnowledgeResult,
    QueryKnowledge,
    StoreKnowledge,
    TaskAssigned,
    TaskCompleted,
    TaskPrompt,
    WorkingMemoryValue,
)
from tests.fakes import FakeEmbedder


@pytest.fixture
def system(data_dir: Path, fake_embedder: FakeEmbedder) -> Iterator[MemorySystem]:
    with MemorySystem.start(Config(data_dir=data_dir), embedder=fake_embedder) as running:
        yield running


def test_design_sketch_runs(system: MemorySystem) -> None:
    agent = system.agent("architect")
    agent.store_knowledge("Avoid Strategy pattern in payment: circular dep", category="pitfall")
    hits = agent.query_knowledge("payment module patterns", top_k=5)
    assert hits and isinstance(hits[0], KnowledgeHit)
    assert hits[0].entry.category == "pitfall"
    prompt = agent.begin_task("t1", "Refactor the payment module")
    assert isinstance(prompt, TaskPrompt) and not prompt.fallback
    assert '<entry category="pitfall"' in prompt.text and prompt.text.endswith(
        "<task>Refactor the payment module</task>"
    )
    agent.complete_task("t1", "Extracted an interface")
    board = system.blackboard("session-1")
    board.publish("agent:architect:status", "busy")
    assert board.get("agent:architect:status") == "busy"


def test_the_largest_top_k_of_a_task_asks_no_more_episodes_than_a_search_takes(system: MemorySystem) -> None:
    """Episodes are asked for ``top_k`` more than the prompt keeps (those repeating a knowledge hit
    are dropped), never more than MAX_TOP_K: the episodes' search would refuse the whole request."""
    agent = system.agent("a1")
    agent.store_knowledge("rollbacks need the previous image tag", category="pitfall")
    agent.remember("the rollback of build 7 used the previous image tag")
    prompt = agent.begin_task("t1", "roll back the image", top_k=MAX_TOP_K)
    assert not prompt.fallback and prompt.reason is None, prompt.reason
    assert [e.episode.content for e in prompt.episodes] == [
        "the rollback of build 7 used the previous image tag"
    ]


def test_query_returns_the_same_hits_as_the_store(system: MemorySystem, data_dir: Path) -> None:
    agent = system.agent("a1")
    for text in ["parse the http request", "retry the database connection", "cache the http response"]:
        agent.store_knowledge(text, category="pattern", tags={"area": "net"})
    via_actor = agent.query_knowledge("http", top_k=3, include_shared=False)
    system.stop()
    with KnowledgeStore.open(data_dir / "knowledge" / "a1.sqlite", FakeEmbedder()) as store:
        store.owner = "a1"  # what the system names the store its entries are in
        direct = store.search("http", top_k=3)
    assert all(h.store == "a1" and h.entry.store == "a1" for h in via_actor)
    assert [(h.entry, h.match_type, h.vector_rank, h.keyword_rank) for h in via_actor] == [
        (h.entry, h.match_type, h.vector_rank, h.keyword_rank) for h in direct
    ]
    assert [round(h.score, 6) for h in via_actor] == [round(h.score, 6) for h in direct]


def test_shared_knowledge_is_merged_into_queries_and_prompts(system: MemorySystem) -> None:
    a1, a2 = system.agent("a1"), system.agent("a2")
    a1.store_knowledge("deploys need the feature flag service running", category="pattern")
    a2.store_knowledge(
        "the feature flag service must be warmed up before deploys", category="pitfall", shared=True
    )
    hits = a1.query_knowledge("feature flag deploys")
    assert {h.entry.content for h in hits} == {
        "deploys need the feature flag service running",
        "the feature flag service must be warmed up before deploys",
    }
    shared_hit = next(h for h in hits if h.entry.category == "pitfall")
    assert shared_hit.entry.author == "a2"
    assert len(a1.query_knowledge("feature flag deploys", include_shared=False)) == 1
    prompt = a1.begin_task("t1", "deploys of the feature flag service")
    assert prompt.text.count("<entry ") == 2


def test_episodes_remember_and_recall_with_an_injected_clock(data_dir: Path) -> None:
    clock = ManualClock(dt.datetime(2025, 6, 1, tzinfo=dt.UTC))
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder(), clock=clock) as system:
        agent = system.agent("a1")
        agent.remember("looked at the flaky login test", title="triage", task_run_id="run-1")
        clock.advance(3600)
        agent.remember("fixed the flaky login test by mocking time", task_run_id="run-2", kind="observation")
        hits = agent.recall("flaky login test")
        assert len(hits) == 2 and isinstance(hits[0], EpisodeHit)
        assert {h.episode.at for h in hits} == {clock.now() - dt.timedelta(hours=1), clock.now()}
        only = agent.recall("flaky", task_run_id="run-2")
        assert [h.episode.task_run_id for h in only] == ["run-2"]
        later = agent.recall("flaky", since=clock.now() - dt.timedelta(minutes=1))
        assert len(later) == 1
        agent.commit()


def test_working_memory_and_clearing_at_task_end(data_dir: Path) -> None:
    clock = ManualClock()
    config = Config(data_dir=data_dir)
    with MemorySystem.start(config, embedder=FakeEmbedder(), clock=clock) as system:
        agent = system.agent("a1")
        agent.set_working("plan", {"steps": ["read", "write"]})
        agent.set_working("token", "abc", ttl_s=30)
        assert agent.get_working("plan") == {"steps": ["read", "write"]}
        clock.advance(31)
        assert agent.get_working("token", "expired") == "expired"
        assert agent.clear_working("plan") == 1
        agent.set_working("scratch", 1, task_id="t1")
        agent.set_working("notes", "agent-wide")
        agent.begin_task("t1", "do a thing")
        agent.complete_task("t1", "did the thing")
        assert system.wait_idle(10)
        assert agent.get_working("scratch", task_id="t1") is None  # the task's space is cleared
        assert agent.get_working("notes") == "agent-wide"  # the agent-wide space stays


def test_working_memory_can_survive_task_end_when_configured(data_dir: Path) -> None:
    config = Config(data_dir=data_dir, agent=AgentConfig(clear_working_memory_on_task_end=False))
    with MemorySystem.start(config, embedder=FakeEmbedder()) as system:
        agent = system.agent("a1")
        agent.set_working("scratch", 1, task_id="t1")
        agent.complete_task("t1", "done")
        assert system.wait_idle(10)
        assert agent.get_working("scratch", task_id="t1") == 1


def test_raw_messages(system: MemorySystem) -> None:
    system.tell(StoreKnowledge("a1", "told, not asked", "pattern"))
    assert system.wait_idle(10)
    result = system.ask(QueryKnowledge("a1", "told asked"))
    assert isinstance(result, KnowledgeResult)
    assert result.hits[0].entry.content == "told, not asked"
    prompt = system.ask(TaskAssigned("t1", "told asked", agent_id="a1"))
    assert isinstance(prompt, TaskPrompt) and not prompt.fallback
    queued = system.agent("a1").ask(TaskCompleted("t1", "finished"))  # agent id filled in
    assert queued.agent_id == "a1"
    reply = system.ask(GetWorkingMemory("a1", "nothing"))
    assert reply == WorkingMemoryValue("a1", "nothing", None, False)
    with pytest.raises(InvalidInputError, match="agent_id is required"):
        system.ask(TaskCompleted("t1", "no agent"))
    with pytest.raises(InvalidInputError, match="not 'a1'"):
        system.agent("a1").ask(StoreKnowledge("a2", "x", "pattern"))


def test_invalid_input_is_reported_not_a_crash(system: MemorySystem) -> None:
    agent = system.agent("a1")
    with pytest.raises(InvalidInputError):
        agent.store_knowledge("x", category="NOT VALID")
    with pytest.raises(InvalidInputError):
        agent.query_knowledge("x", scope="/a/../b")  # scopes are normalised; ".." is rejected
    with pytest.raises(InvalidInputError):
        agent.remember("x", at=dt.datetime(2025, 1, 1))
    with pytest.raises(InvalidInputError):
        agent.set_working("k", object())
    with pytest.raises(InvalidInputError):
        system.agent("../escape")
    assert system.status()["restarts"] == {}
    assert agent.store_knowledge("still fine", category="pattern") > 0


def test_content_over_the_limit_is_refused_before_it_is_acknowledged(data_dir: Path) -> None:
    with MemorySystem.start(
        Config(data_dir=data_dir, max_content_bytes=100), embedder=FakeEmbedder()
    ) as system:
        agent = system.agent("a1")
        with pytest.raises(InvalidInputError, match="max_content_bytes"):
            agent.complete_task("t1", "x" * 101)
        with pytest.raises(InvalidInputError, match="max_content_bytes"):
            agent.store_knowledge("x" * 101)
        assert system.status()["agents"]["a1"]["agent"]["outbox_pending"] == 0


@pytest.mark.parametrize(
    "text",
    ['"; DROP TABLE x; --', "NEAR(a b) OR c*", "\U0001f600", "中文内容测试", "\ud800 lone", "x" * 100_000],
)
def test_hostile_strings_never_crash(system: MemorySystem, text: str) -> None:
    agent = system.agent("a1")
    with contextlib.suppress(InvalidInputError):
        agent.store_knowledge(text, category="pattern")
    assert isinstance(agent.query_knowledge(text), list)
    assert isinstance(agent.recall(text), list)
    prompt = agent.begin_task("t1", text)
    assert prompt.text.startswith("<")
    agent.fail_task("t1", text)
    assert system.wait_idle(10)
    assert system.status()["restarts"] == {}


def test_status_reports_stores_and_embedding(system: MemorySystem) -> None:
    agent = system.agent("a1")
    agent.store_knowledge("one", category="pattern")
    agent.remember("an episode")
    agent.set_working("k", 1)
    system.blackboard("s1").publish("k", 1, wait=True)
    status = system.status()
    assert status["embedding"]["model"] == "fake-bow" and status["embedding"]["keyword_only"] is False
    assert status["vectors"].startswith(("native", "fallback"))
    a1 = status["agents"]["a1"]
    assert a1["knowledge"]["count"] == 1
    assert a1["episodic"]["count"] == 1
    assert a1["working"]["count"] == 1
    assert a1["degraded"] is None
    assert status["blackboards"]["s1"]["keys"] == 1
    assert status["degraded"] == {}


def test_after_stop_every_call_raises_system_stopped(data_dir: Path) -> None:
    system = MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder())
    agent = system.agent("a1")
    board = system.blackboard("s1")
    report = system.stop()
    assert report.drained and report.late == ()
    assert system.stop().drained  # idempotent
    for call in (
        lambda: agent.store_knowledge("x"),
        lambda: agent.query_knowledge("x"),
        lambda: agent.begin_task("t", "d"),
        lambda: agent.complete_task("t", "d"),
        lambda: board.publish("k", 1),
        lambda: board.get("k"),
        lambda: system.agent("a2"),
        lambda: system.tell(StoreKnowledge("a1", "x", "pattern")),
    ):
        with pytest.raises(SystemStoppedError):
            call()
    assert system.status()["stopped"] is True


def test_ask_timeout_is_a_clear_error(system: MemorySystem) -> None:
    gate, entered = threading.Event(), threading.Event()
    board = system.blackboard("s1")
    board.subscribe("k", lambda signal: None)
    agent = system.agent("a1")
    agent.store_knowledge("blocked")
    # a working-memory actor blocked by a callback would be artificial; block the model instead:
    # a search waits for its query vector (within its own bound), and a request queued behind it
    # waits longer than its timeout
    inner = system.embedder
    assert inner is not None
    original = inner.inner.embed_query  # type: ignore[attr-defined]

    def slow(text: str) -> object:
        entered.set()
        gate.wait(10)
        return original(text)

    inner.inner.embed_query = slow  # type: ignore[attr-defined]
    searching = threading.Thread(target=lambda: agent.query_knowledge("held at the model", timeout=20))
    try:
        searching.start()
        assert entered.wait(10)  # the knowledge actor waits for the query's vector now
        with pytest.raises(RequestTimeoutError, match=r"no answer within 0\.2 s"):
            agent.list_knowledge(timeout=0.2)
    finally:
        gate.set()
        searching.join(10)
    assert system.wait_idle(10)
    assert agent.query_knowledge("blocked")[0].entry.content == "blocked"


def test_config_for_an_agent_overrides(data_dir: Path) -> None:
    config = dataclasses.replace(
        Config(data_dir=data_dir), agents={"quick": AgentConfig(retrieval_timeout_s=0.5, retrieval_top_k=1)}
    )
    with MemorySystem.start(config, embedder=FakeEmbedder()) as system:
        quick = system.agent("quick")
        for i in range(3):
            quick.store_knowledge(f"payment note {i}", category="pattern")
        prompt = quick.begin_task("t1", "payment note")
        assert len(prompt.hits) == 1


def test_keyword_only_when_no_model_can_be_loaded(data_dir: Path) -> None:
    from memstrata.config import EmbeddingConfig

    config = Config(data_dir=data_dir, embedding=EmbeddingConfig(model="no-such-org/no-such-model"))
    with MemorySystem.start(config) as system:
        agent = system.agent("a1")
        agent.store_knowledge("keyword only entry about payments", category="pattern")
        hits = agent.query_knowledge("payments")
        assert [h.match_type for h in hits] == ["keyword"]
        assert not agent.begin_task("t1", "payments work").fallback
        status = system.status()
        assert status["embedding"]["keyword_only"] is True
        assert "no-such-model" in status["embedding"]["note"]
        assert status["agents"]["a1"]["knowledge"]["store"]["mode"] == "keyword-only"


def test_a_retired_agent_comes_back_with_its_memory(system: MemorySystem) -> None:
    agent = system.agent("a1")
    agent.store_knowledge("kept across retirement", category="pattern")
    agent.complete_task("t1", "finished before retiring")
    system.retire("a1")
    assert "a1" not in system.status()["agents"]
    contents = {h.entry.content for h in agent.query_knowledge("retiring retirement", include_shared=False)}
    assert contents == {"kept across retirement", "finished before retiring"}


def test_working_memory_outlives_a_retire_and_a_crash(
    system: MemorySystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Working memory lives in the process, not in its actor: retiring the agent, or its working
    memory actor crashing, keeps the agent-wide values and those of a running task."""
    from memstrata.errors import ActorCrashedError
    from memstrata.layers import WorkingMemory
    from tests._support import fail_once

    agent = system.agent("a1")
    agent.set_working("plan", {"step": 3})
    agent.set_working("cursor", 7, task_id="t1")
    system.retire("a1")
    assert agent.get_working("plan") == {"step": 3} and agent.get_working("cursor", task_id="t1") == 7
    fail_once(monkeypatch, WorkingMemory, "set")
    with pytest.raises(ActorCrashedError, match="injected crash"):
        agent.set_working("other", 1)
    assert system.status()["restarts"] == {"working:a1": 1}
    assert agent.get_working("plan") == {"step": 3} and agent.get_working("cursor", task_id="t1") == 7


def _hold_get_knowledge(
    monkeypatch: pytest.MonkeyPatch, entry_id: int
) -> tuple[threading.Event, threading.Event]:
    """A knowledge actor asked for ``entry_id`` sets the first event and holds its mailbox until
    the second is set (at most 120 s)."""
    from memstrata.actors._knowledge_actor import KnowledgeStoreActor

    held, release = threading.Event(), threading.Event()
    handle = KnowledgeStoreActor.handle

    def holding(self: KnowledgeStoreActor, message: object) -> object:
        if isinstance(message, GetKnowledge) and message.entry_id == entry_id:
            held.set()
            release.wait(120)
        return handle(self, message)

    monkeypatch.setattr(KnowledgeStoreActor, "handle", holding)
    return held, release


def test_retire_waits_for_its_own_agents_work_not_for_the_others(
    data_dir: Path, fake_embedder: FakeEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another agent's request in flight does not hold up retiring ``a1`` (before, retire waited
    for the whole system to be idle: under steady traffic, its whole stop timeout); ``a1``'s
    write-back is stored when retire returns."""
    held, release = _hold_get_knowledge(monkeypatch, 424242)
    with MemorySystem.start(Config(data_dir=data_dir), embedder=fake_embedder) as system:
        busy = threading.Thread(target=lambda: system.agent("b1").get_knowledge(424242))
        busy.start()
        assert held.wait(30)  # b1's request is in flight until released
        agent = system.agent("a1")
        agent.complete_task("t1", "finished before retiring")
        retiring = threading.Thread(target=lambda: system.retire("a1", timeout=600))
        retiring.start()
        retiring.join(60)
        finished = not retiring.is_alive()
        release.set()
        busy.join(30)
        retiring.join(30)
        assert finished, "retire waited for another agent's request"
        assert "a1" not in system.status()["agents"]
        assert ["finished before retiring" in e.content for e in agent.list_episodes()] == [True]
        assert system.wait_idle(30)


def test_requests_that_race_with_retire_are_answered_by_the_actor_that_replaces_it(
    data_dir: Path, fake_embedder: FakeEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that reaches an actor's mailbox after its stop message (another thread retires
    the agent meanwhile) is handed to the replacement actor: answered, stored once, and no
    longer counted in flight. Before, it waited for the ask timeout and stayed in flight."""
    held, release = _hold_get_knowledge(monkeypatch, 424242)
    with MemorySystem.start(Config(data_dir=data_dir), embedder=fake_embedder) as system:
        agent = system.agent("a1")
        agent.store_knowledge("stored before retiring", category="pattern")
        runtime = system._runtime
        inbox = runtime.ref("knowledge", "a1").actor_inbox
        queued = {"stop": threading.Event(), "store": threading.Event()}
        put = inbox.put

        def watched(item: object, *args: object, **kwargs: object) -> None:
            put(item, *args, **kwargs)
            inner = getattr(getattr(item, "message", None), "message", None)
            if type(getattr(item, "message", None)).__name__ == "_ActorStop":
                queued["stop"].set()
            elif isinstance(inner, StoreKnowledge):
                queued["store"].set()

        monkeypatch.setattr(inbox, "put", watched)
        answers: dict[str, object] = {}

        def call(name: str, fn: object) -> threading.Thread:
            def run() -> None:
                try:
                    answers[name] = fn()  # type: ignore[operator]
                except Exception as exc:
                    answers[name] = exc

            thread = threading.Thread(target=run)
            thread.start()
            return thread

        holder = call("held", lambda: agent.get_knowledge(424242))
        assert held.wait(30)  # the actor is busy: what comes next waits in its mailbox
        # the runtime's retire: the facade's first waits for the held call to be answered
        retiring = call("retire", lambda: runtime.retire("a1", 30))
        assert queued["stop"].wait(30)  # the stop message is in the mailbox, behind the held call
        racing = call("store", lambda: agent.store_knowledge("stored while retiring", category="pattern"))
        assert queued["store"].wait(30)  # ... and the racing write behind the stop
        release.set()
        for thread in (holder, retiring, racing):
            thread.join(60)
        assert answers["held"] is None and answers["retire"] == []  # every actor stopped in time
        assert isinstance(answers["store"], int), answers["store"]
        assert system.wait_idle(30)
        contents = sorted(e.content for e in agent.list_knowledge())
        assert contents == ["stored before retiring", "stored while retiring"]


def test_an_unusable_data_dir_is_a_clear_error(tmp_path: Path) -> None:
    from memstrata.errors import StorageError

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError, match="cannot create the data dir"):
        MemorySystem.start(Config(data_dir=blocker / "data"), embedder=FakeEmbedder())


@pytest.mark.parametrize("embedder", ["all-MiniLM-L6-v2", object()], ids=["name", "object"])
def test_an_embedder_that_is_not_one_is_refused_before_anything_starts(
    data_dir: Path, embedder: object
) -> None:
    with pytest.raises(InvalidInputError, match="embedder must be an Embedder"):
        MemorySystem.start(Config(data_dir=data_dir), embedder=embedder)  # type: ignore[arg-type]
    assert not any(data_dir.iterdir())


def test_list_get_and_delete_knowledge(system: MemorySystem) -> None:
    agent = system.agent("a1")
    first = agent.store_knowledge("first entry", category="pattern", scope="/src")
    second = agent.store_knowledge("second entry", category="pitfall", tags={"taskId": "t9"})
    shared = agent.store_knowledge("team entry", category="pattern", shared=True)
    assert [e.id for e in agent.list_knowledge()] == [second, first]
    assert [e.id for e in agent.list_knowledge(category="pitfall")] == [second]
    assert [e.content for e in agent.list_knowledge(shared=True)] == ["team entry"]
    entry = agent.get_knowledge(first)
    assert entry is not None and entry.scope == "/src" and entry.author == "a1"
    assert agent.get_knowledge(shared, shared=True).content == "team entry"  # type: ignore[union-attr]
    assert agent.delete_knowledge(first) is True
    assert agent.delete_knowledge(first) is False
    assert agent.get_knowledge(first) is None
    assert [h.entry.id for h in agent.query_knowledge("first entry", include_shared=False)] == [second]


class RecordingService(BatchingEmbedder):
    """The shared embedding service, noting which thread asked for each prefetched query."""

    def __init__(self, inner: FakeEmbedder) -> None:
        super().__init__(inner)
        self.prefetched: list[tuple[str, str]] = []

    def prefetch_query(self, text: str) -> None:
        self.prefetched.append((text, threading.current_thread().name))
        super().prefetch_query(text)


def test_a_retrieval_starts_its_query_vector_before_any_store_searches(data_dir: Path) -> None:
    inner = FakeEmbedder()
    service = RecordingService(inner)
    try:
        with MemorySystem.start(Config(data_dir=data_dir), embedder=service) as system:
            agent = system.agent("a1")
            agent.store_knowledge("retry the flaky upload with backoff", category="pattern")
            system.agent("other").store_knowledge("uploads need a checksum", category="pattern", shared=True)
            agent.remember("the upload failed twice on Monday")
            assert system.wait_idle(10)  # the stores' vectors, computed apart from the writes
            calls = inner.calls
            prompt = agent.begin_task("t1", "Fix the flaky upload")
            assert not prompt.fallback and prompt.reason is None
            askers = [thread for text, thread in service.prefetched if text == "Fix the flaky upload"]
            # the agent's actor first; then each store (its own, shared, episodes) finds it known
            assert askers and askers[0].startswith("AgentActor")
            assert inner.calls == calls + 1  # one computation for the three searches
    finally:
        service.close()
