"""Group commit and shared embeddings: writes waiting in a mailbox are stored together, every
caller still gets its own answer, and a write-back's text is embedded once for both its parts."""

from __future__ import annotations

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
from memstrata.actors import BatchingEmbedder, KnowledgeStoreActor, LayerStores
from memstrata.actors._outbox import Outbox
from memstrata.actors._store_messages import WriteBackEpisode
from memstrata.errors import InvalidInputError, StorageError
from memstrata.layers import EpisodicMemory, KnowledgeStore
from memstrata.messages import StoreKnowledge, TaskCompleted, TaskFailed
from memstrata.storage import Embedder
from tests._support import FirstBatchHeld, wait_until
from tests.fakes import FakeEmbedder

FloatArray = npt.NDArray[np.float32]


def in_threads(calls: Sequence[Callable[[], Any]]) -> tuple[list[threading.Thread], list[Any]]:
    """Start one thread per call; results (or exceptions) land in the returned list."""
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    return threads, results


def join(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(20)
        assert not thread.is_alive()


def mailbox(system: MemorySystem, kind: str, key: str, *types: type) -> int:
    """How many messages (of ``types``, if given) wait in the actor's mailbox."""
    ref = system._runtime.existing(kind, key)
    assert ref is not None
    inbox = ref.actor_inbox
    with inbox.mutex:  # type: ignore[attr-defined]
        waiting = [item.message.message for item in inbox.queue]  # type: ignore[attr-defined]
    return sum(1 for m in waiting if not types or isinstance(m, types))


# -- the embedding service -------------------------------------------------------------------------


def test_a_text_already_in_the_model_is_not_embedded_again() -> None:
    inner = FirstBatchHeld()
    service = BatchingEmbedder(inner, max_batch_wait_ms=0)
    try:
        threads, results = in_threads([lambda: service.embed_documents(["alpha", "beta"])])
        assert inner.entered.wait(5)
        more, later = in_threads([lambda: service.embed_documents(["beta", "gamma"])])
        wait_until(lambda: service.stats().document_requests == 2)
        inner.release.set()
        join(threads + more)
        assert inner.batches == [["alpha", "beta"], ["gamma"]]  # "beta" was computed once
        np.testing.assert_array_equal(later[0][0], results[0][1])
        np.testing.assert_allclose(later[0][1], FakeEmbedder().embed_documents(["gamma"])[0], rtol=1e-6)
        stats = service.stats()
        assert stats.shared_in_flight == 1 and stats.texts_embedded == 3 and stats.model_seconds > 0
    finally:
        inner.release.set()
        service.close()


def test_a_query_does_not_wait_for_a_document_batch() -> None:
    inner = FirstBatchHeld(thread_safe=True)
    service = BatchingEmbedder(inner)
    try:
        threads, _ = in_threads([lambda: service.embed_documents(["a long document batch"])])
        assert inner.entered.wait(5)
        vector = service.embed_query("a query meanwhile")  # the batch is still inside the model
        np.testing.assert_allclose(vector, FakeEmbedder().embed_query("a query meanwhile"), rtol=1e-6)
        assert len(inner.batches) == 1
        inner.release.set()
        join(threads)
    finally:
        inner.release.set()
        service.close()


# -- group commit in the actors --------------------------------------------------------------------


def test_write_backs_waiting_in_the_mailbox_are_committed_together(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transactions: list[int] = []
    gate, entered = threading.Event(), threading.Event()

    class GatedOutbox(Outbox):
        def append(self, kind: str, task_id: str, text: str, at: datetime) -> int:
            entered.set()
            assert gate.wait(10)
            transactions.append(1)
            return super().append(kind, task_id, text, at)

        def append_many(self, rows: list[tuple[str, str, str, datetime]]) -> list[int]:
            transactions.append(len(rows))
            return super().append_many(rows)

    monkeypatch.setattr(agent_module, "Outbox", GatedOutbox)
    with MemorySystem.start(
        Config(data_dir=data_dir, max_content_bytes=400), embedder=FakeEmbedder()
    ) as system:
        agent = system.agent("a1")
        first, _ = in_threads([lambda: agent.complete_task("t0", "the first outcome")])
        assert entered.wait(5)
        calls: list[Callable[[], Any]] = [
            (lambda i=i: agent.complete_task(f"t{i}", f"outcome number {i}")) for i in range(1, 8)
        ]
        calls.insert(3, lambda: agent.fail_task("big", "x" * 500))  # too large: refused alone
        threads, results = in_threads(calls)
        wait_until(lambda: mailbox(system, "agent", "a1", TaskCompleted, TaskFailed) == 8)
        gate.set()
        join(first + threads)
        assert transactions == [1, 7]  # the first alone, then the seven valid ones in one commit
        assert isinstance(results[3], InvalidInputError) and "max_content_bytes" in str(results[3])
        receipts = [r for r in results if not isinstance(r, Exception)]
        assert sorted(r.task_id for r in receipts) == [f"t{i}" for i in range(1, 8)]
        assert len({r.outbox_id for r in receipts}) == 7
        assert system.wait_idle(10)
        assert system.status()["agents"]["a1"]["agent"]["outbox_pending"] == 0
        contents = {e.content for e in agent.list_knowledge(limit=100)}
        assert contents == {"the first outcome"} | {f"outcome number {i}" for i in range(1, 8)}


class GatedStores(LayerStores):
    """Layers whose first write waits for its store's gate; batched writes are recorded."""

    def __init__(self) -> None:
        self.gates = {"knowledge": threading.Event(), "episodic": threading.Event()}
        self.entered = {"knowledge": threading.Event(), "episodic": threading.Event()}
        self.batches: list[tuple[str, int]] = []
        self.failing_batches = 0  # how many batched writes raise before touching the store

    def _hold(self, kind: str) -> None:
        if not self.entered[kind].is_set():
            self.entered[kind].set()
            assert self.gates[kind].wait(10)

    def open_knowledge(self, path: Path, embedder: Embedder | None, config: Config) -> Any:
        stores = self

        class Knowledge(KnowledgeStore):
            def add(self, content: str, **kwargs: Any) -> int:
                stores._hold("knowledge")
                return super().add(content, **kwargs)

            def add_many(self, items: Any, **kwargs: Any) -> list[int]:
                items = list(items)
                stores.batches.append(("knowledge", len(items)))
                stores._hold("knowledge")
                if stores.failing_batches:
                    stores.failing_batches -= 1
                    raise StorageError("the disk hiccupped")
                return super().add_many(items, **kwargs)

        return Knowledge.open(path, embedder, config=config)

    def open_episodic(
        self, path: Path, embedder: Embedder | None, config: Config, clock: Callable[[], datetime]
    ) -> Any:
        stores = self

        class Episodic(EpisodicMemory):
            def record(self, content: str, **kwargs: Any) -> int:
                stores._hold("episodic")
                return super().record(content, **kwargs)

            def record_many(self, items: Any) -> list[int]:
                items = list(items)
                stores.batches.append(("episodic", len(items)))
                stores._hold("episodic")
                return super().record_many(items)

        return Episodic.open(path, embedder, config=config, clock=clock)


def test_queued_stores_share_one_transaction_and_each_caller_gets_its_answer(data_dir: Path) -> None:
    stores = GatedStores()
    config = Config(data_dir=data_dir, max_content_bytes=300)
    with MemorySystem.start(config, embedder=FakeEmbedder(), stores=stores) as system:
        agent = system.agent("a1")
        first, _ = in_threads([lambda: agent.store_knowledge("held at the gate", category="pattern")])
        assert stores.entered["knowledge"].wait(5)
        texts = ["retry with backoff", "cache the lookups", "retry with backoff", "y" * 400, "pin it"]
        threads, results = in_threads(
            [(lambda t=t: agent.store_knowledge(t, category="pattern", tags={"n": t[:8]})) for t in texts]
        )
        wait_until(lambda: mailbox(system, "knowledge", "a1", StoreKnowledge) == len(texts))
        stores.gates["knowledge"].set()
        join(first + threads)
        assert stores.batches == [("knowledge", 4)]  # the oversize one is refused before the batch
        assert isinstance(results[3], InvalidInputError)
        assert results[0] == results[2] and len({results[0], results[1], results[4]}) == 3  # dedup kept
        entries = {e.content: e for e in agent.list_knowledge(limit=10)}
        assert set(entries) == {"held at the gate", "retry with backoff", "cache the lookups", "pin it"}


def _four_queued_behind_a_held_store(system: MemorySystem, stores: GatedStores) -> list[str]:
    """One store held at the gate, four queued behind it (one batch), then the gate opens:
    the four texts (each caller got its own id)."""
    agent = system.agent("a1")
    first, _ = in_threads([lambda: agent.store_knowledge("held at the gate", category="pattern")])
    assert stores.entered["knowledge"].wait(5)
    texts = [f"lesson {i}" for i in range(4)]
    threads, results = in_threads([(lambda t=t: agent.store_knowledge(t, category="pattern")) for t in texts])
    wait_until(lambda: mailbox(system, "knowledge", "a1", StoreKnowledge) == len(texts))
    stores.gates["knowledge"].set()
    join(first + threads)
    assert stores.batches == [("knowledge", 4)]
    assert all(isinstance(r, int) for r in results) and len(set(results)) == 4
    return texts


def test_a_batch_that_fails_is_handled_again_message_by_message(data_dir: Path) -> None:
    stores = GatedStores()
    stores.failing_batches = 1
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder(), stores=stores) as system:
        texts = _four_queued_behind_a_held_store(system, stores)  # it failed, then each went alone
        stored = {e.content for e in system.agent("a1").list_knowledge(limit=10)}
        assert stored == {"held at the gate", *texts}
        assert "storage_errors" not in system.status()["agents"]["a1"]["knowledge"]


def test_a_batch_that_fails_after_its_commit_is_not_written_again(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The work after a batch's commit (asking for its vectors) fails: the batch's answers
    stand, nothing is handed over again one by one (it would be written twice), and the actor
    restarts as after any crash."""
    stores = GatedStores()
    real = KnowledgeStoreActor._committed

    def failing(self: Any, messages: list[Any], answers: list[Any]) -> None:
        if len(messages) > 1:
            raise RuntimeError("asking for the vectors failed")
        real(self, messages, answers)

    monkeypatch.setattr(KnowledgeStoreActor, "_committed", failing)
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder(), stores=stores) as system:
        texts = _four_queued_behind_a_held_store(system, stores)
        contents = [e.content for e in system.agent("a1").list_knowledge(limit=10)]
        assert sorted(contents) == sorted(["held at the gate", *texts])  # each once
        assert system.status()["restarts"] == {"knowledge:a1": 1}


def test_a_write_back_is_embedded_once_and_its_episodes_are_batched(data_dir: Path) -> None:
    stores = GatedStores()
    stores.gates["knowledge"].set()
    embedder = FakeEmbedder()
    with MemorySystem.start(Config(data_dir=data_dir), embedder=embedder, stores=stores) as system:
        agent = system.agent("a1")
        agent.complete_task("t0", "deployed the search index")
        assert stores.entered["episodic"].wait(5)  # the first episode waits in the store
        for i in range(1, 6):
            agent.complete_task(f"t{i}", f"shipped release {i} of the billing service")
        wait_until(lambda: mailbox(system, "episodic", "a1", WriteBackEpisode) == 5)
        stores.gates["episodic"].set()
        assert system.wait_idle(10)
        assert [n for kind, n in stores.batches if kind == "episodic"] == [1, 5]
        status = system.status()["agents"]["a1"]
        assert status["episodic"]["store"]["pending_vectors"] == 0
        assert status["knowledge"]["store"]["pending_vectors"] == 0
        # one text per write-back for both of its parts (an episode alone would embed its title too)
        assert embedder.texts_embedded == 6
        hits = agent.recall("billing service release", top_k=10)
        assert {h.episode.task_run_id for h in hits} >= {f"t{i}" for i in range(1, 6)}


# -- precomputed episode vectors -------------------------------------------------------------------


def test_record_with_a_given_vector(data_dir: Path) -> None:
    embedder = FakeEmbedder()
    memory = EpisodicMemory.open(data_dir / "episodic" / "a1.sqlite", embedder)
    try:
        vector = FakeEmbedder().embed_documents(["zebra crossing"])[0] * 3.0  # any length: normalised
        calls = embedder.calls
        episode = memory.record("the alpha release went out", vector=vector)
        ids = memory.record_many([{"content": "beta notes", "vector": list(vector)}, {"content": "gamma"}])
        assert embedder.calls == calls + 1  # only "gamma" needed the model
        hits = memory.search("zebra crossing", mode="vector", top_k=2)
        assert {h.episode.id for h in hits} == {episode, ids[0]}
        for bad, match in [
            ([1.0, 2.0], "64 finite numbers"),
            ([float("nan")] * 64, "finite"),
            ([0.0] * 64, "zero"),
        ]:
            with pytest.raises(InvalidInputError, match=match):
                memory.record("refused", vector=np.array(bad))
        with pytest.raises(InvalidInputError, match=r"items\[0\]\.vector"):
            memory.record_many([{"content": "refused", "vector": "not numbers"}])
        assert memory.count() == 3
    finally:
        memory.close()
    keyword_only = EpisodicMemory.open(data_dir / "episodic" / "a2.sqlite", None, config=_no_model())
    try:
        assert keyword_only.keyword_only
        keyword_only.record("kept without a vector", vector=np.ones(64))  # no model to belong to
        assert keyword_only.count() == 1
    finally:
        keyword_only.close()


def _no_model() -> Config:
    from memstrata.config import EmbeddingConfig

    return Config(embedding=EmbeddingConfig(model="/nonexistent/model-dir", dim=64))


def test_parallel_model_batches_keep_the_order(real_embedder: Any) -> None:
    texts = [f"note {i}: " + "word " * (i % 7) + f"about topic {i}" for i in range(40)]
    together = real_embedder.embed_documents(texts)  # 3 batches of 16, run side by side
    alone = np.stack([real_embedder.embed_documents([t])[0] for t in texts[::7]])
    np.testing.assert_allclose(together[::7], alone, atol=1e-4)
