"""The orchestrator adapters against each framework's built-in backend, on the same work.

- LangGraph: 10k items put (batches of 100, every item embedded) and searched (by meaning, by
  meaning with a filter, and by filter alone) in ``MemstrataStore`` and in LangGraph's
  ``SqliteStore`` (on a ``sqlean`` connection, as the stdlib ``sqlite3`` of this Python cannot
  load sqlite-vec, which LangGraph's index needs). Both get the same embedding function.
- OpenAI Agents SDK: 1,000 turns recorded (one ``add_items`` per turn) and "the last 20 items"
  read, in ``MemstrataSession`` (episodes of an agent's episodic memory, on a private system
  whose model embeds them apart) and in the SDK's ``SQLiteSession``, both on a file; then 100
  turns given to one ``add_items``.
- AutoGen: 1,000 memories added and queried (k=5) in ``MemstrataMemory`` and in autogen-core's
  built-in ``ListMemory`` (which keeps a list and returns every memory: no ranking, no vectors;
  memstrata's work includes embedding, by the same cheap hash model as above, and ranking).

A framework that is not installed is skipped with a message. Ratios are memstrata / built-in
(lower is better for times).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from _harness import Context, Row

from memstrata.testing import HashEmbedder

DIMS = 64
_EMB = HashEmbedder(dim=DIMS)
_WORDS = ["river", "stone", "maple", "copper", "violet", "harbor", "lantern", "meadow", "falcon", "ember"]


def _embed(texts: Sequence[str]) -> list[list[float]]:
    return [v.tolist() for v in _EMB.embed_documents(list(texts))]


def _text(i: int) -> str:
    return " ".join(_WORDS[(i * k + k) % len(_WORDS)] for k in range(1, 7)) + f" item {i}"


def _p50_ms(fn: Callable[[], Any], runs: int) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def _store_work(store: Any, n: int, runs: int) -> dict[str, float]:
    from langgraph.store.base import PutOp

    t0 = time.perf_counter()
    for start in range(0, n, 100):
        store.batch(
            [
                PutOp(("bench", f"g{i % 10}"), f"k{i}", {"text": _text(i), "n": i, "kind": i % 7})
                for i in range(start, min(start + 100, n))
            ]
        )
    put_s = time.perf_counter() - t0
    queries = [_text(i * 37 % n) for i in range(runs)]
    it = iter(queries * 3)
    return {
        "put": n / put_s,
        "search": _p50_ms(lambda: store.search(("bench",), query=next(it), limit=10), runs),
        "search_filter": _p50_ms(
            lambda: store.search(("bench",), query=next(it), filter={"kind": 3}, limit=10), runs
        ),
        "filter_only": _p50_ms(
            lambda: store.search(("bench", "g3"), filter={"n": {"$gte": n // 2}}, limit=10), runs
        ),
    }


def _against(
    baseline_name: str, ours: dict[str, float], theirs: dict[str, float], *measures: tuple[str, str, str]
) -> list[Row]:
    """A row per ``(name, key, unit)``: our figure against the framework's own ``baseline_name``."""
    return [
        Row("integrations", name, ours[key], unit, baseline=theirs[key], baseline_name=baseline_name)
        for name, key, unit in measures
    ]


def _langgraph(ctx: Context) -> list[Row]:
    import sqlean
    from langgraph.store.sqlite import SqliteStore

    from memstrata.integrations.langgraph import MemstrataStore

    n, runs = ctx.size(10_000, 1_000), ctx.size(30, 5)
    index = {"dims": DIMS, "embed": _embed, "fields": ["text"]}
    with MemstrataStore.from_conn_string(ctx.workdir / "memstrata-items", index=index) as ours_store:
        ours = _store_work(ours_store, n, runs)
    path = str(ctx.workdir / "langgraph.sqlite")
    conn = sqlean.connect(path, check_same_thread=False, isolation_level=None)
    builtin_store = SqliteStore(conn, index=index)
    builtin_store.setup()
    theirs = _store_work(builtin_store, n, runs)
    conn.close()
    label = f"{n // 1000}k items"
    return _against(
        "SqliteStore", ours, theirs,
        (f"LangGraph put rate ({label})", "put", "items/s"),
        (f"LangGraph search by meaning p50 ({label})", "search", "ms"),
        (f"LangGraph search by meaning + filter p50 ({label})", "search_filter", "ms"),
        (f"LangGraph search by filter p50 ({label})", "filter_only", "ms"),
    )  # fmt: skip


