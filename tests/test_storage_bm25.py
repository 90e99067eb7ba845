"""The knowledge store's numpy BM25 ranks exactly as FTS5's bm25() does, and its caches follow
every write (this connection's incrementally, another connection's by reloading)."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memstrata.layers import KnowledgeStore
from memstrata.storage import Bm25Index, _bm25, keyword_terms
from tests.fakes import FakeEmbedder

_WORDS_TEXT = """
    queue retry backoff payment invoice cache timeout database index migration lock table deploy
    rollback token session cookie login schema vector search ranking fusion kafka consumer producer
    partition offset latency throughput memory leak thread pool
"""
WORDS = _WORDS_TEXT.split()


def fts5_ranking(store: KnowledgeStore, terms: list[str], limit: int) -> list[int]:
    """FTS5's own ``ORDER BY bm25()`` for the same words (ties broken by id, as Bm25Index does)."""
    match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
    rows = store._db.query(
        "SELECT rowid, bm25(knowledge_fts, 1.0, 1.0, 1.0) FROM knowledge_fts WHERE knowledge_fts MATCH ?",
        (match,),
    )
    ordered = sorted(rows, key=lambda r: (float(f"{r[1]:.9g}"), r[0]))  # 9 significant digits
    return [int(r[0]) for r in ordered[:limit]]


def numpy_ranking(store: KnowledgeStore, terms: list[str], limit: int) -> list[int]:
    return store._bm25.search(terms, limit)


def fresh_ranking(store: KnowledgeStore, terms: list[str], limit: int) -> list[int]:
    """A new index on the same connection: nothing cached."""
    return Bm25Index(store._db, "knowledge_fts", ["content", "tag_text", "ident"], [1.0, 1.0, 1.0]).search(
        terms, limit
    )


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 25)))


@pytest.fixture
def store(data_dir: Path) -> Iterator[KnowledgeStore]:
    with KnowledgeStore.open(data_dir / "bm25.sqlite", FakeEmbedder()) as ks:
        yield ks


def test_ranking_matches_fts5(store: KnowledgeStore) -> None:
    rng = random.Random(5)
    store.add_many({"content": sentence(rng), "tags": {rng.choice(WORDS): ""}} for _ in range(300))
    for _ in range(40):
        terms = list(dict.fromkeys(rng.sample(WORDS, rng.randint(1, 5))))
        assert numpy_ranking(store, terms, 20) == fts5_ranking(store, terms, 20)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    docs=st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=12), min_size=1, max_size=40),
    query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=4, unique=True),
    deletes=st.lists(st.integers(min_value=0, max_value=39), max_size=5),
)
def test_ranking_matches_fts5_property(
    data_dir: Path, docs: list[list[str]], query: list[str], deletes: list[int]
) -> None:
    path = data_dir / f"prop-{random.getrandbits(64)}.sqlite"
    with KnowledgeStore.open(path, FakeEmbedder()) as ks:
        ids = ks.add_many({"content": " ".join(words) + f" doc{i}"} for i, words in enumerate(docs))
        numpy_ranking(ks, query, 10)  # cache postings before the deletes
        for index in deletes:
            if index < len(ids):
                ks.delete(ids[index])
        assert numpy_ranking(ks, query, 10) == fts5_ranking(ks, query, 10)


def test_caches_follow_this_connections_writes(store: KnowledgeStore) -> None:
    rng = random.Random(9)
    ids = store.add_many({"content": sentence(rng)} for _ in range(120))
    queries = [list(dict.fromkeys(rng.sample(WORDS, 3))) for _ in range(15)]

    def check() -> None:
        for terms in queries:
            assert (
                numpy_ranking(store, terms, 15)
                == fresh_ranking(store, terms, 15)
                == fts5_ranking(store, terms, 15)
            )

    check()  # postings of every query word are cached now
    store.add_many({"content": sentence(rng)} for _ in range(10))  # small: patched in place
    check()
    store.add_many({"content": sentence(rng)} for _ in range(300))  # large: cache dropped
    check()
    store.update(ids[3], content="queue queue queue retry")
    store.delete(ids[4])
    store.add(store.get(ids[5]).content, tags={"kafka": "lag"})  # type: ignore[union-attr]
    check()


