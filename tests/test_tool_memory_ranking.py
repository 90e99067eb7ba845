"""memory_search ranks indexed files and saved memories as one index would: each source's
scores are normalised to its own search, so they are fused again, never compared."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from memstrata import Config, MemorySystem
from memstrata import _workspace_search as merging
from memstrata._workspaces import Workspaces
from memstrata.bridges import tools
from memstrata.core.config import SearchConfig
from tests._support import write_tree
from tests.fakes import FakeEmbedder

QUERY = "where is the deploy key"


@pytest.fixture
def env(system_and_files: tuple[MemorySystem, Workspaces]) -> tuple[MemorySystem, Workspaces]:
    return system_and_files


def call(env: tuple[MemorySystem, Workspaces], name: str, arguments: Any) -> Any:
    system, registry = env
    return tools.dispatch(name, arguments, system, agent_id="a1", workspaces=registry)


def _notes(base: Path) -> Path:
    return write_tree(
        base / "ws",
        {
            "MEMORY.md": "# Ops\n\nThe deploy key lives in the vault under ci deploy.\n",
            "memory/deploy.md": "# Deploy\n\nThe deploy key rotates monthly.\n",
        },
    )


def test_an_unrelated_file_does_not_push_out_the_saved_memory_that_answers(env: Any, tmp_path: Path) -> None:
    """A codebase's nearest chunk scores 1.0 in its own search however far it is from the query."""
    _, registry = env
    unrelated = write_tree(tmp_path / "src", {"linalg.py": "def matrix_multiply(a, b):\n    return a @ b\n"})
    registry.index(unrelated, kind="code")
    saved = call(env, "memory_add", {"content": "The deploy key lives in the vault under ci deploy."})
    [best] = call(env, "memory_search", {"query": QUERY, "maxResults": 1})["hits"]
    assert best["path"] == saved["path"]
    both = call(env, "memory_search", {"query": QUERY, "maxResults": 2})["hits"]
    assert [h["path"] for h in both] == [saved["path"], str(unrelated.resolve() / "linalg.py")]
    assert both[1]["score"] < both[0]["score"]


def test_an_unrelated_saved_memory_does_not_push_out_the_files_that_answer(env: Any, tmp_path: Path) -> None:
    """The one saved memory found scores 1.0 in its own search however far it is from the query."""
    _, registry = env
    notes = _notes(tmp_path)
    registry.index(notes)
    unrelated = call(env, "memory_add", {"content": "Buy oat milk and bread on the way home"})
    found = call(env, "memory_search", {"query": QUERY, "maxResults": 2, "minScore": 0})["hits"]
    assert {h["path"] for h in found} == {
        str(notes.resolve() / "MEMORY.md"),
        str(notes.resolve() / "memory/deploy.md"),
    }
    every = call(env, "memory_search", {"query": QUERY, "maxResults": 3, "minScore": 0})["hits"]
    assert every[-1]["path"] == unrelated["path"] and every[-1]["score"] < every[1]["score"]
    assert every == sorted(every, key=lambda h: -h["score"])


def test_saved_memories_alone_keep_their_own_ranking_and_scores(env: Any) -> None:
    for content in ("The deploy key lives in the vault", "deploy on Tuesdays", "Buy oat milk"):
        call(env, "memory_add", {"content": content})
    found = call(env, "memory_search", {"query": QUERY, "maxResults": 5, "minScore": 0})["hits"]
    system, _ = env
    own = system.agent("a1").query_knowledge(
        QUERY, category="memory", top_k=5, min_score=0, include_shared=False
    )
    assert [(h["path"], h["score"]) for h in found] == [
        (f"memory://{h.entry.id}", round(h.score, 4)) for h in own
    ]


def test_a_tag_filter_still_leaves_files_out(env: Any, tmp_path: Path) -> None:
    _, registry = env
    registry.index(_notes(tmp_path))
    saved = call(env, "memory_add", {"content": "The deploy key is in the vault", "tags": ["area=ops"]})
    found = call(env, "memory_search", {"query": QUERY, "tags": ["area=ops"], "maxResults": 5})["hits"]
    assert [h["path"] for h in found] == [saved["path"]]


class _Synonyms(FakeEmbedder):
    """ "automobile" means "car": matches by meaning alone, no keyword list."""

    def _vector(self, text: str) -> Any:
        return super()._vector(text.lower().replace("automobile", "car"))


