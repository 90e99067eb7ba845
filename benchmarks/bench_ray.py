"""The Ray engine's overhead: the same work through ``engine = "ray"`` and the local engine.

A two-node Ray cluster on loopback (``ray.cluster_utils.Cluster``) on the development machine's two
cores, so the point is the cost of the hop, not a speed-up: pre-task retrieval p50/p99 and
write-back throughput as ratios to the local engine, the per-ask overhead (a working-memory read
through both engines, and a bare Ray actor call), and the resident memory of one agent's host
process and of a node's embedder. The feature-hashing embedder keeps the model out of the figures
(its cost is the same in both engines). Skipped when the ``memstrata[ray]`` extra is not installed.

    .venv/bin/python benchmarks/run.py --scale --only ray  # or: python benchmarks/bench_ray.py
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _harness import Context, Row, percentile

from memstrata import Config, MemorySystem
from memstrata.messages import GetWorkingMemory, StoreKnowledge
from memstrata.testing import HashEmbedder

GROUP = "ray"
NAMESPACE = "memstrata-bench"
AGENTS = ("b0", "b1", "b2", "b3")
TOPICS = ("deploy", "billing", "search", "login", "backup", "queue", "cache", "metrics")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _fill(system: MemorySystem, entries: int) -> None:
    for agent in AGENTS:
        for i in range(entries):
            topic = TOPICS[i % len(TOPICS)]
            text = f"note {i} of {agent}: the {topic} service runs on host {i % 97} in rack {i % 13}"
            system.tell(StoreKnowledge(agent, text, "fact", author=agent))
    system.wait_idle(600)


def _work(system: MemorySystem, tasks: int, asks: int) -> dict[str, Any]:
    """Pre-task latencies, write-back throughput and per-ask latencies on a filled system."""
    for agent_id in AGENTS:  # opened first, in both engines (a cold start is not the hop's cost)
        system.agent(agent_id).begin_task("warm", "which host runs the deploy service")
    prompts: list[float] = []
    fallbacks = 0
    for i in range(tasks):
        agent = system.agent(AGENTS[i % len(AGENTS)])
        t0 = time.perf_counter()
        prompt = agent.begin_task(f"p{i}", f"which host runs the {TOPICS[i % len(TOPICS)]} service")
        prompts.append((time.perf_counter() - t0) * 1000)
        fallbacks += prompt.fallback
    started = time.perf_counter()

    def complete(agent_id: str) -> None:
        agent = system.agent(agent_id)
        for i in range(tasks):
            agent.complete_task(f"w{i}", f"moved the {TOPICS[i % len(TOPICS)]} service to host {i}")

    threads = [threading.Thread(target=complete, args=(a,)) for a in AGENTS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    acked_s = time.perf_counter() - started
    system.wait_idle(600)
    stored_s = time.perf_counter() - started
    ask_ms: list[float] = []
    for i in range(asks):
        t0 = time.perf_counter()
        system.ask(GetWorkingMemory(AGENTS[i % len(AGENTS)], "plan"))
        ask_ms.append((time.perf_counter() - t0) * 1000)
    written = tasks * len(AGENTS)
    return {
        "p50": percentile(prompts, 50),
        "p99": percentile(prompts, 99),
        "fallbacks": fallbacks,
        "acked_per_s": written / acked_s,
        "stored_per_s": written / stored_s,
        "ask_p50": percentile(ask_ms, 50),
    }


def _config(data_dir: Path, engine: str, address: str = "auto", *, scale: bool = False) -> Config:
    """The cluster settings of a run: the agents pinned to the two nodes in turn and the rest
    placed on node b, or (``scale``) nothing pinned, in a namespace of its own."""
    placed: dict[str, Any] = (
        {}
        if scale
        else {
            "cluster__pins": [f"{a}=resource:node_{'ab'[i % 2]}" for i, a in enumerate(AGENTS)],
            "cluster__placement": "resource:node_b",
        }
    )
    return Config.load(
        env={},
        data_dir=data_dir,
        cluster__engine=engine,
        cluster__address=address,
        cluster__namespace=f"{NAMESPACE}-scale" if scale else NAMESPACE,
        **placed,
    )


def _overhead(ctx: Context) -> list[Row]:
    try:
        import ray
        from ray.cluster_utils import Cluster
    except ImportError:
        print("bench_ray: skipped, the memstrata[ray] extra is not installed", file=sys.stderr)
        return []
    entries = ctx.size(5_000, 500)
    tasks = ctx.size(200, 40)
    asks = ctx.size(2_000, 200)
    tells = ctx.size(2_000, 400)
    # the same stores for both engines: filled once, locally, and copied (the Ray hosts open the
    # copy), so the minute this benchmark may take goes to the measured work
    seed = ctx.workdir / "seed"
    with MemorySystem.start(_config(seed, "local"), embedder=HashEmbedder()) as system:
        _fill(system, entries)
    shutil.copytree(seed, ctx.workdir / "local")
    shutil.copytree(seed, ctx.workdir / "ray")
    with MemorySystem.start(_config(ctx.workdir / "local", "local"), embedder=HashEmbedder()) as system:
        local = _work(system, tasks, asks)

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1}})
    cluster.add_node(num_cpus=1, resources={"node_b": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
    try:
        config = _config(ctx.workdir / "ray", "ray", cluster.address)
        with MemorySystem.start(config, embedder=HashEmbedder()) as system:
            remote = _work(system, tasks, asks)
            t0 = time.perf_counter()
            for i in range(tells):
                agent = AGENTS[i % len(AGENTS)]
                system.tell(StoreKnowledge(agent, f"late note {i} of {agent}", "fact", author=agent))
            system.wait_idle(600)
            tell_s = time.perf_counter() - t0
            host = ray.get_actor(f"agent:{AGENTS[0]}", namespace=NAMESPACE)
            node, pid = ray.get(host.where.remote())
            host_mb = _rss_mb(pid)
            embedder = ray.get_actor(f"embedder:{node}", namespace=NAMESPACE)
            embedder_mb = _rss_mb(ray.get(embedder.where.remote())[1])
            system.stop_cluster(60)  # the hosts are detached: the benchmark ends them itself

        @ray.remote(num_cpus=0)
        class Echo:
            def ping(self) -> int:
                return 1

        echo = Echo.options(resources={"node_b": 0.001}).remote()  # type: ignore[attr-defined]
        ray.get(echo.ping.remote())
        pings: list[float] = []
        for _ in range(asks):
            t0 = time.perf_counter()
            ray.get(echo.ping.remote())
            pings.append((time.perf_counter() - t0) * 1000)
    finally:
        ray.shutdown()
        cluster.shutdown()

    note = f"4 agents x {entries:,} entries, 2-node loopback cluster, hashing embedder"
    ratio = "ray / local"
    return [
        Row(
            GROUP,
            "pre-task p50, ray",
            remote["p50"],
            "ms",
            baseline=local["p50"],
            baseline_name="local",
            notes=note,
        ),
        Row(GROUP, "pre-task p99, ray", remote["p99"], "ms", baseline=local["p99"], baseline_name="local"),
        Row(GROUP, "pre-task fallbacks, ray", remote["fallbacks"], "prompts", notes=f"of {tasks}"),
        Row(
            GROUP,
            "write-backs acknowledged/s, ray",
            remote["acked_per_s"],
            "tasks/s",
            baseline=local["acked_per_s"],
            baseline_name="local",
            notes=f"4 threads, {ratio}",
        ),
        Row(
            GROUP,
            "write-backs stored/s, ray",
            remote["stored_per_s"],
            "tasks/s",
            baseline=local["stored_per_s"],
            baseline_name="local",
        ),
        Row(
            GROUP,
            "ask p50 (working memory), ray",
            remote["ask_p50"],
            "ms",
            baseline=local["ask_p50"],
            baseline_name="local",
        ),
        Row(GROUP, "bare Ray actor call p50", percentile(pings, 50), "ms", notes="loopback, no memstrata"),
        Row(
            GROUP, f"RSS, one agent's host at {entries:,} entries", host_mb, "MB", notes="VmRSS of the worker"
        ),
        Row(GROUP, "RSS, a node's embedder (hashing)", embedder_mb, "MB"),
        Row(
            GROUP,
            "stores sent with tell through ray",
            tells / tell_s,
            "stores/s",
            notes=f"{tells:,} tells until stored, group commit",
        ),
    ]


def run_scale(ctx: Context) -> list[Row]:
    """The engine's overhead (``make bench-scale`` only: a Ray cluster's start costs a minute of
    the 10-minute ``make bench`` on the 2-core development machine), then the host's memory."""
    return _overhead(ctx) + _host_memory(ctx)


