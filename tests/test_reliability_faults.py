"""Faults degrade as documented, never silently wrong: a failing or hanging embedder, a full disk, a
damaged database file, a missing sqlite-vec."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import memstrata.actors._agent as agent_module
from memstrata import Config, MemorySystem
from memstrata.actors import LayerStores
from memstrata.actors._outbox import Outbox
from memstrata.config import ActorsConfig, AgentConfig
from memstrata.errors import EmbeddingError, StorageError
from memstrata.layers import EpisodicMemory, KnowledgeStore
from memstrata.storage import Embedder, disable_vec_for_tests, open_database
from tests._support import eventually
from tests.fakes import FakeEmbedder

FloatArray = npt.NDArray[np.float32]


class FlakyEmbedder(FakeEmbedder):
    """A fake model that can be made to raise (always, or on every other call) or to hang."""

    def __init__(self) -> None:
        super().__init__()
        self.mode = "ok"  # "ok" | "raise" | "alternate" | "hang"
        self.gate = threading.Event()
        self.failures = 0
        self._turn = 0

    def _fault(self) -> None:
        if self.mode == "hang":
            self.gate.wait(60)
            return
        self._turn += 1
        if self.mode == "raise" or (self.mode == "alternate" and self._turn % 2):
            self.failures += 1
            raise RuntimeError("model crashed (injected)")

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        self._fault()
        return super().embed_documents(texts)

    def embed_query(self, text: str) -> FloatArray:
        self._fault()
        return super().embed_query(text)


def start(data_dir: Path, embedder: Embedder, *, stores: Any = None, **agent: Any) -> MemorySystem:
    config = Config(
        data_dir=data_dir,
        agent=dataclasses.replace(AgentConfig(), **agent),
        actors=ActorsConfig(embed_timeout_s=0.5, writeback_retries=2),
    )
    return MemorySystem.start(config, embedder=embedder, stores=stores)


def stores_of(system: MemorySystem, agent_id: str) -> dict[str, Any]:
    return {
        k: v.get("store", {}) for k, v in system.status()["agents"][agent_id].items() if isinstance(v, dict)
    }


# -- the embedder ----------------------------------------------------------------------------------


def test_a_failing_embedder_keeps_every_write_and_says_so(data_dir: Path) -> None:
    embedder = FlakyEmbedder()
    with start(data_dir, embedder) as system:
        agent = system.agent("a1")
        agent.store_knowledge("payment retries need idempotency keys", category="pitfall")
        assert system.wait_idle(10)  # its vector (computed apart from the write) before the fault
        embedder.mode = "raise"
        agent.store_knowledge("billing exports run nightly", category="pattern")
        agent.complete_task("t1", "moved billing exports to a queue")
        episode = agent.remember("billing export failed at midnight")
        assert system.wait_idle(20)
        stores = stores_of(system, "a1")
        assert stores["knowledge"]["pending_vectors"] == 2  # stored, vectors pending
        assert "model crashed (injected)" in stores["knowledge"]["last_error"]
        assert stores["episodic"]["episodes"] == 2 and stores["episodic"]["pending_vectors"] == 2
        assert "model crashed" in stores["episodic"]["last_error"]
        warnings = system.status()["warnings"]
        assert any("a1 knowledge: 2 item(s) wait for their vectors" in w for w in warnings), warnings
        assert any("a1 episodic: 2 item(s) wait for their vectors" in w for w in warnings), warnings
        assert system.status()["agents"]["a1"]["agent"]["outbox_pending"] == 0
        # search answers by keywords meanwhile; the prompt is built from what keywords found
        hits = agent.query_knowledge("billing exports")
        assert {h.entry.content for h in hits} >= {"billing exports run nightly"}
        assert all(h.match_type == "keyword" for h in hits)
        assert agent.recall("billing export midnight")[0].episode.id == episode
        prompt = agent.begin_task("t2", "billing exports")
        assert not prompt.fallback and "billing exports run nightly" in prompt.text
        # the model recovers: pending vectors are caught up by the next writes
        embedder.mode = "ok"
        agent.store_knowledge("ledger closes at month end", category="pattern")
        agent.remember("ledger closed without errors")
        assert system.wait_idle(20)  # the vectors they asked for, the pending ones with them
        stores = stores_of(system, "a1")
        assert stores["knowledge"]["pending_vectors"] == 0 and stores["episodic"]["pending_vectors"] == 0
        semantic = agent.query_knowledge("billing exports run nightly", mode="vector", top_k=1)
        assert semantic[0].entry.content == "billing exports run nightly"
        assert system.status()["warnings"] == []


def test_an_intermittent_embedder_loses_nothing(data_dir: Path) -> None:
    embedder = FlakyEmbedder()
    embedder.mode = "alternate"
    with start(data_dir, embedder) as system:
        agent = system.agent("a1")
        for i in range(12):
            if i % 4 == 0:
                agent.fail_task(f"t{i}", f"step {i} failed on host h{i}")
            else:
                agent.complete_task(f"t{i}", f"step {i} finished on host h{i}")
        assert system.wait_idle(30)
        embedder.mode = "ok"
        agent.store_knowledge("the model is healthy again", category="pattern")
        agent.remember("the model is healthy again")
        assert system.wait_idle(30)
        status = system.status()["agents"]["a1"]
        assert status["agent"]["outbox_pending"] == 0 and status["agent"].get("dead_letters", 0) == 0
        assert status["knowledge"]["store"]["pending_vectors"] == 0
        assert status["episodic"]["store"]["pending_vectors"] == 0
        assert embedder.failures > 0
        entries = agent.list_knowledge(limit=100)
        assert sorted(e.content for e in entries if e.category == "pitfall") == sorted(
            f"step {i} failed on host h{i}" for i in range(0, 12, 4)
        )
        assert len([e for e in entries if e.category == "outcome"]) == 9
        assert status["episodic"]["store"]["episodes"] == 13


def test_a_hanging_embedder_falls_back_in_time_and_keeps_writes(data_dir: Path) -> None:
    embedder = FlakyEmbedder()
    system = start(data_dir, embedder, retrieval_timeout_s=0.3)
    try:
        agent = system.agent("a1")
        agent.store_knowledge("cache keys include the tenant id", category="pitfall")
        assert system.wait_idle(10)  # its vector (computed apart from the write) before the hang
        embedder.mode = "hang"
        prompt = agent.begin_task("t1", "cache keys for tenants")
        # the query's vector is late: the keyword ranking still makes the prompt, and says so
        assert not prompt.fallback and "cache keys include the tenant id" in prompt.text
        assert prompt.reason is not None and prompt.reason.startswith("degraded: keyword-only: model")
        receipt = agent.complete_task("t1", "tenant cache keys fixed")  # durable: in the outbox
        assert receipt.task_id == "t1"
        assert system.wait_idle(30)  # the write-back gave up waiting for the model, not on the write
        stores = stores_of(system, "a1")
        assert stores["knowledge"]["entries"] == 2 and stores["knowledge"]["pending_vectors"] == 1
        assert "is stuck since" in stores["knowledge"]["last_error"]  # no write waits for it again
        assert stores["episodic"]["episodes"] == 1 and stores["episodic"]["pending_vectors"] == 1
        assert any("wait for their vectors" in w for w in system.status()["warnings"])
        embedder.mode = "ok"
        embedder.gate.set()
        agent.store_knowledge("tenants never share a cache", category="pattern")
        # the pending vectors are caught up in this process, with no further write
        assert eventually(lambda: stores_of(system, "a1")["knowledge"]["pending_vectors"] == 0)
        assert eventually(lambda: stores_of(system, "a1")["episodic"]["pending_vectors"] == 0)
    finally:
        embedder.gate.set()
        system.stop()


# -- a full disk -----------------------------------------------------------------------------------


def fill_disk(db: Any) -> None:
    """No page beyond the current ones: the next write that needs space fails like a full disk."""
    db.execute(f"PRAGMA max_page_count = {int(db.scalar('PRAGMA page_count'))}")


class FullDiskStores(LayerStores):
    def __init__(self) -> None:
        self.layers: dict[str, Any] = {}

    def open_knowledge(self, path: Path, embedder: Embedder | None, config: Config) -> Any:
        layer = super().open_knowledge(path, embedder, config)
        self.layers[f"knowledge/{path.stem}"] = layer
        return layer

    def open_episodic(
        self, path: Path, embedder: Embedder | None, config: Config, clock: Callable[[], datetime]
    ) -> Any:
        layer = super().open_episodic(path, embedder, config, clock)
        self.layers[f"episodic/{path.stem}"] = layer
        return layer


def test_a_full_disk_is_a_clear_error_nothing_half_written_and_reads_go_on(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outboxes: list[Outbox] = []

    class TrackedOutbox(Outbox):
        def __init__(self, path: Path, owner: str | None = None) -> None:
            super().__init__(path, owner)
            outboxes.append(self)

    monkeypatch.setattr(agent_module, "Outbox", TrackedOutbox)
    stores = FullDiskStores()
    embedder = FakeEmbedder()
    with start(data_dir, embedder, stores=stores) as system:
        agent = system.agent("a1")
        for i in range(5):
            agent.store_knowledge(f"deploy note {i}: roll back on error", category="pattern")
            agent.remember(f"deployed build {i}")
        agent.complete_task("t0", "first deploy went fine")
        assert system.wait_idle(10)
        knowledge, episodic = stores.layers["knowledge/a1"], stores.layers["episodic/a1"]
        before = (knowledge.count(), episodic.count(), outboxes[0].counts())
        big = "disk filler " * 40_000  # needs many new pages
        for db in (knowledge._db, episodic._db, outboxes[0].db):
            fill_disk(db)
        with pytest.raises(StorageError, match=r"knowledge/a1\.sqlite: the disk is full"):
            agent.store_knowledge(big, category="pattern")
        with pytest.raises(StorageError, match=r"episodic/a1\.sqlite: the disk is full"):
            agent.remember(big)
        with pytest.raises(StorageError, match=r"outbox/a1\.sqlite: the disk is full"):
            agent.complete_task("t1", big)  # not acknowledged: the caller knows it was not kept
        assert system.wait_idle(10)
        assert (knowledge.count(), episodic.count(), outboxes[0].counts()) == before
        # reads still work, and the layers agree with themselves
        assert agent.query_knowledge("deploy roll back", top_k=10)[0].entry.content.startswith("deploy note")
        recalled = {h.episode.content for h in agent.recall("deployed build", top_k=10)}
        assert recalled >= {f"deployed build {i}" for i in range(5)}
        assert system.agent("a2").store_knowledge("another agent's disk is fine", category="pattern") > 0
        status = system.status()
        assert status["degraded"] == {} and status["agents"]["a1"]["knowledge"]["storage_errors"] == 1
        assert any("a1 knowledge: 1 request(s) failed in the database" in w for w in status["warnings"])
        for db in (knowledge._db, episodic._db, outboxes[0].db):
            db.execute("PRAGMA max_page_count = 1073741823")  # space freed
        assert agent.store_knowledge("written once space was freed", category="pattern") > 0
        agent.complete_task("t2", "second deploy after cleanup")
        assert system.wait_idle(10)
    for name in ("knowledge/a1.sqlite", "episodic/a1.sqlite", "outbox/a1.sqlite"):
        with open_database(data_dir / name) as db:
            assert db.scalar("PRAGMA integrity_check") == "ok"
    with KnowledgeStore.open(data_dir / "knowledge" / "a1.sqlite", embedder) as store:
        assert store.count() == 5 + 1 + 1 + 1 and store.status()["pending_vectors"] == 0
        assert big not in {e.content for e in store.list(limit=100)}
    with EpisodicMemory.open(data_dir / "episodic" / "a1.sqlite", embedder) as memory:
        assert memory.count() == 5 + 1 + 1 and memory.status()["consistency"]["consistent"]


# -- a damaged database file -----------------------------------------------------------------------


def test_a_damaged_file_names_itself_and_other_agents_carry_on(data_dir: Path) -> None:
    embedder = FakeEmbedder()
    with start(data_dir, embedder) as system:
        for agent_id in ("a1", "a2"):
            system.agent(agent_id).store_knowledge(f"{agent_id} knows the rollout order", category="pattern")
            system.agent(agent_id).remember(f"{agent_id} rolled out v2")
    damaged = data_dir / "knowledge" / "a1.sqlite"
    assert not Path(f"{damaged}-wal").exists()  # closed cleanly: everything is in the main file
    with damaged.open("r+b") as handle:
        handle.write(b"this is not an sqlite header at all!" * 3)
    with start(data_dir, embedder) as system:
        a1, a2 = system.agent("a1"), system.agent("a2")
        with pytest.raises(StorageError, match=rf"cannot open database {damaged}: .*damaged"):
            a1.query_knowledge("rollout order")
        with pytest.raises(StorageError, match=str(damaged)):
            a1.store_knowledge("anything", category="pattern")
        assert a2.query_knowledge("rollout order")[0].entry.content == "a2 knows the rollout order"
        assert a1.recall("rolled out")[0].episode.content == "a1 rolled out v2"  # its other stores work
        prompt = a1.begin_task("t1", "rollout order")
        assert prompt.fallback and prompt.reason is not None and str(damaged) in prompt.reason
        a1.complete_task("t1", "rolled out v3")  # acknowledged: kept in the outbox
        assert system.wait_idle(20)
        status = system.status()
        assert status["agents"]["a1"]["agent"]["outbox_pending"] == 1
        assert status["degraded"] == {} and status["restarts"] == {}  # a damaged file is no crash
        assert any("a1 agent: 1 acknowledged write-back(s) wait" in w for w in status["warnings"])
    # moved aside, the agent starts a new store and the kept write-back lands in it
    damaged.rename(damaged.with_suffix(".damaged"))
    with start(data_dir, embedder) as system:
        assert system.wait_idle(20)
        assert [e.content for e in system.agent("a1").list_knowledge()] == ["rolled out v3"]


def test_a_damaged_page_inside_a_file_is_a_clear_error(data_dir: Path) -> None:
    path = data_dir / "e.sqlite"
    with EpisodicMemory.open(path, FakeEmbedder()) as memory:
        memory.record_many([{"content": f"episode number {i} " + "padding " * 200} for i in range(200)])
        memory.commit()
    size = path.stat().st_size
    with path.open("r+b") as handle:  # garble a run of pages in the middle of the file
        handle.seek(size // 2)
        handle.write(bytes(range(256)) * 64)
    with (
        pytest.raises(StorageError, match=rf"{path}.*(damaged|malformed)"),
        EpisodicMemory.open(path, FakeEmbedder()) as memory,
    ):
        memory.timeline(limit=None)
        memory.search("episode number 7")
        memory.check(full=True)


# -- no sqlite-vec ---------------------------------------------------------------------------------


def fill(system: MemorySystem) -> list[list[str]]:
    agent = system.agent("a1")
    words = ["queue", "cache", "index", "shard", "lease", "quota", "token", "route"]
    for n, word in enumerate(words):
        agent.store_knowledge(f"{word} handling rule {n}: {words[(n + 3) % 8]} first", category="pattern")
        agent.remember(f"{word} incident {n} involved {words[(n + 5) % 8]}")
    results = []
    for word in words:
        results.append([h.entry.content for h in agent.query_knowledge(f"{word} rule", top_k=5)])
        results.append([h.entry.content for h in agent.query_knowledge(word, mode="vector", top_k=3)])
        results.append([h.episode.content for h in agent.recall(f"{word} incident", top_k=3)])
    return results


def test_without_sqlite_vec_new_stores_use_the_numpy_scan_with_the_same_answers(
    tmp_path: Path, no_vec: None
) -> None:
    with start(tmp_path / "numpy", FakeEmbedder()) as system:
        fallback = fill(system)
        status = system.status()
        assert status["vectors"] == "fallback (numpy): sqlite-vec disabled"
        assert status["agents"]["a1"]["knowledge"]["store"]["vectors"]["backend"] == "blob"
        assert status["agents"]["a1"]["knowledge"]["store"]["mode"] == "hybrid"
        assert status["agents"]["a1"]["episodic"]["store"]["vector_backend"] == "blob"
        assert any("sqlite-vec is not loaded" in w for w in status["warnings"])
    disable_vec_for_tests(False)
    with start(tmp_path / "native", FakeEmbedder()) as system:
        native = fill(system)
        assert system.status()["agents"]["a1"]["knowledge"]["store"]["vectors"]["backend"] == "vec0"
    assert fallback == native


def test_a_vec0_store_opened_without_sqlite_vec_goes_keyword_only_and_catches_up(data_dir: Path) -> None:
    embedder = FakeEmbedder()
    with start(data_dir, embedder) as system:
        system.agent("a1").store_knowledge("sharded counters avoid hot rows", category="pattern")
    disable_vec_for_tests(True)
    try:
        with start(data_dir, embedder) as system:
            agent = system.agent("a1")
            agent.store_knowledge("leases expire after thirty seconds", category="pattern")
            store = system.status()["agents"]["a1"]["knowledge"]["store"]
            assert store["mode"] == "keyword-only" and "sqlite-vec" in store["reason"]
            assert [h.match_type for h in agent.query_knowledge("leases expire")] == ["keyword"]
            assert any("a1 knowledge: keyword-only" in w for w in system.status()["warnings"])
    finally:
        disable_vec_for_tests(False)
    with start(data_dir, embedder) as system:
        agent = system.agent("a1")
        hits = agent.query_knowledge("leases expire after thirty seconds", mode="vector", top_k=1)
        assert hits[0].entry.content == "leases expire after thirty seconds"
        store = system.status()["agents"]["a1"]["knowledge"]["store"]
        assert store["mode"] == "hybrid" and store["pending_vectors"] == 0


def test_an_embedding_error_in_vector_only_episode_search_is_not_an_empty_answer(data_dir: Path) -> None:
    embedder = FlakyEmbedder()
    with EpisodicMemory.open(data_dir / "e.sqlite", embedder) as memory:
        memory.record("vector only searches need the model")
        embedder.mode = "raise"
        with pytest.raises(EmbeddingError):
            memory.search("vector only", mode="vector")
        assert [h.match_type for h in memory.search("vector only searches")] == ["keyword"]
        assert memory.status()["last_error"] is not None


def test_a_crash_while_a_write_back_is_marked_done_leaves_no_row_behind(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent actor crashes marking a stored part done: the replay after its restart sends
    the part again (deduplicated) and finishes the row, in this process, not at the next start."""
    real = Outbox.mark_done_many
    calls = iter([True])

    def failing_once(self: Outbox, parts: Any) -> Any:
        if next(calls, False):
            raise RuntimeError("injected crash")
        return real(self, parts)

    monkeypatch.setattr(Outbox, "mark_done_many", failing_once)
    system = MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder())
    try:
        agent = system.agent("a1")
        agent.complete_task("t1", "the only summary")
        assert system.wait_idle(10)
        assert system.status()["agents"]["a1"]["agent"]["outbox_pending"] == 0
        assert len(agent.list_knowledge()) == 1 and len(agent.list_episodes()) == 1
    finally:
        report = system.stop()
    assert report.left == ()
