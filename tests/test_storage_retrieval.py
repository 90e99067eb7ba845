"""The retrieval engine's contract: one keyword ranker (``KeywordIndex``: numpy BM25 over FTS5's
postings, trigram and substring lists) ranks as FTS5 does, filters are exact, and
``hybrid_search`` reports each hit's ranks, match type and normalised score."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from memstrata.errors import InvalidInputError
from memstrata.storage import (
    Database,
    Filter,
    KeywordIndex,
    KeywordTable,
    SearchParams,
    VectorIndex,
    apply_migrations,
    fts_schema,
    hybrid_search,
    identifier_words,
    keyword_index,
    open_database,
    query_terms,
)
from tests._support import hybrid_docs
from tests.fakes import FakeEmbedder

WORDS = [
    "payment", "retry", "queue", "cache", "index", "vector", "keyword", "search", "ranking",
    "fusion", "agent", "memory", "parser", "token", "timeout", "deploy", "rollback", "schema",
    "migration", "lock",
]  # fmt: skip
EMBEDDER = FakeEmbedder(dim=16)
N = 120


def _migration(db: Database) -> None:
    db.execute(
        "CREATE TABLE docs (id INTEGER PRIMARY KEY, body TEXT NOT NULL, idwords TEXT NOT NULL, "
        "cat TEXT NOT NULL, at INTEGER NOT NULL)"
    )
    db.executescript(fts_schema("docs", ["body", "idwords"]))
    db.execute("CREATE VIRTUAL TABLE docs_ctx USING fts5(context)")


def _body(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(2, 10))))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Database, VectorIndex]]:
    db = open_database(tmp_path_factory.mktemp("retrieval") / "r.sqlite")
    apply_migrations(db, "retrieval-test", [_migration])
    vectors = VectorIndex(db, "docs", EMBEDDER.dim, metadata={"cat": "text"})
    rng = np.random.default_rng(11)
    bodies = [_body(rng) for _ in range(N)]
    bodies[7] = "東京大学 payment"  # CJK: trigram list
    bodies[8] = "東京 cache"  # a two-character run: substring list
    cats = [("a", "b", "c")[i % 3] for i in range(N)]
    with db.transaction():
        for i, (body, cat) in enumerate(zip(bodies, cats, strict=True), start=1):
            db.execute(
                "INSERT INTO docs(id, body, idwords, cat, at) VALUES (?, ?, ?, ?, ?)",
                (i, body, identifier_words(body), cat, 1000 + i),
            )
            if i % 4 == 0:  # every fourth row has a context of other words
                db.execute("INSERT INTO docs_ctx(rowid, context) VALUES (?, ?)", (i, _body(rng)))
        vectors.upsert_many(
            list(range(1, N + 1)), EMBEDDER.embed_documents(bodies), [{"cat": c} for c in cats]
        )
    yield db, vectors
    db.close()


def _fts5(db: Database, table: str, terms: list[str], weights: str = "") -> dict[int, float]:
    """FTS5's own bm25() (made positive) of every document matching one of ``terms``."""
    match = " OR ".join('"' + t + '"' for t in terms)
    rows = db.query(f"SELECT rowid, bm25({table}{weights}) FROM {table} WHERE {table} MATCH ?", (match,))
    return {int(r[0]): -float(r[1]) for r in rows}


def _ordered(scores: dict[int, float], limit: int) -> list[int]:
    return sorted(scores, key=lambda i: (-round(scores[i], 9), i))[:limit]


@pytest.mark.parametrize("text", ["payment retry", "vector search ranking", "the lock", "zzz"])
@pytest.mark.parametrize("weights", [(1.0, 1.0), (2.0, 0.5)])
def test_words_rank_as_fts5_bm25(
    corpus: tuple[Database, VectorIndex], text: str, weights: tuple[float, float]
) -> None:
    db, _ = corpus
    index = KeywordIndex(db, KeywordTable("docs", ("body", "idwords"), weights=weights))
    expected = _fts5(db, "docs_fts", query_terms(text), f", {weights[0]}, {weights[1]}")
    assert index.ranking(text, 30, Filter()) == _ordered(expected, 30)
    ((ids, scores),) = index.lists(text, 30, Filter()) if expected else ((np.array([]), np.array([])),)
    assert [round(float(s), 6) for s in scores] == [round(expected[int(i)], 6) for i in ids]


