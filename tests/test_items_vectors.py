"""Items with vectors computed by the caller, batched writes, and items in export/import."""

from __future__ import annotations

import datetime as dt
import itertools
import math
import sqlite3
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pytest

from memstrata import Config, MemorySystem
from memstrata.actors import ManualClock
from memstrata.errors import ConfigError, InvalidInputError, MemstrataError
from memstrata.layers._items import ItemStore
from memstrata.messages import DeleteItem, PutItem, SearchItems, WriteItems, decode, encode
from tests.fakes import FakeEmbedder

_T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def test_put_vectors_are_checked_by_name() -> None:
    with pytest.raises(InvalidInputError, match=r"PutItem.vectors\['t'\] must hold only finite numbers"):
        PutItem(("a",), "k", {}, vectors={"t": [1.0, math.nan]})
    with pytest.raises(InvalidInputError, match="same number of dimensions"):
        PutItem(("a",), "k", {}, vectors={"t": [1.0, 2.0], "u": [1.0]})
    with pytest.raises(InvalidInputError, match="cannot come with index"):
        PutItem(("a",), "k", {"t": "x"}, index=("t",), vectors={"t": [1.0]})
    with pytest.raises(InvalidInputError, match="must hold 1 to"):
        PutItem(("a",), "k", {}, vectors={"t": []})
    with pytest.raises(InvalidInputError, match="must hold only numbers"):
        PutItem(("a",), "k", {}, vectors={"t": ["1"]})
    with pytest.raises(
        InvalidInputError, match=r"PutItem.vectors\['t'\] must hold only finite numbers within float32"
    ):
        PutItem(("a",), "k", {}, vectors={"t": [1e308, 0.0]})  # finite in float64, inf once stored
    with pytest.raises(InvalidInputError, match="cannot come with query"):
        SearchItems(("a",), "q", query_vector=(1.0,))
    with pytest.raises(InvalidInputError, match="query_vector must hold only finite"):
        SearchItems(("a",), query_vector=(math.inf,))
    with pytest.raises(InvalidInputError, match=r"WriteItems.puts\[0\] must be a PutItem"):
        WriteItems((DeleteItem(("a",), "k"),))  # type: ignore[arg-type]


def test_write_items_survives_the_wire() -> None:
    message = WriteItems(
        (PutItem(("a", "b"), "k", {"n": 1}, None, 5.0, {"t": (0.5, 0.25)}),), (DeleteItem(("a",), "x"),)
    )
    again = decode(encode(message))
    assert again == message
    assert isinstance(again, WriteItems) and again.puts[0].vectors == {"t": (0.5, 0.25)}


def test_layer_keeps_one_dimension(tmp_path: Path) -> None:
    store = ItemStore(tmp_path / "i.sqlite")
    store.put_many([(("a",), "k", {}, {"t": [1.0, 0.0]}, None)])
    with pytest.raises(InvalidInputError, match=r"one dimension: got \[2, 3\] \(the store holds 2\)"):
        store.put_many([(("a",), "j", {}, {"t": [1.0, 0.0, 0.0]}, None)])
    with pytest.raises(InvalidInputError, match="not finite"):
        store.put_many([(("a",), "j", {}, {"t": [1.0, math.inf]}, None)])
    exported = {"namespace": ["a"], "key": "j", "value": {}, "created_at": 1.0, "updated_at": 1.0}
    with pytest.raises(
        InvalidInputError, match=r"item record 0 vector 't' is empty or not finite in float32"
    ):
        store.import_rows([exported | {"vectors": {"t": [1e308, 0.0]}}])  # inf once stored
    assert store.count() == 1
    store.close()


