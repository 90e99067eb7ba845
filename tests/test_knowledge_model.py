"""KnowledgeStore with the real default model, real SQLite, sqlite-vec and FTS5."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from memstrata.layers import KnowledgeHit, KnowledgeStore
from memstrata.storage import DEFAULT_MODEL_ID, Embedder
from memstrata.storage._embedder_identity import ModelIdentity
from tests.fakes import FakeEmbedder

pytestmark = pytest.mark.model

ENTRIES = [
    ("Avoid the Strategy pattern in the payment module: it created a circular dependency", "pitfall"),
    ("Retry card authorisation with exponential backoff when the provider throttles us", "pattern"),
    ("The nightly export job runs out of memory when it loads every invoice at once", "pitfall"),
    ("Use parseHttpRequest to read headers; never split the raw socket buffer by hand", "codebase"),
    ("The team prefers short pull requests reviewed within a day", "preference"),
    ("Migrating the orders table with a single ALTER locked production for ten minutes", "outcome"),
]


class Counting(ModelIdentity):
    """The real model, counting the texts it embeds."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self._model_id, self._dim = inner.model_id, inner.dim
        self.texts = 0

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.texts += len(texts)
        return self.inner.embed_documents(texts)

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        return self.inner.embed_query(text)


@pytest.fixture
def store(data_dir: Path, real_embedder: Embedder) -> Iterator[KnowledgeStore]:
    with KnowledgeStore.open(data_dir / "knowledge" / "agent.sqlite", real_embedder) as ks:
        ks.add_many({"content": text, "category": category} for text, category in ENTRIES)
        yield ks


def first(hits: Sequence[KnowledgeHit]) -> str:
    assert hits, "no hits"
    return hits[0].entry.content


def test_paraphrases_are_found_by_meaning(store: KnowledgeStore) -> None:
    query = "payment provider rate-limits our charge attempts; how should we try again?"
    assert first(store.search(query, mode="vector")) == ENTRIES[1][0]
    assert first(store.search(query)) == ENTRIES[1][0]
    query = "batch job crashes with out-of-memory errors while processing all bills"
    assert first(store.search(query, mode="vector")) == ENTRIES[2][0]
    assert first(store.search("code review habits of the group", category="preference")) == ENTRIES[4][0]


def test_hybrid_uses_identifiers_and_meaning(store: KnowledgeStore) -> None:
    hits = store.search("how do I read request headers with parseHttpRequest")
    assert hits[0].entry.content == ENTRIES[3][0]
    assert hits[0].match_type == "hybrid"
    assert hits[0].similarity is not None and hits[0].similarity > 0.3
    assert first(store.search("http", mode="keyword")) == ENTRIES[3][0]


def test_min_score_with_real_similarities(store: KnowledgeStore) -> None:
    query = "exponential backoff when the card provider throttles"
    strict = store.search(query, mode="vector", min_score=0.5)
    assert [h.entry.content for h in strict] == [ENTRIES[1][0]]
    assert all(h.similarity is not None and h.similarity >= 0.5 for h in strict)
    loose = store.search(query, mode="vector")
    assert len(loose) == len(ENTRIES)  # no threshold: every entry is ranked
    keyword = store.search("ALTER", min_score=0.9)
    assert [h.entry.content for h in keyword] == [ENTRIES[5][0]]
    assert keyword[0].match_type == "keyword"


def test_update_reembeds_with_the_model(store: KnowledgeStore) -> None:
    entry_id = store.list(category="preference")[0].id
    store.update(entry_id, content="Deploys happen on Tuesdays after the load test passes")
    hits = store.search("which weekday are deployments scheduled on?", mode="vector")
    assert first(hits).startswith("Deploys")
    assert store.search("pull requests", mode="keyword", category="preference") == []


@pytest.mark.parametrize(
    "query", ["", '"', "NEAR(a b)", "lone \ud800", "nul\x00", "支付失败", "🚀", "x" * 100_000, "a AND"]
)
def test_hostile_queries_with_the_model(store: KnowledgeStore, query: str) -> None:
    for mode in ("hybrid", "vector", "keyword"):
        assert isinstance(store.search(query, mode=mode), list)


def test_one_megabyte_entry(data_dir: Path, real_embedder: Embedder) -> None:
    with KnowledgeStore.open(data_dir / "big.sqlite", real_embedder) as store:
        head = "Kubernetes pods are evicted when the node runs out of disk space. "
        big = head + ("filler text about nothing in particular. " * 25_000)
        assert len(big.encode()) > 1_000_000
        entry_id = store.add(big, category="pitfall")
        store.add("Cooking pasta needs salted boiling water")
        assert (
            store.search("why were my containers evicted from the node?", mode="vector")[0].entry.id
            == entry_id
        )
        assert store.get(entry_id) is not None


def test_rebuild_from_a_fake_model_to_the_real_one(data_dir: Path, real_embedder: Embedder) -> None:
    path = data_dir / "k.sqlite"
    with KnowledgeStore.open(path, FakeEmbedder(dim=64, model_id="fake-a")) as store:
        store.add_many({"content": text, "category": category} for text, category in ENTRIES)
    counting = Counting(real_embedder)
    with KnowledgeStore.open(path, counting) as store:
        status = store.status()
        assert (status["stored_model"], status["stored_dim"]) == (DEFAULT_MODEL_ID, 384)
        assert status["vectors"]["count"] == len(ENTRIES) and counting.texts == len(ENTRIES)
        query = "batch job crashes with out-of-memory errors while processing all bills"
        assert first(store.search(query, mode="vector")) == ENTRIES[2][0]
    counting.texts = 0
    with KnowledgeStore.open(path, counting) as store:  # persisted: nothing embedded again
        assert counting.texts == 0
        assert first(store.search(query, mode="vector")) == ENTRIES[2][0]


def test_default_embedder_is_used_when_none_is_given(data_dir: Path, real_embedder: Embedder) -> None:
    with KnowledgeStore.open(data_dir / "default.sqlite") as store:
        assert store.embedder is real_embedder  # the process-wide default, loaded once
        assert store.status()["model"] == DEFAULT_MODEL_ID
        store.add("The staging database is refreshed from production every Sunday")
        assert first(store.search("when is the test environment data copied?", mode="vector")).startswith(
            "The"
        )
