"""Integration with the real default embedding model (offline): prompts and batched write-backs."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from memstrata import Config, MemorySystem
from tests._support import in_threads

pytestmark = pytest.mark.model


def test_a_learned_pitfall_reaches_a_later_related_prompt(data_dir: Path, real_embedder: Any) -> None:
    with MemorySystem.start(Config(data_dir=data_dir), embedder=real_embedder) as system:
        agent = system.agent("backend")
        first = agent.begin_task("t1", "Add a database migration for the orders table")
        assert first.fallback and first.reason is not None and first.reason.startswith("no-hits:")
        agent.fail_task(
            "t1", "The migration locked the orders table for minutes; run schema changes online in batches"
        )
        agent.complete_task("t2", "Wrote the onboarding email templates in Markdown")
        assert system.wait_idle(30)
        prompt = agent.begin_task("t3", "Create a migration that adds an index to the orders table")
        assert not prompt.fallback
        top = prompt.hits[0].entry
        assert top.category == "pitfall" and top.tags == {"taskId": "t1"}
        assert '<entry category="pitfall" relevance="' in prompt.text and 'taskId="t1"' in prompt.text
        assert prompt.text.endswith("<task>Create a migration that adds an index to the orders table</task>")
        recalled = agent.recall("orders table lock")
        assert recalled[0].episode.title == "Task t1 failed"


def test_concurrent_write_backs_share_model_calls(data_dir: Path, real_embedder: Any) -> None:
    with MemorySystem.start(Config(data_dir=data_dir), embedder=real_embedder) as system:
        agents = [system.agent(f"worker-{i}") for i in range(16)]
        barrier = threading.Barrier(16)

        def work(i: int) -> None:
            barrier.wait(10)
            for n in range(4):
                agents[i].complete_task(f"t{n}", f"worker {i} finished step {n} of the report pipeline")

        in_threads(work, range(16), 60)
        assert system.wait_idle(60)
        stats = system.status()["embedding"]
        assert stats["texts_requested"] >= 16 * 4 * 2  # a knowledge entry and an episode per task
        assert stats["model_calls"] < stats["texts_requested"] / 2
        for agent in agents:
            assert len(agent.query_knowledge("report pipeline", include_shared=False)) == 4
