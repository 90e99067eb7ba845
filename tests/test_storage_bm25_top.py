"""The top-k BM25 search leaves out the commonest words' postings when they cannot change the
result, and still returns exactly FTS5's best documents with FTS5's scores."""

from __future__ import annotations

import itertools
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memstrata.layers import KnowledgeStore
from memstrata.storage import Bm25Index, Keep, _bm25_top
from memstrata.storage._bm25_top import top_scored
from tests.fakes import FakeEmbedder

COMMON = ["queue", "retry", "cache"]  # in most documents
RARE = ["kafka", "vector", "lock", "deploy", "token", "schema", "ranking", "offset"]
COLUMNS = ["content", "tag_text", "ident"]


def fts5_top(
    store: KnowledgeStore, terms: list[str], limit: int, weights: tuple[float, ...], allowed: set[int] | None
) -> list[tuple[int, float]]:
    """FTS5's own ``bm25()`` ranking (scores rounded to 1e-9, ties by id), restricted to ``allowed``."""
    match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
    marks = ", ".join(str(w) for w in weights)
    rows = store._db.query(
        f"SELECT rowid, -bm25(knowledge_fts, {marks}) FROM knowledge_fts WHERE knowledge_fts MATCH ?",
        (match,),
    )
    kept = [(int(r[0]), float(r[1])) for r in rows if allowed is None or int(r[0]) in allowed]
    return sorted(kept, key=lambda r: (-float(f"{r[1]:.9g}"), r[0]))[:limit]  # 9 significant digits


def document(rng: random.Random) -> dict[str, object]:
    words = [w for w in COMMON if rng.random() < 0.8]
    words += rng.sample(RARE, rng.randint(0, 2)) * rng.randint(1, 3)
    words += ["filler"] * rng.randint(0, 12)
    rng.shuffle(words)
    tags = {rng.choice(RARE + COMMON): rng.choice(COMMON)} if rng.random() < 0.3 else {}
    return {"content": " ".join(words) or "empty", "tags": tags}


@pytest.fixture
def store(data_dir: Path) -> Iterator[KnowledgeStore]:
    with KnowledgeStore.open(data_dir / "top.sqlite", FakeEmbedder()) as ks:
        yield ks


def check(
    index: Bm25Index,
    store: KnowledgeStore,
    terms: list[str],
    limit: int,
    weights: tuple[float, ...],
    allowed: set[int] | None = None,
) -> None:
    ids, scores = index.top(terms, limit, sorted(allowed) if allowed is not None else None)
    expected = fts5_top(store, terms, limit, weights, allowed)
    assert ids.tolist() == [i for i, _ in expected], terms
    assert scores.tolist() == pytest.approx([s for _, s in expected], rel=1e-9)


def skip_whenever_allowed() -> Any:
    """Leave words out whenever the bounds allow it (on a small store, reading them is cheaper)."""
    return mock.patch.multiple(_bm25_top, _TOKENIZE_COST=0, _COUNT_FROM=0)


