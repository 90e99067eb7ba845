"""A complete BM25 index file written again from memory at close: the file's postings with the
documents this connection added and removed since equal every posting read from FTS5, and memory
is used only when it holds the whole index."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstrata.layers import KnowledgeStore
from memstrata.storage import _bm25_file, _index_files
from memstrata.storage._bm25_bulk import AllPostings
from memstrata.storage._bm25_held import held_postings
from memstrata.storage._bm25_postings import Postings
from tests.fakes import FakeEmbedder
from tests.test_storage_bm25_top import check, document

QUERIES = [["queue"], ["queue", "kafka", "lock"], ["retry", "cache", "deploy"], ["zebra"], ["zebra", "queue"]]


@pytest.fixture(autouse=True)
def complete_from_small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_index_files, "MIN_ROWS", 1)
    monkeypatch.setattr(_bm25_file, "_COMPLETE_FROM", 50)


def _by_stem(found: AllPostings) -> dict[str, tuple[list[int], list[float]]]:
    out = {}
    for number, stem in enumerate(found.stems):
        a, b = int(found.offsets[number]), int(found.offsets[number + 1])
        out[stem] = (found.positions[a:b].tolist(), found.tf[a:b].astype(np.float64).tolist())
    return out


# -- the layout, against a reference built word by word ----------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_held_postings_equal_a_reference(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 30), label="documents")
    alive = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    stems = [f"s{i}" for i in range(data.draw(st.integers(0, 6)))]
    docs = st.lists(st.integers(0, n - 1), unique=True).map(sorted)
    file = {stem: data.draw(docs, label=stem) for stem in stems}
    counts = {stem: [float(data.draw(st.integers(1, 4))) for _ in file[stem]] for stem in stems}
    split = data.draw(st.integers(0, n), label="first added document")  # added ones come after
    later = st.lists(st.integers(split, n - 1), unique=True, min_size=1).map(sorted) if split < n else None
    added: dict[str, Postings] = {}
    new: dict[str, Postings] = {}
    if later is not None:
        for stem in data.draw(st.lists(st.sampled_from(stems), unique=True)) if stems else []:
            file[stem] = [d for d in file[stem] if d < split]
            counts[stem] = counts[stem][: len(file[stem])]
            more = data.draw(later)
            added[stem] = (np.array(more, dtype=np.int32), np.full(len(more), 2.0))
        for i in range(data.draw(st.integers(0, 2))):
            more = data.draw(later)
            new[f"new{i}"] = (np.array(more, dtype=np.int32), np.full(len(more), 3.0))
    offsets = np.cumsum([0] + [len(file[s]) for s in stems]).astype(np.int64)
    positions = np.array([d for s in stems for d in file[s]], dtype=np.int32)
    tf = np.array([c for s in stems for c in counts[s]], dtype=np.float32)

    found = held_postings(stems, offsets, positions, tf, alive, added, new)

    assert found is not None
    renumber = {old: i for i, old in enumerate(np.flatnonzero(alive).tolist())}
    expected: dict[str, tuple[list[int], list[float]]] = {}
    for stem in [*stems, *new]:
        pairs = list(zip(file.get(stem, []), counts.get(stem, []), strict=True))
        for source in (added, new):
            if stem in source:
                pairs += list(zip(source[stem][0].tolist(), source[stem][1].tolist(), strict=True))
        pairs = [(renumber[d], c) for d, c in pairs if alive[d]]
        if pairs:
            expected[stem] = ([d for d, _ in pairs], [c for _, c in pairs])
    assert _by_stem(found) == expected
    assert list(found.stems) == [s for s in [*stems, *new] if s in expected]  # the file's order kept
    for number in range(len(found.stems)):
        a, b = int(found.offsets[number]), int(found.offsets[number + 1])
        assert int(found.pos_sums[number]) == int(found.positions[a:b].sum())
        assert int(found.tf_sums[number]) == int(found.tf[a:b].view(np.uint32).sum(dtype=np.uint64))


def test_held_postings_refuse_what_does_not_fit() -> None:
    stems, offsets = ["a"], np.array([0, 2], dtype=np.int64)
    positions, tf = np.array([0, 1], dtype=np.int32), np.array([1.0, 2.0], dtype=np.float32)
    alive = np.ones(3, dtype=bool)
    later = (np.array([2], dtype=np.int32), np.array([1.0]))
    assert held_postings(stems, offsets, positions, tf, alive, {"a": later}, {}) is not None
    assert held_postings(stems, offsets, np.array([0, 3], dtype=np.int32), tf, alive, {}, {}) is None
    assert held_postings(stems, offsets, positions, tf, alive, {"b": later}, {}) is None  # not in the file
    assert held_postings(stems, offsets, positions, tf, alive, {}, {"a": later}) is None  # in the file
    assert held_postings(stems, offsets, positions, tf, alive, {"a": (later[0], np.array([0.1]))}, {}) is None
    assert (
        held_postings(stems, offsets, positions, tf, alive, {"a": (np.array([5], np.int32), later[1])}, {})
        is None
    )


# -- a store that used its complete file and wrote ----------------------------------------------


def _store(path: Path, n: int = 300) -> None:
    rng = random.Random(3)
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        store.add_many(document(rng) for _ in range(n))


def test_the_file_is_written_from_memory_after_reported_writes(data_dir: Path) -> None:
    path = data_dir / "held.sqlite"
    _store(path)
    rng = random.Random(4)
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        index = store._bm25
        check(index, store, ["queue", "kafka"], 10, (1.0, 1.0, 1.0))  # the map in use
        assert index.files_status()["complete"]
        ids = store.add_many(document(rng) for _ in range(40))
        store.add_many([{"content": "zebra queue crossing", "tags": {"zebra": "kafka"}}])  # a new word
        for gone in [*ids[::7], 1, 2, 150]:
            assert store.delete(gone)
        for query in QUERIES:
            check(index, store, query, 10, (1.0, 1.0, 1.0))
        held = index._postings_held()
        assert held is not None and "zebra" in held[0].stems
        read = index._read_every_posting()  # every posting from FTS5 (the caches start over)
        assert read is not None
        assert _by_stem(held[0]) == _by_stem(read)
        assert held[1].tolist() == index._ids.tolist() and held[2].tolist() == index._sizes.tolist()

    with KnowledgeStore.open(path, FakeEmbedder()) as store:  # again, now to its close
        index = store._bm25
        check(index, store, ["queue"], 10, (1.0, 1.0, 1.0))
        store.add_many(document(rng) for _ in range(20))
        assert store.delete(3)
    assert index.files_from_memory == 1 and index.files_saved == 1
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        for query in QUERIES:
            check(store._bm25, store, query, 10, (1.0, 1.0, 1.0))
        assert store._bm25.files_loaded == 1 and store._bm25.files_status()["complete"]
        assert store._bm25._read == 0 and store._bm25.files_rejected == 0


@pytest.fixture
def mapped(data_dir: Path) -> Iterator[KnowledgeStore]:
    """A bulk-loaded store (``mapped.sqlite``), open, with its complete file's map in use."""
    _store(data_dir / "mapped.sqlite")
    with KnowledgeStore.open(data_dir / "mapped.sqlite", FakeEmbedder()) as store:
        check(store._bm25, store, ["queue"], 10, (1.0, 1.0, 1.0))
        assert store._bm25.files_status()["complete"] and store._bm25._mapped
        yield store


def test_memory_is_not_used_when_another_connection_wrote(mapped: KnowledgeStore, data_dir: Path) -> None:
    index = mapped._bm25
    mapped.add("queue kafka from this connection")
    with KnowledgeStore.open(data_dir / "mapped.sqlite", FakeEmbedder()) as other:
        other.add("retry lock from another connection")
    assert index._postings_held() is None
    mapped.close()
    assert index.files_from_memory == 0 and index.files_saved == 1  # read from FTS5 instead
    with KnowledgeStore.open(data_dir / "mapped.sqlite", FakeEmbedder()) as store:
        for query in QUERIES:
            check(store._bm25, store, query, 10, (1.0, 1.0, 1.0))
        assert store._bm25.files_loaded == 1 and store._bm25.files_status()["complete"]


def test_memory_is_not_used_when_fts5_counts_other_documents(mapped: KnowledgeStore) -> None:
    index = mapped._bm25
    mapped.add("queue kafka")
    assert index._postings_held() is not None
    index._total += 1.0  # a write this connection did not report would show so
    assert index._postings_held() is None
    index._total -= 1.0
    index._live -= 1
    assert index._postings_held() is None
    index._live += 1
    assert index._postings_held() is not None
