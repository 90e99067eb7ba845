"""A complete BM25 index file written again from memory at close: the file's postings with the
documents this connection added and removed since equal every posting read from FTS5, and memory
is used only when it holds the whole index."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstrata.layers import KnowledgeStore
from memstrata.storage import _bm25_file, _bm25_held, _index_files
from memstrata.storage._bm25_bulk import AllPostings, run_sums
from memstrata.storage._bm25_held import HeldPostings, held_postings
from memstrata.storage._bm25_postings import Postings
from memstrata.storage._bm25_stems import StemTable, stem_arrays
from tests.fakes import FakeEmbedder
from tests.test_storage_bm25_top import check, document

QUERIES = [["queue"], ["queue", "kafka", "lock"], ["retry", "cache", "deploy"], ["zebra"], ["zebra", "queue"]]


@pytest.fixture(autouse=True)
def complete_from_small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_index_files, "MIN_ROWS", 1)
    monkeypatch.setattr(_bm25_file, "_COMPLETE_FROM", 50)


def _whole(found: AllPostings | HeldPostings) -> tuple[np.ndarray, np.ndarray]:
    """The postings and counts of ``found``, its pieces joined and checked against their length."""
    if isinstance(found, AllPostings):
        return found.positions, found.tf
    positions = np.concatenate([np.zeros(0, np.int32), *found.positions.chunks()])
    tf = np.concatenate([np.zeros(0, found.tf.dtype), *found.tf.chunks()])
    assert len(positions) == found.positions.length and len(tf) == found.tf.length
    assert positions.dtype == np.int32 and tf.dtype == found.tf.dtype
    return positions, tf


def _by_stem(found: AllPostings | HeldPostings) -> dict[str, tuple[list[int], list[float]]]:
    positions, tf = _whole(found)
    out = {}
    for number, stem in enumerate(found.stems):
        a, b = int(found.offsets[number]), int(found.offsets[number + 1])
        out[stem] = (positions[a:b].tolist(), tf[a:b].astype(np.float64).tolist())
    return out


def _table(stems: list[str]) -> StemTable:
    table = StemTable.of(stem_arrays(stems))
    assert table is not None
    return table


def _sums(offsets: np.ndarray, positions: np.ndarray, tf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each stem's checksums, as a file holds them."""
    starts = offsets[:-1]
    return run_sums(positions, starts, np.int64), run_sums(tf.view(np.uint32), starts, np.uint64)


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
    group = data.draw(st.integers(1, 8), label="postings laid out at a time")

    with mock.patch.object(_bm25_held, "_GROUP_POSTINGS", group):
        found = held_postings(
            _table(stems), offsets, positions, tf, _sums(offsets, positions, tf), alive, added, new
        )

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
    positions, tf = _whole(found)
    for number in range(len(found.stems)):
        a, b = int(found.offsets[number]), int(found.offsets[number + 1])
        assert int(found.pos_sums[number]) == int(positions[a:b].sum())
        assert int(found.tf_sums[number]) == int(tf[a:b].view(np.uint32).sum(dtype=np.uint64))


def test_held_postings_refuse_what_does_not_fit() -> None:
    stems, offsets = ["a"], np.array([0, 2], dtype=np.int64)
    positions, tf = np.array([0, 1], dtype=np.int32), np.array([1.0, 2.0], dtype=np.float32)
    sums = _sums(offsets, positions, tf)
    alive = np.ones(3, dtype=bool)
    later = (np.array([2], dtype=np.int32), np.array([1.0]))

    def held(
        pos: np.ndarray,
        counted: np.ndarray,
        added: dict[str, Postings],
        new: dict[str, Postings],
        live: np.ndarray = alive,
    ) -> HeldPostings | None:
        return held_postings(_table(stems), offsets, pos, counted, sums, live, added, new)

    assert held(positions, tf, {"a": later}, {}) is not None
    assert held(positions, tf, {"b": later}, {}) is None  # not in the file
    assert held(positions, tf, {}, {"a": later}) is None  # in the file
    assert held(positions, tf, {"a": (later[0], np.array([0.1]))}, {}) is None  # not a float32
    assert held(positions, tf, {"a": (np.array([5], np.int32), later[1])}, {}) is None  # out of range
    assert held(positions[:1], tf, {}, {}) is None  # the arrays disagree with the offsets
    some = np.array([True, False, True])  # removed documents: every word is read, and checked
    assert held(positions, tf, {}, {}, live=some) is not None
    assert held(np.array([0, 3], dtype=np.int32), tf, {}, {}, live=some) is None  # out of range
    assert held(np.array([0, 2], dtype=np.int32), tf, {}, {}, live=some) is None  # its checksum


def test_a_damaged_word_keeps_its_checksum_when_copied() -> None:
    """Without removals the file's postings are not read: a damaged one is carried with the
    file's checksum, so the next reader still finds the word damaged."""
    stems, offsets = ["a", "b"], np.array([0, 2, 3], dtype=np.int64)
    positions, tf = np.array([0, 1, 1], dtype=np.int32), np.array([1.0, 2.0, 1.0], dtype=np.float32)
    sums = _sums(offsets, positions, tf)
    damaged = positions.copy()
    damaged[1] = 2
    found = held_postings(_table(stems), offsets, damaged, tf, sums, np.ones(3, dtype=bool), {}, {})
    assert found is not None
    copied, counts = _whole(found)
    assert copied.tolist() == [0, 2, 1]
    assert found.pos_sums.tolist() == sums[0].tolist() != _sums(found.offsets, copied, counts)[0].tolist()


def test_pieces_that_do_not_add_up_leave_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "pieces.idx"
    assert _index_files.write_index(path, {"v": 1}, {"a": np.arange(3, dtype=np.int32)})

    def short() -> Iterator[np.ndarray]:
        yield np.arange(2, dtype=np.int32)

    for pieces in (
        _index_files.Pieces(np.dtype(np.int32), 3, short),
        _index_files.Pieces(np.dtype(np.int32), 1, short),
        _index_files.Pieces(np.dtype(np.int64), 2, short),
    ):
        assert not _index_files.write_index(path, {"v": 2}, {"a": pieces})
    found = _index_files.read_index(path)
    assert found is not None and found.meta == {"v": 1} and found.arrays["a"].tolist() == [0, 1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["pieces.idx"]  # no temporary file left
    written = _index_files.Pieces(
        np.dtype(np.int32),
        5,
        lambda: iter([np.arange(2, dtype=np.int32)] * 2 + [np.arange(1, dtype=np.int32)]),
    )
    assert _index_files.write_index(path, {"v": 3}, {"a": written, "b": np.ones(2)})
    found = _index_files.read_index(path)
    assert found is not None and found.arrays["a"].tolist() == [0, 1, 0, 1, 0]
    assert found.arrays["b"].tolist() == [1.0, 1.0]


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
