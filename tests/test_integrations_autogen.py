"""AutoGen's Memory on memstrata (memstrata.integrations.autogen), with the real framework."""

from __future__ import annotations

import asyncio
import decimal
from pathlib import Path

import pytest

pytest.importorskip("autogen_core", reason="the autogen extra is not installed")

from autogen_core.memory import MemoryContent, MemoryMimeType
from autogen_core.model_context import BufferedChatCompletionContext
from autogen_core.models import SystemMessage, UserMessage

from memstrata.errors import InvalidInputError
from memstrata.integrations.autogen import MemstrataMemory, MemstrataMemoryConfig
from memstrata.testing import HashEmbedder


def test_metadata_of_any_json_type_is_kept_as_is(tmp_path: Path) -> None:
    async def scenario() -> None:
        config = MemstrataMemoryConfig(collection_name="c", persistence_path=str(tmp_path), k=2)
        memory = MemstrataMemory(config, embedder=HashEmbedder())
        meta = {"n": 3, "w": 0.5, "ok": True, "tags": ["a", "b"], "nested": {"x": None}}
        await memory.add(
            MemoryContent(content="the cellar key hangs by the door", mime_type="text/plain", metadata=meta)
        )
        await memory.add(MemoryContent(content={"city": "Lyon"}, mime_type=MemoryMimeType.JSON))
        found = await memory.query("where is the cellar key")
        top = found.results[0]
        assert top.content == "the cellar key hangs by the door"
        assert {k: v for k, v in (top.metadata or {}).items() if k != "score"} == meta
        assert isinstance((top.metadata or {})["score"], float)
        await memory.close()
        reopened = MemstrataMemory(config, embedder=HashEmbedder())
        assert len((await reopened.query("Lyon")).results) == 2
        await reopened.clear()
        assert (await reopened.query("Lyon")).results == []
        await reopened.close()

    asyncio.run(scenario())


def test_two_runs_write_the_same_keys_and_a_memory_added_twice_is_kept_once(tmp_path: Path) -> None:
    """A simulation's runs must write the same bytes: a memory's key is its content hash."""

    async def run(folder: Path) -> list[str]:
        config = MemstrataMemoryConfig(collection_name="c", persistence_path=str(folder), k=10)
        memory = MemstrataMemory(config, embedder=HashEmbedder())
        for text in ("the cellar key hangs by the door", "the roof has solar panels"):
            await memory.add(MemoryContent(content=text, mime_type="text/plain", metadata={"n": 1}))
        await memory.add(
            MemoryContent(content="the roof has solar panels", mime_type="text/plain", metadata={"n": 1})
        )
        await memory.add(
            MemoryContent(content="the roof has solar panels", mime_type="text/plain", metadata={"n": 2})
        )
        assert len((await memory.query("roof solar panels")).results) == 3
        keys = sorted(item.key for item in memory._items.search(("autogen", "c"), limit=10))
        await memory.close()
        return keys

    first, second = asyncio.run(run(tmp_path / "one")), asyncio.run(run(tmp_path / "two"))
    assert first == second and len(set(first)) == 3


def test_threshold_context_update_reset_and_config_round_trip() -> None:
    async def scenario() -> None:
        memory = MemstrataMemory(MemstrataMemoryConfig(score_threshold=0.5), embedder=HashEmbedder())
        await memory.add(
            MemoryContent(content="Jupiter is the largest planet", mime_type=MemoryMimeType.TEXT)
        )
        assert (await memory.query("sourdough starter feeding")).results == []
        context = BufferedChatCompletionContext(buffer_size=5)
        await context.add_message(UserMessage(content="Jupiter is the largest planet?", source="user"))
        result = await memory.update_context(context)
        assert len(result.memories.results) == 1
        messages = await context.get_messages()
        assert isinstance(messages[-1], SystemMessage) and "Jupiter" in messages[-1].content
        with pytest.raises(InvalidInputError, match="allow_reset"):
            await memory.reset()
        with pytest.raises(InvalidInputError, match="Unsupported content type"):
            await memory.add(MemoryContent(content=b"raw", mime_type=MemoryMimeType.BINARY))
        with pytest.raises(InvalidInputError, match="JSON content must be a dict"):
            await memory.add(MemoryContent(content="x", mime_type=MemoryMimeType.JSON))
        dumped = memory.dump_component()
        assert dumped.config["score_threshold"] == 0.5
        assert dumped.provider == "memstrata.integrations.autogen.MemstrataMemory"
        loaded = MemstrataMemory.load_component(dumped)
        assert isinstance(loaded, MemstrataMemory) and loaded.collection_name == "memstrata_memory"
        await memory.close()
        await loaded.close()

    asyncio.run(scenario())


