"""LangGraph's BaseStore on memstrata (memstrata.integrations.langgraph), with the real framework."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest

pytest.importorskip("langgraph.store.base", reason="the langgraph extra is not installed")

from langgraph.store.base import BaseStore, PutOp
from langgraph.store.memory import InMemoryStore

from memstrata import MemorySystem
from memstrata.config import Config
from memstrata.errors import InvalidInputError
from memstrata.integrations.langgraph import AsyncMemstrataStore, MemstrataStore
from memstrata.testing import HashEmbedder

_EMB = HashEmbedder(dim=64)


def embed(texts: Sequence[str]) -> list[list[float]]:
    """A caller's embedding function, as LangGraph's ``index={"embed": ...}`` takes one."""
    return [list(map(float, _EMB.embed_query(t))) for t in texts]


INDEX = {"dims": 64, "embed": embed, "fields": ["title", "body.parts[0]"]}


def test_is_a_langgraph_store_with_upsert_by_key(tmp_path: Path) -> None:
    with MemstrataStore.from_conn_string(tmp_path / "s.sqlite") as store:
        assert isinstance(store, BaseStore)
        store.setup()
        store.put(("users", "u1"), "prefs", {"theme": "dark"})
        store.put(("users", "u1"), "prefs", {"theme": "light"})
        item = store.get(("users", "u1"), "prefs")
        assert item is not None and item.value == {"theme": "light"}
        assert item.namespace == ("users", "u1")
        store.delete(("users", "u1"), "prefs")
        assert store.get(("users", "u1"), "prefs") is None


def test_semantic_search_by_best_field_with_json_paths_and_index_false() -> None:
    with MemstrataStore.from_conn_string(":memory:", index=INDEX) as store:
        store.put(("docs",), "a", {"title": "solar panels on roofs", "body": {"parts": ["wind"]}})
        store.put(("docs",), "b", {"title": "bread recipes", "body": {"parts": ["solar panels roofs"]}})
        store.put(("docs",), "c", {"title": "solar panels on roofs"}, index=False)
        hits = store.search(("docs",), query="solar panels on roofs", limit=5)
        assert [h.key for h in hits][:2] == ["a", "b"]
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)
        scores = [h.score for h in hits if h.score is not None]
        assert scores == sorted(scores, reverse=True)
        assert "c" not in {h.key for h in hits if h.score is not None}  # stored, not embedded
        assert store.get(("docs",), "c") is not None


def test_query_search_in_a_small_namespace_beside_a_large_one() -> None:
    """The scouting failure: a crowd elsewhere must not hide an item of the searched namespace."""
    with MemstrataStore.from_conn_string(
        ":memory:", index={"dims": 64, "embed": embed, "fields": ["t"]}
    ) as store:
        store.batch([PutOp(("crowd",), f"k{i}", {"t": f"crowd note {i}"}) for i in range(1500)])
        store.put(("mine",), "x", {"t": "a lone remark", "kind": "note"})
        assert [h.key for h in store.search(("mine",), query="crowd note 7")] == ["x"]
        assert [h.key for h in store.search((), query="crowd note", filter={"kind": "note"})] == ["x"]


def test_filters_offset_and_list_namespaces() -> None:
    with MemstrataStore.from_conn_string(":memory:") as store:
        for i in range(6):
            store.put(("shop", "eu" if i % 2 else "us"), f"p{i}", {"price": i * 10, "tag": "t"})
        assert {h.key for h in store.search(("shop",), filter={"price": {"$gte": 30}})} == {"p3", "p4", "p5"}
        assert {h.key for h in store.search(("shop", "eu"), filter={"price": {"$ne": 10}})} == {"p3", "p5"}
        assert len(store.search(("shop",), limit=2, offset=5)) == 1
        assert store.list_namespaces(prefix=("shop",)) == [("shop", "eu"), ("shop", "us")]
        assert store.list_namespaces(max_depth=1) == [("shop",)]
        assert store.list_namespaces(suffix=("eu",)) == [("shop", "eu")]


def test_ttl_sweep_and_sweeper_lifecycle(tmp_path: Path) -> None:
    with MemstrataStore.from_conn_string(tmp_path / "t.sqlite", ttl={"default_ttl": 10}) as store:
        store.put(("t",), "k", {"v": 1})
        store.put(("t",), "forever", {"v": 2}, ttl=None)
        assert store.sweep_ttl() == 0
        store.start_ttl_sweeper(sweep_interval_minutes=60)
        assert store.stop_ttl_sweeper(timeout=5) is True
        assert store.get(("t",), "k") is not None


def test_async_store_and_loop_guard() -> None:
    async def scenario() -> None:
        async with AsyncMemstrataStore.from_conn_string(":memory:", index=INDEX) as store:
            await store.setup()
            await store.aput(("a",), "k", {"title": "hello world"})
            item = await store.aget(("a",), "k")
            assert item is not None and item.value["title"] == "hello world"
            hits = await store.asearch(("a",), query="hello world")
            assert hits[0].key == "k"
            assert await store.alist_namespaces() == [("a",)]
            with pytest.raises(asyncio.InvalidStateError):
                store.get(("a",), "k")

    asyncio.run(scenario())


def test_an_async_embed_function_is_awaited_as_in_memory_store_awaits_it() -> None:
    """LangGraph takes an async function as the index's ``embed``: the async methods await it."""
    calls: list[int] = []

    async def embed(texts: list[str]) -> list[list[float]]:
        calls.append(len(texts))
        return [_EMB.embed_query(t).tolist() for t in texts]

    index = {"dims": 64, "embed": embed, "fields": ["text"]}

    async def work(store: BaseStore) -> list[tuple[str, float]]:
        await store.aput(("docs",), "a", {"text": "solar roofs"})
        await store.aput(("docs",), "b", {"text": "wine cellar"})
        return [
            (h.key, round(h.score or 0.0, 4)) for h in await store.asearch(("docs",), query="solar roofs")
        ]

    async def scenario() -> None:
        expected = await work(InMemoryStore(index=index))  # type: ignore[arg-type]
        async with AsyncMemstrataStore.from_conn_string(":memory:", index=index) as store:  # type: ignore[arg-type]
            calls.clear()
            assert await work(store) == expected
        assert calls == [1, 1, 1] and expected[0] == ("a", 1.0)

    asyncio.run(scenario())


