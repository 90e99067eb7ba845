"""The declared field rules of the messages: every request field is checked by a rule in its type,
each bad field is named in its error, and normalised fields keep their normal form."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Annotated, Any

import pytest

from memstrata.actors import _codec
from memstrata.actors._codec import Message, Rule, field_rules
from memstrata.core.errors import InvalidInputError
from memstrata.messages import QueryKnowledge, StoreKnowledge, StoreMemory, message_types

# the answers, built by the actors from checked data: they hold what they are given (one string:
# a list would repeat the protocol's list of names line by line)
_ANSWERS = """
    EpisodeDeleted EpisodeItem EpisodeList EpisodesArchived EpisodesRestored ItemDeleted ItemList
    ItemStored ItemValue ItemsSwept ItemsWritten KnowledgeDeleted KnowledgeItem KnowledgeList
    KnowledgeResult KnowledgeStored KnowledgeUpdated MemoryCommitted MemorySearchResult MemoryStored
    NamespaceCleared NamespaceList Signal SignalDeleted SignalList SignalPublished SignalSubscribed
    SignalUnsubscribed SignalValue TaskPrompt WorkingMemoryCleared WorkingMemoryValue WriteBackQueued
"""
RESPONSES = frozenset(_ANSWERS.split())
# every other message of the protocol is a request, checked when it is built
REQUESTS = tuple(
    cls
    for name, cls in sorted(message_types().items())
    if cls.__module__.startswith("memstrata.") and name not in RESPONSES
)
# fields checked by the class's cross-field ``_check`` instead of a rule of their own
CROSS_CHECKED = {"PublishSignal.value"}
# a valid value for each required field, by name
SAMPLES: dict[str, Any] = {
    "agent_id": "agent-1",
    "content": "some content",
    "category": "pitfall",
    "query": "a query",
    "entry_id": 1,
    "episode_id": 1,
    "task_run_id": "run-1",
    "path": "/tmp/archive.sqlite",
    "key": "k",
    "value": {"a": 1},
    "key_or_prefix": "k*",
    "subscription_id": 1,
    "task_id": "t1",
    "description": "do it",
    "summary": "done",
    "reason": "failed",
    "namespace": ("a", "b"),
}


def _valid(cls: type[Message]) -> dict[str, Any]:
    return {
        f.name: SAMPLES[f.name]
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }


def test_the_protocol_has_its_requests_and_answers() -> None:
    assert len(REQUESTS) == 36
    assert set(message_types()) >= RESPONSES


@pytest.mark.parametrize("cls", REQUESTS, ids=lambda c: c.__name__)
def test_every_request_field_has_a_rule(cls: type[Message]) -> None:
    rules = field_rules(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        where = f"{cls.__name__}.{f.name}"
        assert (f.name in rules) != (where in CROSS_CHECKED), where


@pytest.mark.parametrize("cls", REQUESTS, ids=lambda c: c.__name__)
def test_each_bad_field_is_named(cls: type[Message]) -> None:
    good = _valid(cls)
    cls(**good)
    crossed = [w.split(".")[1] for w in CROSS_CHECKED if w.startswith(f"{cls.__name__}.")]
    for name in [*field_rules(cls), *crossed]:
        with pytest.raises(InvalidInputError) as caught:
            cls(**{**good, name: object()})
        assert str(caught.value).startswith(f"{cls.__name__}.{name} "), str(caught.value)


@pytest.mark.parametrize(
    "cls", [c for c in REQUESTS if "agent_id" in field_rules(c)], ids=lambda c: c.__name__
)
def test_a_bad_agent_id_fails_naming_the_field(cls: type[Message]) -> None:
    with pytest.raises(InvalidInputError, match=rf"^{cls.__name__}\.agent_id must be an id of 1-64 letters"):
        cls(**{**_valid(cls), "agent_id": "../etc"})


def test_normalised_fields_hold_the_normal_form() -> None:
    entry = StoreKnowledge("a", "c", "pitfall", tags=["z", "b"], scope="src//auth/")
    assert entry.tags == {"b": "", "z": ""}
    assert entry.scope == "/src/auth"
    at = StoreMemory("a", None, "c", at="2030-01-02T03:04:05+00:00")  # type: ignore[arg-type]
    assert at.at == dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert QueryKnowledge("a", "q").tags is None  # an optional field left out stays None


def test_shared_is_a_target_only_where_declared() -> None:
    assert StoreKnowledge("shared", "c", "pitfall").agent_id == "shared"
    with pytest.raises(InvalidInputError, match=r"^StoreMemory\.agent_id 'shared' is reserved"):
        StoreMemory("shared", None, "c")


def _upper(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a str")
    return value.upper()


@pytest.fixture
def own_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages defined by a test stay out of the protocol's registry."""
    monkeypatch.setattr(_codec, "_REGISTRY", dict(_codec._REGISTRY))


@pytest.mark.usefixtures("own_registry")
def test_rules_run_in_field_order_then_the_cross_check() -> None:
    class Shout(Message):
        word: Annotated[str, Rule(_upper, normalise=True)]
        other: Annotated[str | None, Rule(_upper, optional=True)] = None
        extra: int = 0

        def _check(self) -> None:
            if self.other is not None and self.other.upper() == self.word:
                raise InvalidInputError("Shout.other must differ from word")

    assert Shout("hey").word == "HEY"
    assert Shout("hey", "you").other == "you"  # checked, not normalised
    with pytest.raises(InvalidInputError, match=r"^Shout\.word must be a str"):
        Shout(1, 2)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"^Shout\.other must be a str"):
        Shout("a", 2)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="must differ"):
        Shout("a", "A")
    assert "__post_init__" in Shout.__dict__ and Shout.__post_init__ is not Message.__post_init__


@pytest.mark.usefixtures("own_registry")
def test_a_field_with_two_rules_is_refused() -> None:
    class Twice(Message):
        word: Annotated[str, Rule(_upper), Rule(_upper)]

    with pytest.raises(TypeError, match="more than one Rule"):
        Twice("x")