def test_the_commonest_words_are_not_read_when_they_cannot_change_the_result(store: KnowledgeStore) -> None:
    rng = random.Random(3)
    store.add_many(document(rng) for _ in range(400))
    index = Bm25Index(store._db, "knowledge_fts", COLUMNS, [1.0, 1.0, 1.0])
    query = ["queue", "kafka", "lock"]
    with skip_whenever_allowed():
        check(index, store, query, 5, (1.0, 1.0, 1.0))
        assert "kafka" in index._postings and "lock" in index._postings
        assert "queue" not in index._postings  # scored for the few candidates from their text
        assert index._df["queue"] == store._db.scalar(
            "SELECT count(*) FROM knowledge_fts WHERE knowledge_fts MATCH 'queue'"
        )
        check(index, store, ["queue"], 5, (1.0, 1.0, 1.0))  # alone, it is read
        assert "queue" in index._postings
        check(index, store, query, 5, (1.0, 1.0, 1.0))  # now from its postings
    index.reset()
    check(index, store, query, 5, (1.0, 1.0, 1.0))
    assert "queue" in index._postings  # with the real costs, reading 300 postings is cheaper
    assert index._df == {}  # and in a small store every word is read, none counted apart


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    size=st.integers(min_value=1, max_value=120),
    query=st.lists(st.sampled_from(COMMON + RARE + ["don't"]), min_size=1, max_size=5, unique=True),
    limit=st.integers(min_value=1, max_value=20),
    weights=st.sampled_from([(1.0, 1.0, 1.0), (1.0, 0.5, 2.0)]),
    share=st.sampled_from([None, 0.1, 0.5]),
    deletes=st.integers(min_value=0, max_value=5),
    adds=st.integers(min_value=0, max_value=6),
    warm=st.booleans(),
    eager=st.booleans(),
)
def test_top_equals_fts5_property(
    data_dir: Path,
    seed: int,
    size: int,
    query: list[str],
    limit: int,
    weights: tuple[float, ...],
    share: float | None,
    deletes: int,
    adds: int,
    warm: bool,
    eager: bool,
) -> None:
    rng = random.Random(seed)
    path = data_dir / f"top-{uuid.uuid4().hex}.sqlite"  # a new store for every example
    with KnowledgeStore.open(path, FakeEmbedder()) as ks:
        docs = [document(rng) for _ in range(size)]
        for doc in docs[: size // 7]:
            doc["content"] = f"{doc['content']} don't panic"
        ids = ks.add_many(docs)
        index = Bm25Index(ks._db, "knowledge_fts", COLUMNS, list(weights), track_writes=True)
        if warm:
            index.top(query, limit)
            ks._bm25.top(query, limit)  # the store's own index: its cache is patched by writes
        ids += ks.add_many(document(rng) for _ in range(adds))
        for victim in rng.sample(ids, min(deletes, len(ids))):
            ks.delete(victim)
        allowed = None if share is None else {i for i in ids if rng.random() < share}
        with mock.patch.multiple(
            _bm25_top,
            _TOKENIZE_COST=0 if eager else _bm25_top._TOKENIZE_COST,
            _COUNT_FROM=0 if eager else _bm25_top._COUNT_FROM,
        ):
            check(index, ks, query, limit, weights, allowed)
            check(ks._bm25, ks, query, limit, (1.0, 1.0, 1.0), allowed)


@pytest.mark.parametrize("every", [2, 40, 700])
def test_a_mask_filter_and_an_id_filter_agree(store: KnowledgeStore, every: int) -> None:
    """A filter is asked about the best candidates first and about more only while fewer than
    ``limit`` of them pass (one id in 40: a second round; one in 700: none pass)."""
    rng = random.Random(11)
    ids = store.add_many(document(rng) for _ in range(700))
    index = Bm25Index(store._db, "knowledge_fts", COLUMNS, [1.0, 1.0, 1.0])
    kept = {i for i in ids if i % every == 0}
    asked: list[int] = []

    def keep(found: np.ndarray) -> np.ndarray:
        asked.append(len(found))
        return np.asarray(found % every == 0)

    query = ["queue", "retry", "deploy"]
    expected = [i for i, _ in fts5_top(store, query, 10, (1.0, 1.0, 1.0), kept)]
    for eager in (True, False):
        with mock.patch.multiple(
            _bm25_top,
            _TOKENIZE_COST=0 if eager else _bm25_top._TOKENIZE_COST,
            _COUNT_FROM=0 if eager else _bm25_top._COUNT_FROM,
        ):
            index.reset()
            asked.clear()
            assert index.top(query, 10, sorted(kept))[0].tolist() == expected
            assert index.top(query, 10, keep=Keep(keep))[0].tolist() == expected
            matched = len(fts5_top(store, query, 10_000, (1.0, 1.0, 1.0), None))
            assert sum(asked) <= matched  # each candidate asked about once at most
            if every == 2:
                assert sum(asked) < matched  # the best ones sufficed


def test_a_filter_asked_again_is_answered_from_its_mask_until_a_write(store: KnowledgeStore) -> None:
    """A named filter is asked as the words are scored the first time, over every document the
    second time in the same state, and not at all after that; a write starts over."""
    rng = random.Random(5)
    store.add_many(document(rng) for _ in range(300))
    documents = store.count()  # the same text twice is one entry
    index = store._bm25  # told of the store's writes: its caches follow them, not dropped
    asked: list[int] = []

    def allows(found: np.ndarray) -> np.ndarray:
        asked.append(len(found))
        return np.asarray(found % 3 == 0)

    keep = Keep(allows, key=("every third",))
    query = ["queue", "deploy", "token"]

    def expected() -> list[int]:
        kept = {int(row[0]) for row in store._db.query("SELECT id FROM knowledge") if int(row[0]) % 3 == 0}
        return [i for i, _ in fts5_top(store, query, 10, (1.0, 1.0, 1.0), kept)]

    rounds = []
    for _ in range(4):
        asked.clear()
        assert index.top(query, 10, keep=keep)[0].tolist() == expected()
        rounds.append(list(asked))
    assert 0 < sum(rounds[0]) < documents  # the best candidates only
    assert rounds[1] == [documents]  # every document, once
    assert rounds[2] == rounds[3] == []
    store.add_many(document(rng) for _ in range(30))  # a write through the same connection
    asked.clear()
    assert index.top(query, 10, keep=keep)[0].tolist() == expected()
    assert 0 < sum(asked) < documents
    unnamed = Keep(allows)  # without a key: asked every time
    for _ in range(3):
        asked.clear()
        assert index.top(query, 10, keep=unnamed)[0].tolist() == expected()
        assert 0 < sum(asked) < documents


@pytest.mark.parametrize("writer", ["same connection", "another connection"])
def test_a_category_search_repeated_follows_a_change_of_category(data_dir: Path, writer: str) -> None:
    """The mask a category filter keeps goes with any change to the store: an entry moved out
    of the category is no longer found in it, one moved in is."""
    path = data_dir / "moves.sqlite"
    embedder = FakeEmbedder()
    with KnowledgeStore.open(path, embedder) as ks:
        first = ks.add("kafka offset commit after the deploy", category="pitfall")
        second = ks.add("kafka offset reset on a new consumer", category="pattern")
        ks.add_many({"content": f"queue retry note {i}", "category": "pitfall"} for i in range(40))

        def found() -> set[int]:
            return {h.entry.id for h in ks.search("kafka offset", mode="keyword", category="pitfall")}

        for _ in range(3):
            assert first in found() and second not in found()
        if writer == "same connection":
            ks.update(first, category="pattern")
            ks.update(second, category="pitfall")
        else:
            with KnowledgeStore.open(path, embedder) as other:
                other.update(first, category="pattern")
                other.update(second, category="pitfall")
        for _ in range(3):
            assert second in found() and first not in found()


def test_top_scored_breaks_ties_by_lower_id() -> None:
    ids = np.array([9, 3, 5, 1], dtype=np.int64)
    scores = np.array([1.0, 2.0, 2.0, 0.5])
    assert top_scored(ids, scores, 2)[0].tolist() == [3, 5]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(min_value=1, max_value=30), st.sampled_from([0.5, 1.0, 2.0])), max_size=60
    ),
    st.booleans(),
)
def test_counts_by_document_equal_a_sorted_grouping(
    instances: list[tuple[int, float]], ordered: bool
) -> None:
    from memstrata.storage._bm25_postings import _sum_by_doc

    if ordered:
        instances = sorted(instances, key=lambda i: i[0])
    docs = np.asarray([d for d, _ in instances], dtype=np.int64)
    weights = np.asarray([w for _, w in instances], dtype=np.float64)
    ids, tf = _sum_by_doc(docs, weights)
    expected: dict[int, float] = {}
    for doc, weight in instances:
        expected[doc] = expected.get(doc, 0.0) + weight
    assert ids.tolist() == sorted(expected)
    assert tf.tolist() == pytest.approx([expected[d] for d in sorted(expected)])