def test_pages_of_a_ranked_search_hold_every_item_once_when_scores_tie(tmp_path: Path) -> None:
    """Tied items come in one order whatever the page: the best score first, then the older item
    (the groups of tied items are stored in every order, so stored order is not ranked order)."""
    store = ItemStore(tmp_path / "i.sqlite")
    directions = {"deploy": [1.0, 0.0], "budget": [0.6, 0.8], "lunch": [0.0, 1.0]}  # best first
    for order in itertools.permutations(directions):
        namespace = ("docs", "-".join(order))
        store.put_many(
            [
                (namespace, f"{word}-{n}", {}, {"t": directions[word]}, None)
                for word in order
                for n in range(6)
            ]
        )
        whole = [r.key for r in store.search(namespace, query_vector=[1.0, 0.1], limit=100)]
        assert whole == [f"{word}-{n}" for word in directions for n in range(6)]
        for size in (1, 4, 5, 7):
            pages = [
                r.key
                for offset in range(0, len(whole), size)
                for r in store.search(namespace, query_vector=[1.0, 0.1], limit=size, offset=offset)
            ]
            assert pages == whole, (order, size)
    store.close()


def test_caller_vectors_batch_and_refresh_through_the_actor(tmp_path: Path) -> None:
    clock = ManualClock(_T0)
    with MemorySystem.start(Config(data_dir=tmp_path / "d"), embedder=FakeEmbedder(), clock=clock) as system:
        items = system.items
        puts = [
            PutItem(("docs",), "east", {"n": 1}, None, 10.0, {"t": (1.0, 0.0)}),
            PutItem(("docs",), "north", {"n": 2}, None, 10.0, {"t": (0.0, 1.0), "u": (0.6, 0.8)}),
            PutItem(("docs",), "plain", {"n": 3}),
        ]
        written = items.write(puts)
        assert (written.stored, written.deleted) == (3, 0)
        hits = items.search(("docs",), query_vector=(0.0, 1.0), limit=3)
        assert [(h.key, h.score) for h in hits][:2] == [("north", pytest.approx(1.0)), ("east", 0.0)]
        assert hits[2].key == "plain" and hits[2].score is None  # stored without vectors: unscored
        clock.advance(9 * 60)
        items.search(("docs",), query_vector=(1.0, 0.0), limit=1, refresh_ttl=True)  # east only
        clock.advance(2 * 60)
        assert items.get(("docs",), "east") is not None
        assert items.get(("docs",), "north") is None  # expired: its lifetime was not restarted
        again = items.write([PutItem(("docs",), "west", {"n": 4})], [(("docs",), "east"), (("docs",), "zz")])
        assert (again.stored, again.deleted) == (1, 1)
        with pytest.raises(InvalidInputError, match="one dimension"):
            items.put(("docs",), "bad", {}, vectors={"t": [1.0, 0.0, 0.0]})


def test_export_and_import_keep_items_with_times_expiry_and_vectors(tmp_path: Path) -> None:
    clock = ManualClock(_T0)
    start = MemorySystem.start
    with start(Config(data_dir=tmp_path / "a"), embedder=FakeEmbedder(), clock=clock) as system:
        system.items.put(("z", "deep"), "k2", {"text": "second"}, vectors={"t": [0.25, -0.5]})
        system.items.put(("a",), "k1", {"nested": {"x": [1, True, None]}}, ttl_minutes=30)
        lines = system.export(tmp_path / "out.jsonl")
    records = [orjson.loads(line) for line in (tmp_path / "out.jsonl").read_bytes().splitlines()]
    items = [r for r in records if r["kind"] == "item"]
    assert lines == len(records) and [r["key"] for r in items] == ["k1", "k2"]  # sorted by namespace
    assert items[0]["expires_at"] == _T0.timestamp() + 30 * 60 and items[0]["vectors"] is None
    assert items[1]["vectors"] == {"t": [0.25, -0.5]} and items[1]["created_at"] == _T0.timestamp()
    later = ManualClock(_T0 + dt.timedelta(minutes=10))
    with start(Config(data_dir=tmp_path / "b"), embedder=FakeEmbedder(), clock=later) as other:
        counts = other.import_(tmp_path / "out.jsonl")
        assert counts["item"] == 2
        got = other.items.get(("a",), "k1")
        assert got is not None and got.value == {"nested": {"x": [1, True, None]}}
        assert (got.created_at, got.expires_at) == (_T0.timestamp(), _T0.timestamp() + 30 * 60)
        assert [h.key for h in other.items.search((), query_vector=(0.25, -0.5), limit=1)] == ["k2"]
        other.export(tmp_path / "again.jsonl")
    assert (tmp_path / "again.jsonl").read_bytes() == (tmp_path / "out.jsonl").read_bytes()


