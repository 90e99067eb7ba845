"""Int8 rows: what a sieved mirror scores before reading its best few rows in float32.

Codes are steps of a per-dimension scale; their scores stay within the rounding bound of the
exact ones; sieved searches (unfiltered, filtered by group or mask, restricted to candidates)
score float32 for no more than ``refine_count(k)`` rows and return float32 similarities; the codes
follow the rows through compaction and regrouping; an index file saves them and the next process
reads its float32 rows from the file (``pread``), not through the map, while they are as written."""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from memstrata.storage import VectorIndex, _index_files, open_database
from memstrata.storage import _mirror_scoring as scoring_module
from memstrata.storage import _mirror_search as search_module
from memstrata.storage._file_rows import FileRows, OpenFile
from memstrata.storage._index_files import read_index, write_index
from memstrata.storage._int8_rows import Int8Rows, int8_codes, refine_count
from memstrata.storage._sign_codes import SignCodes
from memstrata.storage._vector_mirror import Mirror
from tests._support import exact_top, record_calls, unit

FloatArray = npt.NDArray[np.float32]
DIM = 384


def _clustered(rng: np.random.Generator, n: int, queries: int) -> tuple[FloatArray, FloatArray]:
    centres = unit(rng.standard_normal((50, DIM)).astype(np.float32))
    rows = unit(
        centres[rng.integers(0, 50, n)] + 0.8 * unit(rng.standard_normal((n, DIM)).astype(np.float32))
    )
    q = unit(
        centres[rng.integers(0, 50, queries)]
        + 0.8 * unit(rng.standard_normal((queries, DIM)).astype(np.float32))
    )
    return rows, q


