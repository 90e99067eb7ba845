"""The LangGraph store's arguments at their edges: several namespace match conditions, negative
limits and offsets, NaN and infinity in filters, and the keys, namespaces and lifetimes the item
store holds (refused by the names LangGraph users know)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("langgraph.store.base", reason="the langgraph extra is not installed")

from langgraph.store.base import ListNamespacesOp, MatchCondition, PutOp, SearchOp
from langgraph.store.memory import InMemoryStore

from memstrata.errors import InvalidInputError
from memstrata.integrations.langgraph import MemstrataStore
from tests.fakes import FakeEmbedder

NAMESPACES = [("a", "x"), ("a", "y"), ("b", "x"), ("a", "x", "z"), ("b", "x", "a"), ("a",), ("x", "a", "x")]


@pytest.fixture
def store() -> Iterator[MemstrataStore]:
    with MemstrataStore(":memory:", embedder=FakeEmbedder()) as opened:
        yield opened


def _conditions() -> Iterator[tuple[MatchCondition, ...]]:
    """Every pair and some triples of prefix and suffix conditions over the namespaces' labels."""
    paths = [("a",), ("*", "x"), ("b",), ("a", "*", "z"), ("x",), ("*", "a"), ("a", "x"), ()]
    single = [MatchCondition(kind, path) for kind in ("prefix", "suffix") for path in paths]
    yield from itertools.combinations(single, 2)
    yield from itertools.combinations(single[::3], 3)


def test_every_match_condition_holds_as_in_memory_store(store: MemstrataStore) -> None:
    reference = InMemoryStore()
    for ns in NAMESPACES:
        for target in (reference, store):
            target.put(ns, "k", {"v": 1})
    for conditions in _conditions():
        for depth in (None, 1, 2):
            op = ListNamespacesOp(conditions, depth, 100, 0)
            assert store.batch([op]) == reference.batch([op]), (conditions, depth)


@pytest.mark.parametrize("call", ["search", "list_namespaces"])
@pytest.mark.parametrize("argument", ["limit", "offset"])
def test_a_negative_limit_or_offset_is_refused_by_name(
    store: MemstrataStore, call: str, argument: str
) -> None:
    store.put(("a",), "k", {"v": 1})
    method = getattr(store, call)
    args = (("a",),) if call == "search" else ()
    with pytest.raises(InvalidInputError, match=rf"^{call} {argument} must be an integer from 0, got -1$"):
        method(*args, **{argument: -1})
    with pytest.raises(InvalidInputError, match=rf"^{call} {argument} must be an integer from 0, got 2.5$"):
        method(*args, **{argument: 2.5})
    assert len(method(*args, **{argument: 0})) == (0 if argument == "limit" else 1)
    refused = SearchOp(("a",), limit=-1) if call == "search" else ListNamespacesOp(limit=-1)
    with pytest.raises(InvalidInputError, match=f"^{call} limit"):
        store.batch([PutOp(("a",), "new", {"v": 2}), refused])
    assert store.get(("a",), "new") is None  # nothing of the batch ran


ITEMS: dict[str, dict[str, Any]] = {
    "one": {"f": 1},
    "neg": {"f": -2.5},
    "big": {"f": 1e300},
    "text": {"f": "x"},
    "true": {"f": True},
    "null": {"f": None},
    "none": {"g": 1},
}
NUMBERS = {"one", "neg", "big"}
EVERY = set(ITEMS)


@pytest.mark.parametrize(
    ("operand", "expected"),
    [
        (math.nan, {"$eq": set(), "$gt": set(), "$gte": set(), "$lt": set(), "$lte": set()}),
        (math.inf, {"$eq": set(), "$gt": set(), "$gte": set(), "$lt": NUMBERS, "$lte": NUMBERS}),
        (-math.inf, {"$eq": set(), "$gt": NUMBERS, "$gte": NUMBERS, "$lt": set(), "$lte": set()}),
    ],
)
def test_nan_and_infinity_in_a_filter_follow_the_documented_rule(
    store: MemstrataStore, operand: float, expected: dict[str, set[str]]
) -> None:
    """NaN equals nothing and no number is above or below it; no (finite) number equals
    infinity; ``$ne`` passes exactly what ``$eq`` does not."""
    for key, value in ITEMS.items():
        store.put(("f",), key, value)

    def keys(flt: dict[str, Any]) -> set[str]:
        return {item.key for item in store.search(("f",), filter=flt, limit=100)}

    for op, passing in expected.items():
        assert keys({"f": {op: operand}}) == passing, op
    assert keys({"f": operand}) == set()
    assert keys({"f": {"$ne": operand}}) == EVERY - keys({"f": {"$eq": operand}}) == EVERY


@pytest.mark.parametrize(
    ("namespace", "key", "message"),
    [
        (("a",), "", "key must not be empty or only whitespace, got ''"),
        (("a",), " ", "key must not be empty or only whitespace, got ' '"),
        (("a",), "\n", "key must not be empty or only whitespace, got '\\\\n'"),
        (("a",), "k" * 1025, "key must be at most 1024 characters, got 1025"),
        (("l" * 1025,), "k", "namespace labels must be at most 1024 characters, got 1025"),
        (tuple(f"l{n}" for n in range(65)), "k", "namespace must hold at most 64 labels, got 65"),
    ],
)
def test_keys_and_namespaces_the_item_store_cannot_hold_are_refused_by_their_langgraph_names(
    store: MemstrataStore, namespace: tuple[str, ...], key: str, message: str
) -> None:
    with pytest.raises(InvalidInputError, match=f"^{message}"):
        store.put(namespace, key, {"v": 1})
    with pytest.raises(InvalidInputError, match=f"^{message}"):
        store.get(namespace, key)
    with pytest.raises(InvalidInputError, match=f"^{message}"):
        store.delete(namespace, key)
    with pytest.raises(InvalidInputError, match=f"^{message}"):
        store.batch([PutOp(("a",), "fine", {"v": 1}), PutOp(namespace, key, {"v": 1})])
    assert store.get(("a",), "fine") is None  # nothing of the batch ran
    store.put(("a",), "k" * 1024, {"v": 1})  # the limits themselves are held
    store.put(tuple("l" * 1024 for _ in range(64)), " k ", {"v": 1})
    assert store.get(tuple("l" * 1024 for _ in range(64)), " k ") is not None


def test_ttl_zero_expires_at_once_as_in_langgraphs_sql_stores(store: MemstrataStore) -> None:
    store.put(("t",), "k", {"v": 1})
    store.put(("t",), "j", {"v": 2})
    store.batch([PutOp(("t",), "k", {"v": 3}, ttl=0), PutOp(("t",), "new", {"v": 4}, ttl=0)])
    assert store.get(("t",), "k") is None and store.get(("t",), "new") is None  # expired: never returned
    assert [item.key for item in store.search(("t",))] == ["j"]
    assert store.sweep_ttl() == 0  # nothing expired was kept to sweep
    for bad in (-1, math.nan, math.inf, 1e9, "10"):
        with pytest.raises(
            InvalidInputError, match=r"^ttl must be None or a number of minutes from 0 to 1e\+08, got"
        ):
            store.put(("t",), "j", {"v": 5}, ttl=bad)  # type: ignore[arg-type]
    assert store.get(("t",), "j").value == {"v": 2}  # type: ignore[union-attr]
    with pytest.raises(
        InvalidInputError,
        match=r"^ttl default_ttl must be None or a number of minutes above 0 up to 1e\+08, got 0$",
    ):
        MemstrataStore(store.system, ttl={"default_ttl": 0})