def test_store_on_a_running_system_persists_in_its_data_dir(tmp_path: Path) -> None:
    with MemorySystem.start(Config(data_dir=tmp_path / "data"), embedder=HashEmbedder()) as system:
        store = MemstrataStore(system)
        store.put(("team",), "plan", {"step": 1})
        store.close()
        again = MemstrataStore(system)
        item = again.get(("team",), "plan")
        assert item is not None and item.value == {"step": 1}
        again.close()
    assert (tmp_path / "data" / "items.sqlite").exists()


def test_index_without_embed_uses_the_systems_shared_embedder(tmp_path: Path) -> None:
    with MemorySystem.start(Config(data_dir=tmp_path / "data"), embedder=HashEmbedder()) as system:
        with pytest.raises(
            InvalidInputError, match=r"index dims 64 are not .*'memstrata-hash-v1-256' gives 256"
        ):
            MemstrataStore(":memory:", index={"dims": 64}, embedder=HashEmbedder(dim=256))
        for distance in ("l2", "inner_product"):  # PostgresStore's other distances: refused by name
            with pytest.raises(InvalidInputError, match=f"distance_type must be 'cosine'.*got '{distance}'"):
                MemstrataStore(system, index={"fields": ["t"], "distance_type": distance})
        store = MemstrataStore(system, index={"fields": ["t"], "distance_type": "cosine"})
        store.put(("k",), "a", {"t": "the harbor lantern"})
        store.put(("k",), "b", {"t": "violet meadow"})
        assert store.search(("k",), query="harbor lantern")[0].key == "a"
        store.close()


def _keys_by_filter(store: BaseStore, filters: list[dict[str, object]]) -> dict[str, object]:
    """What each filter finds in the store (an error as its class name, as InMemoryStore raises
    on some)."""
    for key, value in {
        "null": {"status": None, "v": "b"},
        "missing": {"other": 1},
        "set": {"status": "done", "v": "a"},
        "num": {"v": 3},
        "real": {"v": 2.75},
        "list": {"v": [1, 2]},
        "obj": {"v": {"a": 1}},
    }.items():
        store.put(("d",), key, value)
    found: dict[str, object] = {}
    for flt in filters:
        try:
            found[repr(flt)] = sorted(h.key for h in store.search(("d",), filter=flt, limit=50))
        except Exception as exc:
            found[repr(flt)] = type(exc).__name__
    return found


def _sqlite_store_keys(filters: list[dict[str, object]]) -> dict[str, object]:
    from langgraph.store.sqlite import SqliteStore

    conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    try:
        store = SqliteStore(conn)
        store.setup()
        return _keys_by_filter(store, filters)
    finally:
        conn.close()


NULL_FILTERS: list[dict[str, object]] = [
    {"status": None},
    {"status": {"$eq": None}},
    {"status": {"$ne": None}},
    {"v": {"$gte": None}},
    {"v": {"$gt": None}},
    {"v": {"$lt": None}},
    {"v": {"$lte": None}},
]


def test_filters_with_none_find_what_langgraphs_own_stores_find() -> None:
    """None (null) matches a null or missing field in SqliteStore and InMemoryStore alike; a range
    on None is SqliteStore's (None is a blob there: above every value; InMemoryStore raises)."""
    pytest.importorskip("langgraph.store.sqlite", reason="langgraph-checkpoint-sqlite is not installed")
    with MemstrataStore(":memory:", embedder=_EMB) as store:
        ours = _keys_by_filter(store, NULL_FILTERS)
    assert ours == _sqlite_store_keys(NULL_FILTERS)
    in_memory = _keys_by_filter(InMemoryStore(), NULL_FILTERS[:3])
    assert {k: ours[k] for k in in_memory} == in_memory
    assert ours[repr({"status": None})] == ["list", "missing", "null", "num", "obj", "real"]
    assert ours[repr({"status": {"$ne": None}})] == ["set"]
    assert ours[repr({"v": {"$gte": None}})] == []
    assert ours[repr({"v": {"$lt": None}})] == ["list", "null", "num", "obj", "real", "set"]
    with MemstrataStore(":memory:", embedder=_EMB) as store, pytest.raises(InvalidInputError, match=r"\$ne"):
        store.search(("d",), filter={"v": {"$lt": None, "$ne": 3}})


