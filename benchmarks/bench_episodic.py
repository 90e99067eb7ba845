"""Episodic search latency at 100k episodes (10k with --quick).

Episodes are inserted with a cheap deterministic embedder (the model's cost is measured by the
embedding benchmarks); query vectors are computed once beforehand, so the figures are the
search itself: vector scan, FTS5, fusion and loading the hits. The baseline is an exact numpy
scan of the same vectors (matrix-vector product + partial sort), measured in the same run.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np
import numpy.typing as npt
from _harness import Context, Row, p50, percentile, time_calls
from memstrata.layers import EpisodicMemory

DIM = 384
NOW = datetime(2025, 6, 1, tzinfo=UTC)
SPAN_DAYS = 365
RUNS = 1_000
GROUP = "episodic"


class CheapEmbedder:
    """Deterministic pseudo-random unit vectors: a vector per distinct text, at numpy speed."""

    model_id = "bench-cheap"
    dim = DIM

    def __init__(self) -> None:
        self.queries: dict[str, npt.NDArray[np.float32]] = {}

    def _vectors(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        seeds = [zlib.crc32(t.encode("utf-8", "replace")) for t in texts]
        out = np.empty((len(texts), DIM), dtype=np.float32)
        for i, seed in enumerate(seeds):
            out[i] = np.random.default_rng(seed).standard_normal(DIM, dtype=np.float32)
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return self._vectors(texts)

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        cached = self.queries.get(text)
        return cached if cached is not None else self._vectors([text])[0]


def _corpus(n: int, rng: np.random.Generator) -> tuple[list[str], list[dict[str, object]]]:
    vocabulary = [f"{a}{b}" for a in ("deploy", "cache", "queue", "payment", "index", "auth", "build", "disk")
                  for b in ("er", "ing", "ed", "s", "", "ion", "ful", "less")]  # fmt: skip
    vocabulary += [f"term{i}" for i in range(2_000)]
    words = np.array(vocabulary)
    items: list[dict[str, object]] = []
    ages = rng.uniform(0, SPAN_DAYS * 86_400, size=n)
    picks = rng.integers(0, len(words), size=(n, 18))
    for i in range(n):
        items.append(
            {
                "content": f"episode {i}: " + " ".join(words[picks[i]]),
                "title": f"task {i % RUNS} step",
                "task_run_id": f"run-{i % RUNS}",
                "kind": "observation",
                "at": NOW - timedelta(seconds=float(ages[i])),
            }
        )
    return vocabulary, items


def run(ctx: Context) -> list[Row]:
    n = ctx.size(100_000, 10_000)
    rng = np.random.default_rng(7)
    vocabulary, items = _corpus(n, rng)
    embedder = CheapEmbedder()
    rows: list[Row] = []
    path = ctx.workdir / "episodic.sqlite"
    with EpisodicMemory.open(path, embedder, clock=lambda: NOW) as ep:
        start = time.perf_counter()
        for offset in range(0, n, 5_000):
            ep.record_many(items[offset : offset + 5_000])
        elapsed = time.perf_counter() - start
        rows.append(Row(GROUP, f"record_many, {n:,} episodes (cheap embedder)", n / elapsed, "episodes/s"))

        queries = [" ".join(rng.choice(vocabulary, size=3)) for _ in range(30)]
        for q in queries:
            embedder.queries[q] = embedder.embed_documents([q])[0]
        vectors = embedder.embed_documents([str(i["title"]) + "\n\n" + str(i["content"]) for i in items])
        cycle = iter(range(10**9))

        def next_query() -> str:
            return queries[next(cycle) % len(queries)]

        def numpy_scan() -> None:
            q = embedder.queries[next_query()]
            scores = vectors @ q
            top = np.argpartition(-scores, 10)[:10]
            top[np.argsort(-scores[top])]

        repeat = ctx.size(60, 30)
        baseline = p50(time_calls(numpy_scan, repeat))
        rows.append(Row(GROUP, f"exact numpy scan, {n:,} x {DIM}", baseline, "ms", notes="baseline"))

        last_month = NOW - timedelta(days=30)
        cases = [
            ("hybrid search", {}),
            ("vector search", {"mode": "vector"}),
            ("keyword search", {"mode": "keyword"}),
            ("hybrid, last 30 days", {"since": last_month}),
            (
                "hybrid, 6-month range",
                {"since": NOW - timedelta(days=300), "until": NOW - timedelta(days=120)},
            ),
            ("hybrid, one task run", {"task_run_id": "run-17"}),
            ("hybrid, recency half-life 7 d", {"recency_half_life": timedelta(days=7)}),
        ]
        for label, kwargs in cases:
            ep.search(next_query(), **kwargs)  # type: ignore[arg-type]  # loads the matrix once
            samples = time_calls(lambda kw=kwargs: ep.search(next_query(), **kw), repeat)  # type: ignore[misc]
            rows.append(
                Row(
                    GROUP,
                    f"{label}, {n:,} episodes, p50",
                    p50(samples),
                    "ms",
                    baseline=baseline,
                    baseline_name="numpy scan",
                    notes=f"p99 {percentile(samples, 99):.2f} ms; query vector precomputed",
                )
            )

        samples = time_calls(lambda: ep.timeline(limit=100, newest_first=True), repeat)
        rows.append(Row(GROUP, "timeline, newest 100, p50", p50(samples), "ms"))

        archive = ctx.workdir / "oldest-half.sqlite"
        start = time.perf_counter()
        archived = ep.archive(archive, before=NOW - timedelta(days=SPAN_DAYS // 2))
        rows.append(
            Row(GROUP, f"archive {archived:,} episodes to one file", time.perf_counter() - start, "s")
        )
        ep.search(next_query(), include_archives=True)
        samples = time_calls(lambda: ep.search(next_query(), include_archives=True), repeat)
        rows.append(
            Row(
                GROUP,
                f"hybrid incl. archive ({n - archived:,} live + {archived:,} archived), p50",
                p50(samples),
                "ms",
                baseline=baseline,
                baseline_name="numpy scan",
                notes=f"p99 {percentile(samples, 99):.2f} ms",
            )
        )
    return rows
