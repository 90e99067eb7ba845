"""Sign codes: the sieve of a large mirror's searches that allow a good share of the rows.
On a corpus whose entries mix several topics (where inverted lists lose recall), the sieve keeps
recall@10 >= 0.98; its codes follow the rows through appends, deletes, compaction and regrouping
and are saved with the mirror (mapped back by the next connection:
``test_storage_vectors_int8.py``); a filter's rejected rows and dead rows never come back; a sieving
mirror builds no inverted lists, selective filters scan their rows exactly, and low-dimensional
mirrors keep the inverted lists."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from memstrata.storage import _mirror_scoring as scoring_module
from memstrata.storage import _mirror_search as search_module
from memstrata.storage import _sign_codes as sign_module
from memstrata.storage import _vector_kernels as kernels_module
from memstrata.storage._sign_codes import SignCodes, sign_codes
from memstrata.storage._vector_mirror import Mirror
from tests._support import exact_top, unit

FloatArray = npt.NDArray[np.float32]
DIM = 384
CATS = ("a", "b", "c", "d")


def _mixed(rng: np.random.Generator, n: int, queries: int, dim: int = DIM) -> tuple[FloatArray, FloatArray]:
    """Entries = sum of 3 of 2000 "sentence" vectors (each near one of 64 topics), queries = one
    sentence plus noise: the neighbours of a query are spread over many lists."""
    topics = unit(rng.standard_normal((64, dim)).astype(np.float32))
    sentences = unit(
        topics[rng.integers(0, 64, 2000)] + 0.75 * unit(rng.standard_normal((2000, dim)).astype(np.float32))
    )
    picks = rng.integers(0, 2000, (n, 3))
    noise = 0.3 / np.sqrt(dim)
    rows = sentences[picks].sum(axis=1) + noise * rng.standard_normal((n, dim)).astype(np.float32)
    chosen = picks[rng.integers(0, n, queries), rng.integers(0, 3, queries)]
    q = sentences[chosen] + noise * rng.standard_normal((queries, dim)).astype(np.float32)
    return unit(rows), unit(q)


def _mirror(
    vectors: FloatArray, rng: np.random.Generator, approximate_from: int, cats: tuple[str, ...] = CATS
) -> Mirror:
    n = len(vectors)
    mirror = Mirror(vectors.shape[1], ["cat", "agent"])
    mirror.put_many(
        list(range(1, n + 1)),
        vectors,
        {"cat": [str(c) for c in rng.choice(cats, n)], "agent": [str(a) for a in rng.choice(["x", "y"], n)]},
    )
    mirror.maintain(approximate_from)
    if mirror.can_sieve:
        assert mirror.sieved and mirror.partition is None
    else:
        assert mirror.partition is not None
    return mirror


def _recall(mirror: Mirror, queries: FloatArray, truth: list[list[int]], k: int = 10) -> float:
    found = [
        len({h.rowid for h in mirror.search(q, k, {}, None)} & set(t)) / k
        for q, t in zip(queries, truth, strict=True)
    ]
    return float(np.mean(found))


def _spy_on_signs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    nearest = SignCodes.nearest

    def spy(self: SignCodes, *args: Any) -> Any:
        calls.append(1)
        return nearest(self, *args)

    monkeypatch.setattr(SignCodes, "nearest", spy)
    return calls


def test_sign_codes_reach_the_recall_target_where_lists_fall_short(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    vectors, queries = _mixed(rng, 20_000, 60)
    mirror = _mirror(vectors, rng, 10_000)
    truth = [exact_top(mirror, q, 10, {}) for q in queries]
    calls = _spy_on_signs(monkeypatch)
    signs = _recall(mirror, queries, truth)
    assert len(calls) == len(queries)
    monkeypatch.setattr(scoring_module, "MIN_DIM", 10**6)  # the same rows under inverted lists
    listed = _mirror(vectors, np.random.default_rng(7), 10_000)
    lists = _recall(listed, queries, truth)
    assert len(calls) == len(queries)
    assert signs >= 0.98
    assert signs > lists, (signs, lists)


def _check_codes(mirror: Mirror) -> None:
    signs = mirror._signs
    assert signs is not None
    mirror.search(mirror.matrix[0], 5, {}, None)  # brings the codes up to date
    assert signs.rows == mirror.size
    expected = sign_codes(mirror.matrix[: mirror.size], signs.words).T
    assert np.array_equal(signs.saved(), expected)


def test_codes_follow_the_rows_and_every_candidate_gives_the_exact_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(3)
    vectors, queries = _mixed(rng, 6000, 8)
    mirror = _mirror(vectors, rng, 4000)
    monkeypatch.setattr(sign_module, "_CANDIDATES", 10**9)  # every allowed row rescored
    calls = _spy_on_signs(monkeypatch)

    def same_asexact_top() -> None:
        for q in queries:
            for where in ({}, {"agent": "x"}, {"cat": "a"}, {"cat": "b", "agent": "y"}):
                got = [h.rowid for h in mirror.search(q, 10, where, None)]
                assert got == exact_top(mirror, q, 10, where), where

    same_asexact_top()
    _check_codes(mirror)
    more, _ = _mixed(rng, 500, 1)
    mirror.put_many(list(range(6001, 6501)), more, {"cat": ["a"] * 500, "agent": ["y"] * 500})
    mirror.remove_many(range(1, 6501, 3))  # dead rows, then a compaction and a regrouping
    same_asexact_top()
    _check_codes(mirror)
    mirror.maintain(4000)
    assert mirror.dead == 0  # compacted
    _check_codes(mirror)
    same_asexact_top()
    mirror._regroup()  # the tail folded into the groups: rows permuted
    assert mirror.sorted_end == mirror.size and mirror.grouped
    _check_codes(mirror)
    same_asexact_top()
    assert calls and mirror.partition is None


def test_a_selective_filter_and_a_low_dimension_keep_the_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    vectors, queries = _mixed(rng, 6000, 3)
    mirror = _mirror(vectors, rng, 4000, cats=tuple("abcdefghijkl"))  # a value: ~8% of the rows
    calls = _spy_on_signs(monkeypatch)
    mirror.search(queries[0], 10, {"cat": "a"}, None)  # the group's block, exactly
    mirror.search(queries[0], 10, {"cat": "a", "agent": "x"}, None)
    mirror.search(queries[0], 10, {}, None, exact=True)
    assert not calls
    small, small_q = _mixed(rng, 6000, 3, dim=32)
    low = _mirror(small, rng, 4000)
    for q in small_q:
        assert len(low.search(q, 10, {}, None)) == 10
    assert not calls and low._signs is None and low.partition is not None
    mirror.search(queries[0], 10, {"agent": "x"}, None)  # half the rows: the sieve, with a mask
    assert len(calls) == 1
    wide = _mirror(vectors, rng, 4000)  # a group value of ~25% of the rows: the sieve too
    wide.search(queries[0], 10, {"cat": "a"}, None)
    assert len(calls) == 2


def test_a_filter_of_many_rows_sieves_though_it_allows_a_small_share(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(8)
    vectors, queries = _mixed(rng, 6000, 4)
    mirror = _mirror(vectors, rng, 4000, cats=tuple("abcdefghijkl"))  # a value: ~500 rows, ~8 %
    calls = _spy_on_signs(monkeypatch)
    mirror.search(queries[0], 10, {"cat": "a"}, None)
    assert not calls  # few rows: scored all
    monkeypatch.setattr(search_module, "_SIGN_ROWS", 300)  # as if a row were costlier to score
    for q in queries:
        assert [h.rowid for h in mirror.search(q, 10, {"cat": "a"}, None)] == exact_top(
            mirror, q, 10, {"cat": "a"}
        )
        assert [h.rowid for h in mirror.search(q, 10, {"cat": "a", "agent": "x"}, None)] == exact_top(
            mirror, q, 10, {"cat": "a", "agent": "x"}
        )
    assert len(calls) == len(queries)  # the group alone; with the mask, ~250 rows are too few


def test_sign_codes_pad_any_dimension() -> None:
    rows = np.array([[1.0, -1.0, 0.5] + [0.0] * 67, [-1.0] * 70], dtype=np.float32)
    codes = sign_codes(rows, 2)
    assert codes.shape == (2, 2)
    bits = np.unpackbits(codes.view(np.uint8), axis=1)
    assert bits[0, :3].tolist() == [1, 0, 1] and bits[0, 3:].sum() == 0 and bits[1].sum() == 0


def test_saved_codes_are_read_back_and_wrong_ones_ignored() -> None:
    rng = np.random.default_rng(11)
    vectors, queries = _mixed(rng, 5000, 4)
    mirror = _mirror(vectors, rng, 4000)
    arrays, state = mirror.arrays(), mirror.state()
    assert mirror.sieved and arrays["signs"].shape == (6, mirror.size)
    back = Mirror.from_arrays(arrays, state)
    assert back._signs is not None and back._signs.rows == back.size
    assert np.array_equal(back._signs.saved(), mirror._signs.saved())  # type: ignore[union-attr]
    for q in queries:
        assert back.search(q, 10, {}, None) == mirror.search(q, 10, {}, None)
    damaged = dict(arrays, signs=arrays["signs"][:, :-1])
    other = Mirror.from_arrays(damaged, state)
    assert other._signs is None  # coded again at its first search
    assert other.search(queries[0], 10, {}, None) == mirror.search(queries[0], 10, {}, None)
    _check_codes(other)
    flipped = arrays["signs"].copy()
    flipped[:, 0] ^= np.uint64(0xFF)  # the right shape, but not the first row's signs
    assert Mirror.from_arrays(dict(arrays, signs=flipped), state)._signs is None


def test_nearest_over_several_slices_names_the_rows_by_position() -> None:
    rng = np.random.default_rng(17)
    rows = unit(rng.standard_normal((3000, DIM)).astype(np.float32))
    signs = SignCodes(DIM)
    signs.update(rows, len(rows))
    query = rows[1234] + 0.01 * unit(rng.standard_normal(DIM).astype(np.float32))
    starts, ends = [0, 700, 1200, 2999], [300, 700, 2000, 3000]  # one slice empty, one a single row
    valid = rng.random(len(rows)) > 0.3
    picked = signs.nearest(query, starts, ends, valid, 50)
    inside = np.concatenate([np.arange(a, b) for a, b in zip(starts, ends, strict=True)])
    allowed = inside[valid[inside]]
    bits = np.unpackbits(sign_codes(rows, signs.words).view(np.uint8), axis=1)
    qbits = np.unpackbits(sign_codes(query.reshape(1, -1), signs.words).view(np.uint8), axis=1)[0]
    distance = (bits != qbits).sum(axis=1)
    cut = np.sort(distance[allowed])[49]  # every allowed row at most as far as the 50th nearest
    assert sorted(picked.tolist()) == sorted(allowed[distance[allowed] <= cut].tolist())
    assert 1234 in picked.tolist() or not valid[1234]


def test_appended_rows_leave_the_existing_codes_in_place() -> None:
    rng = np.random.default_rng(19)
    rows = unit(rng.standard_normal((4000, DIM)).astype(np.float32))
    signs = SignCodes(DIM)
    signs.update(rows, 3000)  # the codes made at first use
    first = signs.saved()
    signs.update(rows, 3500)
    signs.update(rows, 4000)
    assert np.shares_memory(signs.base, first) and signs.base.shape[1] == 3000  # never copied
    assert np.array_equal(signs.saved(), sign_codes(rows, signs.words).T)
    query = rows[3999]
    near = signs.nearest(query, [2500], [4000], None, 1)  # one slice across both parts
    assert near.tolist() == [3999]
    signs.take(np.arange(3999, -1, -1))  # a move folds both parts into one, in the new order
    assert signs.extra.shape[1] == 0 and np.array_equal(signs.saved(), sign_codes(rows[::-1], signs.words).T)


@pytest.mark.parametrize("split_from", [10**9, 100], ids=["one thread", "two threads"])
def test_a_scan_on_one_thread_or_two_gives_the_same_distances(
    monkeypatch: pytest.MonkeyPatch, split_from: int
) -> None:
    """Large scans are split over two threads, smaller ones not; the distances are the same
    either way, over codes made at first use and appended since."""
    monkeypatch.setattr(sign_module, "_BLOCK", 1000)  # several pieces, in both parts
    monkeypatch.setattr(sign_module, "_SPLIT_FROM", split_from)
    monkeypatch.setattr(kernels_module._Scanner, "_MIN_ROWS", 100)
    monkeypatch.setattr(kernels_module, "_CPUS", 2)
    calls: list[int] = []
    in_two = sign_module.in_two
    monkeypatch.setattr(sign_module, "in_two", lambda *a: calls.append(1) or in_two(*a))
    rng = np.random.default_rng(23)
    rows = unit(rng.standard_normal((5000, DIM)).astype(np.float32))
    signs = SignCodes(DIM)
    signs.update(rows, 3000)
    signs.update(rows, 5000)
    assert signs.base.shape[1] == 3000  # codes in two parts
    query = unit(rng.standard_normal(DIM).astype(np.float32))
    valid = rng.random(len(rows)) > 0.2
    got = signs.distances(query, [0, 2500], [1200, 5000], valid)
    bits = np.unpackbits(sign_codes(rows, signs.words).view(np.uint8), axis=1)
    qbits = np.unpackbits(sign_codes(query.reshape(1, -1), signs.words).view(np.uint8), axis=1)[0]
    expected = (bits != qbits).sum(axis=1)
    expected[~valid] = signs.bits + 1
    assert got.tolist() == np.concatenate([expected[:1200], expected[2500:]]).tolist()
    assert len(calls) == (1 if split_from < 3700 else 0)


def _within_by_definition(distances: npt.NDArray[np.uint16], count: int, bits: int) -> npt.NDArray[np.int64]:
    """Every distance up to the smallest cut-off (at most ``bits``) that ``count`` are within."""
    for cut in range(bits + 1):
        if np.count_nonzero(distances <= cut) >= count:
            return np.flatnonzero(distances <= cut)
    return np.flatnonzero(distances <= bits)


@pytest.mark.parametrize(
    "case",
    [
        "spread",
        "ties",
        "few-allowed",
        "near-rows-off-the-sample",
        "near-rows-on-the-sample",
        "small",
        "all-rejected",
    ],
)
def test_the_sampled_cut_off_selects_what_the_full_histogram_does(case: str) -> None:
    rng = np.random.default_rng(7)
    bits, count, n = 384, 2048, 200_000
    distances = rng.normal(170, 25, n).clip(0, bits).astype(np.uint16)
    if case == "ties":
        distances = rng.integers(90, 94, n).astype(np.uint16)  # thousands at each distance
    elif case == "few-allowed":
        distances[rng.random(n) > 0.005] = bits + 1  # a filter's rejected rows: 1,000 left
    elif case == "near-rows-off-the-sample":
        distances[:] = 300
        distances[1::16][:3000] = 40  # every near row lies between the sampled ones
    elif case == "near-rows-on-the-sample":
        distances[:] = 300
        distances[::16][:300] = 40  # the sample overrates them: too few for the guess, the full way
    elif case == "small":
        distances = distances[:5_000]
    elif case == "all-rejected":
        distances[:] = bits + 1
    got = sign_module.nearest_within(distances, count, bits)
    assert np.array_equal(got, _within_by_definition(distances, count, bits))
    if case == "spread":
        assert 2048 <= len(got) < 2400  # the cut-off is exact, not the sample's generous guess