def test_an_object_in_a_filter_matches_as_in_memory_store_matches_it() -> None:
    """``{"meta": {"user": "ada"}}`` passes every item whose ``meta`` holds that key and value,
    nested objects and operators inside included; an object mixing operators and keys is
    refused by name."""
    items = {
        "both": {"meta": {"user": "ada", "lang": "en", "n": {"x": 2}}},
        "user": {"meta": {"user": "ada"}},
        "other": {"meta": {"user": "bob", "lang": "en"}},
        "flat": {"meta": "ada"},
    }
    filters: list[dict[str, object]] = [
        {"meta": {"user": "ada"}},
        {"meta": {"user": "ada", "lang": "en"}},
        {"meta": {"n": {"x": 2}}},
        {"meta": {"n": {"x": {"$gt": 1}}}},
        {"meta": {"lang": "en"}, "other": None},
    ]
    found = []
    for store in (InMemoryStore(), MemstrataStore(":memory:", embedder=_EMB)):
        for key, value in items.items():
            store.put(("d",), key, value)
        found.append([sorted(i.key for i in store.search(("d",), filter=f)) for f in filters])
        if isinstance(store, MemstrataStore):
            with pytest.raises(InvalidInputError, match=r"filter 'meta' mixes operators and keys"):
                store.search(("d",), filter={"meta": {"$ne": 1, "user": "ada"}})
            store.close()
    assert found[0] == found[1]
    assert found[1][0] == ["both", "user"]


def test_a_range_on_a_number_or_a_string_meets_only_values_of_that_type() -> None:
    """SQLite orders every string, list and object above every number: memstrata compares like
    with like (SqliteStore agrees on $gt 2.5, and casts text to a number for $lt 100)."""
    pytest.importorskip("langgraph.store.sqlite", reason="langgraph-checkpoint-sqlite is not installed")
    filters: list[dict[str, object]] = [
        {"v": {"$gt": 2.5}},
        {"v": {"$gte": 3, "$lt": 100}},
        {"v": {"$lt": 100}},
        {"v": {"$gt": "a"}},
        {"v": {"$lte": "b"}},
        {"v": 3},
        {"v": {"$ne": 3}},
        {"v": "a"},
    ]
    with MemstrataStore(":memory:", embedder=_EMB) as store:
        ours = _keys_by_filter(store, filters)
    sqlite_store = _sqlite_store_keys(filters)
    assert ours[repr({"v": {"$gt": 2.5}})] == sqlite_store[repr({"v": {"$gt": 2.5}})] == ["num", "real"]
    assert ours[repr({"v": {"$gte": 3, "$lt": 100}})] == ["num"]
    assert ours[repr({"v": {"$lt": 100}})] == ["num", "real"]  # SqliteStore: every value, text as 0
    assert ours[repr({"v": {"$gt": "a"}})] == ["null"]  # the string "b", not the object
    assert ours[repr({"v": {"$lte": "b"}})] == ["null", "set"]  # no number, no list
    assert ours[repr({"v": 3})] == ["num"]
    assert ours[repr({"v": {"$ne": 3}})] == ["list", "missing", "null", "obj", "real", "set"]
    assert ours[repr({"v": "a"})] == ["set"]


def test_a_cancelled_aput_is_written_before_the_cancellation_reaches_the_caller() -> None:
    """Cancelled once it began, every write lands, and before the caller sees CancelledError
    (a plain worker thread dropped or kept it at random)."""

    async def scenario() -> None:
        async with AsyncMemstrataStore.from_conn_string(":memory:") as store:
            for n in range(20):
                task = asyncio.create_task(store.aput(("c",), f"k{n}", {"n": n}))
                await asyncio.sleep(0)  # the call begins
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert await store.aget(("c",), f"k{n}") is not None, n

    asyncio.run(scenario())


def test_any_limit_is_paged_through_the_item_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """The item store answers at most MAX_TOP_K (1,000) per request; LangGraph's own stores take
    any limit, so the adapter pages (here in pages of 7)."""
    import memstrata.integrations.langgraph as module

    with MemstrataStore.from_conn_string(":memory:") as store:
        for n in range(20):
            store.put(("docs", f"d{n % 3}"), f"k{n:02d}", {"n": n})
        assert len(store.search(("docs",), limit=5000)) == 20  # the real bound, one page
        monkeypatch.setattr(module, "MAX_TOP_K", 7)
        everything = store.search(("docs",), limit=5000)
        assert sorted(item.key for item in everything) == [f"k{n:02d}" for n in range(20)]
        assert [i.key for i in store.search(("docs",), limit=9, offset=5)] == [
            i.key for i in everything[5:14]
        ]
        assert len(store.list_namespaces(prefix=("docs",), limit=5000)) == 3
