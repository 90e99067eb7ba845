"""An agent's knowledge hits and the shared store's, ranked as one store would rank them."""

from __future__ import annotations

from pathlib import Path

import pytest

from memstrata import Config, MemorySystem
from memstrata.layers import KnowledgeEntry, KnowledgeHit, merge_hits
from tests.fakes import FakeEmbedder


def hit(
    content: str,
    score: float,
    vector_rank: int | None,
    keyword_rank: int | None,
    similarity: float | None,
    *,
    entry_id: int = 1,
    scope: str = "/",
    category: str = "pitfall",
) -> KnowledgeHit:
    entry = KnowledgeEntry(entry_id, content, category, {}, scope, None, 0.0, 0.0)
    kind = "hybrid" if vector_rank and keyword_rank else "semantic" if vector_rank else "keyword"
    return KnowledgeHit(entry, score, kind, vector_rank, keyword_rank, similarity)


def test_a_shared_hit_first_only_in_its_small_store_does_not_tie_the_agents_best() -> None:
    """The shared store's only entry is first of its vector list (1.0 there) though far from the
    query; merged, the agent's hits that match by words and by meaning rank above it."""
    own = [
        hit("a", 1.0, 1, 1, 0.9, entry_id=1),
        hit("b", 0.86, 2, 2, 0.8, entry_id=2),
        hit("c", 0.75, None, 3, 0.7, entry_id=3),
    ]
    far = hit("far", 1.0, 1, None, 0.05, entry_id=1)
    merged = merge_hits(own, [far], 10)
    assert [h.entry.content for h in merged] == ["a", "b", "c", "far"]
    assert merged[0].score == pytest.approx(1.0) and merged[-1].score < merged[-2].score
    assert (merged[-1].vector_rank, merged[-1].keyword_rank) == (3, None)  # ranks of the merged lists
    assert merged[-1].similarity == 0.05 and merged[-1].entry is far.entry


def test_keyword_ranks_take_turns_and_similarities_order_the_vector_list() -> None:
    own = [hit("own-1", 1.0, 1, 1, 0.6, entry_id=1), hit("own-2", 0.5, None, 2, 0.2, entry_id=2)]
    shared = [hit("shared-1", 1.0, 1, 1, 0.7, entry_id=1)]
    merged = merge_hits(own, shared, 10)
    ranks = {h.entry.content: (h.vector_rank, h.keyword_rank) for h in merged}
    assert ranks == {"shared-1": (1, 2), "own-1": (2, 1), "own-2": (None, 3)}
    assert len(merge_hits(own, shared, 2)) == 2


def test_with_models_of_their_own_the_vector_ranks_take_turns_too() -> None:
    own = [hit("own-1", 1.0, 1, None, 0.2, entry_id=1), hit("own-2", 0.5, 2, None, 0.1, entry_id=2)]
    shared = [hit("shared-1", 1.0, 1, None, 0.9, entry_id=1)]
    merged = merge_hits(own, shared, 10, one_model=False)
    assert [h.entry.content for h in merged] == ["own-1", "shared-1", "own-2"]
    assert merge_hits(own, shared, 10)[0].entry.content == "shared-1"  # one model: by similarity


def test_a_shared_copy_of_an_own_entry_is_left_out_and_own_entries_all_stay() -> None:
    own = [
        hit("run migrations", 1.0, 1, 1, 0.9, entry_id=1, scope="/"),
        hit("run migrations", 0.9, 2, 2, 0.9, entry_id=2, scope="/svc"),
    ]
    shared = [
        hit("run migrations", 1.0, 1, 1, 0.9, entry_id=7, scope="/svc"),  # the same entry: left out
        hit("run migrations", 0.9, 2, 2, 0.9, entry_id=8, scope="/svc/api"),  # another scope: kept
        hit("run migrations", 0.8, 3, 3, 0.9, entry_id=9, scope="/", category="pattern"),  # kept
    ]
    merged = merge_hits(own, shared, 10)
    assert sorted((h.entry.id, h.entry.scope, h.entry.category) for h in merged) == [
        (1, "/", "pitfall"),
        (2, "/svc", "pitfall"),
        (8, "/svc/api", "pitfall"),
        (9, "/", "pattern"),
    ]


@pytest.mark.parametrize("top_k", [1, 3])
def test_without_shared_hits_the_agents_hits_stand_as_they_are(top_k: int) -> None:
    own = [hit(f"e{i}", 1 - i / 10, i + 1, None, 0.5, entry_id=i) for i in range(5)]
    assert merge_hits(own, [], top_k) == own[:top_k]
    same = [hit(f"e{i}", 1 - i / 10, i + 1, None, 0.5, entry_id=i + 10) for i in range(5)]
    assert merge_hits(own, same, top_k) == own[:top_k]  # every shared hit is a copy


def test_query_knowledge_ranks_an_unrelated_shared_entry_below_the_agents_matches(tmp_path: Path) -> None:
    with MemorySystem.start(Config(data_dir=tmp_path), embedder=FakeEmbedder()) as system:
        agent = system.agent("arch")
        agent.store_knowledge("payment gateway retries need idempotency keys", category="pitfall")
        agent.store_knowledge("payment gateway timeouts during checkout retries", category="pitfall")
        agent.store_knowledge(
            "retries of payment calls must use backoff and gateway limits", category="pattern"
        )
        agent.store_knowledge(
            "Bake sourdough at 240 degrees for forty minutes", shared=True, category="preference"
        )
        hits = agent.query_knowledge("gateway retries for checkout", top_k=4)
        assert [h.entry.store for h in hits] == ["arch", "arch", "arch", "shared"]
        assert hits[-1].score < min(h.score for h in hits[:-1])
        prompt = agent.begin_task("t1", "fix the checkout", query="gateway retries for checkout", top_k=3)
        assert [h.entry.store for h in prompt.hits] == ["arch"] * 3 and "sourdough" not in prompt.text
        ids = [
            agent.store_knowledge("Run the migrations before deploying", category="pitfall", scope=scope)
            for scope in ("/", "/svc", "/svc/api")
        ]
        found = agent.query_knowledge("migrations deploying", scope="/svc/api", top_k=10, mode="keyword")
        assert sorted(h.entry.id for h in found) == sorted(ids)  # all three scopes, shared store or not
