"""RRF and hybrid search: invariants checked with hypothesis on real SQLite + sqlite-vec."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memstrata.errors import InvalidInputError
from memstrata.storage import (
    DEFAULT_KEYWORD_WEIGHT,
    DEFAULT_RRF_K,
    PLAIN_RRF_K,
    Database,
    Filter,
    SearchParams,
    VectorIndex,
    apply_migrations,
    disable_vec_for_tests,
    fts_schema,
    fuse,
    fusion_weights,
    hybrid_search,
    identifier_words,
    match_type,
    open_database,
    rrf,
    validate_mode,
)
from tests._support import hybrid_docs
from tests.fakes import FakeEmbedder

# -- rrf --------------------------------------------------------------------------------------

ranked_lists = st.lists(st.lists(st.integers(0, 40), max_size=25, unique=True), min_size=1, max_size=4)
repeating_lists = st.lists(st.lists(st.integers(0, 40), max_size=25), min_size=1, max_size=4)


@given(ranked_lists, st.integers(0, 100))
def test_scores_are_normalised_and_sorted(lists: list[list[int]], k: int) -> None:
    fused = rrf(lists, k=k)
    assert {f.key for f in fused} == {key for keys in lists for key in keys}
    scores = [f.score for f in fused]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 < s <= 1.0 + 1e-12 for s in scores)
    for f in fused:
        for keys, rank in zip(lists, f.ranks, strict=True):
            assert (rank is None) == (f.key not in keys)
            if rank is not None:
                assert keys[rank - 1] == f.key


@given(ranked_lists, st.integers(0, 100), st.integers(0, 30))
def test_a_limit_keeps_the_first_results_as_they_are(lists: list[list[int]], k: int, limit: int) -> None:
    assert rrf(lists, k=k, limit=limit) == rrf(lists, k=k)[:limit]


@given(ranked_lists, st.integers(0, 100))
def test_rank_one_everywhere_scores_one(lists: list[list[int]], k: int) -> None:
    lists = [[999, *(key for key in keys if key != 999)] for keys in lists]
    fused = rrf(lists, k=k)
    assert fused[0].key == 999 and fused[0].score == pytest.approx(1.0)


@given(ranked_lists, st.integers(0, 100), st.lists(st.floats(0.01, 10), min_size=4, max_size=4))
def test_dominating_ranks_score_strictly_higher(lists: list[list[int]], k: int, weights: list[float]) -> None:
    """A doc ranked at least as well in every list (and found in more) outranks the other."""
    fused = rrf(lists, k=k, weights=weights[: len(lists)])
    for a in fused:
        for b in fused:
            if a.key == b.key:
                continue
            pairs = list(zip(a.ranks, b.ranks, strict=True))
            no_worse = all(rb is None or (ra is not None and ra <= rb) for ra, rb in pairs)
            strictly = any(ra is not None and (rb is None or ra < rb) for ra, rb in pairs)
            if no_worse and strictly:
                assert a.score > b.score, (a, b)


@given(st.integers(1, 30), st.integers(0, 100))
def test_both_lists_outrank_one_list_at_the_same_ranks(rank: int, k: int) -> None:
    filler = list(range(100, 100 + rank - 1))
    vector = [*filler, 1, 2]  # doc 1 and doc 2 share ranks in the vector list
    keyword = [*filler, 1]  # only doc 1 is found by keywords too
    fused = {f.key: f for f in rrf([vector, keyword], k=k)}
    assert fused[1].score > fused[2].score


def test_formula_and_weights() -> None:
    fused = rrf([[1, 2], [2]], k=60)
    best = 2 / 61
    assert fused[0].key == 2 and fused[0].score == pytest.approx((1 / 62 + 1 / 61) / best)
    assert fused[1].key == 1 and fused[1].score == pytest.approx((1 / 61) / best)
    assert [f.key for f in rrf([[1, 2], [2, 1]], weights=[3.0, 1.0])] == [1, 2]
    assert [f.key for f in rrf([[1, 2], [2, 1]], weights=[1.0, 3.0])] == [2, 1]
    assert [f.key for f in rrf([[1, 2], [2, 1]], weights=[0.0, 1.0])] == [2, 1]
    only = rrf([[5, 6]], weights=[2.5])
    assert only[0].score == pytest.approx(1.0)


def test_ties_keep_first_appearance_and_duplicates_count_once() -> None:
    assert [f.key for f in rrf([[1], [2]])] == [1, 2]
    fused = rrf([[7, 7, 8]])
    assert [(f.key, f.ranks) for f in fused] == [(7, (1,)), (8, (3,))]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"k": -1}, "k must be"),
        ({"weights": [1.0]}, "weights has 1 values for 2 lists"),
        ({"weights": [1.0, -1.0]}, "weights must be finite"),
        ({"weights": [1.0, float("nan")]}, "weights must be finite"),
    ],
)
def test_rrf_rejects_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        rrf([[1], [2]], **kwargs)  # type: ignore[arg-type]


def test_match_type_and_mode() -> None:
    assert match_type(1, 2) == "hybrid"
    assert match_type(1, None) == "semantic"
    assert match_type(None, 3) == "keyword"
    assert validate_mode("keyword") == "keyword"
    with pytest.raises(InvalidInputError, match="mode must be one of"):
        validate_mode("fuzzy")


def test_default_fusion_does_not_bury_a_keyword_first_hit() -> None:
    """With a weak vector list, a turn found in both lists far down must not outrank keyword's
    rank-1 hit missing from the vector list (plain RRF k=60 does exactly that)."""
    vector = [*range(100, 148), 7, 8]  # the shared turn 7 is 49th by vectors
    keyword = [1, *range(200, 240), 7]  # turn 1 is keyword's best; turn 7 is 42nd
    weights = [1.0, DEFAULT_KEYWORD_WEIGHT]
    tuned = [f.key for f in rrf([vector, keyword], k=DEFAULT_RRF_K, weights=weights)]
    assert tuned.index(1) < tuned.index(7)
    assert tuned[0] == 1  # keyword's best beats vector's best: the keyword list weighs more
    plain = [f.key for f in rrf([vector, keyword], k=PLAIN_RRF_K)]
    assert plain[0] == 7  # the textbook fusion, still selectable, buries it


@given(repeating_lists, st.integers(0, 100), st.lists(st.floats(0.0, 5), min_size=4, max_size=4))
def test_fuse_on_arrays_equals_rrf(lists: list[list[int]], k: int, weights: list[float]) -> None:
    """One fusion: the numpy form the episodic store uses gives the same keys, scores (to the
    bit) and ranks as the plain one the other searches use."""
    weights = weights[: len(lists)]
    expected = rrf(lists, k=k, weights=weights)
    arrays = fuse([np.array(keys, dtype=np.int64) for keys in lists], weights, k)
    order = arrays.order()
    assert [int(arrays.keys[n]) for n in order] == [f.key for f in expected]
    assert [min(1.0, float(arrays.scores[n])) for n in order] == [f.score for f in expected]
    for n, f in zip(order, expected, strict=True):
        assert tuple(int(r[n]) or None for r in arrays.ranks) == f.ranks


def test_score_is_monotonic_in_rank_and_bounded() -> None:
    """A threshold on the score means something: it only falls as a rank worsens, 1.0 at best."""
    keyword = list(range(1, 51))
    vector = list(range(50, 0, -1))
    for k, w in ((DEFAULT_RRF_K, DEFAULT_KEYWORD_WEIGHT), (PLAIN_RRF_K, 1.0)):
        alone = {f.key: f.score for f in rrf([[], keyword], k=k, weights=[1.0, w])}
        scores = [alone[key] for key in keyword]
        assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)
        assert all(0.0 < s <= 1.0 for s in scores)
        both = rrf([vector, keyword], k=k, weights=[1.0, w])
        assert all(0.0 < f.score <= 1.0 for f in both)
        assert rrf([[5], [5]], k=k, weights=[1.0, w])[0].score == pytest.approx(1.0)


# -- hybrid_search ----------------------------------------------------------------------------

WORDS = [
    "payment", "module", "refactor", "strategy", "pattern", "circular", "dependency", "interface",
    "database", "index", "migration", "cache", "embedding", "vector", "keyword", "search", "ranking",
    "fusion", "agent", "memory", "pitfall", "outcome", "parser", "token", "chunk", "file", "watcher",
    "actor", "supervisor", "timeout", "retry",
]  # fmt: skip
EMBEDDER = FakeEmbedder(dim=32)


def _migration(db: Database) -> None:
    db.execute(
        "CREATE TABLE docs (id INTEGER PRIMARY KEY, body TEXT NOT NULL, idwords TEXT NOT NULL, "
        "cat TEXT NOT NULL)"
    )
    db.executescript(fts_schema("docs", ["body", "idwords"]))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Database, VectorIndex]]:
    path: Path = tmp_path_factory.mktemp("hybrid") / "h.sqlite"
    db = open_database(path)
    apply_migrations(db, "hybrid-test", [_migration])
    vectors = VectorIndex(db, "docs", EMBEDDER.dim, metadata={"cat": "text"})
    rng = np.random.default_rng(3)
    bodies = [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 9)))) for _ in range(150)]
    cats = [("a", "b", "c")[i % 3] for i in range(150)]
    with db.transaction():
        for i, (body, cat) in enumerate(zip(bodies, cats, strict=True), start=1):
            db.execute(
                "INSERT INTO docs(id, body, idwords, cat) VALUES (?, ?, ?, ?)",
                (i, body, identifier_words(body), cat),
            )
        vectors.upsert_many(list(range(1, 151)), EMBEDDER.embed_documents(bodies), [{"cat": c} for c in cats])
    yield db, vectors
    db.close()


query_texts = st.lists(
    st.sampled_from([*WORDS, "zzz", "the", "🎉", "NEAR(", '"']), min_size=1, max_size=5
).map(" ".join)
SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SETTINGS
@given(
    query_texts,
    st.sampled_from(["hybrid", "vector", "keyword"]),
    st.integers(5, 60),
    st.floats(0.1, 3),
    st.floats(0.1, 3),
)
def test_top_k_one_is_the_top_of_top_k_five(
    corpus: tuple[Database, VectorIndex], text: str, mode: str, depth: int, vw: float, kw: float
) -> None:
    params: dict[str, Any] = {"mode": mode, "depth": depth, "vector_weight": vw, "keyword_weight": kw}
    one = hybrid_docs(EMBEDDER, corpus, text, top_k=1, **params)
    five = hybrid_docs(EMBEDDER, corpus, text, top_k=5, **params)
    assert [h.id for h in one] == [h.id for h in five[:1]]
    assert [h.id for h in hybrid_docs(EMBEDDER, corpus, text, top_k=3, **params)] == [h.id for h in five[:3]]


@SETTINGS
@given(query_texts, st.sampled_from(["hybrid", "vector", "keyword"]))
def test_hits_are_consistent(corpus: tuple[Database, VectorIndex], text: str, mode: str) -> None:
    hits = hybrid_docs(EMBEDDER, corpus, text, top_k=20, mode=mode)
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)
    assert len({h.id for h in hits}) == len(hits)
    for hit in hits:
        assert 0.0 < hit.score <= 1.0 + 1e-12
        assert hit.match_type == match_type(hit.vector_rank, hit.keyword_rank)
        assert hit.similarity is not None and -1.0 <= hit.similarity <= 1.0 + 1e-6
        if mode == "vector":
            assert hit.keyword_rank is None
        if mode == "keyword":
            assert hit.vector_rank is None


@SETTINGS
@given(query_texts, st.sampled_from(["vector", "keyword", "hybrid"]))
def test_filter_is_exact(corpus: tuple[Database, VectorIndex], text: str, mode: str) -> None:
    """Filtered lists are the unfiltered ranking restricted to allowed ids: nothing lost to over-fetch."""
    flt = Filter(sql="SELECT id FROM docs WHERE cat = ?", params=("b",), where={"cat": "b"})
    hits = hybrid_docs(EMBEDDER, corpus, text, flt=flt, top_k=20, mode=mode)
    db, _ = corpus
    allowed = {r[0] for r in db.query("SELECT id FROM docs WHERE cat = 'b'")}
    assert {h.id for h in hits} <= allowed
    if mode != "hybrid":
        everything = hybrid_docs(EMBEDDER, corpus, text, top_k=150, depth=150, mode=mode)
        assert [h.id for h in hits] == [h.id for h in everything if h.id in allowed][:20]


def test_best_in_both_lists_scores_one(tmp_path: Path) -> None:
    db = open_database(tmp_path / "h.sqlite")
    apply_migrations(db, "hybrid-test", [_migration])
    vectors = VectorIndex(db, "docs", EMBEDDER.dim, metadata={"cat": "text"})
    bodies = ["payment module refactor", "database index migration", "agent memory pitfall"]
    for i, body in enumerate(bodies, start=1):
        db.execute("INSERT INTO docs(id, body, idwords, cat) VALUES (?, ?, '', 'a')", (i, body))
    vectors.upsert_many([1, 2, 3], EMBEDDER.embed_documents(bodies), [{"cat": "a"}] * 3)
    hits = hybrid_docs(EMBEDDER, (db, vectors), "payment module refactor", top_k=3)
    assert hits[0].id == 1 and hits[0].score == pytest.approx(1.0) and hits[0].match_type == "hybrid"
    assert hits[0].vector_rank == 1 and hits[0].keyword_rank == 1
    assert hits[0].similarity == pytest.approx(1.0, abs=1e-5)
    # no keyword term in the query: the vector list alone is the best possible
    only_vector = hybrid_docs(EMBEDDER, (db, vectors), "🎉", top_k=1)
    assert only_vector[0].score == pytest.approx(1.0) and only_vector[0].match_type == "semantic"
    db.close()


def test_min_similarity_never_drops_keyword_hits(corpus: tuple[Database, VectorIndex]) -> None:
    hits = hybrid_docs(EMBEDDER, corpus, "payment", top_k=50, min_similarity=0.99)
    assert hits and all(h.keyword_rank is not None for h in hits)
    assert all(h.vector_rank is None or (h.similarity or 0) >= 0.99 for h in hits)
    keyword_hits = hybrid_docs(EMBEDDER, corpus, "payment", top_k=200, mode="keyword")
    everything = hybrid_docs(EMBEDDER, corpus, "payment", top_k=200, min_similarity=0.99)
    assert {h.id for h in keyword_hits} <= {h.id for h in everything}


def test_keyword_only_without_vectors(corpus: tuple[Database, VectorIndex]) -> None:
    db, _ = corpus
    hits = hybrid_search(
        db,
        table="docs",
        columns=["body", "idwords"],
        vectors=None,
        query_vector=None,
        query_text="payment module",
        params=SearchParams(top_k=5),
        flt=Filter(),
    )
    assert hits and all(h.match_type == "keyword" and h.similarity is None for h in hits)
    assert hits[0].score == pytest.approx(1.0)


def test_unavailable_vector_index_falls_back_to_keywords(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    db = open_database(path)
    apply_migrations(db, "hybrid-test", [_migration])
    vectors = VectorIndex(db, "docs", EMBEDDER.dim, metadata={"cat": "text"})
    db.execute("INSERT INTO docs(id, body, idwords, cat) VALUES (1, 'payment module', '', 'a')")
    vectors.upsert(1, EMBEDDER.embed_query("payment module"), {"cat": "a"})
    db.close()
    disable_vec_for_tests(True)
    try:
        db = open_database(path)
        vectors = VectorIndex(db, "docs", EMBEDDER.dim, metadata={"cat": "text"})
        assert not vectors.available
        hits = hybrid_docs(EMBEDDER, (db, vectors), "payment", top_k=5)
        assert [(h.id, h.match_type, h.similarity) for h in hits] == [(1, "keyword", None)]
        db.close()
    finally:
        disable_vec_for_tests(False)


def test_weights_shift_the_balance(corpus: tuple[Database, VectorIndex]) -> None:
    text = "payment cache"
    keyword_heavy = hybrid_docs(EMBEDDER, corpus, text, top_k=1, vector_weight=0.01, keyword_weight=1.0)
    vector_heavy = hybrid_docs(EMBEDDER, corpus, text, top_k=1, vector_weight=1.0, keyword_weight=0.01)
    assert keyword_heavy[0].keyword_rank == 1
    assert vector_heavy[0].vector_rank == 1


def test_bad_mode_and_zero_top_k(corpus: tuple[Database, VectorIndex]) -> None:
    assert hybrid_docs(EMBEDDER, corpus, "payment", top_k=0) == []
    with pytest.raises(InvalidInputError, match="mode"):
        hybrid_docs(EMBEDDER, corpus, "payment", mode="fuzzy")


def test_plain_rrf_is_selectable_in_hybrid_search(corpus: tuple[Database, VectorIndex]) -> None:
    """The search parameters pick the fusion: textbook RRF (k=60, equal weights) and the
    default give the scores of :func:`rrf` on the same two lists."""
    text = "payment cache retry"
    vector = [h.id for h in hybrid_docs(EMBEDDER, corpus, text, top_k=50, mode="vector")]
    keyword = [h.id for h in hybrid_docs(EMBEDDER, corpus, text, top_k=50, mode="keyword")]
    for k, w in ((PLAIN_RRF_K, 1.0), (DEFAULT_RRF_K, DEFAULT_KEYWORD_WEIGHT)):
        hits = hybrid_docs(EMBEDDER, corpus, text, top_k=10, rrf_k=k, keyword_weight=w)
        # the default fusion adapts the keyword weight to the query (a statement here)
        weights = fusion_weights(True, True, 1.0, w, query=text, k=k)
        expected = rrf([vector, keyword], k=k, weights=weights)[:10]
        assert [(h.id, h.vector_rank, h.keyword_rank) for h in hits] == [(f.key, *f.ranks) for f in expected]
        assert [h.score for h in hits] == pytest.approx([f.score for f in expected])
    assert SearchParams().rrf_k == DEFAULT_RRF_K and SearchParams().keyword_weight == DEFAULT_KEYWORD_WEIGHT
