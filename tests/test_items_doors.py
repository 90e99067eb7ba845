"""The item store through the actor system: the facade (``system.items``), its asyncio twin, the
typed messages, and the JSON-lines door, all on the same ``{data_dir}/items.sqlite``."""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import io
import threading
from pathlib import Path

import orjson
import pytest

from memstrata import AsyncMemorySystem, Config, MemorySystem
from memstrata._async import AsyncItems
from memstrata._items import Items
from memstrata._workspaces import Workspaces
from memstrata.actors import ManualClock
from memstrata.bridges._methods import build_methods
from memstrata.bridges._server import JsonLinesServer
from memstrata.errors import InvalidInputError
from memstrata.layers._items import ItemStore
from memstrata.messages import GetItem, ItemValue, PutItem, SearchItems
from tests._support import in_threads
from tests.fakes import FakeEmbedder


def test_facade_puts_gets_searches_lists_and_deletes(data_dir: Path) -> None:
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        items = system.items
        items.put(("users", "u1"), "tea", {"text": "likes green tea", "n": 1}, index=["text"])
        items.put(("users", "u2"), "stocks", {"text": "stock prices fell", "n": 2}, index=["text"])
        items.put(("users", "u2"), "plain", {"text": "no vector kept", "n": 3})
        items.put(("teams", "t1"), "x", {"n": 4})
        got = items.get(("users", "u1"), "tea")
        assert got is not None and got.value == {"text": "likes green tea", "n": 1}
        assert got.namespace == ("users", "u1") and got.score is None
        assert items.get(("users", "u1"), "nope") is None

        ranked = items.search(("users",), query="green tea")
        assert [i.key for i in ranked] == ["tea", "stocks", "plain"]  # unindexed items last, unscored
        assert ranked[0].score is not None and ranked[0].score > (ranked[1].score or 0.0)
        assert ranked[2].score is None
        assert [i.key for i in items.search(("users",), filter={"n": {"$gte": 2}})] == ["plain", "stocks"]
        assert [i.key for i in items.search()] == ["x", "plain", "stocks", "tea"]  # newest first

        assert items.list_namespaces() == [("teams", "t1"), ("users", "u1"), ("users", "u2")]
        assert items.list_namespaces(prefix=["users"], max_depth=1) == [("users",)]
        assert items.list_namespaces(suffix=["*", "u2"]) == [("users", "u2")]
        assert items.delete(("users", "u1"), "tea") is True
        assert items.delete(("users", "u1"), "tea") is False
        assert items.get(("users", "u1"), "tea") is None
        assert system.status()["items"]["count"] == 3  # the item store, not an agent
        assert ":items" not in system.status()["agents"]
    # the adapters' file: the layer opened on it directly sees what the actor wrote
    store = ItemStore(data_dir / "items.sqlite")
    try:
        assert store.count() == 3
    finally:
        store.close()


def test_items_expire_by_the_system_clock_and_sweep_removes_them(data_dir: Path) -> None:
    clock = ManualClock(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder(), clock=clock) as system:
        items = system.items
        items.put(("s",), "short", {"v": 1}, ttl_minutes=1)
        items.put(("s",), "long", {"v": 2}, ttl_minutes=60)
        items.put(("other",), "short", {"v": 3}, ttl_minutes=1)
        clock.advance(120)
        assert items.get(("s",), "short") is None
        assert items.get(("s",), "long") is not None
        assert items.sweep(("s",)) == 1  # only under the prefix
        assert items.sweep() == 1
        assert items.sweep() == 0


