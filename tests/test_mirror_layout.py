"""The mirror's row order under inverted lists: by list, then by group inside each list. An
unfiltered search reads whole lists (one slice per list it probes), a group filter that group's
block of each list; with every list probed, answers equal an exact brute-force scan, through
appends, deletes, rebuilds of the lists and a save/load. An index file saved in the former
(group-major) order is rebuilt, never read as the new one."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from memstrata.storage import VectorIndex, _index_files, open_database
from memstrata.storage import _mirror_search as search_module
from memstrata.storage._index_files import read_index, write_index
from memstrata.storage._vector_mirror import STATE_VERSION, Mirror
from tests.test_filtered_search import CATS, Reference, _churn, _metas, _put

FloatArray = npt.NDArray[np.float32]
DIM = 16
WHERES: list[dict[str, Any]] = [
    {},
    {"cat": "fact"},
    {"cat": "lesson", "agent": "c"},
    {"agent": "b"},
    {"cat": "late"},
]


def _clustered(rng: np.random.Generator, n: int) -> FloatArray:
    centres = rng.standard_normal((40, DIM)).astype(np.float32)
    noise = 0.4 * rng.standard_normal((n, DIM)).astype(np.float32)
    out: FloatArray = centres[rng.integers(0, 40, n)] + noise
    return out


def _mirror(seed: int, n: int = 3000) -> tuple[Mirror, Reference, np.random.Generator]:
    rng = np.random.default_rng(seed)
    mirror, ref = Mirror(DIM, ["cat", "agent"]), Reference()
    _put(mirror, ref, list(range(1, n + 1)), _clustered(rng, n), _metas(rng, n))
    mirror.maintain(1000)
    assert mirror.partition is not None and mirror.grouped
    return mirror, ref, rng


def _check_layout(mirror: Mirror) -> None:
    """Every sorted row sits in block ``list * groups + group``; ``partition.starts`` are the
    lists' starts."""
    part = mirror.partition
    assert part is not None
    groups, end = mirror.groups, mirror.sorted_end
    blocks = mirror.blocks
    assert len(blocks) == part.lists * groups + 1 and blocks[0] == 0 and blocks[-1] == end
    block_of = np.repeat(np.arange(len(blocks) - 1), np.diff(blocks))
    assert np.array_equal(mirror.lists[:end], block_of // groups)
    assert mirror.group is not None
    assert np.array_equal(mirror.codes[mirror.group][:end], block_of % groups)
    assert np.array_equal(part.starts, blocks[::groups])


@pytest.fixture
def every_list(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Searches probe every list (and never fall back to the exact scan); returns a counter of
    answers that came from the lists."""
    answered: list[int] = []
    search_lists = search_module.MirrorSearch._search_lists

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        found = search_lists(self, *args, **kwargs)
        answered.append(found is not None)
        return found

    monkeypatch.setattr(search_module, "_EXACT_SHARE", 1e9)
    monkeypatch.setattr(Mirror, "_probe_rows", lambda self, part, k: float(4 * self.size + 1))
    monkeypatch.setattr(search_module.MirrorSearch, "_search_lists", counted)
    return answered


def _same_as_brute_force(mirror: Mirror, ref: Reference, queries: FloatArray) -> None:
    for where in WHERES:
        for q in queries:
            for k in (1, 10, 50):
                assert [h.rowid for h in mirror.search(q, k, where, None)] == ref.search(q, k, where), (
                    where,
                    k,
                )
                exact = [h.rowid for h in mirror.search(q, k, where, None, exact=True)]
                assert exact == ref.search(q, k, where), (where, k)


def test_rows_are_sorted_by_list_then_group() -> None:
    mirror, _, _ = _mirror(1)
    _check_layout(mirror)
    assert mirror.groups == len(CATS)


def test_an_unfiltered_probe_reads_whole_lists_and_a_group_probe_its_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mirror, _, rng = _mirror(2)
    part = mirror.partition
    assert part is not None
    scans: list[tuple[list[int], list[int]]] = []
    scan = search_module.MirrorSearch._scan

    def spy(self: Any, query: FloatArray, starts: list[int], ends: list[int], *coarse: Any) -> Any:
        scans.append((list(starts), list(ends)))
        return scan(self, query, starts, ends, *coarse)

    monkeypatch.setattr(search_module.MirrorSearch, "_scan", spy)
    monkeypatch.setattr(Mirror, "_probe_rows", lambda self, part, k: float(self.size // 10))
    list_starts = set(part.starts.tolist())
    probed_lists = 0
    for q in _clustered(rng, 5):
        mirror.search(q, 10, {}, None)
        starts, ends = scans.pop()
        assert set(starts) <= list_starts and set(ends) <= list_starts  # whole lists only
        covered = sum(
            int(np.count_nonzero((part.starts[:-1] >= a) & (part.starts[1:] <= b)))
            for a, b in zip(starts, ends, strict=True)
        )
        assert len(starts) <= covered  # at most one slice per probed list (adjacent ones merged)
        probed_lists += covered
    assert probed_lists >= 5
    code = mirror.vocab["cat"]["fact"]
    for q in _clustered(rng, 5):
        mirror.search(q, 10, {"cat": "fact"}, None)
        starts, ends = scans.pop()
        assert starts
        for a, b in zip(starts, ends, strict=True):
            assert (mirror.codes["cat"][a:b] == code).all()  # only the group's rows are read
            assert len(set(mirror.lists[a:b].tolist())) == 1  # one block: one list


def test_every_list_probed_equals_the_exact_scan_through_changes(every_list: list[int]) -> None:
    mirror, ref, rng = _mirror(3)
    queries = _clustered(rng, 4)
    _same_as_brute_force(mirror, ref, queries)
    assert every_list and all(every_list)
    _churn(mirror, ref, rng, 3000)  # deletes, moves, appends (some of a new category) after the build
    assert mirror.size > mirror.sorted_end and mirror.dead
    _same_as_brute_force(mirror, ref, queries)
    new = list(range(5001, 5801))
    _put(mirror, ref, new, _clustered(rng, len(new)), _metas(rng, len(new), (*CATS, "late")))
    mirror.maintain(1000)  # the grown tail folded into the lists (the new category grouped too)
    assert mirror.size == mirror.sorted_end and mirror.dead == 0
    _check_layout(mirror)
    _same_as_brute_force(mirror, ref, queries)
    doomed = [int(r) for r in rng.choice(new, 100, replace=False)]
    mirror.remove_many(doomed)
    ref.remove(doomed)
    _same_as_brute_force(mirror, ref, queries)
    mirror.compact()
    _check_layout(mirror)
    _same_as_brute_force(mirror, ref, queries)


def test_dropping_the_lists_regroups_the_rows() -> None:
    mirror, ref, rng = _mirror(4)
    mirror.maintain(100_000)  # far fewer rows than lists are made for: the lists go
    assert mirror.partition is None and mirror.grouped
    assert len(mirror.blocks) == mirror.groups + 1
    assert mirror.group is not None
    block_of = np.repeat(np.arange(mirror.groups), np.diff(mirror.blocks))
    assert np.array_equal(mirror.codes[mirror.group][: mirror.sorted_end], block_of)
    assert (mirror.lists[: mirror.size] == -1).all()
    _same_as_brute_force(mirror, ref, _clustered(rng, 3))


def test_saved_arrays_keep_the_layout_and_another_version_is_refused(every_list: list[int]) -> None:
    mirror, ref, rng = _mirror(5)
    _churn(mirror, ref, rng, 3000)
    mirror.compact()
    state = mirror.state()
    assert state["version"] == STATE_VERSION
    back = Mirror.from_arrays({k: np.array(v) for k, v in mirror.arrays().items()}, state)
    _check_layout(back)
    _same_as_brute_force(back, ref, _clustered(rng, 3))
    with pytest.raises(ValueError, match="version"):
        Mirror.from_arrays(mirror.arrays(), {**state, "version": 1})


def test_an_index_file_of_the_former_layout_is_rebuilt_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_index_files, "MIN_ROWS", 1)
    path = tmp_path / "v.sqlite"
    meta = {"cat": "text"}
    rng = np.random.default_rng(6)
    n = 1500
    vectors = _clustered(rng, n)
    cats = [str(rng.choice(CATS)) for _ in range(n)]
    db = open_database(path)
    index = VectorIndex(db, "items", DIM, metadata=meta, approximate_from=500)
    index.upsert_many(list(range(1, n + 1)), vectors, [{"cat": c} for c in cats])
    q = _clustered(rng, 1)[0]
    expected = [h.rowid for h in index.search(q, 10, where={"cat": "fact"}, exact=True)]
    assert index.files_saved >= 1
    db.close()
    file = path.with_name(path.name + ".index") / "vectors-items"
    found = read_index(file)
    assert found is not None
    header = dict(found.meta)
    assert header["mirror"]["version"] == STATE_VERSION and header["mirror"]["groups"] == len(CATS)
    header["mirror"] = {**header["mirror"], "version": 1}  # the same arrays, read as group-major before
    arrays = {k: np.array(v) for k, v in found.arrays.items()}
    del found
    assert write_index(file, header, arrays)
    db = open_database(path)
    try:
        index = VectorIndex(db, "items", DIM, metadata=meta, approximate_from=500)
        with caplog.at_level(logging.WARNING, logger="memstrata.storage"):
            got = [h.rowid for h in index.search(q, 10, where={"cat": "fact"}, exact=True)]
        assert got == expected
        assert index.files_loaded == 0 and index.files_rejected == 1 and index.reloads == 1
        assert "layout version 1" in (index.files_note or "")
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # out of date, not damaged
    finally:
        db.close()
    rewritten = read_index(file)
    assert rewritten is not None and rewritten.meta["mirror"]["version"] == STATE_VERSION


def test_a_mapped_mirror_takes_appends_in_its_spare_rows(tmp_path: Path, every_list: list[int]) -> None:
    """A mirror mapped from an index file keeps its matrix mapped when rows are added (they go
    to the file's spare rows) and checks its row index only when first used."""
    mirror, ref, rng = _mirror(7)
    fields, arrays = _index_files.mirror_arrays(mirror)
    file = tmp_path / "mirror"
    assert write_index(file, {}, arrays, spare={"matrix": 500}, unchecked=_index_files.MIRROR_UNCHECKED)
    found = read_index(file)
    assert found is not None
    back = _index_files.mirror_from_arrays(fields, found.arrays)
    mapped = back.matrix
    assert len(mapped) == mirror.size + 500 and len(back.rowids) == mirror.size
    new = list(range(9001, 9401))
    vectors, metas = _clustered(rng, len(new)), _metas(rng, len(new))
    back.put_many(new, vectors, {c: [m[c] for m in metas] for c in ("cat", "agent")})
    ref.put(new, vectors, metas)
    assert back.matrix is mapped  # the spare rows took them: no copy of the matrix
    assert len(back.rowids) == len(mapped)
    _same_as_brute_force(back, ref, _clustered(rng, 3))
    back.remove_many(new[:50])
    ref.remove(new[:50])
    _same_as_brute_force(back, ref, _clustered(rng, 2))


def test_a_grouped_mirror_has_its_file_so_a_new_connection_does_not_sort_its_rows(tmp_path: Path) -> None:
    """From ``GROUP_FROM`` rows a mirror keeps its rows grouped by their category; without a
    file a new connection would read them from SQLite and sort them again (66-91 ms at 19k
    entries, against 8.7 ms with the file). Default sizes: no test override of ``MIN_ROWS``."""
    from memstrata.storage._mirror_layout import GROUP_FROM

    assert _index_files.MIN_ROWS <= GROUP_FROM
    path = tmp_path / "v.sqlite"
    rng = np.random.default_rng(8)
    n = GROUP_FROM + 10
    vectors = _clustered(rng, n)
    cats = [str(rng.choice(CATS)) for _ in range(n)]
    q = _clustered(rng, 1)[0]
    db = open_database(path)
    index = VectorIndex(db, "items", DIM, metadata={"cat": "text"})
    index.upsert_many(list(range(1, n + 1)), vectors, [{"cat": c} for c in cats])
    expected = [h.rowid for h in index.search(q, 10, where={"cat": "fact"})]
    assert index._mirror is not None and index._mirror.groups == len(CATS)
    db.close()
    assert (path.with_name(path.name + ".index") / "vectors-items").exists()
    db = open_database(path)
    try:
        index = VectorIndex(db, "items", DIM, metadata={"cat": "text"})
        assert [h.rowid for h in index.search(q, 10, where={"cat": "fact"})] == expected
        assert index.files_loaded == 1 and index._mirror is not None and index._mirror.regroups == 0
    finally:
        db.close()


def test_hits_and_similarities_do_not_depend_on_where_a_row_is_stored() -> None:
    """A row replaced later moves to the tail; a mirror rebuilt from SQLite holds it in rowid
    order. Equal similarities rank by rowid, and each similarity is the same from either
    mirror, filtered or not, so a run replays whatever its mirror's history."""
    rng = np.random.default_rng(11)
    rows = rng.standard_normal((60, DIM)).astype(np.float32)
    twin = rows[0].copy()
    for rowid in (9, 4, 30):  # identical to rowid 1: equal similarities to any query
        rows[rowid - 1] = twin
    metas = {"cat": ["fact" if n % 2 else "lesson" for n in range(60)], "agent": ["a"] * 60}
    rebuilt, moved = Mirror(DIM, ["cat", "agent"]), Mirror(DIM, ["cat", "agent"])
    rebuilt.put_many(list(range(1, 61)), rows, metas)
    early = rows.copy()
    early[3] = rng.standard_normal(DIM).astype(np.float32)  # rowid 4 before it was replaced
    moved.put_many(list(range(1, 61)), early, metas)
    moved.put_many([4], rows[3:4], {"cat": [metas["cat"][3]], "agent": ["a"]})
    query = twin + 0.01 * rng.standard_normal(DIM).astype(np.float32)
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    q = query.astype(np.float64) / np.linalg.norm(query.astype(np.float64))
    for where in ({}, {"cat": "lesson"}, {"agent": "a"}):
        hits = [[(h.rowid, h.similarity) for h in m.search(query, 8, where, None)] for m in (rebuilt, moved)]
        assert hits[0] == hits[1], where
        twins = [r for r in (1, 4, 9, 30) if where.get("cat") in (None, metas["cat"][r - 1])]
        assert [r for r, _ in hits[0][: len(twins)]] == twins
        for rowid, similarity in hits[0]:
            assert similarity == pytest.approx(float(unit[rowid - 1].astype(np.float64) @ q), abs=1e-6)
    everything = {h.rowid: h.similarity for h in rebuilt.search(query, 60, {}, None)}
    lessons = rebuilt.search(query, 30, {"cat": "lesson"}, None)
    assert all(everything[h.rowid] == h.similarity for h in lessons)  # bit for bit


def test_a_ranking_scored_once_is_the_same_whatever_the_storage_order() -> None:
    """What an episodic search ranks from (``scored``): the same bits for each row, equal ones by
    rowid, whether the rows are stored in rowid order or in reverse, scanned whole or in the
    runs of a range filter; and the ``k`` best, ties at the cut included, by rowid."""
    rng = np.random.default_rng(5)
    n = 40
    rows = rng.standard_normal((n, DIM)).astype(np.float32)
    for rowid in (7, 12, 33):  # identical to rowid 3
        rows[rowid - 1] = rows[2]
    metas: dict[str, list[Any]] = {"run": ["r"] * n, "at": list(range(n))}
    ordered = Mirror(DIM, ["run"], group=False, ranges=["at"], unit=False)
    moved = Mirror(DIM, ["run"], group=False, ranges=["at"], unit=False)
    ordered.put_many(list(range(1, n + 1)), rows, metas)
    moved.put_many(list(range(n, 0, -1)), rows[::-1].copy(), {k: v[::-1] for k, v in metas.items()})
    query = rows[2] + 0.01 * rng.standard_normal(DIM).astype(np.float32)
    for ranges in (None, {"at": (5, 35)}):
        found = [m.scored(query, {}, ranges) for m in (ordered, moved)]
        by_rowid = [dict(zip(f.rowids[f.positions].tolist(), f.scores.tolist(), strict=True)) for f in found]
        assert by_rowid[0] == by_rowid[1]  # bit for bit
        for k in (1, 2, 3, 5, n):
            tops = [f.top(k) for f in found]
            assert tops[0].rowids.tolist() == tops[1].rowids.tolist(), (ranges, k)
        twins = [r for r in (3, 7, 12, 33) if ranges is None or 5 <= r - 1 < 35]
        assert found[1].top(len(twins)).rowids.tolist() == twins


def test_an_episode_ranking_places_equal_similarities_by_id_in_top_and_ranks_of() -> None:
    """``ranks_of`` is where ``top`` puts an episode read to its end, equal ones by id, also
    for an episode whose vector was replaced (moved to the tail of the matrix)."""
    from memstrata.layers._episode_vectors import EpisodeVectors

    rng = np.random.default_rng(9)
    rows = rng.standard_normal((30, DIM)).astype(np.float32)
    rows[[4, 9, 20]] = rows[1]  # ids 5, 10 and 21 tie with id 2
    vectors = EpisodeVectors(DIM)
    vectors.add(list(range(1, 31)), rows, list(range(30)), [None] * 30)
    vectors.add([2], rows[1:2], [1], [None])  # id 2 replaced by the same vector: now stored last
    ranking = vectors.rank(rows[1])
    ids, _, _ = ranking.top(30)
    assert ids[:4].tolist() == [2, 5, 10, 21]
    assert ranking.ranks_of(ids).tolist() == list(range(1, 31))


@pytest.mark.parametrize("share", [0.2, 0.5, 0.9])
def test_scattered_rows_of_a_range_score_the_same_bits_gathered_or_scanned_in_place(share: float) -> None:
    """A range whose rows are scattered over the storage order (episodes recorded out of time
    order) is scored by gathering its rows when few, by scanning every row when many: the bits
    are those of the unfiltered scan either way, so a ranking replays whatever the share."""
    rng = np.random.default_rng(11)
    n = 4_000
    rows = rng.standard_normal((n, DIM)).astype(np.float32)
    metas: dict[str, list[Any]] = {"run": ["r"] * n, "at": rng.permutation(n).tolist()}
    mirror = Mirror(DIM, ["run"], group=False, ranges=["at"], unit=False)
    mirror.put_many(list(range(1, n + 1)), rows, metas)
    query = rng.standard_normal(DIM).astype(np.float32)
    everything = mirror.scored(query, {}, None)
    every = dict(
        zip(everything.rowids[everything.positions].tolist(), everything.scores.tolist(), strict=True)
    )
    inside = mirror.scored(query, {}, {"at": (0, int(n * share))})
    found = dict(zip(inside.rowids[inside.positions].tolist(), inside.scores.tolist(), strict=True))
    assert len(found) == int(n * share)
    assert found == {rowid: every[rowid] for rowid in found}  # bit for bit
    assert set(found) == {
        rowid for rowid, at in zip(range(1, n + 1), metas["at"], strict=True) if at < n * share
    }