def test_an_import_keeps_the_order_items_were_first_stored_in(tmp_path: Path) -> None:
    """tail and pop follow the order items were first stored in, which the key order of an
    export file is not: the export says it (seq), the import keeps it."""
    start = MemorySystem.start
    with start(Config(data_dir=tmp_path / "a"), embedder=FakeEmbedder(), clock=ManualClock(_T0)) as system:
        for key in ("turn-c", "turn-a", "turn-b"):
            system.items.put(("chat",), key, {"text": key})
        system.items.put(("chat",), "turn-c", {"text": "changed"})  # an update keeps its place
        system.export(tmp_path / "out.jsonl")
        before = [i.key for i in system.items.tail(("chat",))]
    with start(Config(data_dir=tmp_path / "b"), embedder=FakeEmbedder(), clock=ManualClock(_T0)) as other:
        other.import_(tmp_path / "out.jsonl")
        assert [i.key for i in other.items.tail(("chat",))] == before == ["turn-c", "turn-a", "turn-b"]
        popped = other.items.pop_last(("chat",))
        assert popped is not None and popped.key == "turn-b"


def test_an_export_without_items_has_no_item_lines_and_makes_no_item_file(tmp_path: Path) -> None:
    with MemorySystem.start(Config(data_dir=tmp_path / "d"), embedder=FakeEmbedder()) as system:
        system.agent("a1").remember("something happened")
        system.export(tmp_path / "out.jsonl")
    assert b'"kind":"item"' not in (tmp_path / "out.jsonl").read_bytes()
    assert not (tmp_path / "d" / "items.sqlite").exists()


def _exported_items(system: MemorySystem, path: Path) -> dict[str, dict[str, Any]]:
    system.export(path)
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return {r["key"]: r for r in records if r["kind"] == "item"}


def test_vectors_of_another_model_are_computed_again_and_the_callers_are_kept(tmp_path: Path) -> None:
    """Items embedded by the system's model, then another model, of the same length or not:
    the vectors the old model computed are computed again before the first search; the vectors
    a caller gave stay as given."""
    config = Config(data_dir=tmp_path / "d")
    with MemorySystem.start(config, embedder=FakeEmbedder(dim=64, model_id="m1")) as system:
        system.items.put(("docs",), "roof", {"text": "solar panels on the roof"}, index=["text"])
        system.items.put(("docs",), "cellar", {"text": "wine in the cellar", "n": 1}, index=["text", "n"])
        system.items.put(("docs",), "plain", {"text": "no vectors"})
    same_length = FakeEmbedder(dim=64, model_id="m2")
    with MemorySystem.start(config, embedder=same_length) as system:
        assert [i.key for i in system.items.search(("docs",), query="solar roof", limit=1)] == ["roof"]
        assert same_length.texts_embedded == 3  # roof's text, cellar's text and its number
        items = _exported_items(system, tmp_path / "m2.jsonl")
    assert {k: r["vectors_model"] for k, r in items.items()} == {"cellar": "m2", "plain": None, "roof": "m2"}
    shorter = FakeEmbedder(dim=32, model_id="m3")
    with MemorySystem.start(config, embedder=shorter) as system:
        system.items.put(("docs",), "mine", {"text": "solar"}, vectors={"t": [1.0] + [0.0] * 31})
        hits = system.items.search(("docs",), query="wine in the cellar", limit=1)
        assert [i.key for i in hits] == ["cellar"] and hits[0].score == pytest.approx(1.0)
        items = _exported_items(system, tmp_path / "m3.jsonl")
    lengths = {k: {f: len(v) for f, v in r["vectors"].items()} for k, r in items.items() if r["vectors"]}
    assert lengths == {"cellar": {"n": 32, "text": 32}, "mine": {"t": 32}, "roof": {"text": 32}}
    assert items["mine"]["vectors"] == {"t": [1.0] + [0.0] * 31} and items["mine"]["vectors_model"] is None