def test_an_agent_with_a_model_of_its_own_takes_turns_with_the_files(data_dir: Path, tmp_path: Path) -> None:
    """Agent b's saved memories embed with another model (the same vectors under another id):
    similarities of two models do not compare, so the files and the memories take turns."""
    shared = _Synonyms()
    config = Config.from_mapping(
        {"data_dir": str(data_dir), "agents": {"b": {"embedding": {"model": "other", "dim": 64}}}}
    )
    with (
        MemorySystem.start(
            config, embedder=shared, model_loader=lambda _: _Synonyms(model_id="other")
        ) as system,
        Workspaces(data_dir, config=system.config, embedder=shared) as registry,
    ):
        notes = write_tree(
            tmp_path / "ws",
            {"MEMORY.md": "car parked outside\n", "memory/x.md": "the car is red and fast and new\n"},
        )
        registry.index(notes)
        order = {}
        for agent_id in ("a", "b"):
            for content in ("car", "car wash tickets expire soon"):
                tools.dispatch(
                    "memory_add", {"content": content}, system, agent_id=agent_id, workspaces=registry
                )
            args = {"query": "automobile", "minScore": 0, "maxResults": 10}
            found = tools.dispatch("memory_search", args, system, agent_id=agent_id, workspaces=registry)[
                "hits"
            ]
            assert [h["score"] for h in found] == sorted({h["score"] for h in found}, reverse=True)
            order[agent_id] = [Path(h["path"]).name for h in found]
        assert order["a"] == ["1", "MEMORY.md", "2", "x.md"]  # one model: by similarity
        assert order["b"] == ["MEMORY.md", "1", "x.md", "2"]  # two: in turns, files first


# -- the fusion itself -----------------------------------------------------------------------------


def _hit(name: str, match_type: str, similarity: float | None, **ranks: int) -> Any:
    return SimpleNamespace(name=name, match_type=match_type, similarity=similarity, score=1.0, **ranks)


def _names(pool: list[Any], *, one_model: bool = True, limit: int = 10) -> list[str]:
    fused = merging.fuse_hits(pool, limit, query="deploy key", search=SearchConfig(), one_model=one_model)
    return [ranked.hit.name for ranked, _ in fused]


def test_the_vector_list_is_by_similarity_and_the_keyword_list_takes_turns() -> None:
    files = merging.ranked_hits([_hit("f1", "semantic", 0.2), _hit("f2", "semantic", 0.1)], 0)
    saved = merging.ranked_hits([_hit("m1", "semantic", 0.9), _hit("m2", "semantic", 0.15)], 1)
    assert _names([*files, *saved]) == ["m1", "f1", "m2", "f2"]
    keyword_files = merging.ranked_hits([_hit("f1", "keyword", None), _hit("f2", "keyword", None)], 0)
    keyword_saved = merging.ranked_hits([_hit("m1", "keyword", None), _hit("m2", "keyword", None)], 1)
    assert _names([*keyword_files, *keyword_saved]) == ["f1", "m1", "f2", "m2"]


def test_two_models_take_turns_in_the_vector_list_too() -> None:
    """Similarities of two models do not compare: each source's vector order is kept."""
    files = merging.ranked_hits([_hit("f1", "semantic", 0.2), _hit("f2", "semantic", 0.1)], 0)
    saved = merging.ranked_hits([_hit("m1", "semantic", 0.9), _hit("m2", "semantic", 0.15)], 1)
    assert _names([*files, *saved], one_model=False) == ["f1", "m1", "f2", "m2"]


def test_equal_hits_rank_in_source_order_and_a_lone_source_keeps_its_scores() -> None:
    pool = [
        *merging.ranked_hits([_hit("m", "hybrid", 0.5)], 1),
        *merging.ranked_hits([_hit("f", "hybrid", 0.5)], 0),
    ]
    fused = merging.fuse_hits(pool, 10, query="deploy key", search=SearchConfig())
    assert [ranked.hit.name for ranked, _ in fused] == ["f", "m"] and fused[0][1] == 1.0 > fused[1][1]
    alone = [_hit("a", "keyword", None), _hit("b", "semantic", 0.9)]
    alone[1].score = 0.25
    fused = merging.fuse_hits(merging.ranked_hits(alone, 0), 10, query="deploy key", search=SearchConfig())
    assert [(ranked.hit.name, score) for ranked, score in fused] == [("a", 1.0), ("b", 0.25)]


def test_store_ranks_order_a_source_whose_hits_carry_them() -> None:
    """Knowledge hits carry their places in their store's lists: those are the source's order."""
    hits = [
        _hit("x", "hybrid", 0.3, vector_rank=2, keyword_rank=1),
        _hit("y", "hybrid", 0.8, vector_rank=1, keyword_rank=3),
    ]
    ranked = merging.ranked_hits(hits, 1, by_ranks=True)
    assert [(r.vector_rank, r.keyword_rank) for r in ranked] == [(2, 1), (1, 2)]
