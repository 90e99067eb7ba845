"""Pre-task retrieval while other agents work: ``begin_task`` at 100k entries with 4 agents busy.

The agent ``bench`` has 100k knowledge entries (10k quick), a 1k shared store and 500 episodes,
loaded as :mod:`bench_system` loads them (the real model's vectors of its base sentences plus
noise, through ``add_many``; the episodes embedded by the model itself). Four other agents keep
the system busy the whole time: each completes a task (a write-back: its summary is embedded and
stored as knowledge and an episode) and then searches its knowledge, pausing 0.1 s between
rounds (:data:`BUSY_PERIOD_S`), so document batches are queued for the model and searches are in
flight. Meanwhile ``bench`` begins tasks with new text each time (the real model embeds every
query: no cache helps).

The baseline, measured in the same run and under the same load, interleaved call by call: the
query's embedding alone, the same model called directly on other new text of the same shape.
The target is the issue's: pre-task retrieval p50 <= 2x the query embedding p50. Also measured,
interleaved: the query embedding through the system's batching service (behind the busy agents'
document batches unless queries go first) and the agent's knowledge search alone; the embedding
measured before the busy agents start is in the notes (the machine's idle figure).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from _harness import Context, Row, percentile
from bench_system import AGENT, _queries, fill_from_bases

from memstrata import Config, MemorySystem
from memstrata.storage import Embedder, default_embedder

GROUP = "pretask busy"
BUSY_AGENTS = 4
BUSY_PERIOD_S = 0.1  # each busy agent: a write-back and a search every 0.1 s


def _busy(system: MemorySystem, index: int, stop: threading.Event, counts: list[int]) -> None:
    """One busy agent: a write-back, then a search of its own knowledge, every
    :data:`BUSY_PERIOD_S` (or back to back when it is 0), until ``stop``."""
    agent = system.agent(f"busy-{index}")
    n = 0
    while not stop.wait(BUSY_PERIOD_S if n else 0):
        agent.complete_task(
            f"b{index}-{n}", f"busy agent {index} finished step {n}: the report export needed batching {n}"
        )
        agent.query_knowledge(f"why did step {n} of agent {index} need batching")
        n += 1
    counts[index] = n


def _measure(system: MemorySystem, model: Embedder, queries: list[str]) -> tuple[dict[str, list[float]], int]:
    """Milliseconds per call, interleaved query by query (each call on new text): ``begin_task``;
    the model's query embedding called directly; the same through the system's embedding
    service (behind the busy agents' document batches unless queries go first); the agent's
    knowledge search alone (``query_knowledge``: its embedding and its 100k-entry search)."""
    agent = system.agent(AGENT)
    service = getattr(system._runtime, "embedder", None)  # the batching service the actors use
    samples: dict[str, list[float]] = {"retrieval": [], "model": [], "service": [], "search": []}
    fallbacks = 0
    for n, query in enumerate(queries):
        calls = {
            "model": lambda q=query: model.embed_query(f"{q} (alone)"),
            "service": lambda q=query: service.embed_query(f"{q} (service)") if service is not None else None,
            "search": lambda q=query: agent.query_knowledge(f"{q} (search)"),
        }
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            samples[name].append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        prompt = agent.begin_task(f"q{n}", query)
        samples["retrieval"].append((time.perf_counter() - started) * 1000)
        fallbacks += int(prompt.fallback or prompt.reason is not None)  # as in bench_system
    return samples, fallbacks


def pretask_busy(ctx: Context, model: Embedder, data: Path, entries: int, fill_note: str) -> list[Row]:
    queries = ctx.size(60, 20)
    with MemorySystem.start(Config(data_dir=data), embedder=model) as system:
        for n, warm in enumerate(_queries(5, 98)):  # opens the stores, maps their index files
            system.agent(AGENT).begin_task(f"warm{n}", warm)
        idle = []
        for text in _queries(20, 97):
            started = time.perf_counter()
            model.embed_query(text)
            idle.append((time.perf_counter() - started) * 1000)
        stop = threading.Event()
        counts = [0] * BUSY_AGENTS
        workers = [
            threading.Thread(target=_busy, args=(system, i, stop, counts), name=f"busy-{i}", daemon=True)
            for i in range(BUSY_AGENTS)
        ]
        for worker in workers:
            worker.start()
        try:
            for n, warm in enumerate(_queries(3, 96)):  # the busy agents' stores open before timing
                system.agent(AGENT).begin_task(f"busy-warm{n}", warm)
            load = f"load average {os.getloadavg()[0]:.1f}"
            before = system.status()["embedding"]
            started = time.perf_counter()
            samples, fallbacks = _measure(system, model, _queries(queries, 95))
            elapsed = time.perf_counter() - started
            after = system.status()["embedding"]
        finally:
            stop.set()
            for worker in workers:
                worker.join(timeout=120)
        system.wait_idle(60)
    retrieval, embedding = samples["retrieval"], samples["model"]
    p50, p99 = percentile(retrieval, 50), percentile(retrieval, 99)
    e50 = percentile(embedding, 50)
    ratio = p50 / e50 if e50 > 0 else float("inf")
    busy_note = _busy_note(counts, before, after, elapsed)
    at = f"@{entries // 1000}k"
    base = "query embedding alone, same run, interleaved"

    def against_embedding(what: str, sample: str, notes: str) -> Row:
        """The p50 of ``sample``, beside the query embedding's own p50."""
        p50 = percentile(samples[sample], 50)
        return Row(
            GROUP, f"{what} p50 {at}, agents busy", p50, "ms", baseline=e50, baseline_name=base, notes=notes
        )

    return [
        Row(
            GROUP,
            f"begin_task p50 {at}, {BUSY_AGENTS} agents busy",
            p50,
            "ms",
            "<= 2x query embedding",
            baseline=e50,
            baseline_name=base,
            met=ratio <= 2.0,
            notes=(
                f"{queries} new queries, real model; "
                f"{entries:,} entries + shared 1k + 500 episodes ({fill_note}); {busy_note}; "
                f"embedding alone before the agents got busy p50 {percentile(idle, 50):.1f} ms; {load}"
            ),
        ),
        Row(
            GROUP,
            f"begin_task p99 {at}, {BUSY_AGENTS} agents busy",
            p99,
            "ms",
            baseline=percentile(embedding, 99),
            baseline_name=f"{base} (p99)",
        ),
        against_embedding(
            "query embedding through the system's service",
            "service",
            "queued with the busy agents' document batches: a ratio near 1 means queries go first",
        ),
        against_embedding(
            "query_knowledge",
            "search",
            "the agent's own store alone (embedding + hybrid search of its entries): what begin_task "
            "adds to the embedding is mostly this search",
        ),
        Row(GROUP, f"begin_task fallbacks/degraded {at}, busy", fallbacks, "prompts", "0", met=not fallbacks),
    ]


def _busy_note(counts: list[int], before: dict[str, Any], after: dict[str, Any], seconds: float) -> str:
    texts = int(after.get("texts_embedded", 0)) - int(before.get("texts_embedded", 0))
    calls = int(after.get("model_calls", 0)) - int(before.get("model_calls", 0))
    return (
        f"busy agents completed {sum(counts)} tasks + as many searches; the model embedded {texts} texts "
        f"in {calls} calls during the {seconds:.1f} s measured"
    )


def run(ctx: Context) -> list[Row]:
    model = default_embedder()
    entries = ctx.size(100_000, 10_000)
    data = ctx.workdir / "pretask"
    return pretask_busy(ctx, model, data, entries, fill_from_bases(model, data, entries, ctx.shared))