@pytest.mark.parametrize("word", ["don't", 'it"s', "l'état", "a'b'c"])
def test_a_word_read_as_a_phrase_scores_as_fts5(store: KnowledgeStore, word: str) -> None:
    """A query word of several tokens is matched and scored by FTS5 as a phrase, quotes and
    accents included; only documents holding its tokens in order count."""
    rng = random.Random(41)
    tokens = word.replace('"', "'").split("'")
    texts = [" ".join(tokens), " ".join(reversed(tokens)), f"{word} {word} filler", "filler only"]
    store.add_many({"content": rng.choice(texts) + f" doc{i}"} for i in range(60))
    index = Bm25Index(store._db, "knowledge_fts", COLUMNS, [1.0, 0.5, 2.0])
    assert any("\x00" in stem for stem in index.stems([word]))
    check(index, store, [word, "filler"], 10, (1.0, 0.5, 2.0))
    check(index, store, [word], 10, (1.0, 0.5, 2.0))


def test_a_phrase_word_tokenized_by_another_store_scores_as_fts5(data_dir: Path) -> None:
    """Query words are tokenized once per process for every index of one tokenizer: a store
    that finds a phrase word already tokenized by another still matches it as a phrase."""
    word = f"don't{uuid.uuid4().hex[:8]}"
    rng = random.Random(43)
    texts = [word, f"{word} {word} filler", "don t", "filler only"]
    with (
        KnowledgeStore.open(data_dir / "first.sqlite", FakeEmbedder()) as first,
        KnowledgeStore.open(data_dir / "second.sqlite", FakeEmbedder()) as second,
    ):
        for store in (first, second):
            store.add_many({"content": rng.choice(texts) + f" doc{i}"} for i in range(40))
        assert any("\x00" in stem for stem in first._bm25.stems([word, "filler"]))
        index = Bm25Index(second._db, "knowledge_fts", COLUMNS, [1.0, 0.5, 2.0])
        with mock.patch.object(Bm25Index, "_query_units", side_effect=AssertionError("tokenized again")):
            check(index, second, [word, "filler"], 10, (1.0, 0.5, 2.0))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    start=st.integers(min_value=1, max_value=1000),
    size=st.integers(min_value=1, max_value=50),
    gaps=st.lists(st.integers(min_value=0, max_value=49), max_size=5),
    asked=st.lists(st.integers(min_value=-5, max_value=1100), max_size=30),
)
def test_positions_of_ids_with_and_without_gaps(
    store: KnowledgeStore, start: int, size: int, gaps: list[int], asked: list[int]
) -> None:
    """Ids without a gap are placed by arithmetic, others by bisection: both give each id's
    index among the known ids, -1 for an unknown one."""
    index = Bm25Index(store._db, "knowledge_fts", COLUMNS, [1.0, 1.0, 1.0])
    known = [start + i for i in range(size) if i not in set(gaps) or i == 0]
    index._ids = np.asarray(known, dtype=np.int64)
    got = index._positions(np.asarray(asked, dtype=np.int64)).tolist()
    assert got == [known.index(i) if i in known else -1 for i in asked]


def test_candidates_scored_in_growing_blocks_give_fts5s_answer(store: KnowledgeStore) -> None:
    """The words left out are added to the candidates in blocks that double in size: every
    candidate that could still reach the cut is scored, whichever block it falls in."""
    rng = random.Random(11)
    store.add_many(document(rng) for _ in range(400))
    rest = _bm25_top.Bm25Top._rest_scores
    blocks = []
    for query in itertools.combinations([*COMMON, *RARE], 3):
        index = Bm25Index(store._db, "knowledge_fts", COLUMNS, [1.0, 1.0, 1.0])
        with (
            skip_whenever_allowed(),
            mock.patch.object(_bm25_top, "_BLOCK", 1),
            mock.patch.object(_bm25_top.Bm25Top, "_rest_scores", autospec=True, side_effect=rest) as spy,
        ):
            check(index, store, list(query), 10, (1.0, 1.0, 1.0))
        blocks.append(spy.call_count)
    assert max(blocks) >= 4 and sum(b >= 3 for b in blocks) >= 20, blocks
