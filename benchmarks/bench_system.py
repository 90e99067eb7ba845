"""The whole system, real model: pre-task retrieval at 100k entries, write-back throughput, memory.

- Pre-task retrieval: ``agent.begin_task`` -> prompt through the actors, with 100k entries in the
  agent's store (10k quick), a 1k shared store and 500 episodes; every query is new text, so the
  real model embeds each one (no cache helps). p50/p99 wall time and CPU time per query (the
  machine is shared: CPU time is the steadier figure). Baseline, in the same run: a
  ``memstrata query`` process per query (model load, store open, search, exit).
- Memory: VmRSS of a fresh process that starts the system on that data dir (default model) and
  answers a few prompts.
- Write-back: 16 agents completing tasks at once, from the first ``complete_task`` until every
  knowledge entry and episode is stored with its vector; then stop, reopen every store and count:
  nothing may be lost. Baseline, same run: the same system with batching off
  (``actors.max_group_commit = 1``, ``embedding.batch_size = 1``: one model call per write).

The stores are loaded with vectors of the real model without running it 100k times: the entries
are ``"The {subject} {problem}; {fix} (case {i})"`` and each gets the real model's vector of its
base sentence (1,728 sentences, embedded once per machine and cached) plus a little noise
(cosine ~0.98 to it). Queries always go through the real model.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from _harness import Context, Row, percentile

from memstrata import Config, MemorySystem
from memstrata.actors._outbox import Outbox
from memstrata.config import ActorsConfig, EmbeddingConfig
from memstrata.layers import EpisodicMemory, KnowledgeStore
from memstrata.storage import Embedder, default_embedder

GROUP = "system"
FloatArray = npt.NDArray[np.float32]

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
VERBS = ["Fix", "Improve", "Review", "Refactor", "Harden", "Speed up", "Test", "Document"]
CATEGORIES = ["pitfall", "pattern", "outcome", "codebase"]
BASES = [f"The {s} {p}; {f}" for s in SUBJECTS for p in PROBLEMS for f in FIXES]
_CASE = re.compile(r" \(case \d+\)$")
AGENT = "bench"


# -- real-model vectors for bulk loading ---------------------------------------------------------


def _cache_dir() -> Path:
    env = os.environ.get("BENCH_CACHE_DIR")
    if env:
        return Path(env).parent
    import platformdirs

    return Path(platformdirs.user_cache_dir("memstrata")) / "bench"


def _base_vectors(model: Embedder) -> tuple[FloatArray, str]:
    """The real model's vectors of :data:`BASES` (computed once per machine: it is deterministic)."""
    key = hashlib.sha256("\n".join([model.model_id, *BASES]).encode()).hexdigest()[:16]
    path = _cache_dir() / f"system-bases-{key}.npy"
    if path.exists():
        return np.load(path).astype(np.float32), "cached"
    started = time.perf_counter()
    vectors = np.asarray(model.embed_documents(BASES), dtype=np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors, f"embedded in {time.perf_counter() - started:.0f} s"


class BaseSentenceVectors:
    """Loads stores only: the vector of ``"<base sentence> (case i)"`` is the real model's vector
    of the base sentence plus noise. It is the real model's id because its vectors are that
    model's (queries, later, go through the real model itself)."""

    def __init__(self, model: Embedder, vectors: FloatArray) -> None:
        self.model_id = model.model_id
        self.dim = model.dim
        self._vectors = vectors
        self._index = {b: i for i, b in enumerate(BASES)}
        self._rng = np.random.default_rng(7)

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        rows = self._vectors[[self._index[_CASE.sub("", t)] for t in texts]]
        rows = rows + self._rng.normal(0.0, 0.01, rows.shape).astype(np.float32)
        unit: FloatArray = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)
        return unit

    def embed_query(self, text: str) -> FloatArray:
        raise RuntimeError("queries go through the real model")


def _entries(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "content": f"The {rng.choice(SUBJECTS)} {rng.choice(PROBLEMS)}; {rng.choice(FIXES)} (case {i})",
            "category": rng.choice(CATEGORIES),
            "tags": {"taskId": f"t{i}"},
        }
        for i in range(n)
    ]


