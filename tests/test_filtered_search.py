"""Filters inside the vector index: the mirror keeps its rows grouped by the most used filter
column (and by inverted list at scale), so a filtered search scans only its rows; results are
compared with an exact brute-force reference on random data, through deletes, updates, rows
added after the grouping or the lists were built, and a save/load of the mirror's arrays. The
hybrid engine applies the same filter to the keyword side through the mirror, exactly."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from memstrata.storage import (
    Database,
    Filter,
    SearchParams,
    VectorIndex,
    apply_migrations,
    fts_schema,
    hybrid_search,
    open_database,
)
from memstrata.storage._mirror_layout import GROUP_FROM
from memstrata.storage._vector_mirror import Mirror

FloatArray = npt.NDArray[np.float32]
DIM = 16
CATS = ("fact", "decision", "pattern", "warning", "lesson")
AGENTS = ("a", "b", "c")


def _unit(a: FloatArray) -> FloatArray:
    out: FloatArray = (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)
    return out


class Reference:
    """What the mirror should hold: rowid -> (unit vector, metadata), searched by brute force."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[FloatArray, dict[str, Any]]] = {}
        self._cache: dict[tuple[tuple[str, Any], ...], tuple[list[int], FloatArray]] = {}

    def put(self, rowids: list[int], vectors: FloatArray, metas: list[dict[str, Any]]) -> None:
        for r, v, m in zip(rowids, _unit(vectors), metas, strict=True):
            self.rows[r] = (v, m)
        self._cache.clear()

    def remove(self, rowids: list[int]) -> None:
        for r in rowids:
            self.rows.pop(r, None)
        self._cache.clear()

    def search(self, query: FloatArray, k: int, where: Mapping[str, Any]) -> list[int]:
        key = tuple(sorted(where.items()))
        if key not in self._cache:
            ids = [r for r, (_, m) in self.rows.items() if all(m[c] == v for c, v in where.items())]
            matrix = np.array([self.rows[r][0] for r in ids], dtype=np.float32).reshape(-1, DIM)
            self._cache[key] = (ids, matrix)
        ids, matrix = self._cache[key]
        if not ids:
            return []
        scores = matrix @ _unit(query.reshape(1, -1))[0]
        order = np.argsort(-scores, kind="stable")[:k]
        return [ids[i] for i in order]


def _metas(rng: np.random.Generator, n: int, cats: tuple[str, ...] = CATS) -> list[dict[str, Any]]:
    return [{"cat": str(rng.choice(cats)), "agent": str(rng.choice(AGENTS))} for _ in range(n)]


def _put(
    mirror: Mirror, ref: Reference, rowids: list[int], vectors: FloatArray, metas: list[dict[str, Any]]
) -> None:
    mirror.put_many(rowids, vectors, {c: [m[c] for m in metas] for c in ("cat", "agent")})
    ref.put(rowids, vectors, metas)


WHERES: list[dict[str, Any]] = [
    {},
    {"cat": "fact"},
    {"cat": "warning"},
    {"agent": "b"},
    {"cat": "lesson", "agent": "c"},
    {"cat": "late"},  # a value first written after the rows were grouped
    {"cat": "nobody"},
]