def test_vectors_given_with_items_of_another_length_than_the_new_model_are_named(tmp_path: Path) -> None:
    """A caller's vectors cannot be computed again: when the new model's length differs, text
    searches say so (a ConfigError, answered; the actor does not crash), and a query vector of
    the stored length still searches."""
    config = Config(data_dir=tmp_path / "d")
    with MemorySystem.start(config, embedder=FakeEmbedder(dim=64)) as system:
        system.items.put(("docs",), "roof", {"text": "solar panels on the roof"}, index=["text"])
        system.items.put(("docs",), "given", {}, vectors={"t": [1.0] + [0.0] * 63})
    with MemorySystem.start(
        Config(data_dir=tmp_path / "d"), embedder=FakeEmbedder(dim=32, model_id="m2")
    ) as system:
        for _ in range(2):  # answered each time, never counted as a crash
            with pytest.raises(ConfigError, match=r"given with the items \(64 numbers\).* gives 32"):
                system.items.search(("docs",), query="solar roof")
        assert system.status()["restarts"] == {}
        found = system.items.search(("docs",), query_vector=[1.0] + [0.0] * 63, limit=1)
        assert [item.key for item in found] == ["given"]


def test_an_import_computes_again_the_vectors_of_another_model(tmp_path: Path) -> None:
    with MemorySystem.start(Config(data_dir=tmp_path / "a"), embedder=FakeEmbedder(dim=64)) as system:
        system.items.put(("docs",), "roof", {"text": "solar panels on the roof"}, index=["text"])
        system.items.put(("docs",), "cellar", {"text": "wine in the cellar"}, index=["text"])
        system.export(tmp_path / "out.jsonl")
    with MemorySystem.start(
        Config(data_dir=tmp_path / "b"), embedder=FakeEmbedder(dim=32, model_id="m2")
    ) as other:
        assert other.import_(tmp_path / "out.jsonl")["item"] == 2
        assert [i.key for i in other.items.search(("docs",), query="wine cellar", limit=1)] == ["cellar"]
        items = _exported_items(other, tmp_path / "again.jsonl")
    assert {k: (len(r["vectors"]["text"]), r["vectors_model"]) for k, r in items.items()} == {
        "cellar": (32, "m2"),
        "roof": (32, "m2"),
    }


def test_an_import_computes_again_the_vectors_of_a_model_of_the_same_name_at_another_length(
    tmp_path: Path,
) -> None:
    with MemorySystem.start(Config(data_dir=tmp_path / "a"), embedder=FakeEmbedder(dim=64)) as system:
        system.items.put(("docs",), "cellar", {"text": "wine in the cellar"}, index=["text"])
        system.export(tmp_path / "out.jsonl")
    with MemorySystem.start(Config(data_dir=tmp_path / "b"), embedder=FakeEmbedder(dim=32)) as other:
        assert FakeEmbedder(dim=32).model_id == FakeEmbedder(dim=64).model_id
        assert other.import_(tmp_path / "out.jsonl")["item"] == 1
        assert [i.key for i in other.items.search(("docs",), query="wine cellar", limit=1)] == ["cellar"]
        items = _exported_items(other, tmp_path / "again.jsonl")
    assert {k: len(r["vectors"]["text"]) for k, r in items.items()} == {"cellar": 32}