def _queries(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        f"{rng.choice(VERBS)} the {rng.choice(SUBJECTS)} because it {rng.choice(PROBLEMS)} #{i}"
        for i in range(n)
    ]


def _fill(
    data: Path, entries: int, loader: BaseSentenceVectors, episode_model: Embedder | None = None
) -> float:
    """The stores, loaded through the bulk path (``add_many`` with precomputed vectors); the
    episodes through ``episode_model`` when given (the real model, so no vector is left for the
    system to catch up while timed), else through the loader."""
    started = time.perf_counter()
    for name, items in ((AGENT, _entries(entries, 1)), ("shared", _entries(1_000, 2))):
        with KnowledgeStore.open(data / "knowledge" / f"{name}.sqlite", loader) as store:  # type: ignore[arg-type]
            store.add_many(items, vectors=loader.embed_documents([str(i["content"]) for i in items]))
    model: Any = loader if episode_model is None else episode_model
    episodic = EpisodicMemory.open(data / "episodic" / f"{AGENT}.sqlite", model)
    try:
        episodic.record_many(
            {"content": e["content"], "task_run_id": f"r{i}", "kind": "task"}
            for i, e in enumerate(_entries(500, 3))
        )
    finally:
        episodic.close()
    return time.perf_counter() - started


def fill_from_bases(model: Embedder, data: Path, entries: int, shared: Path | None = None) -> str:
    """:func:`_fill` with ``entries`` entries whose vectors are the real model's vectors of
    :data:`BASES` plus noise (what the retrieval figures are measured on); how the load went,
    for a row's notes. Given the run's ``shared`` folder, the stores are filled there once and
    copied for each module that asks (this one and ``bench_pretask_busy``: ~17 s a fill)."""
    template = data if shared is None else shared / f"bases-{entries}"
    note = template.with_name(template.name + ".txt")
    if not note.exists():
        vectors, how = _base_vectors(model)
        fill_s = _fill(template, entries, BaseSentenceVectors(model, vectors), model)
        note.write_text(
            f"loaded in {fill_s:.0f} s with the real model's vectors of {len(BASES):,} base sentences ({how})"
        )
    if template != data:
        shutil.copytree(template, data)
    return note.read_text()


# -- pre-task retrieval --------------------------------------------------------------------------