def _turn(i: int) -> dict[str, str]:
    return {"role": "user" if i % 2 == 0 else "assistant", "content": _text(i)}


async def _session_work(session: Any, other: Any, turns: int, runs: int) -> dict[str, float]:
    t0 = time.perf_counter()
    for i in range(turns):
        await session.add_items([_turn(i)])
    add_ms = (time.perf_counter() - t0) * 1000 / turns
    samples = []
    for _ in range(runs):
        t1 = time.perf_counter()
        await session.get_items(limit=20)
        samples.append((time.perf_counter() - t1) * 1000)
    t2 = time.perf_counter()
    await other.add_items([_turn(i) for i in range(100)])
    bulk_ms = (time.perf_counter() - t2) * 1000
    return {"add": add_ms, "get": statistics.median(samples), "bulk": bulk_ms}


def _agents(ctx: Context) -> list[Row]:
    from agents import SQLiteSession

    from memstrata.integrations.openai_agents import MemstrataSession

    turns, runs = ctx.size(1_000, 200), ctx.size(200, 20)
    folder = ctx.workdir / "memstrata-history"
    ours_session, ours_other = MemstrataSession("bench", folder), MemstrataSession("bulk", folder)
    ours = asyncio.run(_session_work(ours_session, ours_other, turns, runs))
    ours_session.close()
    ours_other.close()
    builtin, other = (
        SQLiteSession("bench", ctx.workdir / "agents.sqlite"),
        SQLiteSession("bulk", ctx.workdir / "agents.sqlite"),
    )
    theirs = asyncio.run(_session_work(builtin, other, turns, runs))
    builtin.close()
    other.close()
    return _against(
        "SQLiteSession", ours, theirs,
        (f"Agents SDK add_items per turn ({turns} turns)", "add", "ms"),
        (f"Agents SDK get_items(limit=20) p50 ({turns} turns)", "get", "ms"),
        ("Agents SDK add_items of 100 turns at once", "bulk", "ms"),
    )  # fmt: skip


async def _memory_work(memory: Any, n: int, runs: int) -> dict[str, float]:
    from autogen_core.memory import MemoryContent, MemoryMimeType

    t0 = time.perf_counter()
    for i in range(n):
        await memory.add(MemoryContent(content=_text(i), mime_type=MemoryMimeType.TEXT, metadata={"n": i}))
    add_ms = (time.perf_counter() - t0) * 1000 / n
    samples = []
    for i in range(runs):
        t1 = time.perf_counter()
        await memory.query(_text(i * 37 % n))
        samples.append((time.perf_counter() - t1) * 1000)
    await memory.close()
    return {"add": add_ms, "query": statistics.median(samples)}


def _autogen(ctx: Context) -> list[Row]:
    from autogen_core.memory import ListMemory

    from memstrata.integrations.autogen import MemstrataMemory, MemstrataMemoryConfig

    n, runs = ctx.size(1_000, 200), ctx.size(100, 20)
    config = MemstrataMemoryConfig(persistence_path=str(ctx.workdir / "memstrata-autogen"), k=5)
    ours = asyncio.run(_memory_work(MemstrataMemory(config, embedder=HashEmbedder(dim=DIMS)), n, runs))
    theirs = asyncio.run(_memory_work(ListMemory(), n, runs))
    return _against(
        "ListMemory", ours, theirs,
        (f"AutoGen add per memory ({n} memories)", "add", "ms"),
        (f"AutoGen query p50 ({n} memories, k=5)", "query", "ms"),
    )  # fmt: skip


def run(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    benches = (("LangGraph", _langgraph), ("OpenAI Agents SDK", _agents), ("AutoGen", _autogen))
    for framework, bench in benches:
        try:
            rows += bench(ctx)
        except ImportError as exc:  # each framework is optional: its figures are left out
            print(f"  integrations: {framework} skipped ({exc})", file=sys.stderr)
    return rows


if __name__ == "__main__":
    import tempfile
    from pathlib import Path

    from _harness import format_table

    with tempfile.TemporaryDirectory() as tmp:
        print(format_table(run(Context(quick="--quick" in sys.argv, workdir=Path(tmp)))))
