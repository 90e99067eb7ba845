"""A large index keeps every posting in its index file: written at close (also by a process that
only wrote), mapped by the next one, each word checked when first used; rankings stay exactly
FTS5's, through writes of this connection and of others, and a damaged word is refused."""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstrata.layers import KnowledgeStore
from memstrata.storage import Bm25Index, _bm25_file, _bm25_postings, _bm25_top, _bm25_writes, _index_files
from memstrata.storage._bm25_formula import (
    contribution,
    contribution_into,
    length_norms,
    length_norms_into,
    normed_contribution,
)
from memstrata.storage._bm25_stems import STEM_ARRAYS, StemTable
from tests.fakes import FakeEmbedder
from tests.test_storage_bm25_top import COLUMNS, COMMON, RARE, check, document, skip_whenever_allowed

QUERIES = [["queue"], ["queue", "kafka", "lock"], ["retry", "cache", "deploy"], RARE[:4], [*COMMON, "token"]]


@pytest.fixture(autouse=True)
def complete_from_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small stores count as large: their file holds every posting."""
    monkeypatch.setattr(_index_files, "MIN_ROWS", 1)
    monkeypatch.setattr(_bm25_file, "_COMPLETE_FROM", 50)


def _build(path: Path, n: int = 300, seed: int = 5) -> list[int]:
    rng = random.Random(seed)
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        return store.add_many(document(rng) for _ in range(n))


def _file(path: Path) -> Path:
    return path.with_name(path.name + ".index") / "bm25-knowledge_fts"


@pytest.fixture
def path(data_dir: Path) -> Path:
    p = data_dir / "complete.sqlite"
    _build(p)
    return p


@pytest.fixture
def store(path: Path) -> Iterator[KnowledgeStore]:
    with KnowledgeStore.open(path, FakeEmbedder()) as ks:
        yield ks


def _fts5_index(store: KnowledgeStore) -> Bm25Index:
    """An index of the same table that never uses the file (reads FTS5 word by word)."""
    index = Bm25Index(store._db, "knowledge_fts", COLUMNS, [1.0, 1.0, 1.0])
    index._load_file = lambda: False  # type: ignore[method-assign]
    return index


def test_a_store_that_was_only_written_leaves_every_posting_at_close(
    path: Path, store: KnowledgeStore
) -> None:
    assert _file(path).exists()
    index = store._bm25
    index.search(["queue"], 5)
    status = index.files_status()
    assert status["loaded"] == 1 and status["complete"] and status["rejected"] == 0
    # words are taken from the map when used, not all at open
    assert list(index._postings) == index.stems(["queue"])
    assert len(index._mapped) == int(store._db.scalar("SELECT count(*) FROM temp.knowledge_fts_rows"))
    for query in QUERIES:
        for limit in (1, 5, 50):
            check(index, store, query, limit, (1.0, 1.0, 1.0))


def test_the_map_and_fts5_give_the_same_bits(store: KnowledgeStore) -> None:
    mapped, direct = store._bm25, _fts5_index(store)
    ids = [int(r[0]) for r in store._db.query("SELECT id FROM knowledge")]
    allowed = sorted(ids[::3])
    for query in QUERIES:
        for limit, only in ((5, None), (50, None), (10, allowed), (400, None)):
            a, b = mapped.top(query, limit, only), direct.top(query, limit, only)
            assert a[0].tolist() == b[0].tolist()
            assert a[1].tolist() == b[1].tolist()  # not approximately: the same floats
    assert mapped.files_status()["complete"] and direct.files_loaded == 0


def test_writes_of_this_connection_and_of_others_stay_exact(path: Path) -> None:
    rng = random.Random(8)
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        index = store._bm25
        for query in QUERIES:
            index.top(query, 10)  # words taken from the map, their contributions kept
        assert index._mapped
        added = store.add_many(document(rng) for _ in range(4))
        # the map stays in use, the new documents' postings kept beside it: nothing read from FTS5
        assert index._mapped and index._map_added
        for query in QUERIES:
            check(index, store, query, 10, (1.0, 1.0, 1.0))
        assert index._read == 0
        store.delete(added[0])
        store.update(added[1], content="queue queue kafka kafka kafka lock")
        for query in QUERIES:
            check(index, store, query, 10, (1.0, 1.0, 1.0))
    # the close wrote the file again for the index as it is now
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        index = store._bm25
        for query in QUERIES:
            check(index, store, query, 10, (1.0, 1.0, 1.0))
        assert index.files_loaded == 1 and index.files_status()["complete"]
        with KnowledgeStore.open(path, FakeEmbedder()) as other:  # another connection writes
            other.add_many({"content": "queue kafka kafka deploy"} for _ in range(3))
        for query in QUERIES:
            check(index, store, query, 10, (1.0, 1.0, 1.0))
        # the other connection only wrote: it left the complete file of the earlier state
        assert index.files_loaded == 1 and not index._mapped
    with KnowledgeStore.open(path, FakeEmbedder()) as store:  # the searching one rewrote it
        for query in QUERIES:
            check(store._bm25, store, query, 10, (1.0, 1.0, 1.0))
        assert store._bm25.files_loaded == 1 and store._bm25._mapped


def test_the_map_and_fts5_give_the_same_bits_after_this_connections_writes(path: Path) -> None:
    rng = random.Random(11)
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        mapped = store._bm25
        mapped.top(QUERIES[0], 10)  # one word cached as a view of the file, the rest still mapped
        added = store.add_many(document(rng) for _ in range(6))
        store.add("queue kafka kafka lock filler")
        store.delete(added[2])
        direct = _fts5_index(store)
        for query in QUERIES:
            for limit in (3, 10, 400):
                a, b = mapped.top(query, limit), direct.top(query, limit)
                assert a[0].tolist() == b[0].tolist()
                assert a[1].tolist() == b[1].tolist()
        assert mapped._mapped and mapped._read == 0 and direct.files_loaded == 0
        # a word first taken from the map after the writes holds its added documents too
        word = next(s for s in mapped._map_added if s not in mapped._postings)
        assert mapped._doc_count(word) == direct._doc_count(word)


def test_a_map_far_behind_its_writes_is_dropped_and_words_read_from_fts5(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_bm25_writes, "_MAX_MAP_ADDED", 60)
    rng = random.Random(12)
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        index = store._bm25
        index.top(["queue"], 10)
        store.add("queue kafka lock")
        assert index._mapped and 0 < index._map_added_count <= 60
        store.add_many(document(rng) for _ in range(8))
        assert not index._mapped and not index._map_added and index._map_added_count == 0
        for query in QUERIES:
            check(index, store, query, 10, (1.0, 1.0, 1.0))
        assert index._read > 0


def _rewrite(path: Path, change: str) -> None:
    """The file with one word's postings changed, its header and small arrays intact."""
    found = _index_files.read_index(path)
    assert found is not None
    arrays = {name: np.array(array) for name, array in found.arrays.items()}
    table = StemTable.of(found.arrays)
    assert table is not None
    word = table.get("queue")
    assert word is not None
    start, end = int(arrays["offsets"][word]), int(arrays["offsets"][word + 1])
    assert end - start >= 2
    if change == "order":
        arrays["positions"][[start, start + 1]] = arrays["positions"][[start + 1, start]]
    elif change == "count":
        arrays["tf"][start] += 1  # a plausible count, caught by the word's checksum
    elif change == "document":  # another document, order kept: caught by the word's checksum
        gap = int(np.flatnonzero(np.diff(arrays["positions"][start:end]) > 1)[0])
        arrays["positions"][start + gap + 1] = arrays["positions"][start + gap] + 1
    else:
        arrays["positions"][start] = -3
    assert _index_files.write_index(path, found.meta, arrays)


