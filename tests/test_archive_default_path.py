"""The default archive path of ``archive_episodes()`` is chosen where the archive is written (the
agent's episodic actor, one archive at a time), so callers archiving one agent at the same time
of a manual clock each get a free name of their own."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from memstrata import Config, MemorySystem
from memstrata.actors.messages import ArchiveEpisodes
from memstrata.testing import ManualClock
from tests._support import GatedModel


def test_two_callers_archiving_one_agent_at_one_time_both_get_a_file(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = GatedModel()
    config = Config(data_dir=data_dir / "d")
    with MemorySystem.start(config, embedder=model, clock=ManualClock(), seed=1) as system:
        agent = system.agent("qa")
        for run in ("r1", "r2"):
            agent.remember(f"a note of {run}", task_run_id=run)
        system.wait_idle()
        model.mode = "hang"  # an archive waits for the vector being computed: both calls are made first
        agent.remember("a note whose vector is being computed", task_run_id="r3")
        assert model.entered.wait(30)

        runtime = system._runtime
        ask, asked = runtime.ask, threading.Semaphore(0)

        def counted(message: Any, **kwargs: Any) -> Any:
            if isinstance(message, ArchiveEpisodes):
                asked.release()
            return ask(message, **kwargs)

        monkeypatch.setattr(runtime, "ask", counted)
        results: dict[str, Any] = {}

        def archive(run: str) -> None:
            try:
                results[run] = agent.archive_episodes(task_run_id=run)
            except Exception as exc:
                results[run] = exc

        threads = [threading.Thread(target=archive, args=(run,)) for run in ("r1", "r2")]
        for thread in threads:
            thread.start()
        assert asked.acquire(timeout=30) and asked.acquire(timeout=30)  # both calls are in
        model.release.set()
        for thread in threads:
            thread.join(30)
    names = sorted(Path(r.path).name for r in results.values() if not isinstance(r, Exception))
    assert names == ["qa-20250101T000000000000Z-2.sqlite", "qa-20250101T000000000000Z.sqlite"], results
    assert all(r.archived == 1 for r in results.values())