def test_bad_input_is_one_clear_error_naming_the_field(data_dir: Path) -> None:
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        items = system.items
        with pytest.raises(InvalidInputError, match=r"PutItem\.namespace"):
            items.put("users", "k", {"v": 1})
        with pytest.raises(InvalidInputError, match=r"PutItem\.namespace"):
            items.put(("users", ""), "k", {"v": 1})
        with pytest.raises(InvalidInputError, match=r"PutItem\.value"):
            items.put(("users",), "k", [1, 2])  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match=r"PutItem\.ttl_minutes"):
            items.put(("users",), "k", {"v": 1}, ttl_minutes=0)
        with pytest.raises(InvalidInputError, match=r"SearchItems\.limit"):
            items.search(limit=-1)
        with pytest.raises(InvalidInputError, match="filter key"):
            items.search(filter={"a b": 1})  # refused by the layer, answered through the actor
        for call in (  # keys and labels are names: a lone surrogate is refused, never stored
            lambda: items.put(("users",), "k\ud800", {"v": 1}),
            lambda: items.get(("users",), "\udfff"),
            lambda: items.delete(("users",), "\ud800"),
            lambda: items.put(("users", "a\ud800"), "k", {"v": 1}),
        ):
            with pytest.raises(
                InvalidInputError, match=r"Item\.(key|namespace) must not contain lone surrogates"
            ):
                call()
        for call, field in (  # a namespace that is no list at all: the message names it too
            (lambda: items.put(1.5, "k", {"v": 1}), r"PutItem\.namespace"),  # type: ignore[arg-type]
            (lambda: items.get(Path("/tmp"), "k"), r"GetItem\.namespace"),  # type: ignore[arg-type]
            (lambda: items.search({"users": 1}), r"SearchItems\.prefix"),  # type: ignore[arg-type]
            (lambda: items.tail(7), r"TailItems\.namespace"),  # type: ignore[arg-type]
            (lambda: items.sweep(None), r"SweepItems\.prefix"),  # type: ignore[arg-type]
            (lambda: items.search(query_vector=1.5), r"SearchItems\.query_vector"),  # type: ignore[arg-type]
            (lambda: items.write(0), r"WriteItems\.puts must be a list"),  # type: ignore[arg-type]
            (lambda: items.write(deletes=3), r"WriteItems\.deletes must be a list"),  # type: ignore[arg-type]
            (lambda: items.write(deletes=[("users",)]), r"deletes\[0\] must be a \(namespace, key\) pair"),
            (lambda: items.write(deletes=[(1.5, "k")]), r"DeleteItem\.namespace"),  # type: ignore[list-item]
        ):
            with pytest.raises(InvalidInputError, match=field):
                call()
        assert items.search() == []  # nothing was stored by the refused calls


def test_keyword_only_system_refuses_an_index_but_stores_plain_items(data_dir: Path) -> None:
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        system._runtime.embedder = None  # as a system whose model could not be loaded
        system.items.put(("n",), "k", {"text": "kept"})
        with pytest.raises(InvalidInputError, match="keyword-only"):
            system.items.put(("n",), "k2", {"text": "needs a vector"}, index=["text"])
        with pytest.raises(InvalidInputError, match="keyword-only"):
            system.items.search(("n",), query="x")
        assert [i.key for i in system.items.search(("n",))] == ["k"]


def test_concurrent_puts_from_many_threads_all_land(data_dir: Path) -> None:
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        barrier = threading.Barrier(8)
        errors: list[BaseException] = []

        def writer(n: int) -> None:
            try:
                barrier.wait(timeout=10)
                for i in range(20):
                    system.items.put(("w", str(n)), f"k{i}", {"text": f"writer {n} item {i}"}, index=["text"])
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        in_threads(writer, range(8), 60)
        assert not errors
        assert len(system.items.search(("w",), limit=1000)) == 160
        assert len(system.items.list_namespaces(prefix=["w"])) == 8


def test_messages_go_through_ask_and_the_async_twin_matches_the_handle(data_dir: Path) -> None:
    public = {n for n, v in vars(Items).items() if not n.startswith("_") and callable(v)}
    assert public <= {n for n, v in vars(AsyncItems).items() if callable(v)}
    for name in public:
        twin = getattr(AsyncItems, name)
        assert inspect.iscoroutinefunction(twin), name
        assert inspect.signature(twin) == inspect.signature(getattr(Items, name)), name

    async def main() -> list[str]:
        async with AsyncMemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
            await system.items.put(("a",), "k", {"text": "async tea"}, index=["text"])
            reply = await system.ask(GetItem(("a",), "k"))
            assert isinstance(reply, ItemValue) and reply.item is not None
            assert reply.item.value == {"text": "async tea"}
            return [i.key for i in await system.items.search(("a",), query="tea")]

    assert asyncio.run(main()) == ["k"]
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        system.ask(PutItem(("a",), "k2", {"v": 2}))
        assert [i.key for i in system.ask(SearchItems(("a",))).items] == ["k2", "k"]