def _sieved(vectors: FloatArray, rng: np.random.Generator, cats: str = "abcd") -> Mirror:
    n = len(vectors)
    mirror = Mirror(DIM, ["cat", "agent"])
    mirror.put_many(
        list(range(1, n + 1)),
        vectors,
        {
            "cat": [str(c) for c in rng.choice(list(cats), n)],
            "agent": [str(a) for a in rng.choice(["x", "y"], n)],
        },
    )
    mirror.maintain(n // 2)
    assert mirror.sieved
    return mirror


def _check_codes(mirror: Mirror) -> None:
    int8 = mirror._int8
    assert int8 is not None and int8.scale is not None and int8.rows == mirror.size
    assert np.array_equal(int8.saved(), int8_codes(mirror.matrix[: mirror.size], int8.scale))


def test_codes_are_steps_of_each_dimension_clipped_at_127() -> None:
    scale = np.array([0.5, 0.01], dtype=np.float32)
    rows = np.array([[1.0, 0.011], [-0.74, -0.5], [0.26, 2.0]], dtype=np.float32)
    assert int8_codes(rows, scale).tolist() == [[2, 1], [-1, -50], [1, 127]]
    codes = Int8Rows(2)
    codes.update(rows[:2], 2)  # the scale comes from the rows coded first: largest magnitude / 127
    assert codes.scale is not None and np.allclose(codes.scale, [1.0 / 127, 0.5 / 127])
    assert codes.saved().tolist() == [[127, 3], [-94, -127]]
    grown = np.concatenate([rows, rows])
    codes.update(grown, 5)  # appended rows join with the same scale (beyond it: clipped)
    assert codes.rows == 5 and codes.saved()[2].tolist() == [33, 127]


def test_scores_stay_within_the_rounding_bound() -> None:
    rng = np.random.default_rng(3)
    rows, queries = _clustered(rng, 5000, 5)
    codes = Int8Rows(DIM)
    codes.update(rows, len(rows))
    assert codes.scale is not None
    positions = np.sort(rng.choice(len(rows), 3000, replace=False)).astype(np.int64)
    for q in queries:
        bound = float(np.abs(q * codes.scale).sum()) / 2 + 1e-5  # half a step in every dimension
        exact = rows @ q
        assert np.max(np.abs(codes.scores_at(positions, q) - exact[positions])) <= bound
        slices = codes.scores_in([0, 4000], [2500, 5000], q)
        assert np.max(np.abs(slices - np.concatenate([exact[:2500], exact[4000:]]))) <= bound
        assert bound < 0.02
    with pytest.raises(IndexError, match="outside"):  # the gather clips: positions are checked first
        codes.scores_at(np.append(positions, len(codes.codes)), queries[0])


def test_sieved_searches_read_float32_for_only_their_best_few_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    vectors, queries = _clustered(rng, 8000, 6)
    mirror = _sieved(vectors, rng, cats="abcdefghijkl")  # a value: ~8% of the rows (scanned, not sieved)
    scored = record_calls(
        monkeypatch, scoring_module, "dot_rows", lambda matrix, positions, q: len(positions)
    )
    k = 10
    hits = found = 0
    searches: list[dict[str, Any]] = [{}, {"cat": "a"}, {"agent": "x"}, {"cat": "b", "agent": "y"}]
    for q in queries:
        for where in searches:
            got = mirror.search(q, k, where, None)
            assert scored and max(scored) <= refine_count(k), (where, scored)
            scored.clear()
            truth = exact_top(mirror, q, k, where)
            hits += len({h.rowid for h in got} & set(truth))
            found += len(truth)
            for h in got:  # similarities are float32 ones, not int8 approximations
                assert h.similarity == pytest.approx(float(vectors[h.rowid - 1] @ q), abs=1e-5)
        many = np.arange(1, 3001, dtype=np.int64)  # candidates: more than refine_count(k)
        assert [h.rowid for h in mirror.search(q, k, {}, many)][:5] == [
            int(r) for r in many[np.argsort(-(vectors[:3000] @ q), kind="stable")][:5]
        ]
        assert scored and max(scored) <= refine_count(k)
        scored.clear()
    assert hits / found >= 0.99
    calls = record_calls(monkeypatch, search_module, "dot", lambda matrix, q: len(matrix))
    mirror.search(queries[0], k, {}, None, exact=True)  # exact: every row in float32
    assert calls == [mirror.size] and not scored


def test_codes_follow_the_rows_through_compaction_and_regrouping() -> None:
    rng = np.random.default_rng(9)
    vectors, queries = _clustered(rng, 9000, 3)
    mirror = _sieved(vectors[:6000], rng)
    mirror.search(queries[0], 10, {}, None)  # codes made
    _check_codes(mirror)
    mirror.remove_many(range(1, 2500))
    more = {"cat": [str(c) for c in rng.choice(list("abcd"), 3000)], "agent": ["x"] * 3000}
    mirror.put_many(list(range(6001, 9001)), vectors[6000:], more)
    mirror.maintain(3000)  # compacts the dead rows, then folds the grown tail into the groups
    assert mirror.regroups >= 2 and mirror.dead == 0
    _check_codes(mirror)
    for q in queries:
        assert [h.rowid for h in mirror.search(q, 10, {"cat": "c"}, None)] == exact_top(
            mirror, q, 10, {"cat": "c"}
        )


def test_saved_codes_are_mapped_back_and_wrong_ones_coded_again() -> None:
    rng = np.random.default_rng(11)
    vectors, queries = _clustered(rng, 5000, 3)
    mirror = _sieved(vectors, rng)
    arrays, state = mirror.arrays(), mirror.state()
    assert arrays["int8"].shape == (5000, DIM) and arrays["int8_scale"].shape == (DIM,)
    back = Mirror.from_arrays(arrays, state)
    assert back._int8 is not None and not back.codes_missing
    assert np.array_equal(back._int8.saved(), arrays["int8"])
    flipped = arrays["int8"].copy()
    flipped[0] = -flipped[0] - 1  # the right shape, not the first row's codes
    for damaged in (
        dict(arrays, int8=flipped),
        dict(arrays, int8=arrays["int8"][:-1]),
        dict(arrays, int8_scale=-arrays["int8_scale"]),
    ):
        other = Mirror.from_arrays(damaged, state)
        assert other._int8 is None and other.codes_missing
        assert other.search(queries[0], 10, {}, None) == mirror.search(queries[0], 10, {}, None)
        _check_codes(other)


def _index(path: Path) -> tuple[Any, VectorIndex]:
    db = open_database(path)
    return db, VectorIndex(db, "items", DIM, metadata={"cat": "text"}, approximate_from=2000)


@dataclass
class Saved:
    path: Path
    vectors: FloatArray
    queries: FloatArray
    first: list[Any]  # the hits of ``queries`` before the store was closed


@pytest.fixture
def saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Saved:
    """A sieved store of 3,000 vectors whose index file was written at close."""
    monkeypatch.setattr(_index_files, "MIN_ROWS", 1000)
    rng = np.random.default_rng(13)
    vectors, queries = _clustered(rng, 3000, 4)
    path = tmp_path / "store.sqlite"
    db, index = _index(path)
    with db.transaction():
        index.upsert_many(
            list(range(1, 3001)), vectors, [{"cat": str(c)} for c in rng.choice(list("ab"), 3000)]
        )
    first = [index.search(q, 10) for q in queries]
    assert index.status()["approximate"]["sign_codes"]
    db.close()  # writes the index file, sign codes and int8 rows included
    return Saved(path, vectors, queries, first)


def test_the_next_process_reads_float32_rows_from_the_file(
    saved: Saved, monkeypatch: pytest.MonkeyPatch
) -> None:
    vectors, queries = saved.vectors, saved.queries
    later_db, later = _index(saved.path)
    reads = record_calls(monkeypatch, FileRows, "read", lambda rows, positions: len(positions))
    coded = record_calls(monkeypatch, Int8Rows, "update", lambda rows, matrix, size: size - rows.rows)
    signed = record_calls(monkeypatch, SignCodes, "update", lambda codes, matrix, size: size - codes.rows)
    assert [later.search(q, 10) for q in queries] == saved.first
    assert later.status()["index_file"]["loaded"] == 1
    mirror = later._mirror
    assert mirror is not None and mirror.file is not None and mirror.file_rows == mirror.size == 3000
    assert reads and all(0 < n <= refine_count(10) for n in reads)  # the best few, from the file
    assert coded and not any(coded) and signed and not any(signed)  # no row coded again: all mapped
    with later_db.transaction():  # a replaced row joins the tail: read from memory, not the file
        later.upsert_many([5], -vectors[4:5], [{"cat": "a"}])
    top = later.search(-vectors[4], 1)
    assert top[0].rowid == 5 and top[0].similarity == pytest.approx(1.0, abs=1e-5)
    mirror.compact()  # row 5's old place was near the front: the rows after it moved
    assert mirror.file_rows == 4
    for q in queries:
        assert [h.rowid for h in later.search(q, 10)] == exact_top(mirror, q, 10, {})
    later_db.close()


def test_a_file_without_int8_rows_is_written_again_with_them(saved: Saved) -> None:
    path, queries = saved.path, saved.queries
    file = path.parent / f"{path.name}.index" / "vectors-items"
    found = read_index(file)
    assert found is not None and "int8" in found.arrays
    older = {name: np.array(a) for name, a in found.arrays.items() if not name.startswith("int8")}
    del found
    gc.collect()
    assert write_index(file, dict(read_index(file).meta), older, unchecked=("index_keys", "index_values"))  # type: ignore[union-attr]

    later_db, later = _index(path)
    assert later.search(queries[0], 10) == saved.first[0]
    assert later.search(queries[1], 10)  # the file was due: written again, now with its codes
    again = read_index(file)
    assert again is not None and "int8" in again.arrays and later.status()["index_file"]["saved"] >= 1
    later_db.close()


def test_rows_are_read_from_the_file_that_was_opened(tmp_path: Path) -> None:
    path = tmp_path / "rows.bin"
    rows = np.arange(40, dtype=np.float32).reshape(10, 4)
    path.write_bytes(b"\0" * 16 + rows.tobytes())
    with open(path, "rb") as f:
        opened = OpenFile(f.fileno())
    reader = FileRows(opened, 16, np.float32, 4, 10)
    (tmp_path / "new.bin").write_bytes(b"\1" * 200)
    os.replace(tmp_path / "new.bin", path)  # renamed over, as a writer replaces an index file
    got = reader.read(np.array([9, 0, 3], dtype=np.int64))
    assert np.array_equal(got, rows[[9, 0, 3]])
    fd = opened.fd
    del reader, opened
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)  # closed with its last holder