def test_rolled_back_writes_leave_no_trace(store: KnowledgeStore) -> None:
    kept = store.add("kafka consumer lag")
    assert store.search("kafka", mode="keyword")
    with pytest.raises(RuntimeError), store._db.transaction():
        store.add("kafka producer retries")
        raise RuntimeError("abort")
    assert [h.entry.id for h in store.search("kafka", mode="keyword")] == [kept]
    assert numpy_ranking(store, ["kafka"], 5) == fts5_ranking(store, ["kafka"], 5) == [kept]


def test_query_words_are_stemmed_like_fts5(store: KnowledgeStore) -> None:
    entry = store.add("the migrations were running slowly")
    for query in ("migration", "running", "runs slow", "MIGRATING"):
        assert [h.entry.id for h in store.search(query, mode="keyword")] == [entry], query
    assert store._bm25.stems(keyword_terms("Migrations running")) == ["migrat", "run"]


def test_query_words_are_tokenized_once_for_every_index_of_the_same_tokenizer(
    store: KnowledgeStore, data_dir: Path
) -> None:
    """A word's stems depend on the tokenizer only: a second store does not tokenize the words
    the first one did, and an index with another tokenizer gets its own stems."""
    words = [f"running{uuid.uuid4().hex[:8]}", "migrations"]
    tokenized: list[list[str]] = []
    real = Bm25Index._query_units

    def counted(index: Bm25Index, terms: list[str]) -> list[tuple[str, ...]]:
        tokenized.append(list(terms))
        return real(index, terms)

    with mock.patch.object(Bm25Index, "_query_units", counted):
        porter = store._bm25.stems(words)
        with KnowledgeStore.open(data_dir / "other.sqlite", FakeEmbedder()) as other:
            assert other._bm25.stems(words) == porter
        assert tokenized in ([words], [words[:1]])  # "migrations" may be known from another test
        store._db.execute("CREATE VIRTUAL TABLE plain USING fts5(body, tokenize='unicode61')")
        plain = Bm25Index(store._db, "plain", ["body"], [1.0]).stems(words)
    assert tokenized[-1] == words
    assert plain == [w.lower() for w in words] != porter


def test_a_full_cache_of_query_words_starts_again_and_ranks_the_same(store: KnowledgeStore) -> None:
    rng = random.Random(6)
    store.add_many({"content": sentence(rng) + " don't"} for _ in range(100))
    # an empty cache: words other tests left in it would never be tokenized here, nor cleared
    with mock.patch.object(_bm25, "_MAX_CACHED_STEMS", 2), mock.patch.object(_bm25, "_UNITS", {}):
        for _ in range(20):
            terms = list(dict.fromkeys([*rng.sample(WORDS, rng.randint(2, 5)), "don't"]))
            assert numpy_ranking(store, terms, 10) == fts5_ranking(store, terms, 10)
            assert len(_bm25._units_of(store._bm25._tokenize_option)) <= len(terms)


def test_only_stop_words_still_search(store: KnowledgeStore) -> None:
    entry = store.add("what it is about")
    assert [h.entry.id for h in store.search("what is it", mode="keyword")] == [entry]


def test_scores_equal_fts5_bm25_with_long_columns(store: KnowledgeStore) -> None:
    """Columns of 128+ tokens have multi-byte lengths in FTS5's ``_docsize``: a wrong varint decode
    gives them huge lengths and sinks long entries; the scores must be FTS5's own to the digit."""
    rng = random.Random(11)
    lengths = [3, 20, 127, 128, 129, 208, 300, 1000, 16_384, 5]
    ids = store.add_many(
        {"content": " ".join(rng.choice(WORDS) for _ in range(n)), "tags": {"kafka": "queue"}}
        for n in lengths
    )
    for terms in (["queue"], ["kafka", "retry"], ["payment", "invoice", "lock"], ["thread"]):
        match = " OR ".join(f'"{t}"' for t in terms)
        sql = (
            "SELECT rowid, -bm25(knowledge_fts, 1.0, 1.0, 1.0) FROM knowledge_fts WHERE knowledge_fts MATCH ?"
        )
        rows = store._db.query(sql, (match,))
        expected = {int(r[0]): float(r[1]) for r in rows}
        got = dict(zip(ids, store._bm25.scores(terms, ids), strict=True))
        for rowid in ids:
            assert got[rowid] == pytest.approx(expected.get(rowid, 0.0), rel=1e-9, abs=1e-12), (terms, rowid)
        assert numpy_ranking(store, terms, 10) == fts5_ranking(store, terms, 10)


