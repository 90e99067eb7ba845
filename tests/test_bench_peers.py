"""The side-by-side benchmark's own pieces: its peers must answer what the floors answer, or its
ratios compare different work."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_peers


def _data(n: int = 300, dim: int = bench_peers.DIM) -> bench_peers.Data:
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((n, dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    words = ["cache", "retry", "index", "queue", "deadlock", "unicode", "timeout", "schema"]
    texts = [f"entry {i} about {words[i % 8]} and {words[(i * 3) % 8]}" for i in range(n)]
    categories = [bench_peers.CATEGORIES[i % 5] for i in range(n)]
    qv = vectors[:5] + rng.standard_normal((5, dim), dtype=np.float32) * np.float32(0.01)
    qv /= np.linalg.norm(qv, axis=1, keepdims=True)
    return bench_peers.Data(texts, categories, vectors, ["cache retry", "index", "queue", "x", "schema"], qv)


def test_rrf_ranks_items_found_by_both_lists_first() -> None:
    fused = bench_peers._rrf([1, 2, 3], [3, 4, 5])
    assert fused[0] == 3
    assert set(fused) == {1, 2, 3, 4, 5}


@pytest.mark.parametrize("text", ['he said "hi"', "", "  ", "a OR b NOT c*", "(x) AND {y}", "naïve café"])
def test_fts_query_is_safe_for_any_text(tmp_path: Path, text: str) -> None:
    data = _data(20)
    bench_peers.build_minimal(tmp_path / "m.sqlite", data)
    minimal = bench_peers.Minimal(tmp_path / "m.sqlite")
    try:
        assert isinstance(minimal.keyword(text, None), list)
    finally:
        minimal.conn.close()


def test_minimal_schema_and_numpy_floor_agree_on_exact_answers(tmp_path: Path) -> None:
    data = _data()
    bench_peers.build_minimal(tmp_path / "m.sqlite", data)
    minimal = bench_peers.Minimal(tmp_path / "m.sqlite")
    try:
        floor = bench_peers.Floor(data, minimal)
        for i, qv in enumerate(data.query_vectors):
            assert minimal.vector(qv, None) == floor.vector(qv, None)
            allowed = floor.vector(qv, bench_peers.FILTER)
            assert all(data.categories[j] == bench_peers.FILTER for j in allowed)
            assert minimal.vector(qv, bench_peers.FILTER) == allowed
            assert floor.vector(qv, None)[0] == i  # each query is a near copy of entry i
            hybrid = minimal.hybrid(data.queries[i], qv, bench_peers.FILTER)
            assert hybrid == floor.hybrid(data.queries[i], qv, bench_peers.FILTER)
            assert all(data.categories[j] == bench_peers.FILTER for j in hybrid)
    finally:
        minimal.conn.close()


def test_recall_counts_overlap_with_the_exact_answer() -> None:
    truth = {0: list(range(10)), 1: list(range(10, 20))}
    assert bench_peers.recall({0: list(range(10)), 1: list(range(10, 20))}, truth) == 1.0
    assert bench_peers.recall({0: list(range(5)) + [99] * 5, 1: list(range(10, 20))}, truth) == 0.75


def test_fts_query_leaves_out_common_words_unless_nothing_else_is_left() -> None:
    assert bench_peers.fts_query("The cache of the queue") == '"cache" OR "queue"'
    assert bench_peers.fts_query("the of") == '"the" OR "of"'
    assert bench_peers.fts_query("!!") == '""'


def test_tail_latency_times_every_query_once_per_contender_in_turn(tmp_path: Path) -> None:
    """memstrata's store is searched with the query's own vector; a peer through ``hybrid``."""
    data = _data()
    calls: list[tuple[str, str]] = []

    class Store:
        def search(self, text: str, *, query_vector: np.ndarray) -> list[int]:
            assert np.array_equal(query_vector, data.query_vectors[data.queries.index(text)])
            calls.append(("memstrata", text))
            return []

    class Peer:
        def hybrid(self, text: str, qv: np.ndarray, category: str | None) -> list[int]:
            assert category is None
            calls.append(("peer", text))
            return []

    samples = bench_peers.tail_latency(
        {"memstrata": Store(), "peer": Peer()}, data.queries, data.query_vectors, range(2, 5)
    )
    assert calls == [(name, data.queries[i]) for i in range(2, 5) for name in ("memstrata", "peer")]
    assert {name: len(s) for name, s in samples.items()} == {"memstrata": 3, "peer": 3}
    assert all(ms >= 0 for s in samples.values() for ms in s)


def test_median_run_is_the_middle_first_query_and_keeps_its_other_figures() -> None:
    runs = [
        {"first_ms": 130.0, "import_ms": 1.0},
        {"first_ms": 70.0, "import_ms": 2.0},
        {"first_ms": 75.0, "import_ms": 3.0},
    ]
    assert bench_peers._median_run(runs) == {"first_ms": 75.0, "import_ms": 3.0}
    assert bench_peers._median_run(runs[:2])["first_ms"] == 70.0  # even count: the lower middle
    assert bench_peers._median_run(runs[:1])["first_ms"] == 130.0
