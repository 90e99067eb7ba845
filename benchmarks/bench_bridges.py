"""Bridges: what a CLI call costs as a process, and what the JSON-lines server adds to a request.

- ``memstrata query`` process wall time against a process that does the least a query needs
  (import the layer, load the model, open the store, search): the cost of the CLI and the
  actor system on top of the unavoidable work.
- ``memstrata status`` and ``memstrata query`` as processes on a store of 100k entries, and where
  a query process spends its time, are :mod:`bench_startup`'s (this module measured them too).
- ``memstrata serve``: pipelined ``query_knowledge`` throughput against the same queries made
  in-process through the facade on a thread pool (two rounds of each, in turn, the best of each
  reported: a busy spell of a shared machine slows one round, not both sides), and the round-trip
  latency of a request that does no storage work (``get_signal``), i.e. the protocol's own
  overhead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
from _harness import Context, Row, p50, percentile

REPO = Path(__file__).resolve().parent.parent
AGENTS = ["b0", "b1", "b2", "b3"]
THROUGHPUT_ROUNDS = 2  # serve and the facade, in turn
PINGS = 250  # round trips per round


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for key in ("MEMSTRATA_CONFIG", "MEMSTRATA_DATA_DIR"):
        env.pop(key, None)
    return env


def _prepare(data_dir: Path, per_agent: int) -> None:
    """Entries written in bulk through the layer (batched embedding), as an earlier run would have."""
    from memstrata.layers import KnowledgeStore
    from memstrata.storage import default_embedder

    embedder = default_embedder()
    for agent_id in AGENTS:
        with KnowledgeStore.open(KnowledgeStore.path_for(data_dir, agent_id), embedder) as store:
            store.add_many(
                {
                    "content": f"{agent_id} note {i}: service {i % 17} retries {i % 5} times, fails over",
                    "category": "pattern" if i % 3 else "pitfall",
                }
                for i in range(per_agent)
            )


def _process_ms(args: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(args, cwd=cwd, env=_env(), check=True, capture_output=True, timeout=300)
    return (time.perf_counter() - start) * 1000


_LAYER_ONLY = textwrap.dedent(
    """
    import sys
    from memstrata.layers import KnowledgeStore
    from memstrata.storage import default_embedder
    with KnowledgeStore.open(sys.argv[1], default_embedder()) as store:
        store.search(sys.argv[2], top_k=10)
    """
)


def _cli_rows(ctx: Context, data_dir: Path) -> list[Row]:
    runs = ctx.size(10, 3)
    query = "how often does a service retry"
    cli = [sys.executable, "-m", "memstrata", "--data-dir", str(data_dir), "query", query, "--agent", "b0"]
    direct = [sys.executable, "-c", _LAYER_ONLY, str(data_dir / "knowledge" / "b0.sqlite"), query]
    help_ = [sys.executable, "-m", "memstrata", "--help"]
    bare = [sys.executable, "-c", "pass"]
    _process_ms(cli, data_dir)  # warm the page cache
    cli_ms, direct_ms, help_ms, bare_ms = [], [], [], []
    for _ in range(runs):  # interleaved, so machine load hits all alike
        cli_ms.append(_process_ms(cli, data_dir))
        direct_ms.append(_process_ms(direct, data_dir))
        help_ms.append(_process_ms(help_, data_dir))
        bare_ms.append(_process_ms(bare, data_dir))
    cli_p50, direct_p50 = p50(cli_ms), p50(direct_ms)
    return [
        Row("bridges", "`memstrata query` process p50", cli_p50, "ms", "<= 1.3x layer-only process",
            direct_p50, "layer-only process", cli_p50 <= 1.3 * direct_p50,
            f"{runs} runs; both load the model; p90 {percentile(cli_ms, 90):.0f} ms"),
        Row("bridges", "`memstrata --help` process p50", p50(help_ms), "ms", "<= bare python + 200 ms",
            p50(bare_ms), "python -c pass", p50(help_ms) <= p50(bare_ms) + 200, "no numpy, model or actors"),
    ]  # fmt: skip


class _Serve:
    def __init__(self, data_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memstrata", "--data-dir", str(data_dir), "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=data_dir,
            env=_env(),
        )

    def send(self, requests: list[dict[str, object]]) -> threading.Thread:
        """Write from a thread: a client must read responses while it writes, or both pipes fill."""
        assert self.proc.stdin is not None
        stdin = self.proc.stdin
        data = b"".join(orjson.dumps(r) + b"\n" for r in requests)

        def write() -> None:
            stdin.write(data)
            stdin.flush()

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        return writer

    def receive(self, count: int) -> list[dict[str, object]]:
        assert self.proc.stdout is not None
        out = [orjson.loads(self.proc.stdout.readline()) for _ in range(count)]
        bad = [r for r in out if "error" in r]
        if bad:
            raise RuntimeError(f"serve answered with errors: {bad[:2]}")
        return out

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(300)


def _queries(count: int) -> list[tuple[str, str]]:
    return [(AGENTS[i % len(AGENTS)], f"how many times does service {i % 17} retry") for i in range(count)]


def _serve_round(data_dir: Path, requests: list[dict[str, object]], pings: list[float]) -> float:
    """One ``serve`` process: requests per second of ``requests`` sent pipelined (after a warm-up
    that loads the model and spawns the actors), then ``get_signal`` round trips into ``pings``."""
    server = _Serve(data_dir)
    try:
        server.send(requests[:8])  # warm up: model loaded, actors spawned
        server.receive(8)
        start = time.perf_counter()
        server.send(requests)
        server.receive(len(requests))
        rate = len(requests) / (time.perf_counter() - start)
        for i in range(len(pings), len(pings) + PINGS):
            t = time.perf_counter()
            server.send([{"id": f"p{i}", "method": "get_signal", "params": {"session_id": "s", "key": "k"}}])
            server.receive(1)
            pings.append((time.perf_counter() - t) * 1000)
    finally:
        server.close()
    return rate


def _facade_round(data_dir: Path, queries: list[tuple[str, str]], signal_ms: list[float]) -> float:
    """The same queries in-process through the facade on 4 threads (requests per second), then
    in-process ``board.signal`` calls into ``signal_ms``."""
    from memstrata import Config, MemorySystem

    with MemorySystem.start(Config(data_dir=data_dir)) as system:
        for agent_id in AGENTS:
            system.agent(agent_id).query_knowledge("warm up")
        start = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda aq: system.agent(aq[0]).query_knowledge(aq[1], top_k=10), queries))
        rate = len(queries) / (time.perf_counter() - start)
        board = system.blackboard("s")
        for _ in range(PINGS):
            t = time.perf_counter()
            board.signal("k")
            signal_ms.append((time.perf_counter() - t) * 1000)
    return rate


def _serve_rows(ctx: Context, data_dir: Path) -> list[Row]:
    count = ctx.size(2000, 200)
    queries = _queries(count)
    requests: list[dict[str, object]] = [
        {"id": i, "method": "query_knowledge", "params": {"agent_id": a, "query": q, "top_k": 10}}
        for i, (a, q) in enumerate(queries)
    ]
    pings: list[float] = []
    signal_ms: list[float] = []
    serve_rates: list[float] = []
    direct_rates: list[float] = []
    for _ in range(ctx.size(THROUGHPUT_ROUNDS, 1)):  # in turn: a busy spell slows one round of each
        serve_rates.append(_serve_round(data_dir, requests, pings))
        direct_rates.append(_facade_round(data_dir, queries, signal_ms))
    serve_rate, direct_rate = max(serve_rates), max(direct_rates)
    rounds = ", ".join(f"{s:.0f}/{d:.0f}" for s, d in zip(serve_rates, direct_rates, strict=True))
    return [
        Row("bridges", "serve query_knowledge throughput", serve_rate, "req/s", ">= 0.7x in-process facade",
            direct_rate, "facade, 4 threads", serve_rate >= 0.7 * direct_rate,
            f"{count} pipelined requests over 4 agents, real model; the best of {len(serve_rates)} rounds "
            f"each, in turn (serve/facade req/s: {rounds})"),
        Row("bridges", "serve round trip p50 (get_signal)", p50(pings), "ms", "<= 2 ms + in-process",
            p50(signal_ms), "in-process board.signal", p50(pings) <= p50(signal_ms) + 2.0,
            f"p99 {percentile(pings, 99):.2f} ms; one request at a time"),
    ]  # fmt: skip


def run(ctx: Context) -> list[Row]:
    data_dir = ctx.workdir / "bridges"
    _prepare(data_dir, ctx.size(500, 50))
    return _cli_rows(ctx, data_dir) + _serve_rows(ctx, data_dir)
