"""LangGraph's BaseStore on memstrata (memstrata.integrations.langgraph), with the real framework."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

pytest.importorskip("langgraph.store.base", reason="the langgraph extra is not installed")

from langgraph.store.base import BaseStore, PutOp

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
        private = MemstrataStore(":memory:", index={"dims": 64}, embedder=HashEmbedder(dim=256))
        with pytest.raises(InvalidInputError, match="256 dimensions for text 0, not 64"):
            private.put(("k",), "a", {"t": "x"})
        private.close()
        store = MemstrataStore(system, index={"fields": ["t"]})
        store.put(("k",), "a", {"t": "the harbor lantern"})
        store.put(("k",), "b", {"t": "violet meadow"})
        assert store.search(("k",), query="harbor lantern")[0].key == "a"
        store.close()
