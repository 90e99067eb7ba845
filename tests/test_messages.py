"""Messages: validation at construction and an exact orjson round trip for every type."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path
from typing import Any

import orjson
import pytest

from memstrata import Config, MemorySystem, messages
from memstrata.core.constants import MAX_TOP_K
from memstrata.errors import InvalidInputError
from memstrata.layers import Episode, EpisodeHit, KnowledgeEntry, KnowledgeHit
from tests.fakes import FakeEmbedder

AT = dt.datetime(2025, 3, 1, 12, 30, tzinfo=dt.UTC)
ENTRY = KnowledgeEntry(7, "Avoid <Strategy> & co", "pitfall", {"taskId": "t1"}, "/src", "a1", 1.5, 2.5)
KHIT = KnowledgeHit(ENTRY, 0.87, "hybrid", 1, 2, 0.61)
EPISODE = Episode(3, "did things", "Task t1 completed", "t1", {"taskId": "t1"}, "task", AT, "uuid-1")
EHIT = EpisodeHit(EPISODE, 0.5, "semantic", 0.4, 1, None)

ITEM = messages.StoredItem(("users", "u1"), "k", {"text": "hi"}, 1.5, 2.5, 0.75, 99.0)

EXAMPLES: list[messages.Message] = [
    messages.StoreKnowledge("a1", "content", "pitfall", {"taskId": "t1"}, "/src", author="a1"),
    messages.KnowledgeStored("a1", 4),
    messages.ListKnowledge("shared", "pitfall", {"taskId": "t1"}, "/src", 20, 40),
    messages.KnowledgeList("a1", (ENTRY,)),
    messages.GetKnowledge("a1", 7),
    messages.KnowledgeItem("a1", ENTRY),
    messages.KnowledgeItem("a1", None),
    messages.DeleteKnowledge("a1", 7),
    messages.KnowledgeDeleted("a1", 7, True),
    messages.QueryKnowledge("a1", "payment", "pattern", 5, {"k": ""}, "/src", True, "keyword", 0.2),
    messages.KnowledgeResult("a1", (KHIT,)),
    messages.StoreMemory("a1", "t1", "content", "title", {"x": "y"}, "task", AT),
    messages.MemoryStored("a1", 9),
    messages.SearchMemory("a1", "query", "t1", 3, AT, AT + dt.timedelta(days=1)),
    messages.MemorySearchResult("a1", "t1", (EHIT,)),
    messages.CommitMemory("a1"),
    messages.MemoryCommitted("a1"),
    messages.SetWorkingMemory("a1", "plan", {"steps": [1, 2, {"n": None}]}, 2.5),
    messages.GetWorkingMemory("a1", "plan"),
    messages.WorkingMemoryValue("a1", "plan", [1, "two"], True),
    messages.ClearWorkingMemory("a1", "plan"),
    messages.WorkingMemoryCleared("a1", 2),
    messages.PublishSignal("agent:a1:status", {"state": "busy", "n": 3}, "a1", "s1"),
    messages.SignalPublished("s1", "k", 2),
    messages.QuerySignal("k", "s1"),
    messages.SignalValue("s1", "k", [1], True, "a1", 3, AT),
    messages.Signal("s1", "k", "v", None, 1, AT),
    messages.SubscribeSignal("agent:*", "s1"),
    messages.SignalSubscribed("s1", 5, "agent:*"),
    messages.UnsubscribeSignal(5, "s1"),
    messages.SignalUnsubscribed("s1", 5, True),
    messages.ListSignals("agent:", "s1"),
    messages.SignalList("s1", "agent:", ("agent:a", "agent:b")),
    messages.DeleteSignal("agent:a", "s1"),
    messages.SignalDeleted("s1", "agent:a", True, 4),
    messages.Signal("s1", "agent:a", None, None, 4, AT, True),
    messages.TaskAssigned("t1", "Refactor payment", "a1", "payment", "pitfall", {"a": "b"}, "/src", 4),
    messages.TaskPrompt("<task>x</task>", (KHIT,), False, None, "a1", "t1", (EHIT,)),
    messages.TaskCompleted("t1", "done", "a1"),
    messages.TaskFailed("t1", "broke", None),
    messages.WriteBackQueued("a1", "t1", 12),
    messages.UpdateKnowledge("shared", 7, "new text", "pattern", {"k": "v"}, "/src"),
    messages.KnowledgeUpdated("shared", 7, ENTRY),
    messages.ListEpisodes("a1", "t1", AT, AT + dt.timedelta(days=1), 20, 40, False),
    messages.EpisodeList("a1", (EPISODE,)),
    messages.GetEpisode("a1", 3),
    messages.EpisodeItem("a1", EPISODE),
    messages.EpisodeItem("a1", None),
    messages.DeleteEpisode("a1", 3),
    messages.EpisodeDeleted("a1", 3, True),
    messages.ArchiveEpisodes("a1", "/tmp/a1.sqlite", AT, "t1"),
    messages.EpisodesArchived("a1", "/tmp/a1.sqlite", 4),
    messages.RestoreEpisodes("a1", "/tmp/a1.sqlite"),
    messages.EpisodesRestored("a1", "/tmp/a1.sqlite", 4),
    messages.PutItem(("users", "u1"), "k", {"text": "hi", "n": [1, None]}, ("text",), 5.0),
    messages.ItemStored(("users", "u1"), "k"),
    messages.GetItem(("users", "u1"), "k", True),
    messages.ItemValue(("users", "u1"), "k", ITEM),
    messages.ItemValue(("users", "u1"), "k", None),
    messages.SearchItems(("users",), "greeting", {"n": {"$gte": 1}}, 5, 2),
    messages.ItemList(("users",), (ITEM,)),
    messages.DeleteItem(("users", "u1"), "k"),
    messages.ItemDeleted(("users", "u1"), "k", True),
    messages.ListNamespaces(("users", "*"), ("u1",), 2, 50, 1),
    messages.NamespaceList((("users", "u1"), ("users", "u2"))),
    messages.SweepItems(("users",)),
    messages.TailItems(("chat", "s1"), 20),
    messages.PopItem(("chat", "s1")),
    messages.ClearNamespace(("chat", "s1")),
    messages.NamespaceCleared(("chat", "s1"), 4),
    messages.ItemsSwept(3),
    messages.WriteItems(
        (messages.PutItem(("docs",), "a", {"t": "x"}, None, None, {"t": (0.5, -1.0)}),),
        (messages.DeleteItem(("docs",), "b"),),
    ),
    messages.ItemsWritten(1, 1),
]


def test_every_message_type_has_an_example() -> None:
    assert {type(m).__name__ for m in EXAMPLES} == set(messages.message_types())


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_orjson_round_trip_is_exact(message: messages.Message) -> None:
    data = messages.encode(message)
    assert orjson.loads(data)["type"] == type(message).__name__
    back = messages.decode(data)
    assert back == message
    assert type(back) is type(message)
    assert type(message).from_dict(message.to_dict()) == message
    assert messages.decode(data.decode("utf-8")) == message


def test_decode_refuses_an_integer_beyond_64_bits_instead_of_reading_a_float() -> None:
    data = (
        b'{"type": "PutItem", "namespace": ["a"], "key": "k", "value": {"n": 123456789012345678901234567890}}'
    )
    with pytest.raises(InvalidInputError, match=r"^message is refused: integer 1234567890\d+ at 'value.n'"):
        messages.decode(data)
    with pytest.raises(InvalidInputError, match=rf"PutItem.value must hold integers .* found {2**63}"):
        messages.PutItem(("a",), "k", {"n": 2**63})  # what orjson would write and read back
    edge = messages.decode(
        f'{{"type": "PutItem", "namespace": ["a"], "key": "k", "value": {{"n": {2**63 - 1}}}}}'
    )
    assert edge == messages.PutItem(("a",), "k", {"n": 2**63 - 1})


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_messages_are_frozen_and_slotted(message: messages.Message) -> None:
    assert not hasattr(message, "__dict__")
    field = dataclasses.fields(message)[0].name  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(message, field, "x")


def test_hits_decode_to_layer_objects() -> None:
    result = messages.decode(messages.encode(messages.KnowledgeResult("a1", (KHIT,))))
    assert isinstance(result, messages.KnowledgeResult)
    assert isinstance(result.hits[0], KnowledgeHit)
    assert isinstance(result.hits[0].entry, KnowledgeEntry)
    episodes = messages.decode(messages.encode(messages.MemorySearchResult("a1", None, (EHIT,))))
    assert isinstance(episodes, messages.MemorySearchResult)
    assert episodes.hits[0].episode.at == AT
    assert episodes.hits[0].episode.at.tzinfo is not None


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: messages.StoreKnowledge("", "c", "pitfall"), "StoreKnowledge.agent_id"),
        (lambda: messages.StoreKnowledge("../etc", "c", "pitfall"), "StoreKnowledge.agent_id"),
        (lambda: messages.StoreKnowledge("a/b", "c", "pitfall"), "StoreKnowledge.agent_id"),
        (lambda: messages.StoreKnowledge("a1", "   ", "pitfall"), "StoreKnowledge.content"),
        (lambda: messages.StoreKnowledge("a1", 5, "pitfall"), "StoreKnowledge.content"),
        (lambda: messages.StoreKnowledge("a1", "c", "Bad Category"), "StoreKnowledge.category"),
        (lambda: messages.StoreKnowledge("a1", "c", "pitfall", {"k": 1}), "StoreKnowledge.tags['k']"),
        (lambda: messages.StoreKnowledge("a1", "c", "pitfall", scope="/src/../etc"), "StoreKnowledge.scope"),
        (lambda: messages.QueryKnowledge("a1", "q", top_k=0), "QueryKnowledge.top_k"),
        (lambda: messages.ListKnowledge("a1", limit=-1), "ListKnowledge.limit"),
        (lambda: messages.GetKnowledge("a1", 0), "GetKnowledge.entry_id"),
        (lambda: messages.DeleteKnowledge("a1", "7"), "DeleteKnowledge.entry_id"),
        (lambda: messages.QueryKnowledge("a1", "q", top_k=True), "QueryKnowledge.top_k"),
        (lambda: messages.QueryKnowledge("a1", "q", mode="fuzzy"), "QueryKnowledge.mode"),
        (lambda: messages.QueryKnowledge("a1", "q", min_score=2.0), "QueryKnowledge.min_score"),
        (lambda: messages.StoreMemory("a1", "t1", "c", at=dt.datetime(2025, 1, 1)), "StoreMemory.at"),
        (lambda: messages.SearchMemory("a1", "q", since="yesterday"), "SearchMemory.since"),
        (lambda: messages.StoreMemory("shared", None, "c"), "StoreMemory.agent_id"),
        (lambda: messages.SetWorkingMemory("a1", "k", object()), "SetWorkingMemory.value"),
        (lambda: messages.SetWorkingMemory("a1", "", 1), "SetWorkingMemory.key"),
        (lambda: messages.SetWorkingMemory("a1", "k", 1, ttl_s=-1), "SetWorkingMemory.ttl_s"),
        (lambda: messages.SetWorkingMemory("a1", "k", 1, ttl_s=0), "SetWorkingMemory.ttl_s"),
        (lambda: messages.PublishSignal("k*", 1), "PublishSignal.key"),
        (lambda: messages.PublishSignal("k", {1, 2}), "PublishSignal.value"),
        (lambda: messages.PublishSignal("k", 1, session_id="a b"), "PublishSignal.session_id"),
        (lambda: messages.SubscribeSignal("a*b*"), "SubscribeSignal.key_or_prefix"),
        (lambda: messages.UnsubscribeSignal(0), "UnsubscribeSignal.subscription_id"),
        (lambda: messages.TaskAssigned("", "d"), "TaskAssigned.task_id"),
        (lambda: messages.TaskAssigned("t\n1", "d"), "TaskAssigned.task_id"),
        (lambda: messages.TaskAssigned("t1", ""), "TaskAssigned.description"),
        (lambda: messages.TaskCompleted("t1", ""), "TaskCompleted.summary"),
        (lambda: messages.TaskFailed("t1", None), "TaskFailed.reason"),
    ],
)
def test_bad_fields_fail_at_construction_naming_the_field(build: Any, needle: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        build()
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("agent_id", ["a", "architect", "Agent-7", "a.b_c", "x" * 64])
def test_valid_agent_ids(agent_id: str) -> None:
    assert messages.check_agent_id(agent_id) == agent_id


@pytest.mark.parametrize(
    "agent_id", ["", ".", "..", "a.", "-a", "x" * 65, "con", "NUL", "com1.txt", "shared", "a b", "é", "a\x00"]
)
def test_unsafe_agent_ids_are_rejected(agent_id: str) -> None:
    with pytest.raises(InvalidInputError):
        messages.check_agent_id(agent_id)


def test_shared_is_a_knowledge_target_but_not_an_agent() -> None:
    assert messages.StoreKnowledge("shared", "c", "pattern").agent_id == "shared"
    with pytest.raises(InvalidInputError, match="reserved"):
        messages.TaskCompleted("t1", "s", "shared")


def test_bare_tags_become_empty_values_and_tags_are_copied() -> None:
    tags = {"k": "v"}
    message = messages.StoreKnowledge("a1", "c", "pattern", tags)
    tags["k"] = "changed"
    assert message.tags == {"k": "v"}
    assert messages.StoreKnowledge("a1", "c", "pattern", ["urgent", "db"]).tags == {"urgent": "", "db": ""}


@pytest.mark.parametrize(
    "text",
    ['"; DROP TABLE x; --', "NEAR(a b) OR c*", "\U0001f600 emoji", "中文内容", "\ud800 lone", "x" * 100_000],
)
def test_hostile_content_is_accepted_and_round_trips(text: str) -> None:
    message = messages.StoreKnowledge("a1", text, "pattern")
    if "\ud800" in text:  # JSON cannot carry a lone surrogate: a clear error, not a crash
        with pytest.raises((InvalidInputError, TypeError, orjson.JSONEncodeError)):
            messages.encode(message)
        return
    assert messages.decode(messages.encode(message)) == message


@pytest.mark.parametrize(
    "data",
    [b"not json", b"[1, 2]", b'{"type": "Nope"}', b'{"type": "StoreKnowledge", "agent_id": "a1"}', b"{}"],
)
def test_decode_rejects_bad_input_clearly(data: bytes) -> None:
    with pytest.raises(InvalidInputError):
        messages.decode(data)


def test_decode_rejects_unknown_fields_and_invalid_values() -> None:
    good = messages.StoreKnowledge("a1", "c", "pattern").to_dict()
    with pytest.raises(InvalidInputError, match="unknown field"):
        messages.decode({**good, "extra": 1})
    with pytest.raises(InvalidInputError, match=r"StoreKnowledge\.category"):
        messages.decode({**good, "category": "NOT OK"})
    with pytest.raises(InvalidInputError, match="expected a StoreKnowledge"):
        messages.StoreKnowledge.from_dict({**good, "type": "StoreMemory"})


# -- issue 15: NaN/infinity and surrogate keys (one rule in memstrata.core.validation) ----------


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), float("-inf"), {"reading": [1.0, float("nan")]}]
)
def test_publishing_nan_or_infinity_is_rejected_naming_the_key(value: Any) -> None:
    with pytest.raises(InvalidInputError, match=r"PublishSignal\.value for key 'sensor\.temp'.*NaN") as info:
        messages.PublishSignal("sensor.temp", value)
    assert "\n" not in str(info.value)
    with pytest.raises(InvalidInputError, match=r"SetWorkingMemory\.value"):
        messages.SetWorkingMemory("a1", "k", value)


def test_publish_through_the_facade_rejects_nan_instead_of_reading_back_none(data_dir: Path) -> None:
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        board = system.blackboard("s1")
        for value in (float("nan"), float("inf")):
            with pytest.raises(InvalidInputError, match="'level'"):
                board.publish("level", value, wait=True)
            with pytest.raises(InvalidInputError, match="'level'"):
                board.publish("level", value)  # fire-and-forget fails in the caller's thread too
        assert board.list() == []
        board.publish("level", None, wait=True)  # null itself is fine
        assert board.signal("level").found and board.get("level", "absent") is None


@pytest.mark.parametrize("key", ["a\ud800", "a\udfff"])
def test_the_two_surrogate_keys_are_rejected_everywhere(key: str) -> None:
    for build, needle in [
        (lambda: messages.PublishSignal(key, 1), "PublishSignal.key"),
        (lambda: messages.QuerySignal(key), "QuerySignal.key"),
        (lambda: messages.SubscribeSignal(key + "*"), "SubscribeSignal.key_or_prefix"),
        (lambda: messages.SetWorkingMemory("a1", key, 1), "SetWorkingMemory.key"),
        (lambda: messages.StoreKnowledge("a1", "c", "pattern", {key: "v"}), "StoreKnowledge.tags key"),
        (lambda: messages.StoreMemory("a1", key, "c"), "StoreMemory.task_run_id"),
        (lambda: messages.TaskAssigned(key, "d"), "TaskAssigned.task_id"),
        (lambda: messages.QueryKnowledge("a1", "q", scope="/" + key), "QueryKnowledge.scope"),
        (lambda: messages.QueryKnowledge("a1", "q", category=key), "QueryKnowledge.category"),
        (lambda: messages.PublishSignal("k", 1, session_id=key), "PublishSignal.session_id"),
    ]:
        with pytest.raises(InvalidInputError) as info:
            build()
        assert needle in str(info.value)


def test_messages_hold_normalised_tags_and_scopes() -> None:
    message = messages.StoreKnowledge("a1", "c", "pattern", {"b": "1", "a": "2"}, scope="src//auth/")
    assert list(message.tags or {}) == ["a", "b"] and message.scope == "/src/auth"
    assert messages.QueryKnowledge("a1", "q", scope="/x/./y").scope == "/x/y"
    assert messages.decode(messages.encode(message)) == message


def test_messages_and_layers_share_one_top_k_bound() -> None:
    assert messages.QueryKnowledge("a1", "q", top_k=MAX_TOP_K).top_k == MAX_TOP_K
    for build in (
        lambda: messages.QueryKnowledge("a1", "q", top_k=MAX_TOP_K + 1),
        lambda: messages.SearchMemory("a1", "q", top_k=MAX_TOP_K + 1),
        lambda: messages.TaskAssigned("t1", "d", top_k=MAX_TOP_K + 1),
    ):
        with pytest.raises(InvalidInputError, match=f"from 1 to {MAX_TOP_K}"):
            build()


def test_the_public_module_re_exports_the_actors_protocol() -> None:
    import memstrata.actors.messages as protocol
    import memstrata.messages as public

    assert public.__all__ == protocol.__all__
    assert all(getattr(public, name) is getattr(protocol, name) for name in public.__all__)
    assert public.StoreKnowledge.__module__ == "memstrata.actors._msg_knowledge"


def test_the_protocol_module_lists_every_message_of_every_message_module() -> None:
    """``memstrata.messages`` is the union of the message modules, which list nothing themselves.
    Its ``__all__`` is the one literal list (mypy reads only literal lists), so this test fails
    for a class defined in a module but not listed there."""
    import importlib

    import memstrata.actors.messages as protocol
    import memstrata.messages as public

    for name in ("blackboard", "episodic", "items", "knowledge", "tasks", "working"):
        module = importlib.import_module(f"memstrata.actors._msg_{name}")
        defined = {
            n
            for n, value in vars(module).items()
            if isinstance(value, type) and value.__module__ == module.__name__
        }
        assert defined, name
        missing = defined - set(protocol.__all__)
        assert not missing, f"{name}: {sorted(missing)}"
        assert all(getattr(public, n) is getattr(module, n) for n in defined)


def test_messages_hold_their_own_copy_of_a_json_value() -> None:
    """A message sent without waiting is read later, on an actor's thread: the sender's object
    may have changed by then, so the message keeps what it was at construction."""
    value: dict[str, Any] = {"steps": [1, 2], "kind": "plan"}
    sent = [
        messages.SetWorkingMemory("a1", "plan", value),
        messages.PutItem(("n",), "k", value),
        messages.PublishSignal("k", value),
    ]
    query = messages.SearchItems(("n",), filter=value)
    value["steps"].append(3)
    value["kind"] = "changed"
    assert [m.value for m in sent] == [{"steps": [1, 2], "kind": "plan"}] * 3
    assert query.filter == {"steps": [1, 2], "kind": "plan"}
