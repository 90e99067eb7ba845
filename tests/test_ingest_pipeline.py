"""Bulk ingest pipeline: batch k+1 is prepared (hashes, indexed texts, normalised vectors) on a
worker thread while batch k is written, and the shortcut of the item checks. Order, results and
errors must be those of writing one batch after another on one thread."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import memstrata.layers._knowledge_bulk as bulk
import memstrata.layers._knowledge_rows as row_sql
import memstrata.layers._knowledge_schema as schema
import memstrata.layers._knowledge_writes as writes
from memstrata import Config
from memstrata.errors import InvalidInputError, StorageError
from memstrata.layers import KnowledgeStore
from tests._support import check_knowledge
from tests.fakes import FakeEmbedder

DIM = 32
WORKER = "memstrata-ingest"


def _vectors(n: int, seed: int = 5) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32) * 2


def _mixed_items() -> list[dict[str, Any]]:
    """Duplicates within a batch and across batches, tags merged into a new row, CJK text,
    identifiers, several categories and scopes, authors."""
    items: list[dict[str, Any]] = []
    for i in range(23):
        items.append(
            {
                "content": f"entry {i} calls parseHttpRequest{i % 3}",
                "category": ("pattern", "pitfall", "outcome")[i % 3],
                "scope": "/" if i % 4 else "/team/a",
            }
        )
    items += [
        {
            "content": "entry 2 calls parseHttpRequest2",
            "category": "outcome",
            "scope": "/",
            "tags": {"x": "1"},
        },
        {"content": "支付系统的重试策略 with retries", "tags": {"lang": "go"}, "author": "ann"},
        {"content": "支付系统的重试策略 with retries", "tags": {"area": "payments"}},  # merged: same batch
        {"content": "entry 0 calls parseHttpRequest0", "category": "pattern", "scope": "/team/a"},
        {"content": "tags only later", "tags": ["alpha"]},
        {"content": "tags only later", "tags": {"beta": "b"}, "author": "bob"},
    ]
    return items


def _snapshot(store: KnowledgeStore) -> list[tuple[Any, ...]]:
    rows = store._db.query(
        "SELECT id, content, category, scope, author, content_hash, tag_text, ident, cjk, vector_pending "
        "FROM knowledge ORDER BY id"
    )
    tags = store._db.query("SELECT entry_id, key, value FROM knowledge_tags ORDER BY entry_id, key")
    return [*(tuple(r) for r in rows), *(tuple(t) for t in tags)]


def test_batches_prepared_ahead_give_what_one_batch_gives(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = _mixed_items()
    vectors = _vectors(len(items))
    with KnowledgeStore.open(data_dir / "one.sqlite", FakeEmbedder(dim=DIM)) as store:
        one_ids = store.add_many(items, vectors=vectors)
        one = _snapshot(store)
        assert store._vectors is not None
        one_vectors = [store._vectors.get(i) for i in sorted(set(one_ids))]
    threads: set[str] = set()
    original = schema._Item.prepare

    def prepare(self: schema._Item) -> None:
        threads.add(threading.current_thread().name)
        original(self)

    monkeypatch.setattr(schema._Item, "prepare", prepare)
    monkeypatch.setattr(writes, "BULK_BATCH", 4)
    with KnowledgeStore.open(data_dir / "many.sqlite", FakeEmbedder(dim=DIM)) as store:
        ids = store.add_many(items, vectors=vectors)
        assert ids == one_ids  # ids in input order, duplicates on their first entry
        assert _snapshot(store) == one
        assert store._vectors is not None
        got = [store._vectors.get(i) for i in sorted(set(ids))]
        assert all(v is not None for v in got + one_vectors)
        np.testing.assert_array_equal(np.stack(got), np.stack(one_vectors))  # type: ignore[arg-type]
        merged = store.get(ids[24])
        assert merged is not None and merged.tags == {"lang": "go", "area": "payments"}
        hits = store.search("payments", mode="keyword")  # the merged tags are indexed
        assert [h.entry.id for h in hits] == [ids[24]]
        report = check_knowledge(store._db, store._vectors, full=True)
        assert report.problems == []
    assert any(name.startswith(WORKER) for name in threads)  # the later batches were prepared ahead
    assert threading.current_thread().name in threads  # the first one on the writer's thread
    assert not [t for t in threading.enumerate() if t.name.startswith(WORKER)]


def test_an_error_while_preparing_ahead_is_raised_before_its_batch_is_written(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writes, "BULK_BATCH", 4)
    items = [{"content": f"row {i} fooBar"} for i in range(12)]
    raised_on: list[str] = []
    original = schema.identifier_words

    def words(text: str) -> str:
        if text == "row 6 fooBar":  # in the second batch, prepared on the worker
            raised_on.append(threading.current_thread().name)
            raise MemoryError("no memory for row 6 (injected)")
        return original(text)

    monkeypatch.setattr(schema, "identifier_words", words)
    with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(dim=DIM)) as store:
        with pytest.raises(MemoryError, match=r"^no memory for row 6 \(injected\)$"):
            store.add_many(items, vectors=_vectors(12))
        assert raised_on and raised_on[0].startswith(WORKER)
        # the first batch was committed before; nothing of the second (nor later) was written
        assert [e.content for e in store.list(order_by="id", descending=False)] == [
            f"row {i} fooBar" for i in range(4)
        ]
        assert store._db.scalar("SELECT count(*) FROM knowledge_fts_docsize") == 4
        assert store._vectors is not None and store._vectors.count() == 4
        assert check_knowledge(store._db, store._vectors, full=True).problems == []
        assert not [t for t in threading.enumerate() if t.name.startswith(WORKER)]
        monkeypatch.undo()
        assert len(set(store.add_many(items, vectors=_vectors(12)))) == 12  # the rest can follow


def test_an_error_while_writing_stops_the_worker_and_keeps_earlier_batches(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writes, "BULK_BATCH", 3)
    with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(dim=DIM)) as store:
        original = store._add_batch
        calls: list[int] = []

        def add_batch(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            if len(calls) == 2:
                raise InvalidInputError("second batch refused (injected)")
            return original(*args, **kwargs)

        monkeypatch.setattr(store, "_add_batch", add_batch)
        with pytest.raises(InvalidInputError, match="second batch refused"):
            store.add_many([{"content": f"item {i}"} for i in range(9)], vectors=_vectors(9))
        assert store.count() == 3
        assert not [t for t in threading.enumerate() if t.name.startswith(WORKER)]


def test_one_batch_uses_no_thread(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []
    original = bulk.ThreadPoolExecutor

    def pool(*args: Any, **kwargs: Any) -> Any:
        started.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(bulk, "ThreadPoolExecutor", pool)
    with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(dim=DIM)) as store:
        store.add("a single entry")
        store.add_many([{"content": f"few {i}"} for i in range(5)], vectors=_vectors(5))
        assert started == []
        monkeypatch.setattr(writes, "BULK_BATCH", 2)
        store.add_many([{"content": f"more {i}"} for i in range(5)], vectors=_vectors(5))
        assert started == [1]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"content": "x", "category": ["pattern"]}, r"items\[1\]\.category"),
        ({"content": "x", "scope": {"/": 1}}, r"items\[1\]\.scope"),
        ({"content": "   \t "}, r"items\[1\]\.content must not be empty"),
        ({"content": ""}, r"items\[1\]\.content must not be empty"),
        ({"content": "y" * 101}, r"items\[1\]\.content is 101 bytes of UTF-8, over the limit of 100 bytes"),
        ({"content": "é" * 60}, r"items\[1\]\.content is 120 bytes of UTF-8, over the limit of 100"),
        ({"content": 5}, r"items\[1\]\.content must be a str"),
        ({"text": "x"}, r"items\[1\] has unknown key\(s\) \['text'\]"),
        ({"category": "pattern"}, r"items\[1\] has no 'content'"),
        ({"content": "x", "category": "Not Valid"}, r"items\[1\]\.category is not valid"),
        ({"content": "x", "tags": "notatag list"}, r"items\[1\]\.tags"),
        ({"content": "x", "author": 7}, r"items\[1\]\.author"),
        ("not a mapping", r"items\[1\] must be a mapping, got str"),
    ],
)
def test_every_item_is_checked_first_and_named_after_a_valid_one(
    data_dir: Path, bad: Any, message: str
) -> None:
    config = Config(data_dir=data_dir, max_content_bytes=100)
    with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(dim=DIM), config=config) as store:
        with pytest.raises(InvalidInputError, match=message):
            store.add_many([{"content": "valid first", "category": "pattern", "scope": "/"}, bad])
        assert store.count() == 0


def test_the_check_shortcut_stores_what_the_full_check_stores(data_dir: Path) -> None:
    """Items the shortcut takes (plain dicts of ASCII text) and the same items as another mapping
    type (the full check) give the same rows; a scope the check normalises is kept normalised."""

    class Item(dict[str, Any]):
        pass

    items: list[dict[str, Any]] = [
        {"content": "plain ascii text"},
        {"content": "in a scope", "scope": "/team/a", "category": "pitfall"},
        {"content": "again in the scope", "scope": "/team/a", "category": "pitfall"},
        {"content": "  padded  ", "category": None, "scope": None},
        {"content": "Unicode ü text"},
    ]
    with (
        KnowledgeStore.open(data_dir / "a.sqlite", FakeEmbedder(dim=DIM)) as fast,
        KnowledgeStore.open(data_dir / "b.sqlite", FakeEmbedder(dim=DIM)) as full,
    ):
        fast.add_many(items, vectors=_vectors(len(items)))
        full.add_many([Item(i) for i in items], vectors=_vectors(len(items)))
        assert _snapshot(fast) == _snapshot(full)


@pytest.mark.parametrize(
    ("values", "literal"),
    [
        ([None, None], "NULL"),
        ([0, 0, 0], "0"),
        (["/team/a-b_c.d", "/team/a-b_c.d"], "'/team/a-b_c.d'"),
        ([""], "''"),
        (["a", "b"], None),
        (["it's", "it's"], None),  # a quote is never written into the statement
        (["Zoë"], None),
        (["two\nlines"], None),
        ([True, True], None),
        ([1.5, 1.5], None),
        ([None, ""], None),
    ],
)
def test_only_safe_shared_values_are_written_into_the_statement(
    values: list[Any], literal: str | None
) -> None:
    assert row_sql._literal(values) == literal


def test_values_a_batch_shares_are_stored_as_given(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writes, "BULK_BATCH", 3)
    shared: list[dict[str, Any]] = [
        {"content": f"shared {i}", "category": "pitfall", "scope": "/team/a-b_c.d", "author": "O'Brien"}
        for i in range(3)
    ]
    varied: list[dict[str, Any]] = [
        {"content": "one", "scope": "/team/x", "tags": {"k": "it's"}, "author": "Zoë"},
        {"content": "two 重试策略", "category": "outcome", "tags": {"k": "it's"}},
        {"content": "three"},
    ]
    with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(dim=DIM)) as store:
        store.clock = lambda: 1234.5
        ids = store.add_many(shared + varied, vectors=_vectors(6))
        rows = store._db.query(
            "SELECT id, category, scope, author, tag_text, cjk, created_at, updated_at, vector_pending "
            "FROM knowledge ORDER BY id"
        )
        assert [tuple(r) for r in rows] == [
            (ids[0], "pitfall", "/team/a-b_c.d", "O'Brien", "", "", 1234.5, 1234.5, 0),
            (ids[1], "pitfall", "/team/a-b_c.d", "O'Brien", "", "", 1234.5, 1234.5, 0),
            (ids[2], "pitfall", "/team/a-b_c.d", "O'Brien", "", "", 1234.5, 1234.5, 0),
            (ids[3], "pattern", "/team/x", "Zoë", "k it's", "", 1234.5, 1234.5, 0),
            (ids[4], "outcome", "/", None, "k it's", "重试策略", 1234.5, 1234.5, 0),
            (ids[5], "pattern", "/", None, "", "", 1234.5, 1234.5, 0),
        ]
        assert check_knowledge(store._db, store._vectors, full=True).problems == []


def test_the_cycle_collector_is_paused_during_a_bulk_load_only(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc

    seen: list[bool] = []
    original = schema._Item.prepare

    def prepare(self: schema._Item) -> None:
        seen.append(gc.isenabled())
        original(self)

    monkeypatch.setattr(schema._Item, "prepare", prepare)
    assert gc.isenabled()
    with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(dim=DIM)) as store:
        store.add_many([{"content": f"a {i}"} for i in range(3)], vectors=_vectors(3))
        assert seen == [False] * 3 and gc.isenabled()
        with pytest.raises(InvalidInputError):
            store.add_many([{"content": "b"}, {"content": ""}], vectors=_vectors(2))
        assert gc.isenabled()  # given back after an error too
        seen.clear()
        store.add_many([{"content": "c"}])  # the model embeds: not paused
        assert seen == [True]
        gc.disable()
        try:
            store.add_many([{"content": "d"}], vectors=_vectors(1))
            assert not gc.isenabled()  # a collector paused by the application stays paused
        finally:
            gc.enable()


@pytest.mark.parametrize("now", [1234.5, 1732470000.123456, 0.1, 0.0, 1e-300, 1e300, 2.0**70])
def test_times_are_stored_exactly_written_or_bound(data_dir: Path, now: float) -> None:
    expression = row_sql._exact_real(now)
    assert expression is None or expression.startswith("(CAST(")
    with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(dim=DIM)) as store:
        store.clock = lambda: now
        if expression is not None:
            assert store._db.scalar(f"SELECT {expression}") == now
        ids = store.add_many([{"content": "a"}, {"content": "b"}], vectors=_vectors(2))
        rows = store._db.query("SELECT created_at, updated_at FROM knowledge ORDER BY id")
        assert [tuple(r) for r in rows] == [(now, now), (now, now)] and len(ids) == 2


def test_rows_numbered_otherwise_than_expected_are_refused(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(dim=DIM)) as store:
        store.add_many([{"content": "first"}], vectors=_vectors(1))
        monkeypatch.setattr(store, "_next_id", lambda: 7)  # SQLite gives 2
        with pytest.raises(StorageError, match=r"numbered up to 2, not 7"):
            store.add_many([{"content": "second"}], vectors=_vectors(1))
        monkeypatch.undo()
        assert store.count() == 1 and _fts_count(store) == 1
        assert store._vectors is not None and store._vectors.count() == 1


def _fts_count(store: KnowledgeStore) -> int:
    return int(store._db.scalar("SELECT count(*) FROM knowledge_fts_docsize"))