def _host_memory(ctx: Context) -> list[Row]:
    """The resident memory of one agent's host at 100k entries of 384-d vectors (the default
    model's dimension), against the local engine's whole process on the same store: what bounds
    the agents per node (about 2 minutes)."""
    try:
        import ray
        from ray.cluster_utils import Cluster
    except ImportError:
        print("bench_ray: skipped, the memstrata[ray] extra is not installed", file=sys.stderr)
        return []
    entries = ctx.size(100_000, 5_000)
    agent = AGENTS[0]
    query = "which host runs the deploy service"

    def use(system: MemorySystem) -> None:  # what an agent's first tasks load: index, caches
        for i in range(20):
            system.agent(agent).begin_task(f"s{i}", f"which host runs the {TOPICS[i % len(TOPICS)]} service")
        system.agent(agent).query_knowledge(query)

    t0 = time.perf_counter()
    with MemorySystem.start(
        _config(ctx.workdir / "local", "local", scale=True), embedder=HashEmbedder(dim=384)
    ) as system:
        for i in range(entries):
            topic = TOPICS[i % len(TOPICS)]
            text = f"note {i} of {agent}: the {topic} service runs on host {i % 97} in rack {i % 13}"
            system.tell(StoreKnowledge(agent, text, "fact", author=agent))
        system.wait_idle(1800)
        fill_s = time.perf_counter() - t0
        use(system)
        local_mb = _rss_mb(os.getpid())
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    ray.init(address=cluster.address, namespace=f"{NAMESPACE}-scale", log_to_driver=False)
    try:
        system = MemorySystem.start(
            _config(ctx.workdir / "local", "ray", cluster.address, scale=True), embedder=HashEmbedder(dim=384)
        )
        try:
            use(system)
            host_mb = _rss_mb(ray.get(ray.get_actor(f"agent:{agent}").where.remote())[1])
        finally:
            system.stop_cluster(120)
    finally:
        ray.shutdown()
        cluster.shutdown()
    note = f"1 agent x {entries:,} entries, 384-d hashing vectors, after 20 prompts"
    return [
        Row(GROUP, f"RSS, one agent's host at {entries:,} entries", host_mb, "MB", notes=note),
        Row(
            GROUP,
            f"RSS, local engine process at {entries:,} entries",
            local_mb,
            "MB",
            notes="the same store, in this process (Ray imported)",
        ),
        Row(GROUP, f"fill, {entries:,} stores told", entries / fill_s, "stores/s", notes="local engine"),
    ]


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for row in run_scale(Context(quick="--quick" in sys.argv, workdir=Path(tmp))):
            print(f"{row.name:45} {row.value:10.2f} {row.unit:8} {row.baseline or ''} {row.notes}")