def test_a_score_of_the_memory_s_own_is_kept_beside_the_search_score() -> None:
    async def scenario() -> None:
        memory = MemstrataMemory(MemstrataMemoryConfig(), embedder=HashEmbedder())
        meta = {"score": "A+", "user_score": 3, "grade": 1}
        await memory.add(MemoryContent(content="the key", mime_type=MemoryMimeType.TEXT, metadata=meta))
        (found,) = (await memory.query("the key")).results
        assert found.metadata is not None and isinstance(found.metadata["score"], float)  # as AutoGen's
        assert {k: v for k, v in found.metadata.items() if k != "score"} == {
            "user_user_score": "A+",
            "user_score": 3,
            "grade": 1,
        }
        await memory.close()

    asyncio.run(scenario())


def test_a_query_that_is_neither_text_nor_memory_content_is_refused_by_type() -> None:
    async def scenario() -> None:
        memory = MemstrataMemory(MemstrataMemoryConfig(), embedder=HashEmbedder())
        for query, kind in ((5, "int"), (None, "NoneType"), (["key"], "list")):
            with pytest.raises(
                InvalidInputError, match=f"^query must be a string or a MemoryContent, got {kind}$"
            ):
                await memory.query(query)  # type: ignore[arg-type]
        await memory.close()

    asyncio.run(scenario())


def test_errors_name_the_field_at_fault_and_k_is_not_converted() -> None:
    async def scenario() -> None:
        memory = MemstrataMemory(MemstrataMemoryConfig(), embedder=HashEmbedder())
        with pytest.raises(InvalidInputError, match=r"^memory content is not JSON: .*surrogates"):
            await memory.add(MemoryContent(content="key under the pot \ud800", mime_type=MemoryMimeType.TEXT))
        with pytest.raises(InvalidInputError, match=r"^memory metadata is not JSON: .*surrogates"):
            await memory.add(
                MemoryContent(content="key", mime_type=MemoryMimeType.TEXT, metadata={"x": "\udfff"})
            )
        for bad in ({"a": {1, 2}}, {"price": decimal.Decimal("1.5")}):
            with pytest.raises(
                InvalidInputError, match=r"^memory content is not JSON: .*not JSON serializable"
            ):
                await memory.add(MemoryContent(content=bad, mime_type=MemoryMimeType.JSON))
        await memory.add(MemoryContent(content="the key hangs by the door", mime_type=MemoryMimeType.TEXT))
        for k in ("2", 2.7, True, 0, 1001):
            with pytest.raises(InvalidInputError, match=r"^k must be an integer from 1 to 1000"):
                await memory.query("key", k=k)
        assert len((await memory.query("key", k=1)).results) == 1
        await memory.close()

    asyncio.run(scenario())
    with pytest.raises(ValueError, match="k"):
        MemstrataMemoryConfig(k=1001)
    for threshold in (float("nan"), float("inf"), float("-inf")):  # NaN would filter nothing
        with pytest.raises(ValueError, match="score_threshold"):
            MemstrataMemoryConfig(score_threshold=threshold)