def _churn(mirror: Mirror, ref: Reference, rng: np.random.Generator, n: int) -> None:
    """Deletes, updates (vector and category) and new rows, some of a new category."""
    doomed = [int(r) for r in rng.choice(np.arange(1, n + 1), n // 10, replace=False)]
    mirror.remove_many(doomed)
    ref.remove(doomed)
    moved = [int(r) for r in rng.choice(np.arange(1, n + 1), n // 20, replace=False) if int(r) not in doomed]
    _put(
        mirror, ref, moved, rng.standard_normal((len(moved), DIM)).astype(np.float32), _metas(rng, len(moved))
    )
    new = list(range(n + 1, n + 301))
    metas = _metas(rng, len(new), (*CATS, "late"))
    _put(mirror, ref, new, rng.standard_normal((len(new), DIM)).astype(np.float32), metas)


def _check_exact(mirror: Mirror, ref: Reference, queries: FloatArray, *, exact: bool = False) -> None:
    for where in WHERES:
        for q in queries:
            for k in (1, 10, 40):
                got = [h.rowid for h in mirror.search(q, k, where, None, exact=exact)]
                assert got == ref.search(q, k, where), (where, k)


@pytest.mark.parametrize("approximate_from", [None, 3000])
def test_filtered_search_equals_brute_force_through_changes(approximate_from: int | None) -> None:
    rng = np.random.default_rng(5)
    n = GROUP_FROM + 2000
    mirror, ref = Mirror(DIM, ["cat", "agent"]), Reference()
    _put(mirror, ref, list(range(1, n + 1)), rng.standard_normal((n, DIM)).astype(np.float32), _metas(rng, n))
    queries = rng.standard_normal((6, DIM)).astype(np.float32)
    _check_exact(mirror, ref, queries)  # nothing grouped yet: every row is in the tail
    mirror.maintain(approximate_from)
    assert mirror.grouped and mirror.sorted_end == n and mirror.groups == len(CATS)
    assert (mirror.partition is not None) == (approximate_from is not None)
    _check_exact(mirror, ref, queries, exact=True)
    if approximate_from is None:
        _check_exact(mirror, ref, queries)
    _churn(mirror, ref, rng, n)
    assert mirror.size > mirror.sorted_end  # rows added after the grouping
    _check_exact(mirror, ref, queries, exact=True)
    if approximate_from is None:
        _check_exact(mirror, ref, queries)
    mirror.compact()
    _check_exact(mirror, ref, queries, exact=True)
    mirror.maintain(approximate_from)  # the grown tail is folded in (or the lists extended)
    _check_exact(mirror, ref, queries, exact=True)


def test_a_group_filter_scans_only_its_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    from memstrata.storage import _mirror_search as search_module

    rng = np.random.default_rng(6)
    n = GROUP_FROM * 2
    mirror, ref = Mirror(DIM, ["cat", "agent"]), Reference()
    _put(mirror, ref, list(range(1, n + 1)), rng.standard_normal((n, DIM)).astype(np.float32), _metas(rng, n))
    mirror.maintain(None)
    scanned: list[int] = []
    dot = search_module.dot

    def counting(matrix: FloatArray, query: FloatArray) -> FloatArray:
        scanned.append(len(matrix))
        return dot(matrix, query)

    monkeypatch.setattr(search_module, "dot", counting)
    q = rng.standard_normal(DIM).astype(np.float32)
    assert [h.rowid for h in mirror.search(q, 10, {"cat": "decision"}, None)] == ref.search(
        q, 10, {"cat": "decision"}
    )
    in_group = sum(1 for _, m in ref.rows.values() if m["cat"] == "decision")
    assert scanned == [in_group]  # one contiguous slice: the group's rows, no others
    scanned.clear()
    mirror.search(q, 10, {}, None)
    assert scanned == [n]


def test_approximate_group_search_keeps_recall_and_filters_exactly() -> None:
    rng = np.random.default_rng(7)
    n = 20_000
    bases = _unit(rng.standard_normal((200, DIM)).astype(np.float32))
    vectors = _unit(bases[rng.integers(0, 200, n)] + 0.3 * rng.standard_normal((n, DIM)).astype(np.float32))
    mirror, ref = Mirror(DIM, ["cat", "agent"]), Reference()
    # categories that follow topics, the hard case for a filter over inverted lists
    metas = [{"cat": CATS[int(np.argmax(v[:5]))], "agent": str(rng.choice(AGENTS))} for v in vectors]
    _put(mirror, ref, list(range(1, n + 1)), vectors, metas)
    mirror.maintain(10_000)
    assert mirror.partition is not None and mirror.grouped
    queries = _unit(bases[rng.integers(0, 200, 30)] + 0.2 * rng.standard_normal((30, DIM)).astype(np.float32))
    for where in ({}, {"cat": "fact"}, {"cat": "pattern", "agent": "a"}):
        found = expected = 0
        for q in queries:
            hits = mirror.search(q, 10, where, None)
            for h in hits:
                vec, meta = ref.rows[h.rowid]
                assert all(meta[c] == v for c, v in where.items())
                assert h.similarity == pytest.approx(float(vec @ _unit(q.reshape(1, -1))[0]), abs=1e-5)
            truth = set(ref.search(q, 10, where))
            found += len(truth & {h.rowid for h in hits})
            expected += len(truth)
        assert found / expected >= 0.97, where


def test_arrays_round_trip_and_damage_is_refused() -> None:
    rng = np.random.default_rng(8)
    n = GROUP_FROM + 500
    mirror, ref = Mirror(DIM, ["cat", "agent"]), Reference()
    _put(mirror, ref, list(range(1, n + 1)), rng.standard_normal((n, DIM)).astype(np.float32), _metas(rng, n))
    mirror.maintain(3000)
    _churn(mirror, ref, rng, n)
    arrays = {name: np.array(a) for name, a in mirror.arrays().items()}  # copies, as a file would
    state = mirror.state()
    copy = Mirror.from_arrays(arrays, state)
    assert copy.matrix is arrays["matrix"]  # used as it is (a mapped file stays mapped)
    queries = rng.standard_normal((4, DIM)).astype(np.float32)
    _check_exact(copy, ref, queries, exact=True)
    # the copy goes on living: writes, compaction and a rebuild of its lists
    _churn(copy, ref, rng, n + 300)
    copy.maintain(3000)
    _check_exact(copy, ref, queries, exact=True)
    # read-only arrays are copied, not written through
    frozen = {name: np.array(a) for name, a in mirror.arrays().items()}
    for a in frozen.values():
        a.flags.writeable = False
    thawed = Mirror.from_arrays(frozen, mirror.state())
    gone = [r for r in range(1, 50) if r in ref.rows][:3]
    thawed.remove_many(gone)
    assert thawed.live == mirror.live - 3
    assert np.array_equal(frozen["alive"], mirror.arrays()["alive"])  # untouched
    damaged: list[tuple[dict[str, Any], dict[str, Any]]] = []
    bad_blocks = dict(arrays, blocks=arrays["blocks"][::-1].copy())
    damaged.append((bad_blocks, state))
    bad_codes = dict(arrays, **{"code:cat": np.full_like(arrays["code:cat"], 99)})
    damaged.append((bad_codes, state))
    damaged.append(({k: v for k, v in arrays.items() if k != "rowids"}, state))
    damaged.append((dict(arrays, matrix=arrays["matrix"][:, :4].copy()), state))
    damaged.append((arrays, dict(state, version=0)))
    damaged.append((arrays, dict(state, dead=state["dead"] + 1)))
    for bad_arrays, bad_state in damaged:
        with pytest.raises(ValueError):
            Mirror.from_arrays(bad_arrays, bad_state)
    # a stale row index is rebuilt rather than trusted
    fresh = {name: np.array(a) for name, a in mirror.arrays().items()}  # ``copy`` wrote into its matrix
    wrong = Mirror.from_arrays(dict(fresh, index_values=np.roll(fresh["index_values"], 1)), mirror.state())
    gone = [r for r in range(1, 80) if int(wrong.positions(np.array([r]))[0]) >= 0][:5]
    assert gone and (wrong.positions(np.array(gone)) == mirror.positions(np.array(gone))).all()
    for where in WHERES:
        for q in queries:
            assert wrong.search(q, 10, where, None) == mirror.search(q, 10, where, None)


# -- the hybrid engine: the keyword side filtered through the mirror ------------------------------

WORDS = ("payment", "retry", "queue", "cache", "index", "vector", "search", "token", "deploy", "lock")


def _migration(db: Database) -> None:
    db.execute("CREATE TABLE docs (id INTEGER PRIMARY KEY, body TEXT NOT NULL, cat TEXT NOT NULL)")
    db.executescript(fts_schema("docs", ["body"]))


@pytest.fixture
def docs(tmp_path: Path) -> Iterator[tuple[Database, VectorIndex, np.random.Generator]]:
    db = open_database(tmp_path / "docs.sqlite")
    apply_migrations(db, "filtered-search-test", [_migration])
    vectors = VectorIndex(db, "docs", DIM, metadata={"cat": "text"})
    rng = np.random.default_rng(9)
    n = 3000
    with db.transaction():
        cats = [str(rng.choice(CATS)) for _ in range(n)]
        db.executemany(
            "INSERT INTO docs(id, body, cat) VALUES (?, ?, ?)",
            [(i, " ".join(rng.choice(WORDS, 4)), cats[i - 1]) for i in range(1, n + 1)],
        )
        # rows 1..n-200 have vectors; the last 200 have none (pending): the keyword side must
        # still filter them exactly, by SQL
        have = n - 200
        vectors.upsert_many(
            list(range(1, have + 1)),
            rng.standard_normal((have, DIM)).astype(np.float32),
            [{"cat": c} for c in cats[:have]],
        )
    yield db, vectors, rng
    db.close()


def _ranked(
    db: Database, vectors: VectorIndex, query: FloatArray, text: str, flt: Filter, mode: str
) -> list[tuple[int, float]]:
    hits = hybrid_search(
        db, table="docs", columns=["body"], vectors=vectors, query_vector=query, query_text=text,
        params=SearchParams(top_k=20, mode=mode),  # type: ignore[arg-type]
        flt=flt,
    )  # fmt: skip
    return [(h.id, round(h.score, 9)) for h in hits]


def test_hybrid_filter_through_the_mirror_equals_the_sql_filter(
    docs: tuple[Database, VectorIndex, np.random.Generator],
) -> None:
    db, vectors, rng = docs
    for cat in (*CATS, "nobody"):
        by_sql = Filter("SELECT id FROM docs WHERE cat = ?", (cat,), where={"cat": cat})
        by_mirror = Filter(
            "SELECT id FROM docs WHERE cat = ?", (cat,), where={"cat": cat}, where_is_exact=True
        )
        for text in ("payment retry", "lock", "cache index token"):
            q = rng.standard_normal(DIM).astype(np.float32)
            for mode in ("hybrid", "vector", "keyword"):
                expected = _ranked(db, vectors, q, text, by_sql, mode)
                assert _ranked(db, vectors, q, text, by_mirror, mode) == expected, (cat, text, mode)
                allowed = {int(r[0]) for r in db.query("SELECT id FROM docs WHERE cat = ?", (cat,))}
                assert {i for i, _ in expected} <= allowed
    # a category change and a delete are seen by both sides at once
    with db.transaction():
        db.execute("UPDATE docs SET cat = 'fact' WHERE id IN (1, 2, 2999)")
        db.execute("DELETE FROM docs WHERE id = 3")
        vectors.update_metadata(1, {"cat": "fact"})
        vectors.update_metadata(2, {"cat": "fact"})
        vectors.delete(3)
    for cat in ("fact", "decision"):
        by_sql = Filter("SELECT id FROM docs WHERE cat = ?", (cat,), where={"cat": cat})
        by_mirror = Filter(
            "SELECT id FROM docs WHERE cat = ?", (cat,), where={"cat": cat}, where_is_exact=True
        )
        q = rng.standard_normal(DIM).astype(np.float32)
        assert _ranked(db, vectors, q, "payment lock", by_mirror, "hybrid") == _ranked(
            db, vectors, q, "payment lock", by_sql, "hybrid"
        )


# -- episodes: a time range column and a task-run column in the same mirror -----------------------


def test_episode_time_and_run_filters_equal_brute_force() -> None:
    from memstrata.layers._episode_vectors import EpisodeVectors

    rng = np.random.default_rng(10)
    n = 5000
    vectors = EpisodeVectors(DIM)
    raw = rng.standard_normal((n, DIM)).astype(np.float32)  # not unit: kept as stored
    at = np.sort(rng.integers(0, 10**9, n))  # recorded in time order, as episodes are
    runs = [None if i % 7 == 0 else f"run-{i % 5}" for i in range(n)]
    ids = list(range(1, n + 1))
    vectors.add(ids, raw, at.tolist(), runs)
    gone = set(int(i) for i in rng.choice(ids, 400, replace=False))
    vectors.remove(gone)
    late = [n + 1, n + 2, 3]  # new rows, and one replaced (moves to the end)
    late_raw = rng.standard_normal((3, DIM)).astype(np.float32)
    vectors.add(late, late_raw, [5, 10**9 + 1, int(at[2])], ["run-1", "run-9", "run-2"])
    rows = {i: (raw[i - 1], int(at[i - 1]), runs[i - 1]) for i in ids if i not in gone}
    for i, v, a, r in zip(
        late, late_raw, [5, 10**9 + 1, int(at[2])], ["run-1", "run-9", "run-2"], strict=True
    ):
        rows[i] = (v, a, r)
    stored_ids, stored = vectors.live()
    assert sorted(stored_ids.tolist()) == sorted(rows)
    for i, v in zip(stored_ids.tolist(), stored, strict=True):
        assert np.array_equal(v, rows[i][0])  # the stored bytes, exactly
    q = rng.standard_normal(DIM).astype(np.float32)
    for since, until, run in (
        (None, None, None),
        (int(at[1000]), None, None),
        (None, int(at[3000]), None),
        (int(at[1000]), int(at[1200]), "run-1"),
        (0, 10, None),
        (None, None, "run-9"),
        (None, None, "nobody"),
    ):
        ranking = vectors.rank(q, since_us=since, until_us=until, task_run_id=run)
        allowed = [
            i
            for i, (_, a, r) in rows.items()
            if (since is None or a >= since) and (until is None or a < until) and (run is None or r == run)
        ]
        assert len(ranking) == len(allowed)
        scores = {i: float(rows[i][0] @ q) for i in allowed}
        expected = sorted(allowed, key=lambda i: -scores[i])
        for k in (1, 10, len(allowed)):
            got_ids, got_scores, got_at = ranking.top(k)
            assert got_ids.tolist() == expected[:k]
            assert got_at.tolist() == [rows[i][1] for i in expected[:k]]
            assert np.allclose(got_scores, [scores[i] for i in expected[:k]], atol=1e-5)
    assert vectors.similarity(n + 1, q) == pytest.approx(float(late_raw[0] @ q), abs=1e-5)
    assert vectors.similarity(next(iter(gone)), q) is None
    asked = np.array([3, n + 2, next(iter(gone)), n + 50, 1], dtype=np.int64)
    times, held = vectors.times(asked)
    assert held.tolist() == [True, True, False, False, 1 not in gone]
    assert times[held].tolist() == [rows[int(i)][1] for i in asked[held]]


def test_episode_rankings_of_scattered_times_equal_brute_force(monkeypatch: pytest.MonkeyPatch) -> None:
    """Times recorded out of order: a range allows rows scattered in many runs, scored by
    gathering them (a small gather block: many blocks) or, for a large share, by scoring every
    row; every depth ranks from one scoring."""
    from memstrata.layers._episode_vectors import EpisodeVectors
    from memstrata.storage import _vector_kernels as kernels

    monkeypatch.setattr(kernels, "_GATHER_ROWS", 64)
    rng = np.random.default_rng(11)
    n = 4000
    vectors = EpisodeVectors(DIM)
    raw = rng.standard_normal((n, DIM)).astype(np.float32)
    at = rng.integers(0, 1000, n)
    vectors.add(list(range(1, n + 1)), raw, at.tolist(), [None] * n)
    q = rng.standard_normal(DIM).astype(np.float32)
    scored = 0
    original = vectors.mirror.scored

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal scored
        scored += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(vectors.mirror, "scored", counted)
    for since, until in ((300, 600), (100, 700), (0, 1000), (None, 150), (990, None)):
        ranking = vectors.rank(q, since_us=since, until_us=until)
        allowed = [
            i for i in range(n) if (since is None or at[i] >= since) and (until is None or at[i] < until)
        ]
        expected = sorted(allowed, key=lambda i: (-float(raw[i] @ q), i))
        for k in (1, 10, 100, len(allowed)):
            got_ids, got_scores, got_at = ranking.top(k)
            assert [i - 1 for i in got_ids.tolist()] == expected[:k]
            assert got_at.tolist() == at[expected[:k]].tolist()
            assert np.allclose(got_scores, raw[expected[:k]] @ q, atol=1e-5)
    assert scored == 5  # once per ranking, whatever the depths asked