def _cli_baseline(data: Path, queries: list[str]) -> tuple[list[float], float]:
    """Wall ms of a ``memstrata query`` process per query, and its mean CPU ms."""
    exe = Path(sys.executable).with_name("memstrata")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "memstrata"]
    wall: list[float] = []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for query in queries:
        started = time.perf_counter()
        done = subprocess.run(
            [*command, "--data-dir", str(data), "query", query, "--agent", AGENT, "--json"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        wall.append((time.perf_counter() - started) * 1000)
        if done.returncode != 0 or not json.loads(done.stdout):
            raise RuntimeError(f"memstrata query failed ({done.returncode}): {done.stderr.strip()[-300:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000 / len(queries)
    return wall, cpu


def _load() -> str:
    """The machine's load when a measurement starts (2 cores shared with other work)."""
    return f"load average {os.getloadavg()[0]:.1f}"


def _retrieval(ctx: Context, data: Path, entries: int, note: str) -> list[Row]:
    queries = _queries(ctx.size(400, 60), 4)
    latencies: list[float] = []
    fallbacks = 0
    with MemorySystem.start(Config(data_dir=data)) as system:
        agent = system.agent(AGENT)
        for n, warm in enumerate(_queries(5, 99)):  # opens the stores, loads their caches
            agent.begin_task(f"warm{n}", warm)
        load = _load()
        cpu_started = time.process_time()
        for n, query in enumerate(queries):
            started = time.perf_counter()
            prompt = agent.begin_task(f"q{n}", query)
            latencies.append((time.perf_counter() - started) * 1000)
            # a fallback, or a prompt with a part degraded or missing (``reason`` says which): a
            # search that failed or ranked one way only is fast, and must not pass for a fast one
            fallbacks += int(prompt.fallback or prompt.reason is not None)
        cpu = (time.process_time() - cpu_started) * 1000 / len(queries)
    cli_wall, cli_cpu = _cli_baseline(data, _queries(ctx.size(3, 2), 5))
    cli = statistics.median(cli_wall)
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    size = f"@{entries // 1000}k"
    base = "memstrata query process"
    return [
        Row(
            GROUP,
            f"pre-task retrieval p50 {size}",
            p50,
            "ms",
            "<= 10 ms",
            baseline=cli,
            baseline_name=base,
            met=p50 <= 10,
            notes=(
                f"{len(queries)} new queries, real model; {entries:,} entries + shared 1k + 500 episodes; "
                f"{note}; {load}"
            ),
        ),
        Row(
            GROUP,
            f"pre-task retrieval p99 {size}",
            percentile(latencies, 99),
            "ms",
            "<= 30 ms",
            baseline=max(cli_wall),
            baseline_name=f"slowest {base}",
            met=p99 <= 30,
        ),
        Row(
            GROUP,
            f"pre-task retrieval CPU per prompt {size}",
            cpu,
            "ms",
            baseline=cli_cpu,
            baseline_name=base,
            notes="all threads of the process: query embedding, searches, actors",
        ),
        Row(GROUP, f"pre-task fallbacks/degraded {size}", fallbacks, "prompts", "0", met=fallbacks == 0),
    ]


# -- memory --------------------------------------------------------------------------------------

_RSS_SCRIPT = """
import json, sys
from pathlib import Path
from memstrata import Config, MemorySystem

def status():
    out = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) / 1024
    return out

with MemorySystem.start(Config(data_dir=Path(sys.argv[1]))) as system:
    started = status()
    agent = system.agent(sys.argv[2])
    for n, query in enumerate(json.loads(sys.argv[3])):
        agent.begin_task(f"rss{n}", query)
    print(json.dumps({"started": started, "serving": status()}))
"""


def _memory(data: Path, entries: int) -> list[Row]:
    done = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT, str(data), AGENT, json.dumps(_queries(20, 6))],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    info = json.loads(done.stdout.strip().splitlines()[-1])
    rss, started = info["serving"]["VmRSS"], info["started"]["VmRSS"]
    return [
        Row(
            GROUP,
            f"RSS, model + {entries // 1000}k entries",
            rss,
            "MB",
            "<= 400 MB",
            met=rss <= 400,
            notes=(
                f"fresh process after 20 prompts: {started:.0f} MB once started with the model, "
                f"peak {info['serving']['VmHWM']:.0f} MB, anonymous {info['serving']['RssAnon']:.0f} MB"
            ),
        )
    ]


# -- write-back ----------------------------------------------------------------------------------


def _write_back_run(data: Path, config: Config, agents: int, per_agent: int) -> dict[str, Any]:
    acks: list[float] = []
    lock = threading.Lock()
    with MemorySystem.start(config) as system:
        handles = [system.agent(f"worker-{i}") for i in range(agents)]
        for handle in handles:  # open every actor first: measure steady state, not first use
            handle.store_knowledge("warm up", category="pattern")
            handle.remember("warm up")
        if not system.wait_idle(120):
            raise RuntimeError("the warm-up did not finish")
        before = system.status()["embedding"]
        barrier = threading.Barrier(agents + 1)
        texts = _entries(agents * per_agent, 11)

        def work(i: int) -> None:
            barrier.wait()
            for n in range(per_agent):
                started = time.perf_counter()
                summary = f"worker {i} finished task {n}: {texts[i * per_agent + n]['content']}"
                handles[i].complete_task(f"t{n}", summary)
                with lock:
                    acks.append((time.perf_counter() - started) * 1000)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(agents)]
        for thread in threads:
            thread.start()
        load = _load()
        barrier.wait()
        started, cpu_started = time.perf_counter(), time.process_time()
        for thread in threads:
            thread.join()
        idle = system.wait_idle(600)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        after = system.status()["embedding"]
    # counted after stop, from the files
    model = default_embedder()
    stored = pending_vectors = outbox_rows = 0
    for i in range(agents):
        with KnowledgeStore.open(data / "knowledge" / f"worker-{i}.sqlite", model) as store:
            stored += store.count() - 1  # minus the warm-up entry
            pending_vectors += int(store.status()["pending_vectors"])
        episodic = EpisodicMemory.open(data / "episodic" / f"worker-{i}.sqlite", model)
        try:
            stored += episodic.count() - 1
            pending_vectors += int(episodic.status().get("pending_vectors", 0))
        finally:
            episodic.close()
        outbox = Outbox(data / "outbox" / f"worker-{i}.sqlite")
        try:
            outbox_rows += outbox.counts()["pending"]
        finally:
            outbox.close()
    tasks = agents * per_agent
    delta = {
        k: after[k] - before[k] for k in ("model_calls", "texts_embedded", "texts_requested", "model_seconds")
    }
    return {
        "tasks": tasks,
        "seconds": elapsed,
        "rate": tasks / elapsed,
        "cpu_ms": cpu * 1000 / tasks,
        "lost": 2 * tasks - stored,
        "pending_vectors": pending_vectors,
        "outbox_rows": outbox_rows,
        "idle": idle,
        "acks": acks,
        "load": load,
        **delta,
    }


def _write_back(ctx: Context) -> list[Row]:
    agents = 16
    batched = _write_back_run(
        ctx.workdir / "writeback", Config(data_dir=ctx.workdir / "writeback"), agents, ctx.size(150, 25)
    )
    unbatched_config = Config(
        data_dir=ctx.workdir / "writeback-unbatched",
        actors=ActorsConfig(max_group_commit=1),
        embedding=EmbeddingConfig(batch_size=1),
    )
    unbatched = _write_back_run(
        ctx.workdir / "writeback-unbatched", unbatched_config, agents, ctx.size(20, 4)
    )
    rate, base_rate = batched["rate"], unbatched["rate"]
    complete = batched["lost"] == 0 and batched["pending_vectors"] == 0 and batched["outbox_rows"] == 0
    busy = batched["model_seconds"] / batched["seconds"]
    base = "no batching: one model call per write"
    return [
        Row(
            GROUP,
            f"write-back throughput, {agents} agents",
            rate,
            "tasks/s",
            ">= 300 tasks/s",
            baseline=base_rate,
            baseline_name=base,
            met=rate >= 300 and complete,
            notes=(
                f"{batched['tasks']} tasks (baseline {unbatched['tasks']}), real model, from the first "
                f"complete_task until every entry and episode is stored with its vector; model busy "
                f"{busy:.0%} of the time; {batched['texts_embedded']} texts embedded for "
                f"{batched['texts_requested']} requested; {batched['load']}"
            ),
        ),
        Row(
            GROUP,
            "write-back CPU per task",
            batched["cpu_ms"],
            "ms",
            baseline=unbatched["cpu_ms"],
            baseline_name=base,
            notes=(
                f"all threads; {2000 / batched['cpu_ms']:.0f} tasks/s is what 2 free cores allow at this "
                f"cost; the model's calls take {batched['model_seconds'] * 1000 / batched['tasks']:.1f} ms "
                "of wall time per task"
            ),
        ),
        Row(
            GROUP,
            "write-backs lost (after stop + reopen)",
            batched["lost"] + unbatched["lost"],
            "entries",
            "0",
            met=batched["lost"] + unbatched["lost"] == 0,
            notes=(
                f"vectors pending: {batched['pending_vectors'] + unbatched['pending_vectors']}, "
                f"outbox rows left: {batched['outbox_rows'] + unbatched['outbox_rows']}"
            ),
        ),
        Row(
            GROUP,
            "write-back model calls",
            batched["model_calls"],
            "calls",
            "< one per text",
            baseline=batched["texts_requested"],
            baseline_name="one call per text",
            met=batched["model_calls"] < batched["texts_requested"],
        ),
        Row(
            GROUP,
            "complete_task ack p50",
            percentile(batched["acks"], 50),
            "ms",
            notes="durable outbox commit",
        ),
        Row(GROUP, "complete_task ack p99", percentile(batched["acks"], 99), "ms"),
    ]


def run(ctx: Context) -> list[Row]:
    model = default_embedder()
    entries = ctx.size(100_000, 10_000)
    data = ctx.workdir / "retrieval"
    rows = _retrieval(
        ctx, data, entries, f"stores {fill_from_bases(model, data, entries, ctx.shared)} + noise"
    )
    rows += _memory(data, entries)
    rows += _write_back(ctx)
    return rows
