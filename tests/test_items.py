"""The keyed item layer (layers/_items.py): exact prefix and filter search, tail reads, deletion, TTL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memstrata.errors import InvalidInputError
from memstrata.layers._items import ItemStore
from memstrata.messages import PutItem
from tests._support import HandClock


@pytest.fixture
def items(tmp_path: Path) -> ItemStore:
    return ItemStore(tmp_path / "items.sqlite")


def test_upsert_by_key_keeps_created_and_replaces_value(tmp_path: Path) -> None:
    clock = HandClock()
    store = ItemStore(tmp_path / "i.sqlite", clock=clock)
    store.put_many([(("a",), "k", {"v": 1}, None, None)])
    clock.now += 5
    store.put_many([(("a",), "k", {"v": 2}, None, None)])
    rec = store.get(("a",), "k")
    assert rec is not None and rec.value == {"v": 2}
    assert (rec.created_at, rec.updated_at) == (1_000.0, 1_005.0)
    assert store.count() == 1


def test_prefix_search_finds_descendants_not_siblings_or_ancestors(items: ItemStore) -> None:
    items.put_many(
        [
            (("a",), "top", {"x": 1}, None, None),
            (("a", "b"), "child", {"x": 2}, None, None),
            (("ab",), "sibling", {"x": 3}, None, None),
        ]
    )
    assert {r.key for r in items.search(("a",))} == {"top", "child"}
    assert {r.key for r in items.search(("a", "b"))} == {"child"}
    assert {r.key for r in items.search(())} == {"top", "child", "sibling"}


def test_filter_is_exact_inside_the_engine_not_after_a_global_top_k(items: ItemStore) -> None:
    crowd = [(("other",), f"k{i}", {"kind": "x"}, {"$": [1.0, 0.0]}, None) for i in range(1500)]
    items.put_many([*crowd, (("mine",), "only", {"kind": "y"}, {"$": [0.0, 1.0]}, None)])
    hits = items.search(("mine",), query_vector=[1.0, 0.0], limit=10)
    assert [h.key for h in hits] == ["only"]
    hits = items.search((), query_vector=[1.0, 0.0], filter={"kind": "y"}, limit=3)
    assert [h.key for h in hits] == ["only"]


def test_filter_operators(items: ItemStore) -> None:
    items.put_many(
        [
            (("n",), f"k{i}", {"n": i, "tag": "even" if i % 2 == 0 else "odd", "ok": i < 2}, None, None)
            for i in range(5)
        ]
    )

    def keys(flt: dict[str, object]) -> set[str]:
        return {r.key for r in items.search(("n",), filter=flt, limit=50)}

    assert keys({"n": {"$gt": 2}}) == {"k3", "k4"}
    assert keys({"n": {"$gte": 2, "$lt": 4}}) == {"k2", "k3"}
    assert keys({"n": {"$lte": 0}}) == {"k0"}
    assert keys({"tag": {"$ne": "even"}}) == {"k1", "k3"}
    assert keys({"tag": "even", "n": {"$eq": 4}}) == {"k4"}
    assert keys({"ok": True}) == {"k0", "k1"}
    with pytest.raises(InvalidInputError, match=r"\$like"):
        items.search(("n",), filter={"n": {"$like": 1}})
    with pytest.raises(InvalidInputError, match="Invalid filter key"):
        items.search(("n",), filter={"n') OR 1=1 --": 1})


def test_filters_compare_like_with_like_and_null_means_null_or_missing(items: ItemStore) -> None:
    """SQLite orders text, lists and objects above numbers and reads true as 1: a filter value
    meets only values of its own JSON type. Null and a missing field are one to a filter, so $eq
    and $ne on any value split the items between them."""
    values: dict[str, object] = {
        "int": 3,
        "real": 2.5,
        "big": 1e300,
        "text": "abc",
        "digits": "5",
        "true": True,
        "list": [1, 2],
        "list_text": "[1,2]",
        "obj": {"a": 1},
        "null": None,
    }
    items.put_many([(("t",), k, {"v": v}, None, None) for k, v in values.items()])
    items.put_many([(("t",), "missing", {"w": 1}, None, None)])
    every = {*values, "missing"}

    def keys(flt: dict[str, object]) -> set[str]:
        return {r.key for r in items.search(("t",), filter=flt, limit=50)}

    assert keys({"v": {"$gt": 2}}) == {"int", "real", "big"}
    assert keys({"v": {"$lt": 100}}) == {"int", "real"}
    assert keys({"v": {"$gte": 0.5, "$lte": 1}}) == set()  # not true
    assert keys({"v": 1}) == set() and keys({"v": True}) == {"true"}
    assert keys({"v": {"$gt": "a"}}) == {"text"}  # not the list, the object or a number
    assert keys({"v": {"$lt": "b"}}) == {"text", "digits", "list_text"}
    assert keys({"v": [1, 2]}) == {"list"} and keys({"v": "[1,2]"}) == {"list_text"}
    assert keys({"v": {"a": 1}}) == {"obj"}
    assert keys({"v": None}) == keys({"v": {"$eq": None}}) == {"null", "missing"}
    assert keys({"v": {"$ne": None}}) == every - {"null", "missing"}
    for value in (3, "abc", [1, 2], {"a": 1}, True, None):
        assert keys({"v": value}) | keys({"v": {"$ne": value}}) == every
        assert not keys({"v": value}) & keys({"v": {"$ne": value}})
    for op in ("$gt", "$gte", "$lt", "$lte"):
        with pytest.raises(InvalidInputError, match=rf"\{op}' does not apply to a null"):
            items.search(("t",), filter={"v": {op: None}})


def test_lists_and_objects_in_a_filter_match_whatever_their_key_order(items: ItemStore) -> None:
    """Two objects Python holds equal are one to a filter, nested in lists too, and a whole
    number is one number whether written 2 or 2.0."""
    items.put_many([(("o",), "k", {"meta": {"a": 2, "b": 1.0}, "l": [{"y": 1, "x": [2.0]}]}, None, None)])
    items.put_many([(("o",), "other", {"meta": {"a": 2}, "l": []}, None, None)])

    def keys(flt: dict[str, object]) -> set[str]:
        return {r.key for r in items.search(("o",), filter=flt, limit=50)}

    assert keys({"meta": {"b": 1, "a": 2.0}}) == {"k"}
    assert keys({"meta": {"$ne": {"b": 1, "a": 2}}}) == {"other"}
    assert keys({"l": [{"x": [2], "y": 1}]}) == {"k"}
    assert keys({"meta": {"a": 2, "b": 1.5}}) == set()
    assert keys({"meta": {"a": 2}}) == {"other"}


def test_best_field_score_ranks_and_offset_pages(items: ItemStore) -> None:
    items.put_many(
        [
            (("d",), "near", {}, {"title": [0.0, 1.0], "body": [1.0, 0.0]}, None),
            (("d",), "mid", {}, {"title": [0.6, 0.8]}, None),
            (("d",), "far", {}, {"title": [0.0, 1.0]}, None),
            (("d",), "plain", {}, None, None),
        ]
    )
    hits = items.search(("d",), query_vector=[1.0, 0.0], limit=10)
    assert [h.key for h in hits] == ["near", "mid", "far", "plain"]
    assert hits[0].score == pytest.approx(1.0) and hits[1].score == pytest.approx(0.6)
    assert hits[3].score is None
    assert [h.key for h in items.search(("d",), query_vector=[1.0, 0.0], limit=2, offset=1)] == ["mid", "far"]


def test_tail_pop_and_delete_are_real(items: ItemStore) -> None:
    items.put_many([(("s",), f"t{i}", {"i": i}, None, None) for i in range(6)])
    assert [r.value["i"] for r in items.tail(("s",), 2)] == [4, 5]
    popped = items.pop_last(("s",))
    assert popped is not None and popped.value == {"i": 5}
    assert [r.value["i"] for r in items.tail(("s",))] == [0, 1, 2, 3, 4]
    assert items.delete_many([(("s",), "t0")]) == 1
    assert items.delete_namespace(("s",)) == 4
    assert items.tail(("s",)) == [] and items.pop_last(("s",)) is None


def test_ttl_expiry_refresh_and_sweep(tmp_path: Path) -> None:
    clock = HandClock()
    store = ItemStore(tmp_path / "t.sqlite", clock=clock)
    store.put_many([(("t",), "short", {}, None, 1.0), (("t",), "kept", {}, None, None)])
    clock.now += 50
    assert store.get(("t",), "short", refresh_ttl=True) is not None  # now lives until +110 s
    clock.now += 50
    assert store.get(("t",), "short") is not None
    clock.now += 61
    assert store.get(("t",), "short") is None  # expired: never returned, even before a sweep
    assert [r.key for r in store.search(("t",))] == ["kept"]
    assert store.sweep() == 1 and store.count() == 1


def test_a_read_that_refreshes_the_lifetime_returns_the_new_expiry(tmp_path: Path) -> None:
    clock = HandClock()
    store = ItemStore(tmp_path / "t.sqlite", clock=clock)
    store.put_many(
        [(("t",), "a", {}, None, 1.0), (("t",), "b", {}, None, 1.0), (("t",), "c", {}, None, None)]
    )
    clock.now += 30
    got = store.get(("t",), "a", refresh_ttl=True)
    assert got is not None and got.expires_at == clock.now + 60
    found = {r.key: r.expires_at for r in store.search(("t",), refresh_ttl=True)}
    assert found == {"a": clock.now + 60, "b": clock.now + 60, "c": None}
    assert {r.key: r.expires_at for r in store.search(("t",))} == found  # as stored


def test_list_namespaces_prefix_suffix_depth(items: ItemStore) -> None:
    for ns in [("a", "b", "c"), ("a", "b", "d"), ("a", "x"), ("z", "b")]:
        items.put_many([(ns, "k", {}, None, None)])
    assert items.list_namespaces(prefix=("a",)) == [("a", "b", "c"), ("a", "b", "d"), ("a", "x")]
    assert items.list_namespaces(suffix=("b",)) == [("z", "b")]
    assert items.list_namespaces(prefix=("*", "b")) == [("a", "b", "c"), ("a", "b", "d"), ("z", "b")]
    assert items.list_namespaces(max_depth=1) == [("a",), ("z",)]
    assert items.list_namespaces(limit=1, offset=1) == [("a", "b", "d")]


def test_bad_input_is_named(items: ItemStore) -> None:
    with pytest.raises(InvalidInputError, match="namespace"):
        items.put_many([((), "k", {}, None, None)])
    with pytest.raises(InvalidInputError, match=r"^item value for key 'k' must be JSON-serialisable"):
        items.put_many([(("a",), "k", {"x": object()}, None, None)])
    with pytest.raises(InvalidInputError, match=r"NaN or infinity .* at value\['x'\]\[1\]$"):
        items.put_many([(("a",), "k", {"x": [1, float("nan")]}, None, None)])  # not stored as null
    with pytest.raises(InvalidInputError, match=r"64-bit range .* at value\['x'\]$"):
        items.put_many([(("a",), "k", {"x": 2**64 - 1}, None, None)])
    assert items.get(("a",), "k") is None
    with pytest.raises(InvalidInputError, match="ttl"):
        items.put_many([(("a",), "k", {}, None, -1)])
    with pytest.raises(InvalidInputError, match="limit"):
        items.tail(("a",), -1)


def test_search_sees_writes_of_another_connection(tmp_path: Path) -> None:
    """Vectors are mirrored in memory; a write through another connection must refresh them."""
    first, second = ItemStore(tmp_path / "shared.sqlite"), ItemStore(tmp_path / "shared.sqlite")
    first.put_many([(("s",), "a", {}, {"$": [1.0, 0.0]}, None)])
    assert [h.key for h in first.search(("s",), query_vector=[0.0, 1.0])] == ["a"]
    second.put_many([(("s",), "b", {}, {"$": [0.0, 1.0]}, None)])
    second.delete_many([(("s",), "a")])
    assert [h.key for h in first.search(("s",), query_vector=[0.0, 1.0])] == ["b"]
    assert first.search(("s",), query_vector=[0.0, 1.0], limit=0) == []
    with pytest.raises(InvalidInputError, match="dimensions"):
        first.search(("s",), query_vector=[1.0, 0.0, 0.0])
    first.close()
    second.close()


def test_labels_with_control_characters_are_not_confused_with_children(items: ItemStore) -> None:
    items.put_many(
        [(("a",), "k1", {}, None, None), (("a\n",), "k2", {}, None, None), (("a", "b"), "k3", {}, None, None)]
    )
    assert {r.key for r in items.search(("a",))} == {"k1", "k3"}
    assert [r.key for r in items.search(("a\n",))] == ["k2"]
    assert items.list_namespaces(prefix=("a",)) == [("a",), ("a", "b")]
    with pytest.raises(InvalidInputError, match="reserved"):
        items.put_many([(("a\x1fb",), "k", {}, None, None)])
    with pytest.raises(InvalidInputError, match="reserved"):  # substr() miscounts text with \x00
        items.put_many([(("team\x00x", "child"), "k", {}, None, None)])
    with pytest.raises(InvalidInputError, match=r"PutItem.namespace labels must be .* without \\x00"):
        PutItem(("team\x00x",), "k", {})


def test_list_namespaces_walk_agrees_with_a_brute_force_listing(tmp_path: Path) -> None:
    import random

    clock = HandClock()
    store = ItemStore(tmp_path / "walk.sqlite", clock=clock)
    rng = random.Random(7)
    labels = ["a", "b", "a\n", "ab", "*x"]
    live: set[tuple[str, ...]] = set()
    for i in range(300):
        ns = tuple(rng.choice(labels) for _ in range(rng.randint(1, 4)))
        expiring = rng.random() < 0.2
        store.put_many([(ns, f"k{i}", {}, None, 1.0 if expiring else None)])
        if not expiring:
            live.add(ns)
    clock.now += 120  # the expiring items are gone

    def brute(
        prefix: tuple[str, ...] | None, suffix: tuple[str, ...] | None, depth: int | None
    ) -> list[tuple[str, ...]]:
        def ok(ns: tuple[str, ...], pat: tuple[str, ...], end: bool) -> bool:
            part = ns[len(ns) - len(pat) :] if end else ns[: len(pat)]
            return len(pat) <= len(ns) and all(p in ("*", n) for p, n in zip(pat, part, strict=True))

        out = {
            ns[:depth] if depth else ns
            for ns in live
            if (not prefix or ok(ns, prefix, False)) and (not suffix or ok(ns, suffix, True))
        }
        return sorted(out)

    cases: list[dict[str, Any]] = [
        {},
        {"depth": 1},
        {"depth": 2},
        {"prefix": ("a",)},
        {"prefix": ("a",), "depth": 2},
        {"prefix": ("*", "b")},
        {"suffix": ("b",), "depth": 1},
        {"prefix": ("a\n",), "suffix": ("a",)},
    ]
    for case in cases:
        got = store.list_namespaces(
            prefix=case.get("prefix"), suffix=case.get("suffix"), max_depth=case.get("depth"), limit=10_000
        )
        assert got == brute(case.get("prefix"), case.get("suffix"), case.get("depth")), case
