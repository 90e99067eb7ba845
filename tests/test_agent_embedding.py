"""Per-agent embedding models: an ``[agents.<id>.embedding]`` override applies to every store and
query of that agent (knowledge, episodes, workspace, the pre-task query), through one embedding
service per distinct setting; agents without one keep the shared service. Also: content over
``max_content_bytes`` is refused by the one rule wherever it enters.

Deterministic embedders (``HashEmbedder`` of different dimensions) stand in for two models: the
dimension each store reports says which model made its vectors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memstrata import MemorySystem
from memstrata.config import Config, EmbeddingConfig
from memstrata.errors import EmbedderUnavailableError, InvalidInputError
from memstrata.testing import HashEmbedder


class Loader:
    """Makes a ``HashEmbedder`` of the section's ``dim`` and records every load."""

    def __init__(self) -> None:
        self.loaded: list[tuple[str, int | None]] = []

    def __call__(self, settings: EmbeddingConfig) -> HashEmbedder:
        self.loaded.append((settings.model, settings.dim))
        if settings.model == "missing":
            raise EmbedderUnavailableError("model 'missing' is not installed")
        return HashEmbedder(dim=settings.dim or 32)


def _config(data_dir: Path, agents: dict[str, Any]) -> Config:
    return Config.from_mapping({"data_dir": str(data_dir), "agents": agents})


def _dims(system: MemorySystem, agent_id: str) -> dict[str, int]:
    """The vector dimension of each of the agent's open stores, as the stores report it."""
    state = system.status()["agents"][agent_id]
    return {kind: int(state[kind]["store"]["dim"]) for kind in ("knowledge", "episodic") if kind in state}


TWO_MODELS = {
    "b": {"embedding": {"model": "hash-128", "dim": 128}},
    "c": {"embedding": {"model": "hash-128", "dim": 128}},  # same setting as b: same service
}


def test_each_agent_stores_vectors_of_its_own_model_and_finds_its_own_entries(data_dir: Path) -> None:
    loader = Loader()
    config = _config(data_dir, TWO_MODELS)
    with MemorySystem.start(config, embedder=HashEmbedder(dim=64), model_loader=loader) as system:
        for agent_id, fact in (
            ("a", "retry the flaky upload"),
            ("b", "pin the compiler"),
            ("c", "vendor it"),
        ):
            agent = system.agent(agent_id)
            agent.store_knowledge(f"{fact} with care", category="pattern")
            agent.remember(f"episode: {fact}")
        system.agent("a").store_knowledge("shared rule: review every migration", shared=True)
        assert _dims(system, "a") == {"knowledge": 64, "episodic": 64}
        assert _dims(system, "b") == {"knowledge": 128, "episodic": 128}
        assert _dims(system, "c") == {"knowledge": 128, "episodic": 128}
        assert system.status()["shared_knowledge"]["store"]["dim"] == 64  # the shared model, always
        assert loader.loaded == [("hash-128", 128)]  # b and c share one service: one load

        b = system.agent("b")
        own = b.query_knowledge("pin the compiler", include_shared=False)
        assert [h.entry.content for h in own] == ["pin the compiler with care"]
        assert own[0].similarity is not None and own[0].similarity > 0.5  # ranked by its own vectors
        episodes = b.recall("pin the compiler")
        assert episodes and episodes[0].episode.content == "episode: pin the compiler"
        fused = {h.entry.content for h in b.query_knowledge("review every migration")}
        assert "shared rule: review every migration" in fused  # the shared store, by its model

        status = system.status()["embedding"]
        assert status["dim"] == 64
        (service,) = status["per_agent"]
        assert service["agents"] == ["b", "c"] and service["dim"] == 128
        assert service["model"] == "memstrata-hash-v1-128" and service["state"]["state"] == "ok"
    after = system.status()["embedding"]["per_agent"][0]
    assert after["state"]["state"] == "closed"  # closed on stop, like the shared one


def test_the_pre_task_query_is_embedded_by_the_agents_model(data_dir: Path) -> None:
    config = _config(data_dir, {"b": {"embedding": {"model": "hash-128", "dim": 128}}})
    with MemorySystem.start(config, embedder=HashEmbedder(dim=64), model_loader=Loader()) as system:
        b = system.agent("b")
        b.store_knowledge("rotate the signing keys before the release", category="pattern")
        before = system.status()["embedding"]
        prompt = b.begin_task("t1", "rotate the signing keys", query="signing keys rotation")
        assert not prompt.fallback and prompt.hits[0].entry.content.startswith("rotate the signing")
        assert prompt.hits[0].similarity is not None  # the vector side ranked it: no model mismatch
        after = system.status()["embedding"]
        assert after["per_agent"][0]["query_requests"] > before["per_agent"][0]["query_requests"]
        # no shared store exists, so the shared model was not asked for this query
        assert after["query_requests"] == before["query_requests"]
        b.complete_task("t1", "rotated the signing keys")
        assert system.wait_idle(10)
        assert _dims(system, "b") == {"knowledge": 128, "episodic": 128}