def test_context_adds_its_weighted_bm25(corpus: tuple[Database, VectorIndex]) -> None:
    db, _ = corpus
    spec = KeywordTable("docs", ("body", "idwords"), context=("docs_ctx", ("context",), 0.4))
    index = KeywordIndex(db, spec)
    terms = query_terms("retry cache")
    own = _fts5(db, "docs_fts", terms)
    context = _fts5(db, "docs_ctx", terms)
    expected = {i: own.get(i, 0.0) + 0.4 * context.get(i, 0.0) for i in {*own, *context}}
    ((ids, scores),) = index.lists("retry cache", N, Filter())
    assert ids.tolist() == _ordered(expected, N)
    assert scores.tolist() == pytest.approx([expected[int(i)] for i in ids])
    assert set(context) - set(own), "the corpus has rows found only through their context"


@pytest.mark.parametrize("text", ["payment deploy", "東京大学", "東京", "payment 東京"])
def test_filters_are_exact(corpus: tuple[Database, VectorIndex], text: str) -> None:
    db, _ = corpus
    index = keyword_index(db, "docs", ["body", "idwords"])
    flt = Filter("SELECT id FROM docs WHERE cat = ? AND at < ?", ("a", 1000 + N // 2))
    allowed = {int(r[0]) for r in db.query(flt.sql or "", flt.params)}
    for (ids, _), (all_ids, _) in zip(index.lists(text, N, flt), index.lists(text, N, Filter()), strict=True):
        assert ids.tolist() == [i for i in all_ids.tolist() if i in allowed]
    assert set(index.ranking(text, N, flt)) <= allowed


def test_cjk_lists(corpus: tuple[Database, VectorIndex]) -> None:
    db, _ = corpus
    index = keyword_index(db, "docs", ["body", "idwords"])
    assert index.ranking("東京大学", 5, Filter()) == [8]
    assert index.ranking("東京", 5, Filter()) == [9, 8]  # substring matches, newest id first


def test_ranks_match_type_and_score(corpus: tuple[Database, VectorIndex]) -> None:
    db, vectors = corpus
    text = "payment retry queue"
    hits = hybrid_docs(EMBEDDER, corpus, text, top_k=40, depth=40)
    vector_ids = [h.rowid for h in vectors.search(EMBEDDER.embed_query(text), 40)]
    keyword_ids = keyword_index(db, "docs", ["body", "idwords"]).ranking(text, 40, Filter())
    k, wv, wk = 5, 1.0, 1.25  # the default keyword weight of a query that is no question
    best = wv / (k + 1) + wk / (k + 1)
    kinds = set()
    for hit in hits:
        vrank = vector_ids.index(hit.id) + 1 if hit.id in vector_ids else None
        krank = keyword_ids.index(hit.id) + 1 if hit.id in keyword_ids else None
        assert (hit.vector_rank, hit.keyword_rank) == (vrank, krank)
        raw = (wv / (k + vrank) if vrank else 0.0) + (wk / (k + krank) if krank else 0.0)
        assert hit.score == pytest.approx(raw / best)
        expected_type = "hybrid" if vrank and krank else ("semantic" if vrank else "keyword")
        assert hit.match_type == expected_type
        assert hit.similarity is not None and -1.0 - 1e-5 <= hit.similarity <= 1.0 + 1e-5
        kinds.add(hit.match_type)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert kinds == {"hybrid", "semantic", "keyword"}


def test_an_exact_vector_filter_needs_no_id_list(corpus: tuple[Database, VectorIndex]) -> None:
    sql = Filter("SELECT id FROM docs WHERE cat = ?", ("b",), where={"cat": "b"})
    exact = Filter("SELECT id FROM docs WHERE cat = ?", ("b",), where={"cat": "b"}, where_is_exact=True)
    for mode in ("hybrid", "vector", "keyword"):
        assert hybrid_docs(EMBEDDER, corpus, "cache index", sql, mode=mode) == hybrid_docs(
            EMBEDDER, corpus, "cache index", exact, mode=mode
        )


def test_a_lazy_query_vector_is_asked_for_after_the_keywords(corpus: tuple[Database, VectorIndex]) -> None:
    db, vectors = corpus
    index = keyword_index(db, "docs", ["body", "idwords"])
    events: list[str] = []
    ranking = index.ranking

    def keywords(*args: object, **kwargs: object) -> list[int]:
        events.append("keywords")
        return ranking(*args, **kwargs)  # type: ignore[arg-type]

    def vector() -> np.ndarray | None:  # type: ignore[type-arg]
        events.append("vector")
        return EMBEDDER.embed_query("payment")

    index.ranking = keywords  # type: ignore[method-assign]
    try:
        hits = hybrid_search(
            db, keywords=index, vectors=vectors, query_vector=vector, query_text="payment",
            params=SearchParams(top_k=5), flt=Filter(),
        )  # fmt: skip
        assert events == ["keywords", "vector"]
        assert [h.id for h in hits] == [h.id for h in hybrid_docs(EMBEDDER, corpus, "payment", top_k=5)]
        # the model failed (None): a vector search answers by keywords rather than not at all
        failed = hybrid_search(
            db, keywords=index, vectors=vectors, query_vector=lambda: None, query_text="payment",
            params=SearchParams(top_k=5, mode="vector"), flt=Filter(),
        )  # fmt: skip
        assert failed and all(h.match_type == "keyword" for h in failed)
        assert [h.id for h in failed] == ranking("payment", 5, Filter())
    finally:
        del index.ranking


def test_writes_through_the_connection_are_seen(tmp_path: Path) -> None:
    db = open_database(tmp_path / "w.sqlite")
    apply_migrations(db, "retrieval-test", [_migration])
    index = keyword_index(db, "docs", ["body", "idwords"])
    assert index.ranking("zebra", 5, Filter()) == []
    db.execute("INSERT INTO docs(id, body, idwords, cat, at) VALUES (1, 'zebra crossing', '', 'a', 1)")
    assert index.ranking("zebra", 5, Filter()) == [1]
    index.ranking("crossing words never seen", 5, Filter())  # tokenising new words is no change
    assert index.bm25._postings, "postings stay cached across searches without writes"
    db.execute("DELETE FROM docs WHERE id = 1")
    assert index.ranking("zebra", 5, Filter()) == []
    db.close()


def test_episodic_search_takes_a_vector_computed_once(tmp_path: Path) -> None:
    from memstrata.layers import EpisodicMemory

    embedder = FakeEmbedder()
    with EpisodicMemory.open(tmp_path / "e.sqlite", embedder) as memory:
        memory.record_many([{"content": f"release {i} of the billing service"} for i in range(5)])
        memory.record("the zebra crossing was repainted", title="roads")
        vector = embedder.embed_query("zebra crossing")
        calls = embedder.calls
        given = memory.search("zebra crossing", query_vector=vector * 2.0, top_k=3)  # any length
        assert embedder.calls == calls  # the query was not embedded again
        assert [(h.episode.id, h.score) for h in given] == [
            (h.episode.id, h.score) for h in memory.search("zebra crossing", top_k=3)
        ]
        only_vector = memory.search("", query_vector=vector, mode="vector", top_k=1)
        assert [h.episode.content for h in only_vector] == ["the zebra crossing was repainted"]
        with pytest.raises(InvalidInputError, match="query_vector"):
            memory.search("zebra", query_vector=np.zeros(3))


def test_episode_keyword_caches_follow_every_write(tmp_path: Path) -> None:
    """Searches with warm caches after each kind of write rank as a store opened afresh."""
    from memstrata.layers import EpisodicMemory

    rng = np.random.default_rng(5)
    path = tmp_path / "e.sqlite"

    def same(memory: EpisodicMemory, text: str) -> None:
        with EpisodicMemory.open(path, FakeEmbedder()) as fresh:
            warm = [(h.episode.id, round(h.score, 9)) for h in memory.search(text, mode="keyword", top_k=20)]
            cold = [(h.episode.id, round(h.score, 9)) for h in fresh.search(text, mode="keyword", top_k=20)]
        assert warm == cold

    with EpisodicMemory.open(path, FakeEmbedder()) as memory:
        items = [{"content": _body(rng), "task_run_id": f"run-{i % 3}"} for i in range(40)]
        memory.record_many(items)
        same(memory, "payment retry")  # loads the caches
        memory.record("payment payment retry", task_run_id="run-1")
        same(memory, "payment retry")
        memory.delete(3)
        same(memory, "payment retry cache")
        archive = tmp_path / "a.sqlite"
        assert memory.archive(archive, task_run_id="run-0") > 0
        same(memory, "payment retry cache")
        assert memory.restore(archive) > 0
        same(memory, "payment retry cache")


def test_a_connections_keyword_index_goes_with_it(tmp_path: Path) -> None:
    import gc
    import weakref

    db = open_database(tmp_path / "g.sqlite")
    apply_migrations(db, "retrieval-test", [_migration])
    assert keyword_index(db, "docs", ["body", "idwords"]) is keyword_index(db, "docs", ["body", "idwords"])
    ref = weakref.ref(db)
    db.close()
    del db
    gc.collect()
    assert ref() is None


def test_a_word_of_several_tokens_matches_as_a_phrase(tmp_path: Path) -> None:
    """A word FTS5 splits ("rock'n'roll") is matched as a phrase; an English clitic after an
    apostrophe ("Caroline's", "don't") is left out of the query instead (its phrase cost 10-90 ms
    at 1M entries and told the search nothing)."""
    db = open_database(tmp_path / "p.sqlite")
    apply_migrations(db, "retrieval-test", [_migration])
    bodies = [
        "Caroline's dog barked at the mailman",
        "Caroline has a dog and a cat",
        "press the s key, Caroline",
        "the dog's bowl and Caroline's bowl; Caroline's cat",
        "nothing to see here",
        "rock'n'roll all night",
        "rock and roll, n is a letter",
    ]
    with db.transaction():
        for i, body in enumerate(bodies, start=1):
            db.execute(
                "INSERT INTO docs(id, body, idwords, cat, at) VALUES (?, ?, ?, 'a', ?)",
                (i, body, identifier_words(body), i),
            )
    index = KeywordIndex(db, KeywordTable("docs", ("body", "idwords"), weights=(1.0, 2.0)))
    for text in ["Caroline's dog", "don't dog's", "caroline", "rock'n'roll", "O'Brien’s rock'n'roll"]:
        expected = _fts5(db, "docs_fts", query_terms(text), ", 1.0, 2.0")
        ((ids, scores),) = index.lists(text, 10, Filter()) if expected else ((np.array([]), np.array([])),)
        assert ids.tolist() == _ordered(expected, 10), text
        assert scores.tolist() == pytest.approx([expected[int(i)] for i in ids])
    assert query_terms("Caroline’s DOG's don't we'll") == ["caroline", "dog", "don"]  # "we" a stop word
    assert query_terms("O'Brien's rock'n'roll") == ["o'brien", "rock'n'roll"]
    assert 7 not in index.ranking("rock'n'roll", 10, Filter())  # "rock", "n" and "roll" apart
    assert set(index.ranking("rock'n'roll", 10, Filter())) == {6}
    assert set(index.ranking("Caroline's", 10, Filter())) == {1, 2, 3, 4}
    db.close()