def test_the_json_lines_door_serves_the_item_operations(data_dir: Path) -> None:
    with (
        MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system,
        Workspaces.open(data_dir, embedder=FakeEmbedder()) as workspaces,
    ):
        requests = [
            (
                "put_item",
                {"namespace": ["u", "1"], "key": "k", "value": {"text": "green tea"}, "index": ["text"]},
            ),
            ("get_item", {"namespace": ["u", "1"], "key": "k"}),
            ("search_items", {"prefix": ["u"], "query": "tea", "filter": {"text": "green tea"}}),
            ("list_namespaces", {"prefix": ["u"]}),
            ("delete_item", {"namespace": ["u", "1"], "key": "k"}),
            ("get_item", {"namespace": ["u", "1"], "key": "k"}),
            ("put_item", {"namespace": "u", "key": "k", "value": {}}),
        ]
        lines = b"".join(
            orjson.dumps({"jsonrpc": "2.0", "id": n, "method": m, "params": p}) + b"\n"
            for n, (m, p) in enumerate(requests)
        )
        out = io.BytesIO()
        JsonLinesServer(build_methods(system, workspaces), workers=4).serve(io.BytesIO(lines), out)
    answers = {r["id"]: r for r in map(orjson.loads, out.getvalue().splitlines())}
    assert answers[0]["result"] == {"namespace": ["u", "1"], "key": "k"}
    got = answers[1]["result"]
    assert got["value"] == {"text": "green tea"} and got["created_at"].endswith("Z")
    assert [i["key"] for i in answers[2]["result"]] == ["k"] and answers[2]["result"][0]["score"] > 0
    assert answers[3]["result"] == [["u", "1"]]
    assert answers[4]["result"]["deleted"] is True
    assert answers[5]["result"] is None
    error = answers[6]["error"]["message"]
    assert "namespace" in error and "\n" not in error


_PAST = dt.datetime(2001, 1, 1, tzinfo=dt.UTC)  # items stamped with it were written by the actor


def test_openai_sessions_on_a_system_are_episodes_of_its_agent(data_dir: Path) -> None:
    pytest.importorskip("agents", reason="the openai-agents extra is not installed")
    from memstrata.integrations.openai_agents import MemstrataSession

    clock = ManualClock(_PAST)

    async def scenario(system: MemorySystem) -> None:
        one, two = MemstrataSession("s1", system=system), MemstrataSession("s2", system=system)
        await one.add_items([{"role": "user", "content": f"m{i}"} for i in range(4)])
        await two.add_items([{"role": "user", "content": "elsewhere"}])
        assert [i["content"] for i in await one.get_items()] == ["m0", "m1", "m2", "m3"]
        assert [i["content"] for i in await one.get_items(limit=2)] == ["m2", "m3"]
        assert await one.pop_item() == {"role": "user", "content": "m3"}
        again = MemstrataSession("s1", system=system)  # a second handle on the same history
        assert [i["content"] for i in await again.get_items()] == ["m0", "m1", "m2"]
        await one.clear_session()
        assert await again.get_items() == [] and await again.pop_item() is None
        assert len(await two.get_items()) == 1
        one.close()  # closes the session, not the system
        (episode,) = system.agent("openai-agents").list_episodes(task_run_id="s2")
        assert (episode.at, episode.kind) == (_PAST, "turn")
        assert episode.content == '{"role":"user","content":"elsewhere"}'
        assert system.items.tail(("openai-agents", "s2")) == []  # not items any more

    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder(), clock=clock) as system:
        asyncio.run(scenario(system))


def test_autogen_memories_on_a_system_use_its_actor_and_embedder(data_dir: Path) -> None:
    pytest.importorskip("autogen_core", reason="the autogen extra is not installed")
    from autogen_core.memory import MemoryContent, MemoryMimeType

    from memstrata.integrations.autogen import MemstrataMemory, MemstrataMemoryConfig

    clock = ManualClock(_PAST)

    async def scenario(system: MemorySystem) -> None:
        config = MemstrataMemoryConfig(collection_name="c", k=2)
        memory = MemstrataMemory(config, system=system)
        meta = {"n": 3, "tags": ["a"]}
        text = "the cellar key hangs by the door"
        await memory.add(MemoryContent(content=text, mime_type="text/plain", metadata=meta))
        await memory.add(MemoryContent(content={"city": "Lyon"}, mime_type=MemoryMimeType.JSON))
        found = (await memory.query("where is the cellar key")).results
        assert found[0].content == text and (found[0].metadata or {})["n"] == 3
        assert isinstance((found[0].metadata or {})["score"], float)
        other = MemstrataMemory(config, system=system)  # another agent's memory, same collection
        assert len((await other.query("Lyon")).results) == 2
        stored = system.items.tail(("autogen", "c"))
        assert [r.created_at for r in stored] == [_PAST.timestamp()] * 2
        await memory.close()
        await other.clear()
        assert (await other.query("Lyon")).results == []

    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder(), clock=clock) as system:
        asyncio.run(scenario(system))