def test_agents_without_an_embedding_override_load_no_model(data_dir: Path) -> None:
    loader = Loader()
    agents = {
        "a": {"retrieval_top_k": 2},  # settings of its own, the shared embedding
        "b": {"embedding": {"model": "default"}},  # the same setting as [embedding]
        "c": {"embedding": {"batch_size": 8}},  # the same model, batched differently
    }
    with MemorySystem.start(
        _config(data_dir, agents), embedder=HashEmbedder(dim=64), model_loader=loader
    ) as system:
        for agent_id in ("a", "b", "c"):
            system.agent(agent_id).store_knowledge(f"note of {agent_id}", category="pattern")
            assert _dims(system, agent_id) == {"knowledge": 64}
        assert loader.loaded == []
        (service,) = system.status()["embedding"]["per_agent"]  # c's batching, the shared model
        assert service["agents"] == ["c"] and service["model"] == "memstrata-hash-v1-64"


def test_an_agent_model_that_cannot_be_loaded_leaves_that_agent_keyword_only(data_dir: Path) -> None:
    config = _config(data_dir, {"b": {"embedding": {"model": "missing", "dim": 16}}})
    with MemorySystem.start(config, embedder=HashEmbedder(dim=64), model_loader=Loader()) as system:
        system.agent("a").store_knowledge("the shared model still works", category="pattern")
        b = system.agent("b")
        b.store_knowledge("found by keywords", category="pattern")
        assert [h.entry.content for h in b.query_knowledge("keywords")] == ["found by keywords"]
        status = system.status()
        assert status["agents"]["b"]["knowledge"]["store"]["mode"] == "keyword-only"
        assert status["agents"]["a"]["knowledge"]["store"]["dim"] == 64
        (service,) = status["embedding"]["per_agent"]
        assert service["keyword_only"] and "'missing'" in service["note"]
        assert any(w.startswith("agents b: keyword-only") for w in status["warnings"])


def test_content_over_the_limit_is_refused_by_the_one_rule_on_every_path(data_dir: Path) -> None:
    with MemorySystem.start(
        Config(data_dir=data_dir, max_content_bytes=100), embedder=HashEmbedder(dim=64)
    ) as system:
        agent = system.agent("a1")
        entry = agent.store_knowledge("small enough", category="pattern")
        too_big = "é" * 51  # 51 characters, 102 bytes of UTF-8
        for call in (
            lambda: agent.store_knowledge(too_big, category="pattern"),
            lambda: agent.update_knowledge(entry, content=too_big),
            lambda: agent.remember(too_big),
            lambda: agent.complete_task("t1", too_big),
            lambda: agent.fail_task("t2", too_big),
        ):
            with pytest.raises(InvalidInputError, match=r"102 bytes of UTF-8, over the limit of 100 bytes"):
                call()
        agent.complete_task("t3", "\ud800 fits once repaired")  # a lone surrogate is kept as U+FFFD
        assert system.wait_idle(10)
        state = system.status()
        assert state["restarts"] == {} and state["agents"]["a1"]["agent"]["outbox_pending"] == 0
        assert state["agents"]["a1"]["agent"]["outbox_dead"] == 0
        contents = {e.content for e in agent.list_knowledge(limit=10)}
        assert contents == {"small enough", "\ufffd fits once repaired"}


def test_the_agents_workspace_shares_its_stores_service(data_dir: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "MEMORY.md").write_text("# Notes\n\nThe billing service deploys on Tuesdays only.\n")
    agents = {"b": {"workspace": str(workspace), "embedding": {"model": "hash-128", "dim": 128}}}
    config = Config.from_mapping({"data_dir": str(data_dir), "sync": {"watch": False}, "agents": agents})
    loader = Loader()
    with MemorySystem.start(config, embedder=HashEmbedder(dim=64), model_loader=loader) as system:
        b = system.agent("b")
        b.store_knowledge("pin the compiler version", category="pattern")
        prompt = b.begin_task("t1", "when does billing deploy")
        assert [f.path for f in prompt.files] == ["MEMORY.md"]
        status = system.status()
        assert status["agents"]["b"]["workspace"]["mode"] == "hybrid"
        assert loader.loaded == [("hash-128", 128)]  # one model for the workspace and the stores
        assert status["embedding"]["model_calls"] == 0  # nothing of b's went to the shared model
        assert status["embedding"]["per_agent"][0]["model_calls"] > 0


def test_counting_stores_outside_the_actors_opens_each_with_its_agents_model(data_dir: Path) -> None:
    from memstrata.bridges._status import stored_counts

    config = _config(data_dir, {"b": {"embedding": {"model": "hash-128", "dim": 128}}})
    with MemorySystem.start(config, embedder=HashEmbedder(dim=64), model_loader=Loader()) as system:
        system.agent("b").store_knowledge("pin the compiler", category="pattern")
        system.agent("b").remember("pinned the compiler")
    with MemorySystem.start(config, embedder=HashEmbedder(dim=64), model_loader=Loader()) as system:
        counts = stored_counts(system)
        assert counts["knowledge"]["b"]["count"] == 1 and counts["episodic"]["b"]["count"] == 1
        assert counts["episodic"]["b"]["mode"] != "keyword-only"
        assert system.status()["embedding"]["texts_embedded"] == 0  # nothing rebuilt for the shared model
