"""VectorIndex at scale: inverted lists (recall, deletes, filters, rebuilds), the change-log
refresh between connections, bulk deletes and the chunk-table reader.

The inverted lists switch on at ``approximate_from`` live vectors (100k by default); these tests
set it low so that 20k vectors exercise the same code in seconds.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from memstrata.errors import InvalidInputError
from memstrata.storage import Database, VectorIndex, open_database
from memstrata.storage import _vector_kernels as kernels_module
from memstrata.storage import _vector_mirror as mirror_module
from memstrata.storage import _vector_sync as vector_sync_module
from memstrata.storage._vec0_chunks import read_rows

DIM = 32
N = 20_000
THRESHOLD = 10_000
META = {"cat": "integer", "agent": "text"}
AGENTS = ("a", "agent-with-a-long-name", "ägent-ünïcode-long-name-✓")  # short, long, long non-ASCII

FloatArray = npt.NDArray[np.float32]


def _unit(a: FloatArray) -> FloatArray:
    out: FloatArray = (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)
    return out


BASES = _unit(np.random.default_rng(0).standard_normal((400, DIM)).astype(np.float32))


def _clustered(seed: int, n: int) -> FloatArray:
    """Vectors that cluster like sentence embeddings: a base, part of another, noise."""
    rng = np.random.default_rng(seed)
    mixed = BASES[rng.integers(0, len(BASES), n)] + 0.5 * BASES[rng.integers(0, len(BASES), n)]
    mixed += rng.standard_normal((n, DIM)).astype(np.float32) * (0.6 / np.sqrt(DIM))
    return _unit(mixed)


def _queries(seed: int, n: int) -> FloatArray:
    """Queries near the bases (like a short question near the sentences that answer it)."""
    rng = np.random.default_rng(seed + 1000)
    noise = rng.standard_normal((n, DIM)).astype(np.float32) * (0.5 / np.sqrt(DIM))
    return _unit(BASES[rng.integers(0, len(BASES), n)] + noise)


VECTORS = _clustered(1, N)
CATS = np.random.default_rng(2).integers(0, 4, N)
AGENT_OF = np.random.default_rng(3).choice(
    len(AGENTS), N, p=[0.9, 0.05, 0.05]
)  # a broad and two narrow filters


def _metas(rows: range | list[int]) -> list[dict[str, Any]]:
    return [{"cat": int(CATS[r - 1]), "agent": AGENTS[int(AGENT_OF[r - 1])]} for r in rows]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store of N vectors, copied for each test (inserting them takes longer than a copy)."""
    path = tmp_path_factory.mktemp("scale") / "template.sqlite"
    db = open_database(path)
    index = VectorIndex(db, "items", DIM, metadata=META)
    for start in range(1, N + 1, 5000):
        rows = range(start, min(N, start + 4999) + 1)
        with db.transaction():
            index.upsert_many(list(rows), VECTORS[start - 1 : rows[-1]], _metas(rows))
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return path