def test_weighted_columns_and_phrases_score_as_fts5(store: KnowledgeStore) -> None:
    """Column weights apply per occurrence, and a word FTS5 reads as a phrase ("don't") counts
    only its runs in order: the scores are FTS5's own ``bm25()`` with the same weights."""
    rng = random.Random(23)
    texts = [
        sentence(rng) + rng.choice(["", " don't panic", " do not panic", " panic don't"]) for _ in range(80)
    ]
    ids = store.add_many({"content": t, "tags": {rng.choice(WORDS): rng.choice(WORDS)}} for t in texts)
    weights = [1.0, 0.5, 2.0]
    index = Bm25Index(store._db, "knowledge_fts", ["content", "tag_text", "ident"], weights)
    for terms in (["queue", "retry"], ["don't", "panic"], ["kafka", "don't"], ["lock"]):
        match = " OR ".join(f'"{t}"' for t in terms)
        rows = store._db.query(
            "SELECT rowid, -bm25(knowledge_fts, 1.0, 0.5, 2.0) FROM knowledge_fts "
            "WHERE knowledge_fts MATCH ?",
            (match,),
        )
        expected = {int(r[0]): float(r[1]) for r in rows}
        assert expected, terms
        got = dict(zip(ids, index.scores(terms, ids), strict=True))
        for rowid in ids:
            assert got[rowid] == pytest.approx(expected.get(rowid, 0.0), rel=1e-9, abs=1e-12), (terms, rowid)


def test_a_full_postings_cache_drops_the_least_recently_used(
    store: KnowledgeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memstrata.storage import _bm25_postings

    rng = random.Random(29)
    store.add_many({"content": sentence(rng)} for _ in range(200))
    index = Bm25Index(store._db, "knowledge_fts", ["content", "tag_text", "ident"], [1.0, 1.0, 1.0])
    for word in ("queue", "retry", "cache"):  # a word alone is always read
        index.search([word], 10)
    sizes = {w: len(index._postings[index.stems([w])[0]][0]) for w in ("queue", "retry", "cache")}
    index.reset()
    # room for "queue" and either other word, not for all three
    monkeypatch.setattr(
        _bm25_postings, "_MAX_CACHED_POSTINGS", sizes["queue"] + max(sizes["retry"], sizes["cache"])
    )
    for terms in (["queue"], ["retry"], ["queue"], ["cache"]):  # "queue" used again: "retry" goes
        assert index.search(terms, 10) == fts5_ranking(store, terms, 10)
    cached = set(index._postings)
    assert index.stems(["queue"])[0] in cached and index.stems(["retry"])[0] not in cached
    assert index._cached == sum(len(p) for p, _ in index._postings.values())


def _varint(value: int) -> bytes:
    """SQLite's varint of ``value`` (below 2**56: seven bits a byte, big-endian)."""
    groups = [value & 0x7F]
    value >>= 7
    while value:
        groups.append(0x80 | (value & 0x7F))
        value >>= 7
    return bytes(reversed(groups))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(min_value=0, max_value=2**49), max_size=4), max_size=30))
def test_document_lengths_are_decoded_in_bulk_as_one_by_one(records: list[list[int]]) -> None:
    import numpy as np

    from memstrata.storage._bm25_postings import _varint_sum, _varint_sums

    blobs = [b"".join(_varint(v) for v in record) for record in records]
    assert all(_varint_sum(b) == sum(r) for b, r in zip(blobs, records, strict=True))
    lengths = np.asarray([len(b) for b in blobs], dtype=np.int64)
    got = _varint_sums(b"".join(blobs), lengths)
    assert got.tolist() == [float(sum(r)) for r in records]
