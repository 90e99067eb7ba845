"""Writes never wait for the model: a store commits its rows and keyword index at once with the
vector pending, the store actor asks the embedding service for the vector apart, and a search
waits for those vectors only within its own embedding deadline (read-your-writes).

The model is a double whose calls wait on an event the test controls, or that answers all-zero
or NaN vectors on demand; nothing sleeps to synchronise, and time is only bounded from above
(bounded polls with an explicit condition, for work a background timer does).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memstrata import Config
from memstrata.actors import BatchingEmbedder
from memstrata.core.constants import EMBED_CHARS
from memstrata.errors import EmbeddingError, InvalidInputError, ModelFaultError
from memstrata.layers import EpisodicMemory, KnowledgeStore
from tests._support import GatedModel, eventually, hung_system, start_with_model, store_status
from tests.fakes import FakeEmbedder

# -- the actors ----------------------------------------------------------------------------------


def test_the_first_store_after_a_hang_returns_while_the_model_call_is_still_blocked(data_dir: Path) -> None:
    # the model is given up on only after 25 s: a store that waited for it would return after that
    with hung_system(
        data_dir, episode=True, ask_timeout_s=30.0, embed_timeout_s=25.0, query_embed_timeout_s=0.5
    ) as (system, model, agent):
        entry = agent.store_knowledge("the cache warms up after deploys", category="pattern")
        episode = agent.remember("the cache was cold after the deploy of build 7")
        # the stores returned with the model call still blocked and not yet given up on
        assert model.entered.wait(10)
        assert model.inside >= 1 and not model.release.is_set()
        assert system.status()["embedding"]["state"]["state"] == "ok"
        listed = agent.list_knowledge()  # needs no model: answers while the model is blocked
        assert {e.content for e in listed} >= {"the cache warms up after deploys"}
        assert model.inside >= 1 and system.status()["embedding"]["state"]["state"] == "ok"
        assert agent.get_knowledge(entry) is not None
        # keyword-searchable at once; the search says why it is not a full hybrid ranking
        hits = agent.query_knowledge("cache warms up")
        assert hits[0].entry.id == entry
        assert hits.degraded is not None and "fake-bow" in hits.degraded
        recalled = agent.recall("cache cold build 7")
        assert recalled[0].episode.id == episode and recalled.degraded is not None
        # the query embedding gave up on the model: status names it stuck, and since when
        state = system.status()["embedding"]["state"]
        assert state["state"] == "stuck" and state["model"] == "fake-bow" and state["since"].endswith("Z")
        assert store_status(system, "a1", "knowledge")["pending_vectors"] == 1
        assert store_status(system, "a1", "episodic")["pending_vectors"] == 1
        actor = system.status()["agents"]["a1"]["knowledge"]
        assert actor["pending_vectors"] == 1
        # the model returns: the vectors are filled in this process, with no further write
        model.mode = "ok"
        model.release.set()
        assert eventually(lambda: store_status(system, "a1", "knowledge")["pending_vectors"] == 0)
        assert eventually(lambda: store_status(system, "a1", "episodic")["pending_vectors"] == 0)
        semantic = agent.query_knowledge("the cache warms up after deploys", mode="vector", top_k=1)
        assert semantic[0].entry.id == entry and semantic.degraded is None
        assert system.status()["embedding"]["state"]["state"] == "ok"


@pytest.mark.parametrize("mode", ["zeros", "nan"])
def test_bad_vectors_stay_pending_are_caught_up_and_never_make_a_dead_letter(
    data_dir: Path, mode: str
) -> None:
    model = GatedModel()
    with start_with_model(data_dir, model) as system:
        agent = system.agent("a1")
        model.mode = mode
        agent.complete_task("t1", "moved the invoice export to a queue")
        entry = agent.store_knowledge("invoices are numbered per tenant", category="pattern")
        assert system.wait_idle(20)  # the write-back and the vector requests have been answered
        status = system.status()["agents"]["a1"]["agent"]
        assert status["outbox_dead"] == 0 and status["outbox_pending"] == 0
        knowledge = store_status(system, "a1", "knowledge")
        assert knowledge["pending_vectors"] == 2
        assert "model 'fake-bow' returned" in knowledge["last_error"]
        assert store_status(system, "a1", "episodic")["pending_vectors"] == 1
        assert agent.query_knowledge("invoices numbered")[0].entry.id == entry
        model.mode = "ok"  # bad vectors were never cached: they are computed again
        assert eventually(lambda: store_status(system, "a1", "knowledge")["pending_vectors"] == 0)
        assert eventually(lambda: store_status(system, "a1", "episodic")["pending_vectors"] == 0)
        assert store_status(system, "a1", "knowledge")["last_error"] is None
        hit = agent.query_knowledge("moved the invoice export to a queue", mode="vector", top_k=1)[0]
        assert hit.entry.content == "moved the invoice export to a queue"
        assert agent.recall("invoice export queue")[0].episode.task_run_id == "t1"


def test_a_query_right_after_a_store_finds_it_by_vector(data_dir: Path) -> None:
    model = GatedModel()
    with start_with_model(data_dir, model) as system:
        agent = system.agent("a1")
        texts = [
            "webhooks are retried with exponential backoff",
            "the ledger is sharded by month",
            "feature flags live in the config service",
            "nightly builds publish to the staging bucket",
        ]
        for text in texts:
            entry = agent.store_knowledge(text, category="pattern")
            hits = agent.query_knowledge(text, mode="vector", top_k=1)
            assert hits.degraded is None
            assert hits[0].entry.id == entry
            episode = agent.remember(f"noted: {text}")
            recalled = agent.recall(f"noted: {text}", top_k=1)
            assert recalled.degraded is None and recalled[0].episode.id == episode


def test_a_query_right_after_an_update_finds_the_new_text_by_vector(data_dir: Path) -> None:
    with start_with_model(data_dir, GatedModel()) as system:
        agent = system.agent("a1")
        for n in range(4):  # the old text's vector may still be on its way when the text changes
            entry = agent.store_knowledge(f"cache the invoice totals of region {n}", category="pattern")
            agent.update_knowledge(entry, content=f"memoise the shipping quotes of lane {n}")
            hits = agent.query_knowledge(f"memoise the shipping quotes of lane {n}", mode="vector", top_k=1)
            assert hits.degraded is None
            assert [h.entry.id for h in hits] == [entry]


def test_a_search_waits_for_the_vectors_in_flight_within_its_deadline(data_dir: Path) -> None:
    with hung_system(data_dir, ask_timeout_s=30.0, embed_timeout_s=20.0, query_embed_timeout_s=15.0) as (
        _,
        model,
        agent,
    ):
        entry = agent.store_knowledge("rollbacks need the previous image tag", category="pitfall")
        assert model.entered.wait(10)  # its vector is inside the model now
        answer: list[Any] = []
        searching = threading.Thread(
            target=lambda: answer.append(agent.query_knowledge("previous image tag", mode="vector", top_k=1))
        )
        searching.start()
        model.mode = "ok"
        model.release.set()  # before or while the search waits: either way it sees the vector
        searching.join(30)
        assert not searching.is_alive()
        hits = answer[0]
        assert hits.degraded is None and hits[0].entry.id == entry


def test_the_next_start_computes_vectors_left_pending_on_disk(data_dir: Path) -> None:
    model = GatedModel()
    config = Config(data_dir=data_dir)
    knowledge = KnowledgeStore.open(
        data_dir / "knowledge" / "a1.sqlite", model, config=config, defer_vectors=True
    )
    try:
        knowledge.add("left pending by a stop", category="pattern")
        assert knowledge.pending_vectors() == 1
    finally:
        knowledge.close()
    episodic = EpisodicMemory.open(
        data_dir / "episodic" / "a1.sqlite", model, config=config, defer_vectors=True
    )
    try:
        episodic.record("an episode left pending by a stop")
        assert episodic.pending_vectors() == 1
    finally:
        episodic.close()
    with start_with_model(data_dir, model) as system:
        agent = system.agent("a1")
        assert [e.content for e in agent.list_knowledge()] == ["left pending by a stop"]
        assert agent.recall("episode left pending")[0].episode.content == "an episode left pending by a stop"
        assert eventually(lambda: store_status(system, "a1", "knowledge")["pending_vectors"] == 0)
        assert eventually(lambda: store_status(system, "a1", "episodic")["pending_vectors"] == 0)
        hit = agent.query_knowledge("left pending by a stop", mode="vector", top_k=1)
        assert hit.degraded is None and hit[0].entry.content == "left pending by a stop"


# -- the layers ----------------------------------------------------------------------------------


def test_a_knowledge_store_keeps_vectors_pending_and_stores_only_current_usable_ones(tmp_path: Path) -> None:
    model = FakeEmbedder()
    config = Config(data_dir=tmp_path)
    with KnowledgeStore.open(tmp_path / "k.sqlite", model, config=config) as inline:
        inline.add("direct users embed inline", category="pattern")
        assert inline.pending_vectors() == 0 and model.calls == 1
    store = KnowledgeStore.open(tmp_path / "d.sqlite", model, config=config, defer_vectors=True)
    try:
        calls = model.calls
        a = store.add("alpha entry about caches", category="pattern")
        b = store.add("beta entry about queues", category="pattern")
        c = store.add("gamma entry about locks", category="pattern")
        assert model.calls == calls and store.pending_vectors() == 3
        pending = store.pending_texts(10)
        assert [i for i, _ in pending] == [a, b, c]
        assert store.pending_texts(10, skip={a}) == pending[1:]
        ids, texts = [i for i, _ in pending], [t for _, t in pending]
        store.update(b, content="beta entry about queues, rewritten")  # changed meanwhile: skipped
        store.delete(c)  # deleted meanwhile: skipped
        assert store.store_vectors(ids, texts, model.embed_documents(texts)) == 1
        assert [i for i, _ in store.pending_texts(10)] == [b]
        # a NaN row is the model's fault: recorded, and the entry stays pending
        ((_, text),) = store.pending_texts(10)
        bad = np.full((1, model.dim), np.nan, dtype=np.float32)
        assert store.store_vectors([b], [text], bad) == 0
        assert store.pending_vectors() == 1 and "NaN" in str(store.status()["last_error"])
        assert store.store_vectors([b], [text], np.zeros((1, model.dim), dtype=np.float32)) == 0
        assert store.store_vectors([b], [text], model.embed_documents([text])) == 1
        assert store.pending_vectors() == 0 and store.status()["last_error"] is None
        assert store.search("rewritten queues", mode="vector", top_k=1)[0].entry.id == b
        long = "é" * 5000 + " ünïcode 語 " * 500  # past the embedded prefix, not ASCII
        d = store.add(long, category="pattern")
        ((got, prefix),) = store.pending_texts(10)
        assert got == d and prefix == long[:EMBED_CHARS]
        assert store.store_vectors([d], [prefix], model.embed_documents([prefix])) == 1
        with pytest.raises(InvalidInputError, match="2 ids for 1 texts"):
            store.store_vectors([a, b], [text], model.embed_documents([text]))
    finally:
        store.close()


def test_an_episodic_store_keeps_vectors_pending_and_stores_only_current_usable_ones(tmp_path: Path) -> None:
    model = FakeEmbedder()
    memory = EpisodicMemory.open(
        tmp_path / "e.sqlite", model, config=Config(data_dir=tmp_path), defer_vectors=True
    )
    try:
        first = memory.record("the deploy of build 7 failed", title="deploy")
        second = memory.record("the cache was cold afterwards")
        assert model.calls == 0 and memory.pending_vectors() == 2
        pending = memory.pending_texts(10)
        assert [i for i, _ in pending] == [first, second]
        assert pending[0][1].startswith("deploy\n\nthe deploy of build 7 failed (")  # title, content, date
        memory.delete(second)
        ids, texts = [i for i, _ in pending], [t for _, t in pending]
        vectors = model.embed_documents(texts)
        vectors[0] = np.nan
        assert memory.store_vectors(ids, texts, vectors) == 0  # NaN for the first, the second is gone
        assert memory.pending_vectors() == 1 and "NaN" in str(memory.status()["last_error"])
        assert memory.store_vectors(ids[:1], texts[:1], model.embed_documents(texts[:1])) == 1
        assert memory.pending_vectors() == 0
        assert memory.search("deploy of build 7 failed", top_k=1)[0].episode.id == first
    finally:
        memory.close()


# -- the embedding service -----------------------------------------------------------------------


def test_submit_documents_shares_the_cache_and_fails_fast_when_stuck_or_closed() -> None:
    model = GatedModel()
    service = BatchingEmbedder(model, call_timeout_s=0.3)
    try:
        first = service.submit_documents(["alpha text", "beta text"]).result(10)
        assert first.shape == (2, model.dim)
        again = service.submit_documents(["beta text"]).result(10)
        assert np.array_equal(again[0], first[1]) and service.stats().cache_hits >= 1
        model.mode = "hang"
        hung = service.submit_documents(["gamma text"])
        assert model.entered.wait(10)
        # nobody waits on it with a timeout: once the call outlives its bound, the model is stuck
        error = hung.exception(10)
        assert isinstance(error, ModelFaultError) and "is stuck since" in str(error)
        assert service.model_status()["state"] == "stuck"
        fast = service.submit_documents(["delta text"])
        assert fast.done() and isinstance(fast.exception(), ModelFaultError)
        assert "is stuck since" in str(fast.exception())
        assert service.submit_documents(["alpha text"]).result(0).shape == (1, model.dim)  # cached
    finally:
        model.release.set()
        service.close()
    closed = service.submit_documents(["epsilon text"])
    assert closed.done() and isinstance(closed.exception(), EmbeddingError)


def test_a_restore_into_a_store_that_defers_vectors_leaves_them_pending(tmp_path: Path) -> None:
    """An archive made by another model (or without vectors) is restored without calling the
    model: the episodes' vectors are pending, for the owner to compute apart."""
    other = FakeEmbedder(model_id="another-model")
    with EpisodicMemory.open(tmp_path / "old.sqlite", other, config=Config(data_dir=tmp_path)) as old:
        old.record("gamma ray burst observed")
        old.archive(tmp_path / "gamma.msarchive")
    model = FakeEmbedder()
    memory = EpisodicMemory.open(
        tmp_path / "e.sqlite", model, config=Config(data_dir=tmp_path), defer_vectors=True
    )
    try:
        assert memory.restore(tmp_path / "gamma.msarchive") == 1
        assert model.calls == 0 and memory.pending_vectors() == 1
        ids, texts = zip(*memory.pending_texts(10), strict=True)
        assert memory.store_vectors(list(ids), list(texts), model.embed_documents(list(texts))) == 1
        assert (
            memory.search("gamma ray burst", mode="vector", top_k=1)[0].episode.content
            == "gamma ray burst observed"
        )
    finally:
        memory.close()