@pytest.mark.parametrize("change", ["order", "count", "document", "range"])
def test_a_damaged_word_is_refused_with_a_warning_and_read_from_fts5(
    path: Path, caplog: pytest.LogCaptureFixture, change: str
) -> None:
    _rewrite(_file(path), change)
    with (
        caplog.at_level(logging.WARNING, logger="memstrata.storage"),
        KnowledgeStore.open(path, FakeEmbedder()) as store,
    ):
        index = store._bm25
        check(index, store, ["kafka"], 10, (1.0, 1.0, 1.0))  # an intact word: from the map
        assert index._mapped and index.files_rejected == 0
        for query in QUERIES:
            check(index, store, query, 10, (1.0, 1.0, 1.0))
        assert index.files_rejected == 1 and not index._mapped
    assert any("damaged" in r.getMessage() for r in caplog.records)
    with KnowledgeStore.open(path, FakeEmbedder()) as store:  # written again at that close
        check(store._bm25, store, ["queue", "kafka"], 10, (1.0, 1.0, 1.0))
        assert store._bm25.files_status()["complete"] and store._bm25.files_rejected == 0


def test_an_index_below_the_size_keeps_only_the_words_it_read(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_bm25_file, "_COMPLETE_FROM", 10_000)
    monkeypatch.setattr(_bm25_file, "_BULK_SHARE", 2.0)  # no load counts as a bulk load
    p = data_dir / "small.sqlite"
    _build(p)
    assert not _file(p).exists()  # never searched, not large: nothing to keep
    with KnowledgeStore.open(p, FakeEmbedder()) as store:
        store._bm25.search(["queue"], 5)
    with KnowledgeStore.open(p, FakeEmbedder()) as store:
        store._bm25.search(["queue"], 5)
        assert store._bm25.files_loaded == 1 and not store._bm25.files_status()["complete"]
        assert list(store._bm25._postings) == store._bm25.stems(["queue"])