def test_a_store_made_before_vectors_named_their_model_opens_with_its_vectors_the_callers(
    tmp_path: Path,
) -> None:
    path = tmp_path / "items.sqlite"
    with sqlite3.connect(path) as old:  # the schema of stores made before the migrations
        old.executescript(
            "CREATE TABLE items (id INTEGER PRIMARY KEY, ns TEXT NOT NULL, key TEXT NOT NULL,"
            " value TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL, expires_at REAL,"
            " ttl_minutes REAL, UNIQUE (ns, key));"
            "CREATE TABLE item_vectors (item_id INTEGER NOT NULL REFERENCES items (id) ON DELETE CASCADE,"
            " field TEXT NOT NULL, vec BLOB NOT NULL, PRIMARY KEY (item_id, field));"
            "INSERT INTO items VALUES (1, 'docs', 'k', '{\"t\": \"x\"}', 1.0, 1.0, NULL, NULL);"
        )
        old.execute("INSERT INTO item_vectors VALUES (1, 't', ?)", (struct.pack("2f", 1.0, 0.0),))
    old.close()
    store = ItemStore(path)
    assert store.stale_items("any", 2) == []  # the caller's, as far as anyone can tell
    store.put_many([(("docs",), "j", {"t": "y"}, {"t": [0.0, 1.0]}, None, "m1")])
    assert store.stale_items("m2", 2) == [(2, {"t": "y"}, ["t"])]
    store.replace_vectors([(2, "t", [0.6, 0.8])], "m2")
    assert store.stale_items("m2", 2) == []
    assert [r.key for r in store.search(("docs",), query_vector=[0.6, 0.8])] == ["j", "k"]
    with pytest.raises(ConfigError, match=r"differ in length \(\[2, 3\]\): nothing was changed"):
        store.replace_vectors([(2, "t", [1.0, 0.0, 0.0])], "m2")
    kept = {r["key"]: (r["vectors"], r["vectors_model"]) for r in store.export_rows()}
    assert kept == {
        "j": ({"t": [pytest.approx(0.6), pytest.approx(0.8)]}, "m2"),
        "k": ({"t": [1.0, 0.0]}, None),
    }
    store.close()


class _FailsAfter(FakeEmbedder):
    """A model whose document calls fail with "model crashed" once ``good_calls`` have run."""

    def __init__(self, good_calls: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.good_calls = good_calls

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if self.calls >= self.good_calls:
            raise RuntimeError("model crashed")
        return super().embed_documents(texts)


def test_a_model_failing_midway_leaves_every_vector_as_it_was(tmp_path: Path) -> None:
    """The vectors of 300 items are computed again in two embedding requests; the second fails:
    nothing is stored (the store never holds two lengths), and the next search tries again."""
    config = Config(data_dir=tmp_path / "d")
    with MemorySystem.start(config, embedder=FakeEmbedder(dim=16, model_id="m1")) as system:
        system.items.write(
            [PutItem(("ns",), f"k{i:03}", {"text": f"apple {i}"}, ("text",)) for i in range(300)]
        )
    flaky = _FailsAfter(1, dim=8, model_id="m2")
    with MemorySystem.start(config, embedder=flaky) as system:
        with pytest.raises(MemstrataError, match="model crashed"):
            system.items.search(("ns",), query="apple 3")
        items = _exported_items(system, tmp_path / "after-failure.jsonl")
        assert {(len(r["vectors"]["text"]), r["vectors_model"]) for r in items.values()} == {(16, "m1")}
        assert len(system.items.search(("ns",), query_vector=[1.0] * 16, limit=3)) == 3
        flaky.good_calls = 10**9  # the model is back
        assert system.items.search(("ns",), query="apple 3", limit=1)[0].key == "k003"
        items = _exported_items(system, tmp_path / "after-recovery.jsonl")
    assert {(len(r["vectors"]["text"]), r["vectors_model"]) for r in items.values()} == {(8, "m2")}


def test_a_field_path_holding_the_separator_and_a_model_of_the_same_name_but_another_length(
    tmp_path: Path,
) -> None:
    config = Config(data_dir=tmp_path / "d")
    with MemorySystem.start(config, embedder=FakeEmbedder(dim=16, model_id="m1")) as system:
        system.items.put(("ns",), "odd", {"a\x1fb": "solar roof", "c": "wine"}, index=["a\x1fb", "c"])
    with MemorySystem.start(config, embedder=FakeEmbedder(dim=8, model_id="m1")) as system:  # same name
        hits = system.items.search(("ns",), query="solar roof", limit=1)
        assert [h.key for h in hits] == ["odd"] and hits[0].score == pytest.approx(1.0)
        items = _exported_items(system, tmp_path / "out.jsonl")
    assert {f: len(v) for f, v in items["odd"]["vectors"].items()} == {"a\x1fb": 8, "c": 8}
