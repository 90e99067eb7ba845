"""Actors: pre-task retrieval latency through the whole actor path, and write-back throughput.

- Pre-task retrieval: ``agent.begin_task`` on an agent with 10k knowledge entries (2k quick)
  plus a 1k-entry shared store and some episodes, real default model for every query (each
  query is new, so no cache helps); p50/p99 and how many fell back.
- Durable acknowledgement: ``complete_task`` latency (the outbox commit the caller waits for).
- Write-back throughput: 16 agents completing tasks at once with the real model, from the first
  ``complete_task`` until every entry and episode is stored; nothing may be lost; model calls
  against the one-call-per-text baseline of an embedder without batching.
"""

from __future__ import annotations

import random
import threading
import time

from _harness import Context, Row, percentile
from memstrata.layers import EpisodicMemory, KnowledgeStore
from memstrata.storage import default_embedder

from memstrata import Config, MemorySystem

GROUP = "actors"
SUBJECTS = [
    "payment adapter", "orders migration", "search index", "login form", "session cache", "email queue",
    "refund flow", "cart page", "feature flags", "audit log", "rate limiter", "image resizer",
    "report export", "webhook handler", "billing cron", "profile page", "api gateway", "retry policy",
]  # fmt: skip
PROBLEMS = [
    "times out under load", "locks the table", "leaks memory after a deploy", "returns stale data",
    "double-charges on retry", "breaks on unicode input", "fails when the network flaps",
    "drops messages on restart", "needs an idempotency key", "must run in small batches",
    "is slow without an index", "logs secrets by mistake",
]  # fmt: skip
FIXES = [
    "add a circuit breaker", "batch the writes", "cache the lookups", "validate the input early",
    "use exponential backoff", "add a covering index", "stream the response", "pin the dependency",
]  # fmt: skip
CATEGORIES = ["pitfall", "pattern", "outcome", "codebase"]


def _entries(n: int, seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    items = []
    for i in range(n):
        subject, problem, fix = rng.choice(SUBJECTS), rng.choice(PROBLEMS), rng.choice(FIXES)
        items.append(
            {
                "content": f"The {subject} {problem}; {fix} (case {i})",
                "category": rng.choice(CATEGORIES),
                "tags": {"taskId": f"t{i}"},
            }
        )
    return items


def _queries(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    verbs = ["Fix", "Improve", "Review", "Refactor", "Harden", "Speed up", "Test", "Document"]
    return [
        f"{rng.choice(verbs)} the {rng.choice(SUBJECTS)} because it {rng.choice(PROBLEMS)} #{i}"
        for i in range(n)
    ]


def _retrieval(ctx: Context, embedder: object) -> list[Row]:
    size = ctx.size(10_000, 2_000)
    data = ctx.workdir / "retrieval"
    started = time.perf_counter()
    with KnowledgeStore.open(data / "knowledge" / "bench.sqlite", embedder) as store:  # type: ignore[arg-type]
        store.add_many(_entries(size, 1))
    with KnowledgeStore.open(data / "knowledge" / "shared.sqlite", embedder) as store:  # type: ignore[arg-type]
        store.add_many(_entries(ctx.size(1_000, 200), 2))
    episodic = EpisodicMemory.open(data / "episodic" / "bench.sqlite", embedder)  # type: ignore[arg-type]
    try:
        episodic.record_many(
            [
                {"content": e["content"], "task_run_id": f"r{i}", "kind": "task"}
                for i, e in enumerate(_entries(500, 3))
            ]
        )
    finally:
        episodic.close()
    fill_s = time.perf_counter() - started
    queries = _queries(ctx.size(300, 60), 4)
    latencies: list[float] = []
    fallbacks = 0
    with MemorySystem.start(Config(data_dir=data), embedder=embedder) as system:  # type: ignore[arg-type]
        agent = system.agent("bench")
        for warm in range(3):
            agent.begin_task(f"warm{warm}", f"warm up query {warm}")
        for i, query in enumerate(queries):
            t0 = time.perf_counter()
            prompt = agent.begin_task(f"q{i}", query)
            latencies.append((time.perf_counter() - t0) * 1000)
            fallbacks += int(prompt.fallback)
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    notes = f"{size} entries + shared 1k + 500 episodes; {len(queries)} new queries; fill {fill_s:.0f} s"
    return [
        Row(
            GROUP,
            f"pre-task retrieval p50 @{size // 1000}k",
            p50,
            "ms",
            "<= 50 ms",
            notes=notes,
            met=p50 <= 50,
        ),
        Row(
            GROUP,
            f"pre-task retrieval p99 @{size // 1000}k",
            p99,
            "ms",
            "<= 5000 ms (the timeout)",
            met=p99 <= 5000,
        ),
        Row(GROUP, "pre-task fallbacks", fallbacks, "prompts", "0", met=fallbacks == 0),
    ]


def _write_back(ctx: Context, embedder: object) -> list[Row]:
    agents, per_agent = 16, ctx.size(25, 6)
    data = ctx.workdir / "writeback"
    acks: list[float] = []
    lock = threading.Lock()
    with MemorySystem.start(Config(data_dir=data), embedder=embedder) as system:  # type: ignore[arg-type]
        handles = [system.agent(f"worker-{i}") for i in range(agents)]
        for handle in handles:  # open every actor first: measure steady state, not first use
            handle.store_knowledge("warm up", category="pattern")
            handle.remember("warm up")
        assert system.wait_idle(60)
        before = system.status()["embedding"]
        barrier = threading.Barrier(agents + 1)

        def work(i: int) -> None:
            barrier.wait()
            for n in range(per_agent):
                t0 = time.perf_counter()
                handles[i].complete_task(
                    f"t{n}", f"worker {i} finished task {n}: {_entries(1, i * 1000 + n)[0]['content']}"
                )
                with lock:
                    acks.append((time.perf_counter() - t0) * 1000)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(agents)]
        for t in threads:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        idle = system.wait_idle(300)
        elapsed = time.perf_counter() - t0
        after = system.status()
    tasks = agents * per_agent
    stored = 0
    for i in range(agents):
        with KnowledgeStore.open(data / "knowledge" / f"worker-{i}.sqlite", embedder) as store:  # type: ignore[arg-type]
            stored += store.count() - 1  # minus the warm-up entry
        episodic = EpisodicMemory.open(data / "episodic" / f"worker-{i}.sqlite", embedder)  # type: ignore[arg-type]
        try:
            stored += episodic.count() - 1
        finally:
            episodic.close()
    emb = after["embedding"]
    calls = emb["model_calls"] - before["model_calls"]
    texts = emb["texts_requested"] - before["texts_requested"]
    lost = 2 * tasks - stored
    return [
        Row(
            GROUP,
            "write-back throughput (16 agents)",
            tasks / elapsed,
            "tasks/s",
            notes=f"{tasks} tasks, idle={idle}",
        ),
        Row(GROUP, "write-backs lost", lost, "entries", "0", met=lost == 0),
        Row(
            GROUP,
            "write-back model calls",
            calls,
            "calls",
            "< one per text",
            baseline=texts,
            baseline_name="one call per text",
            met=calls < texts,
        ),
        Row(GROUP, "complete_task ack p50", percentile(acks, 50), "ms", notes="durable outbox commit"),
        Row(GROUP, "complete_task ack p99", percentile(acks, 99), "ms"),
    ]


def run(ctx: Context) -> list[Row]:
    embedder = default_embedder()
    return _retrieval(ctx, embedder) + _write_back(ctx, embedder)