def test_a_bulk_load_below_the_size_leaves_every_posting(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection that added half the index or more writes the complete file at its close,
    also over a complete file of an earlier state though it never searched; a process that used
    the complete file keeps it so (also after writing); one that found it out of date keeps the
    words it read instead."""
    monkeypatch.setattr(_bm25_file, "_COMPLETE_FROM", 10_000)
    p = data_dir / "bulk.sqlite"
    _build(p)  # 300 documents in one load
    with KnowledgeStore.open(p, FakeEmbedder()) as store:
        for query in QUERIES:
            check(store._bm25, store, query, 10, (1.0, 1.0, 1.0))
        assert store._bm25.files_loaded == 1 and store._bm25.files_status()["complete"]
        assert store._bm25._read == 0  # no word read from FTS5
    with KnowledgeStore.open(p, FakeEmbedder()) as store:  # a searcher left the complete file
        check(store._bm25, store, ["queue"], 10, (1.0, 1.0, 1.0))
        assert store._bm25.files_loaded == 1 and store._bm25.files_status()["complete"]
    with KnowledgeStore.open(p, FakeEmbedder()) as store:
        store.add("retry cache deploy")  # only wrote: the file is now of an earlier state
    rng = random.Random(9)
    with KnowledgeStore.open(p, FakeEmbedder()) as store:
        store.add_many(document(rng) for _ in range(400))  # 400 of 701: a bulk load
    with KnowledgeStore.open(p, FakeEmbedder()) as store:
        for query in QUERIES:
            check(store._bm25, store, query, 10, (1.0, 1.0, 1.0))
        assert store._bm25.files_loaded == 1 and store._bm25.files_status()["complete"]
        store.add_many({"content": f"queue kafka lock {i}", "category": "pattern"} for i in range(5))
        check(store._bm25, store, ["queue", "kafka"], 10, (1.0, 1.0, 1.0))
    with KnowledgeStore.open(p, FakeEmbedder()) as store:  # used the complete file: kept it so
        check(store._bm25, store, ["queue", "kafka"], 10, (1.0, 1.0, 1.0))
        assert store._bm25.files_loaded == 1 and store._bm25.files_status()["complete"]
    with KnowledgeStore.open(p, FakeEmbedder()) as store:
        store.add("retry lock")  # only wrote: out of date again
    with KnowledgeStore.open(p, FakeEmbedder()) as store:  # found it out of date: the words read
        check(store._bm25, store, ["queue"], 10, (1.0, 1.0, 1.0))
        assert store._bm25.files_loaded == 0 and store._bm25.files_rejected == 1
    with KnowledgeStore.open(p, FakeEmbedder()) as store:
        check(store._bm25, store, ["queue"], 10, (1.0, 1.0, 1.0))
        assert store._bm25.files_loaded == 1 and not store._bm25.files_status()["complete"]


@pytest.mark.parametrize("weights", [(1.0, 1.0, 1.0), (1.0, 0.5, 2.0), (2.0, 1.0, 3.0)])
def test_every_posting_read_at_once_equals_each_word_read_alone(
    store: KnowledgeStore, weights: tuple[float, ...]
) -> None:
    store.add_many(
        {"content": "queue kafka", "tags": {"kafka": "queue"}, "category": "pattern"} for _ in range(5)
    )
    index = Bm25Index(store._db, "knowledge_fts", COLUMNS, list(weights))
    index._load_file = lambda: False  # type: ignore[method-assign]
    integral = all(w.is_integer() for w in weights)
    found = index._read_every_posting()
    assert found is not None
    assert found.tf.dtype == (np.float32 if integral else np.float64)
    for number, stem in enumerate(found.stems):
        start, end = int(found.offsets[number]), int(found.offsets[number + 1])
        pos, tf = index._postings_of(stem)
        assert found.positions[start:end].tolist() == pos.tolist(), stem
        assert found.tf[start:end].astype(np.float64).tolist() == tf.tolist(), stem


def test_a_weighted_index_leaves_a_complete_file_too(path: Path) -> None:
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        index = Bm25Index(store._db, "knowledge_fts", COLUMNS, [1.0, 0.5, 2.0])
        index.search(["queue"], 5)
        index.persist()  # the store's own index writes the same file name: checked here alone
        assert index.files_status()["complete"]
        fresh = Bm25Index(store._db, "knowledge_fts", COLUMNS, [1.0, 0.5, 2.0])
        for query in QUERIES:
            check(fresh, store, query, 10, (1.0, 0.5, 2.0))
        assert fresh.files_loaded == 1 and fresh.files_status()["complete"]


def test_kept_contributions_are_recomputed_after_lengths_change(store: KnowledgeStore) -> None:
    index = store._bm25
    check(index, store, ["queue", "kafka"], 10, (1.0, 1.0, 1.0))
    assert index._contribs
    first = int(store._db.scalar("SELECT min(id) FROM knowledge"))
    store.update(first, content="queue " + "filler " * 40)  # same words, another length
    assert not index._contribs
    check(index, store, ["queue", "kafka"], 10, (1.0, 1.0, 1.0))


def test_a_small_budget_for_contributions_still_ranks_exactly(
    store: KnowledgeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_bm25_top, "_MAX_CACHED_CONTRIBUTIONS", 40)
    index = store._bm25
    for _ in range(2):
        for query in QUERIES:
            check(index, store, query, 10, (1.0, 1.0, 1.0))
    assert index._contrib_count <= 40


@settings(max_examples=200, deadline=None)
@given(
    idf=st.floats(min_value=1e-6, max_value=20.0),
    tf=st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0, 7.5]), min_size=1, max_size=20),
    avg=st.floats(min_value=0.5, max_value=500.0),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_normed_contributions_equal_the_formula_to_the_last_bit(
    idf: float, tf: list[float], avg: float, seed: int
) -> None:
    sizes = np.random.default_rng(seed).integers(0, 400, len(tf)).astype(np.float64)
    counts = np.asarray(tf, dtype=np.float64)
    expected = contribution(idf, counts, sizes, avg)
    assert normed_contribution(idf, counts, length_norms(sizes, avg)).tolist() == expected.tolist()
    norms = length_norms_into(sizes.copy(), avg)
    assert norms.tolist() == length_norms(sizes, avg).tolist()
    assert contribution_into(idf, counts, norms.copy(), own_tf=False).tolist() == expected.tolist()
    assert contribution_into(idf, counts.copy(), norms, own_tf=True).tolist() == expected.tolist()


def test_documents_are_counted_from_fts5s_averages_record(store: KnowledgeStore) -> None:
    index = store._bm25
    for _ in range(2):  # 300 documents take two bytes to count, then more after the adds
        assert index._index_rows() == store._db.scalar("SELECT count(*) FROM knowledge_fts_docsize")
        store.add_many({"content": f"queue {i}"} for i in range(20))


def _as_layout_1(file: Path, stems: object = None) -> None:
    """The file as layout 1 wrote it: its words listed in the header (``stems``: instead of them)."""
    found = _index_files.read_index(file)
    assert found is not None and found.meta["layout"] == 2
    table = StemTable.of(found.arrays)
    assert table is not None
    meta = {key: value for key, value in found.meta.items() if key != "layout"}
    meta["stems"] = table.stems() if stems is None else stems
    arrays = {name: np.array(a) for name, a in found.arrays.items() if name not in STEM_ARRAYS}
    assert _index_files.write_index(file, meta, arrays)


@pytest.mark.parametrize("complete", [True, False])
def test_a_file_of_the_earlier_layout_is_used_and_written_in_this_layout_at_close(
    path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, complete: bool
) -> None:
    """Layout 1 listed the words in the header: its words are taken from there, nothing is read
    from FTS5 for them, and the close writes the file again in layout 2, of the same kind (the
    index is below the size that keeps every posting whatever happens)."""
    monkeypatch.setattr(_bm25_file, "_COMPLETE_FROM", 10_000)
    words = ["queue", "kafka"]
    if not complete:  # a file of the words one process read
        _file(path).unlink()
        with KnowledgeStore.open(path, FakeEmbedder()) as store:
            store._bm25.search(words, 10)
    _as_layout_1(_file(path))
    with (
        caplog.at_level(logging.WARNING, logger="memstrata.storage"),
        KnowledgeStore.open(path, FakeEmbedder()) as store,
    ):
        check(store._bm25, store, words, 10, (1.0, 1.0, 1.0))
        status = store._bm25.files_status()
        assert status["loaded"] == 1 and status["rejected"] == 0 and status["complete"] == complete
        assert store._bm25._read == 0 and bool(store._bm25._mapped) == complete
    assert not caplog.records
    found = _index_files.read_index(_file(path))
    assert found is not None and found.meta["layout"] == 2 and "stems" not in found.meta
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        check(store._bm25, store, words, 10, (1.0, 1.0, 1.0))
        status = store._bm25.files_status()
        assert status["loaded"] == 1 and status["complete"] == complete and status["rejected"] == 0
        assert store._bm25._read == 0


@pytest.mark.parametrize("change", ["keys", "ends", "order", "missing", "listed"])
def test_words_that_do_not_fit_refuse_the_file_with_a_warning(
    path: Path, caplog: pytest.LogCaptureFixture, change: str
) -> None:
    found = _index_files.read_index(_file(path))
    assert found is not None
    arrays = {name: np.array(a) for name, a in found.arrays.items()}
    if change == "keys":  # no longer in order
        arrays["stem_keys"][[0, -1]] = arrays["stem_keys"][[-1, 0]]
    elif change == "ends":  # past the text
        arrays["stem_ends"][-1] += 1
    elif change == "order":  # a number no word has
        arrays["stem_order"][0] = len(arrays["stem_order"])
    elif change == "missing":
        del arrays["stem_text"]
    if change == "listed":  # a file of layout 1 whose header lists no words
        _as_layout_1(_file(path), stems=5)
    else:
        assert _index_files.write_index(_file(path), found.meta, arrays)
    with (
        caplog.at_level(logging.WARNING, logger="memstrata.storage"),
        KnowledgeStore.open(path, FakeEmbedder()) as store,
    ):
        check(store._bm25, store, ["queue", "kafka"], 10, (1.0, 1.0, 1.0))
        assert store._bm25.files_rejected == 1 and not store._bm25._mapped
    assert any("words do not fit" in r.getMessage() for r in caplog.records)
    with KnowledgeStore.open(path, FakeEmbedder()) as store:  # written again at that close
        check(store._bm25, store, ["queue", "kafka"], 10, (1.0, 1.0, 1.0))
        assert store._bm25.files_status()["complete"] and store._bm25.files_rejected == 0


def test_two_indexes_of_a_table_write_its_file_once(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    real = _bm25_file.read_all_postings

    def counted(*args: object, **kwargs: object) -> object:
        reads.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_bm25_file, "read_all_postings", counted)
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        store.add_many({"content": "queue kafka"} for _ in range(3))
        other = Bm25Index(store._db, "knowledge_fts", COLUMNS, [1.0, 1.0, 1.0])
        store._bm25.search(["queue"], 5)
        other.search(["kafka"], 5)
    assert len(reads) == 1


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    size=st.integers(min_value=1, max_value=120),
    query=st.lists(st.sampled_from([*COMMON, *RARE, "don't"]), min_size=1, max_size=5, unique=True),
    limit=st.integers(min_value=1, max_value=20),
    share=st.sampled_from([None, 0.2]),
    writes=st.lists(st.sampled_from(["add", "delete", "update"]), max_size=4),
)
def test_rankings_from_a_complete_file_equal_fts5_property(
    tmp_path_factory: pytest.TempPathFactory,
    seed: int,
    size: int,
    query: list[str],
    limit: int,
    share: float | None,
    writes: list[str],
) -> None:
    rng = random.Random(seed)
    p = tmp_path_factory.mktemp("complete") / "k.sqlite"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_index_files, "MIN_ROWS", 1)
        patch.setattr(_bm25_file, "_COMPLETE_FROM", 1)
        with KnowledgeStore.open(p, FakeEmbedder()) as store:
            docs = [document(rng) for _ in range(size)]
            for doc in docs[: size // 5]:
                doc["content"] = f"{doc['content']} don't panic"
            ids = store.add_many(docs)
        with KnowledgeStore.open(p, FakeEmbedder()) as store:
            index = store._bm25
            index.top(query[: rng.randint(0, len(query))] or ["filler"], limit)  # some words from the map
            assert index.files_status()["complete"]
            for write in writes:
                if write == "add":
                    ids += store.add_many(document(rng) for _ in range(rng.randint(1, 3)))
                elif write == "delete" and len(ids) > 1:
                    store.delete(ids.pop(rng.randrange(len(ids))))
                elif write == "update":
                    store.update(rng.choice(ids), content=str(document(rng)["content"]))
            allowed = None if share is None else {i for i in ids if rng.random() < share}
            check(index, store, query, limit, (1.0, 1.0, 1.0), allowed)


def test_scores_are_the_same_bits_whichever_words_are_left_out(store: KnowledgeStore) -> None:
    """Words left out by MaxScore are added to the candidates in the order every word is added
    to every document otherwise, so both paths give the same floats."""
    every = _fts5_index(store)
    finish = _bm25_top.Bm25Top._finish
    finished = 0
    for query in itertools.combinations([*COMMON, *RARE], 4):
        left_out = _fts5_index(store)  # nothing cached: the commonest words are left out
        with skip_whenever_allowed(), mock.patch.object(_bm25_top.Bm25Top, "_finish", autospec=True) as spy:
            spy.side_effect = finish
            a = left_out.top(list(query), 3)
        finished += spy.called
        with mock.patch.object(_bm25_top, "_CHECK_SHARE", 10**9):  # no word is worth a check
            b = every.top(list(query), 3)
        assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist(), query
    assert finished >= 50  # of 330 queries


def test_a_process_that_neither_searched_nor_wrote_leaves_no_file(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = data_dir / "quiet.sqlite"
    with monkeypatch.context() as below:
        below.setattr(_bm25_file, "_COMPLETE_FROM", 10_000)
        below.setattr(_bm25_file, "_BULK_SHARE", 2.0)
        _build(p)  # below the size then, and no load counts as a bulk load: no file
    with KnowledgeStore.open(p, FakeEmbedder()) as store:
        assert store.count() > 250  # only counted
    assert not _file(p).exists()
    with KnowledgeStore.open(p, FakeEmbedder()) as store:
        store.add("queue kafka")
    assert _file(p).exists()
    with KnowledgeStore.open(p, FakeEmbedder()) as store:
        check(store._bm25, store, ["queue", "kafka"], 10, (1.0, 1.0, 1.0))
        assert store._bm25.files_status()["complete"]


def test_words_from_the_map_hold_no_memory_until_a_write_copies_them(
    store: KnowledgeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_bm25_postings, "_MAX_CACHED_POSTINGS", 60)
    index = store._bm25
    for query in QUERIES:
        check(index, store, query, 10, (1.0, 1.0, 1.0))
    words = set(index.stems([word for query in QUERIES for word in query]))
    assert words <= set(index._postings) and index._cached == 0  # views of the file, all kept
    store.add("queue kafka lock")  # patched: copies in memory, within the budget
    assert index._cached <= 60 and len(index._postings) < len(words)
    for query in QUERIES:
        check(index, store, query, 10, (1.0, 1.0, 1.0))


def test_reading_every_posting_at_close_is_logged_with_its_time(
    data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The one-pass read can take seconds on a large index: a slow close says why."""
    with caplog.at_level(logging.INFO, logger="memstrata.storage"):
        _build(data_dir / "logged.sqlite", n=120)
    said = [r.getMessage() for r in caplog.records if r.name == "memstrata.storage"]
    assert any("reading every posting for its index file" in m for m in said), said
    assert any(m.startswith("knowledge_fts: ") and " postings read in " in m for m in said), said


def test_a_fresh_index_norms_only_the_documents_it_scores_and_gives_the_same_bits(path: Path) -> None:
    """Until an index has scored as many postings as it has documents, it computes the length
    norms of the documents at hand only; the scores are those of norming every document."""
    with (
        KnowledgeStore.open(path, FakeEmbedder()) as fresh,
        KnowledgeStore.open(path, FakeEmbedder()) as whole,
    ):
        lazy, every = fresh._bm25, whole._bm25
        every._normed = 10**9  # norms every document at its first word
        a = lazy.top(["kafka"], 5)
        assert lazy._norms is None and 0 < lazy._normed < len(lazy._ids)
        b = every.top(["kafka"], 5)
        assert every._norms is not None
        assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()
        for query in QUERIES * 2:  # past as many postings as documents: every one normed
            a, b = lazy.top(query, 10), every.top(query, 10)
            assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist(), query
        assert lazy._norms is not None