def test_rows_read_again_come_from_the_last_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A search reads its best rows twice (refined, then reported): the second read of rows
    the last one returned makes no system call, and any other row is read from the file."""
    path = tmp_path / "rows.bin"
    rows = np.arange(40, dtype=np.float32).reshape(10, 4)
    path.write_bytes(b"\0" * 16 + rows.tobytes())
    with open(path, "rb") as f:
        reader = FileRows(OpenFile(f.fileno()), 16, np.float32, 4, 10)
    calls = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda *a: calls.append(a[2]) or real(*a))
    assert np.array_equal(reader.read(np.array([9, 0, 3, 7])), rows[[9, 0, 3, 7]])
    assert len(calls) == 4
    again = reader.read(np.array([3, 9, 9]))
    assert np.array_equal(again, rows[[3, 9, 9]]) and len(calls) == 4
    again[:] = -1  # a copy of its own: the kept rows stay as read
    assert np.array_equal(reader.read(np.array([7, 3])), rows[[7, 3]]) and len(calls) == 4
    assert np.array_equal(reader.read(np.array([3, 5])), rows[[3, 5]]) and len(calls) == 6
    assert np.array_equal(reader.read(np.array([5])), rows[[5]]) and len(calls) == 6
    assert reader.read(np.zeros(0, dtype=np.int64)).shape == (0, 4)
    assert np.array_equal(reader.read(np.array([5])), rows[[5]]) and len(calls) == 6


def test_spare_rows_can_follow_any_array(tmp_path: Path) -> None:
    path = tmp_path / "spare"
    first = np.arange(12, dtype=np.int8).reshape(3, 4)
    last = np.ones((2, 3), dtype=np.float32)
    assert write_index(path, {}, {"first": first, "last": last}, spare={"first": 5, "last": 1})
    found = read_index(path)
    assert found is not None
    assert found.arrays["first"].shape == (8, 4) and np.array_equal(found.arrays["first"][:3], first)
    assert not found.arrays["first"][3:].any()  # the hole reads as zeros
    assert np.array_equal(found.arrays["last"][:2], last) and found.arrays["last"].shape == (3, 3)
    reader = found.rows("first")
    assert reader is not None and np.array_equal(reader.read(np.array([2, 0])), first[[2, 0]])