def test_top_k_is_k_a_blank_query_finds_nothing_and_a_wrong_type_is_a_type_error() -> None:
    """As AutoGen's Redis memory reads them: ``top_k`` is the count; a dict query is a TypeError."""

    async def scenario() -> None:
        memory = MemstrataMemory(MemstrataMemoryConfig(k=5), embedder=HashEmbedder())
        for text in ("my favorite fruit are apples", "I also like cherries", "I like plums as well"):
            await memory.add(MemoryContent(content=text, mime_type=MemoryMimeType.TEXT))
        assert len((await memory.query("what fruits do I like?")).results) == 3
        assert len((await memory.query("what fruits do I like?", top_k=2)).results) == 2
        assert len((await memory.query("what fruits do I like?", k=1, top_k=1)).results) == 1
        with pytest.raises(InvalidInputError, match=r"^give k or top_k .*k=1, top_k=2"):
            await memory.query("fruit", k=1, top_k=2)
        with pytest.raises(InvalidInputError, match=r"^top_k must be an integer from 1 to 1000"):
            await memory.query("fruit", top_k=0)
        for blank in ("", "   ", "\n\t"):
            assert (await memory.query(blank)).results == []
        assert (await memory.query(MemoryContent(content=" ", mime_type=MemoryMimeType.TEXT))).results == []
        with pytest.raises(
            TypeError, match=r"^query must be a string or a MemoryContent, got dict$"
        ) as caught:
            await memory.query({"question": "what fruit?"})  # type: ignore[arg-type]
        assert isinstance(caught.value, InvalidInputError)
        with pytest.raises(TypeError, match=r"^memory metadata is not JSON"):
            await memory.add(
                MemoryContent(content="k", mime_type=MemoryMimeType.TEXT, metadata={"x": object()})
            )
        with pytest.raises(TypeError, match=r"^memory metadata is not JSON: .* at value\['order_id'\]"):
            await memory.add(
                MemoryContent(content="k", mime_type=MemoryMimeType.TEXT, metadata={"order_id": 2**64})
            )
        await memory.close()

    asyncio.run(scenario())


def test_a_cancelled_add_is_stored_before_the_cancellation_reaches_the_caller() -> None:
    async def scenario() -> None:
        memory = MemstrataMemory(MemstrataMemoryConfig(k=50), embedder=HashEmbedder())
        for n in range(20):
            content = MemoryContent(content=f"fact number {n}", mime_type=MemoryMimeType.TEXT)
            task = asyncio.create_task(memory.add(content))
            await asyncio.sleep(0)  # the call begins
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        found = await memory.query("fact number")
        assert sorted(str(m.content) for m in found.results) == sorted(f"fact number {n}" for n in range(20))
        await memory.close()

    asyncio.run(scenario())


def test_a_collection_name_the_item_store_cannot_hold_is_refused_when_the_memory_is_made() -> None:
    for name, reason in (("notes\x1fv2", r"without \\x00 or \\x1f"), ("n" * 1025, "at most 1024 characters")):
        with pytest.raises(InvalidInputError, match=rf"^collection_name .*{reason}") as caught:
            MemstrataMemory(MemstrataMemoryConfig(collection_name=name), embedder=HashEmbedder())
        assert "\n" not in str(caught.value) and "PutItem" not in str(caught.value)
    memory = MemstrataMemory(MemstrataMemoryConfig(collection_name="n" * 1024), embedder=HashEmbedder())
    asyncio.run(memory.close())


def test_an_unknown_query_option_is_refused_by_name() -> None:
    """``topk`` (a typo of ``top_k``) and Redis memory's ``distance_threshold`` and ``sequential``
    would change nothing here: refused, as ChromaDB's memory refuses an option its query lacks."""

    async def scenario() -> None:
        memory = MemstrataMemory(MemstrataMemoryConfig(k=3), embedder=HashEmbedder())
        for fruit in ("apples", "cherries", "plums"):
            await memory.add(MemoryContent(content=f"I like {fruit}", mime_type=MemoryMimeType.TEXT))
        with pytest.raises(TypeError, match=r"^query got an unknown option 'topk' \(it takes k or top_k\)$"):
            await memory.query("fruit", topk=1)
        with pytest.raises(
            InvalidInputError, match=r"^query got unknown options 'distance_threshold', 'sequential' "
        ):
            await memory.query("fruit", sequential=True, distance_threshold=0.01, k=1)
        assert len((await memory.query("fruit", top_k=1)).results) == 1
        await memory.close()

    asyncio.run(scenario())