@pytest.fixture
def store(template: Path, tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "store.sqlite"
    shutil.copy(template, path)
    yield path


def _open(path: Path, threshold: int | None = THRESHOLD) -> tuple[Database, VectorIndex]:
    db = open_database(path)
    return db, VectorIndex(db, "items", DIM, metadata=META, approximate_from=threshold)


def _exact(index: VectorIndex, query: FloatArray, k: int, where: dict[str, Any] | None = None) -> list[int]:
    return [h.rowid for h in index.search(query, k, where=where, engine="vec0")]


def _recall(
    index: VectorIndex, queries: FloatArray, k: int = 10, where: dict[str, Any] | None = None
) -> float:
    found = [
        len({h.rowid for h in index.search(q, k, where=where)} & set(_exact(index, q, k, where)))
        for q in queries
    ]
    return sum(found) / (k * len(queries))


def test_inverted_lists_reach_the_recall_target(store: Path) -> None:
    db, index = _open(store)
    queries = _queries(1, 60)
    index.search(queries[0], 10)
    approx = index.status()["approximate"]
    assert approx is not None and approx["lists"] >= 128 and approx["tail_rows"] == 0
    assert _recall(index, queries) >= 0.99
    # the similarities are exact ones, not estimates
    for hit in index.search(queries[1], 5):
        stored = index.get(hit.rowid)
        assert stored is not None
        assert hit.similarity == pytest.approx(float(_unit(stored) @ queries[1]), abs=1e-5)
    db.close()


def test_small_mirrors_candidates_and_exact_stay_exact(store: Path) -> None:
    db, index = _open(store, threshold=None)
    queries = _queries(2, 20)
    for q in queries:
        assert [h.rowid for h in index.search(q, 10)] == _exact(index, q, 10)
    assert index.status()["approximate"] is None
    db.close()
    db, index = _open(store)
    index.search(queries[0], 1)
    assert index.status()["approximate"] is not None
    rng = np.random.default_rng(3)
    for q in queries:
        subset = [int(i) for i in rng.choice(np.arange(1, N + 1), 3000, replace=False)]
        for candidates in (subset[:50], subset):  # both candidate paths
            expected = [h.rowid for h in index.search(q, 10, candidates=candidates, engine="vec0")]
            assert [h.rowid for h in index.search(q, 10, candidates=candidates)] == expected
        assert [h.rowid for h in index.search(q, 10, exact=True)] == _exact(index, q, 10)
    db.close()


def test_deletes_and_filters_under_the_inverted_lists(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    masked: list[bool] = []  # each search through the lists: did it carry a mask of allowed rows?
    scan = mirror_module.Mirror._search_lists

    def spy(self: Any, part: Any, query: Any, k: int, valid: Any, rows: float) -> Any:
        masked.append(valid is not None)
        return scan(self, part, query, k, valid, rows)

    monkeypatch.setattr(mirror_module.Mirror, "_search_lists", spy)
    # 256 lists at this size: scan 64 of them, so that a filter passing 90% of rows stays below
    # the share from which a search scans everything (as it does with more lists at 200k+)
    monkeypatch.setattr(mirror_module, "PROBE_LISTS", 64)
    db, index = _open(store)
    queries = _queries(3, 40)
    index.search(queries[0], 1)
    assert index.status()["approximate"] is not None and masked == [False]
    # delete the current best answers and 10% of the rows: they must never come back
    rng = np.random.default_rng(11)
    doomed = {h.rowid for q in queries for h in index.search(q, 3)}
    doomed |= {int(r) for r in rng.choice(np.arange(1, N + 1), N // 10, replace=False)}
    index.delete_many(doomed)
    masked.clear()
    for q in queries:
        assert not doomed & {h.rowid for h in index.search(q, 10)}
    assert masked and all(masked)  # the dead rows were masked out of the scanned lists
    queries = _queries(13, 40)  # fresh queries: recall over what is left
    assert _recall(index, queries) >= 0.99
    # a broad filter (90% of rows) scans the lists with a mask; narrow ones scan their rows exactly
    for where, through_lists in (
        ({"agent": "a"}, True),
        ({"agent": AGENTS[1]}, False),
        ({"agent": AGENTS[2], "cat": 1}, False),
    ):
        masked.clear()
        for q in queries[:10]:
            hits = index.search(q, 10, where=where)
            assert hits, where
            for hit in hits:
                assert AGENTS[int(AGENT_OF[hit.rowid - 1])] == where["agent"]
                assert int(CATS[hit.rowid - 1]) == where.get("cat", int(CATS[hit.rowid - 1]))
        assert masked == ([True] * 10 if through_lists else []), where
        assert _recall(index, queries, where=where) >= 0.99
    assert index.search(queries[0], 10, where={"agent": "nobody"}) == []
    db.close()


def test_new_rows_are_found_and_the_tail_is_folded_in(store: Path) -> None:
    db, index = _open(store)
    queries = _queries(4, 30)
    index.search(queries[0], 1)
    first = index.status()["approximate"]
    assert first["builds"] == 1
    # new rows go to the tail, which every search scans exactly: a copy of a query is found first
    index.upsert_many([N + 1, N + 2], queries[:2] * 3, _metas([1, 2]))
    assert index.search(queries[0], 1)[0].rowid == N + 1
    assert index.search(queries[1], 1, where={"cat": int(CATS[1])})[0].rowid == N + 2
    assert index.status()["approximate"]["tail_rows"] == 2
    # an update moves a row to the tail; its old place no longer answers
    index.upsert_many([5], queries[2:3], _metas([5]))
    assert index.search(queries[2], 1)[0].rowid == 5
    # a tail beyond 15% of the lists is folded into them (same centroids)
    more = _clustered(40, 4000)
    index.upsert_many(list(range(N + 3, N + 4003)), more, _metas(list(range(1, 4001))))
    index.search(queries[0], 1)
    folded = index.status()["approximate"]
    assert (
        folded["builds"] == 2 and folded["tail_rows"] == 0 and folded["trained_rows"] == first["trained_rows"]
    )
    assert index.search(queries[0], 1)[0].rowid == N + 1
    assert _recall(index, queries) >= 0.99
    # twice the rows the centroids were trained on: they are trained again
    grow = _clustered(41, N + 4000)
    start = N + 5000
    for offset in range(0, len(grow), 8000):
        chunk = grow[offset : offset + 8000]
        ids = list(range(start + offset, start + offset + len(chunk)))
        index.upsert_many(ids, chunk, _metas([1 + i % N for i in range(len(chunk))]))
    index.search(queries[0], 1)
    retrained = index.status()["approximate"]
    assert retrained["trained_rows"] > 2 * first["trained_rows"] and retrained["tail_rows"] == 0
    assert _recall(index, queries) >= 0.99
    # shrinking far below the threshold returns to exact search
    index.delete_many(r for r in range(1, start + len(grow)) if r not in (N + 1, N + 2))
    assert [h.rowid for h in index.search(queries[0], 5)] == [N + 1, N + 2]
    assert index.status()["approximate"] is None
    db.close()


State = dict[int, tuple[FloatArray, int, str]]


def _mirror_state(index: VectorIndex) -> State:
    """What the mirror holds: rowid -> (unit vector, cat, agent)."""
    mirror = index._mirror
    assert mirror is not None
    vocab = {c: {code: value for value, code in mirror.vocab[c].items()} for c in META}
    state = {}
    for pos in np.flatnonzero(mirror.alive[: mirror.size]):
        state[int(mirror.rowids[pos])] = (
            mirror.matrix[pos],
            vocab["cat"][int(mirror.codes["cat"][pos])],
            vocab["agent"][int(mirror.codes["agent"][pos])],
        )
    return state


def _store_state(db: Database) -> State:
    return {
        int(r): (_unit(np.frombuffer(e, dtype=np.float32)), int(c), str(a))
        for r, e, c, a in db.query("SELECT rowid, embedding, cat, agent FROM items_vec")
    }


def _same(a: State, b: State) -> bool:
    return a.keys() == b.keys() and all(
        a[r][1:] == b[r][1:] and np.allclose(a[r][0], b[r][0], atol=1e-6) for r in a
    )


def test_another_connections_writes_refresh_the_mirror_incrementally(store: Path) -> None:
    db_a, index_a = _open(store)
    db_b, index_b = _open(store)
    queries = _queries(5, 20)
    index_a.search(queries[0], 1)
    assert index_a.reloads == 1 and index_a.status()["approximate"] is not None
    rng = np.random.default_rng(6)
    renamed = set()
    for round_ in range(3):
        with db_b.transaction():
            index_b.upsert_many(
                list(range(N + 1 + 100 * round_, N + 101 + 100 * round_)),
                _clustered(7 + round_, 100),
                _metas(range(1, 101)),
            )
            index_b.delete_many([int(r) for r in rng.choice(np.arange(1, N + 1), 50, replace=False)])
            updated = [int(r) for r in rng.choice(np.arange(1, N + 1), 30, replace=False)]
            index_b.upsert_many(updated, _clustered(20 + round_, 30), _metas([1 + (u % 7) for u in updated]))
        index_b.update_metadata(updated[0], {"cat": 3, "agent": "renamed-agent-long-name"})
        renamed.add(updated[0])
        hits = index_a.search(queries[round_], 10)
        assert [h.rowid for h in hits] == [h.rowid for h in index_a.search(queries[round_], 10)]
        assert _same(_mirror_state(index_a), _store_state(db_a))
    assert index_a.reloads == 1 and index_a.refreshes >= 3
    found = index_a.search(queries[0], 5, where={"agent": "renamed-agent-long-name"})
    assert {h.rowid for h in found} == renamed
    db_a.close()
    db_b.close()


def test_a_mirror_behind_the_pruned_log_or_a_reset_reloads(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vector_sync_module, "LOG_KEEP", 50)
    monkeypatch.setattr(vector_sync_module, "_LOG_SLACK", 10)
    db_a, index_a = _open(store)
    db_b, index_b = _open(store)
    index_a.search(VECTORS[0], 1)
    for i in range(5):
        index_b.upsert_many(
            list(range(N + 1 + 40 * i, N + 41 + 40 * i)), _clustered(30 + i, 40), _metas(range(1, 41))
        )
    assert int(db_b.scalar("SELECT count(*) FROM items_vec_log")) <= 61
    index_a.search(VECTORS[0], 1)
    assert index_a.reloads == 2  # the entries it needed were pruned
    assert _same(_mirror_state(index_a), _store_state(db_a))
    index_b.upsert(N + 500, VECTORS[1], _metas([2])[0])
    index_a.search(VECTORS[0], 1)
    assert index_a.reloads == 2 and (N + 500) in _mirror_state(index_a)
    index_b.reset(DIM * 2)
    wide = np.ones(DIM * 2, dtype=np.float32)
    index_b.upsert(1, wide, _metas([1])[0])
    with pytest.raises(InvalidInputError, match=f"{DIM * 2}"):  # reloaded: the table changed dimension
        index_a.search(VECTORS[0], 3)
    assert [h.rowid for h in index_a.search(wide, 3)] == [1]
    assert index_a.reloads == 3 and index_a.dim == DIM * 2
    db_a.close()
    db_b.close()


def test_rollback_rereads_only_what_it_touched(store: Path) -> None:
    db, index = _open(store)
    queries = _queries(8, 5)
    before = [h.rowid for h in index.search(queries[0], 5)]
    with pytest.raises(RuntimeError), db.transaction():
        index.upsert_many([N + 1], queries[:1], _metas([1]))
        index.delete_many(before[:2])
        assert index.search(queries[0], 1)[0].rowid == N + 1
        with pytest.raises(RuntimeError), db.transaction():  # a savepoint inside
            index.delete_many([N + 1])
            raise RuntimeError("inner")
        assert index.search(queries[0], 1)[0].rowid == N + 1
        raise RuntimeError("outer")
    assert [h.rowid for h in index.search(queries[0], 5)] == before
    assert index.reloads == 1
    assert _same(_mirror_state(index), _store_state(db))
    db.close()


def test_bulk_delete_many(store: Path) -> None:
    db, index = _open(store)
    index.search(VECTORS[0], 1)
    rng = np.random.default_rng(9)
    doomed = [int(r) for r in rng.choice(np.arange(1, N + 1), 3000, replace=False)]
    with db.transaction():
        index.delete_many([*doomed, 10 * N])  # an unknown rowid is ignored
    assert index.count() == N - 3000
    assert int(db.scalar("PRAGMA cache_size")) == -2000  # restored after the batch
    assert set(doomed).isdisjoint(index.rowids())
    assert set(doomed).isdisjoint(_mirror_state(index))
    other_db, other = _open(store)
    other.search(VECTORS[0], 1)
    assert _same(_mirror_state(other), _store_state(db)) and len(_mirror_state(other)) == N - 3000
    db.close()
    other_db.close()


def test_chunk_reader_matches_the_virtual_table_with_metadata(store: Path) -> None:
    db, index = _open(store)
    index.delete_many(range(100, 3000, 7))
    index.upsert_many([N + 1], VECTORS[:1], [{"cat": 9, "agent": "exactly12chr"}])
    index.upsert_many([N + 2], VECTORS[1:2], [{"cat": -(2**40), "agent": ""}])
    table = "items_vec"
    expected = {int(r[0]): r[1:] for r in db.query(f"SELECT rowid, embedding, cat, agent FROM {table}")}
    for wanted in (None, [*sorted(expected)[::97], N + 1, N + 2, 123_456], sorted(expected)[:4000:2]):
        rows = read_rows(db, table, DIM, list(META.items()), wanted)
        assert rows is not None
        keys = sorted(expected) if wanted is None else sorted(w for w in wanted if w in expected)
        assert sorted(rows.rowids) == keys
        for i, rowid in enumerate(rows.rowids):
            blob, cat, agent = expected[rowid]
            assert rows.vectors[i].tobytes() == blob
            assert (rows.metas["cat"][i], rows.metas["agent"][i]) == (cat, agent)
    db.close()


def test_chunk_reader_types(tmp_path: Path) -> None:
    db = open_database(tmp_path / "t.sqlite")
    meta = {"n": "integer", "x": "float", "flag": "boolean", "label": "text"}
    index = VectorIndex(db, "typed", 8, metadata=meta)
    rng = np.random.default_rng(10)
    metas = [
        {
            "n": int(i) - 500,
            "x": float(i) / 3,
            "flag": bool(i % 3 == 0),
            "label": "long label " * (i % 4) + str(i),
        }
        for i in range(2100)
    ]
    index.upsert_many(list(range(1, 2101)), rng.standard_normal((2100, 8)).astype(np.float32), metas)
    rows = read_rows(db, "typed_vec", 8, list(meta.items()))
    assert rows is not None and sorted(rows.rowids) == list(range(1, 2101))
    for i, rowid in enumerate(rows.rowids):
        want = metas[rowid - 1]
        assert rows.metas["n"][i] == want["n"] and rows.metas["x"][i] == want["x"]
        assert rows.metas["flag"][i] == int(want["flag"]) and rows.metas["label"][i] == want["label"]
    for where in ({"flag": True}, {"label": metas[7]["label"]}, {"x": metas[9]["x"], "n": metas[9]["n"]}):
        got = {h.rowid for h in index.search(np.ones(8, dtype=np.float32), 3000, where=where)}
        assert got == {
            h.rowid for h in index.search(np.ones(8, dtype=np.float32), 3000, where=where, engine="vec0")
        }
    db.close()


def test_rows_are_permuted_in_place() -> None:
    from memstrata.storage._vector_kernels import permute_rows

    rng = np.random.default_rng(12)
    for n in (1, 7, 16_384, 40_000):
        original = rng.standard_normal((n + 5, 3)).astype(np.float32)
        for order in (
            rng.permutation(n),
            np.arange(n)[::-1],
            np.argsort(rng.integers(0, 9, n), kind="stable"),
        ):
            matrix = original.copy()
            permute_rows(matrix, order)
            assert np.array_equal(matrix[:n], original[order]) and np.array_equal(matrix[n:], original[n:])


def test_large_scans_pick_the_faster_way_and_agree() -> None:
    scanner = kernels_module._Scanner()
    matrix = _unit(np.random.default_rng(14).standard_normal((20_000, DIM)).astype(np.float32))
    query = matrix[3]
    first = scanner.dot(matrix, query)
    second = scanner.dot(matrix, query)  # the first scan measured one way, the second the other
    assert scanner.cost["einsum"] > 0 and scanner.cost["blas"] > 0
    assert np.allclose(first, second, atol=1e-5) and np.allclose(first, matrix @ query, atol=1e-5)
    scanner.cost = {"einsum": 1.0, "blas": 1e-12}  # pretend BLAS is far cheaper: only it is used
    scanner.scans = 0
    for _ in range(scanner._EXPLORE - 1):
        scanner.dot(matrix, query)
    assert scanner.cost["einsum"] == 1.0
    scanner.dot(matrix, query)  # ... except once every _EXPLORE scans, to notice a change
    assert scanner.cost["einsum"] < 1.0
    small = kernels_module._Scanner()
    small.dot(matrix[:100], query)  # small scans stay on the calling thread, unmeasured
    assert small.cost == {"einsum": 0.0, "blas": 0.0}


def test_the_next_connection_adopts_the_stored_lists(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    queries = _queries(15, 40)
    db_a, index_a = _open(store)
    index_a.search(queries[0], 1)
    built = index_a.status()["approximate"]
    assert built["builds"] == 1 and built["restored"] == 0
    assert db_a.scalar("SELECT count(*) FROM items_vec_lists") == 1

    db_b, index_b = _open(store)
    index_b.search(queries[0], 1)
    adopted = index_b.status()["approximate"]
    assert adopted["builds"] == 0 and adopted["restored"] == 1
    assert adopted["lists"] == built["lists"] and adopted["tail_rows"] == 0
    assert _recall(index_b, queries) >= 0.99
    db_b.close()

    # rows written since the lists were stored join the tail; the others keep their lists
    index_a.upsert_many([N + 1, 7], queries[1:3], _metas([1, 7]))
    index_a.delete_many([8, 9])
    db_c, index_c = _open(store)
    assert [h.rowid for h in index_c.search(queries[1], 1)] == [N + 1]
    assert [h.rowid for h in index_c.search(queries[2], 1)] == [7]
    adopted = index_c.status()["approximate"]
    assert adopted["restored"] == 1 and adopted["tail_rows"] == 2
    assert _same(_mirror_state(index_c), _store_state(db_c))
    db_c.close()

    # when the log no longer reaches back to the stored lists, they are built again
    monkeypatch.setattr(vector_sync_module, "LOG_KEEP", 5)
    monkeypatch.setattr(vector_sync_module, "_LOG_SLACK", 1)
    for i in range(3):
        index_a.upsert_many(
            list(range(N + 10 + 10 * i, N + 20 + 10 * i)), _clustered(50 + i, 10), _metas(range(1, 11))
        )
    db_d, index_d = _open(store)
    index_d.search(queries[0], 1)
    assert index_d.status()["approximate"]["builds"] == 1 and index_d.status()["approximate"]["restored"] == 0
    db_d.close()
    index_a.reset(DIM)  # a reset forgets them
    assert db_a.scalar("SELECT count(*) FROM items_vec_lists") == 0
    db_a.close()


def test_list_scans_split_over_two_threads_rank_like_one(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db, index = _open(store)
    queries = _queries(7, 30)
    monkeypatch.setattr(kernels_module._Scanner, "_MIN_ROWS", 1_000)  # 20k rows: split every scan
    monkeypatch.setattr(kernels_module, "_CPUS", 2)
    split = [[(h.rowid, h.similarity) for h in index.search(q, k)] for q in queries for k in (1, 10, 50)]
    assert any(t.name.startswith("memstrata-scan") for t in threading.enumerate())
    monkeypatch.setattr(kernels_module, "_CPUS", 1)
    alone = [[(h.rowid, h.similarity) for h in index.search(q, k)] for q in queries for k in (1, 10, 50)]
    assert index.status()["approximate"] is not None
    # the same rows; similarities agree to float32 rounding (numpy's summation order follows
    # the query array's alignment, which varies from call to call in either mode)
    assert [[r for r, _ in hits] for hits in split] == [[r for r, _ in hits] for hits in alone]
    for a, b in zip(split, alone, strict=True):
        np.testing.assert_allclose([s for _, s in a], [s for _, s in b], atol=1e-6)
    assert all(len(hits) == k for hits, k in zip(split, [1, 10, 50] * len(queries), strict=True))
    db.close()


@pytest.mark.parametrize("cpus", [1, 2])
def test_scattered_rows_are_scored_a_block_at_a_time(monkeypatch: pytest.MonkeyPatch, cpus: int) -> None:
    monkeypatch.setattr(kernels_module, "_GATHER_ROWS", 100)  # several blocks, one partial
    monkeypatch.setattr(kernels_module._Scanner, "_MIN_ROWS", 1_000)
    monkeypatch.setattr(kernels_module, "_CPUS", cpus)
    rng = np.random.default_rng(9)
    positions = np.sort(rng.choice(N, 2_345, replace=False)).astype(np.int64)
    query = _queries(9, 1)[0]
    scores = kernels_module.dot_rows(VECTORS, positions, query)
    np.testing.assert_allclose(scores, VECTORS[positions] @ query, atol=1e-6)
    assert scores.dtype == np.float32 and len(scores) == len(positions)
    assert len(kernels_module.dot_rows(VECTORS, positions[:0], query)) == 0
    for bad in (N, -1):  # the gather itself clips: positions are checked first
        with pytest.raises(IndexError, match="outside"):
            kernels_module.dot_rows(VECTORS, np.append(positions, bad), query)


def test_selective_filters_rank_like_vec0(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels_module, "_GATHER_ROWS", 64)
    db, index = _open(store)
    for q in _queries(10, 10):
        for where in ({"cat": 2}, {"agent": AGENTS[1]}):  # ~25% and ~5% of the rows
            expected = [h.rowid for h in index.search(q, 10, where=where, engine="vec0")]
            assert [h.rowid for h in index.search(q, 10, where=where, exact=True)] == expected
    db.close()
