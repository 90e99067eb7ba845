"""The Agent handle's shared steps: an archive path is checked in the caller and made absolute
against the caller's directory; both searches refuse a stopped system and keep the list type."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import pytest

from memstrata import Config, MemorySystem
from memstrata._agent_handle import Hits
from memstrata.errors import InvalidInputError, SystemStoppedError
from memstrata.testing import ManualClock
from tests.fakes import FakeEmbedder


def test_archive_and_restore_refuse_a_path_of_the_wrong_type(data_dir: Path) -> None:
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        agent = system.agent("a1")
        agent.remember("the nightly build broke on the arm runner")
        with pytest.raises(InvalidInputError, match="path must be a str or Path, got int"):
            agent.archive_episodes(42)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="path must be a str or Path, got bytes"):
            agent.restore_episodes(b"archive.sqlite")  # type: ignore[arg-type]
        for blank in ("", "  "):
            with pytest.raises(InvalidInputError, match=r"^path must be a non-empty path"):
                agent.archive_episodes(blank)
        assert len(agent.list_episodes()) == 1  # nothing was archived by the refused calls


def test_a_relative_archive_path_is_taken_from_the_callers_directory(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        agent = system.agent("a1")
        agent.remember("the nightly build broke on the arm runner")
        done = agent.archive_episodes("old.sqlite")
        assert done.archived == 1
        assert Path(done.path) == work / "old.sqlite" and (work / "old.sqlite").is_file()
        assert agent.restore_episodes("old.sqlite") == 1


def test_default_archive_paths_stay_apart_when_the_clock_stands_still(data_dir: Path) -> None:
    """A manual clock gives two archives one time: the second gets its own name, not an error."""
    clock = ManualClock(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder(), clock=clock) as system:
        agent = system.agent("a1")
        for run in ("r1", "r2", "r3"):
            agent.remember(f"step of {run}", task_run_id=run)
        done = [agent.archive_episodes(task_run_id=run) for run in ("r1", "r2", "r3")]
        names = [Path(d.path).name for d in done]
        assert names == [
            "a1-20260101T000000000000Z.sqlite",
            "a1-20260101T000000000000Z-2.sqlite",
            "a1-20260101T000000000000Z-3.sqlite",
        ]
        assert [d.archived for d in done] == [1, 1, 1]
        assert agent.restore_episodes(done[1].path) == 1
        assert [e.content for e in agent.list_episodes()] == ["step of r2"]


def test_a_time_range_that_ends_before_it_starts_is_refused_before_the_agent_has_episodes(
    data_dir: Path,
) -> None:
    """The refusal came from the episodic store, so an agent without one answered "no matches"."""
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    late, early = now + dt.timedelta(days=1), now - dt.timedelta(days=1)
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        fresh, used = system.agent("fresh"), system.agent("used")
        used.remember("the cache warmed up")
        for agent in (fresh, used):
            with pytest.raises(
                InvalidInputError, match=rf"^since \({re.escape(late.isoformat())}\) is after until"
            ):
                agent.list_episodes(since=late, until=early)
            with pytest.raises(InvalidInputError, match="is after until"):
                agent.recall("cache", since=late, until=early)
        assert [e.content for e in used.list_episodes(since=early, until=late)] == ["the cache warmed up"]


def test_both_searches_answer_hits_and_refuse_a_stopped_system(data_dir: Path) -> None:
    system = MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder())
    agent = system.agent("a1")
    try:
        agent.store_knowledge("pin the numpy version in CI")
        agent.remember("pinned numpy after the CI break")
        knowledge = agent.query_knowledge("numpy version")
        episodes = agent.recall("numpy")
        assert isinstance(knowledge, Hits) and knowledge[0].entry.content == "pin the numpy version in CI"
        assert isinstance(episodes, Hits) and episodes[0].episode.content == "pinned numpy after the CI break"
        assert knowledge.degraded is None and episodes.degraded is None
    finally:
        system.stop()
    with pytest.raises(SystemStoppedError):
        agent.query_knowledge("numpy version")
    with pytest.raises(SystemStoppedError):
        agent.recall("numpy")


def test_both_searches_refuse_top_k_zero_as_every_door_does(data_dir: Path) -> None:
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        agent = system.agent("a1")
        agent.store_knowledge("pin the numpy version in CI")
        agent.remember("pinned numpy after the CI break")
        for top_k in (0, -1):
            with pytest.raises(InvalidInputError, match=rf"QueryKnowledge\.top_k .*, got {top_k}$"):
                agent.query_knowledge("numpy version", top_k=top_k)
            with pytest.raises(InvalidInputError, match=rf"SearchMemory\.top_k .*, got {top_k}$"):
                agent.recall("numpy", top_k=top_k)
        assert len(agent.query_knowledge("numpy version", top_k=None)) == 1  # None: search.top_k
        assert len(agent.recall("numpy", top_k=1)) == 1


def test_shared_must_be_a_boolean_as_at_every_other_door(data_dir: Path) -> None:
    """``shared="no"`` was truthy: the entry went to the shared store, where every agent finds it."""
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        agent = system.agent("a1")
        with pytest.raises(InvalidInputError, match="shared must be true or false, got 'no'"):
            agent.store_knowledge("private note", shared="no")  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="shared must be true or false, got 1"):
            agent.list_knowledge(shared=1)  # type: ignore[arg-type]
        assert system.agent("b1").query_knowledge("private note", include_shared=True) == []


def test_retire_takes_a_zero_timeout_as_given(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``timeout=0`` retires without waiting (as ``stop(0)`` stops); it was read as the default."""
    config = Config(data_dir=data_dir)
    with MemorySystem.start(config, embedder=FakeEmbedder()) as system:
        system.agent("a1").store_knowledge("an entry", category="fact")
        runtime = system._runtime
        bounds: list[tuple[str, float]] = []
        for name in ("wait_idle", "retire"):
            real = getattr(runtime, name)

            def spy(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
                bounds.append((_name, args[1] if _name == "retire" else args[0]))
                return _real(*args, **kwargs)

            monkeypatch.setattr(runtime, name, spy)
        system.retire("a1", 0)
        system.retire("a1")
        default = config.actors.stop_timeout_s
        assert bounds == [("wait_idle", 0.0), ("retire", 0.0), ("wait_idle", default), ("retire", default)]
        assert [e.content for e in system.agent("a1").list_knowledge()] == ["an entry"]  # nothing lost


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), 1e300, "2", True])
def test_a_bad_timeout_is_refused_before_anything_is_sent(data_dir: Path, bad: object) -> None:
    """A negative or NaN bound was a RequestTimeoutError that never was ("no answer within nan s"),
    a huge one an OverflowError, text a TypeError. Each is now refused naming it; nothing runs."""
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        agent = system.agent("a1")
        calls = [
            lambda: agent.store_knowledge("a write that must not happen", category="fact", timeout=bad),
            lambda: agent.complete_task("t1", "an outcome that must not be queued", timeout=bad),
            lambda: agent.query_knowledge("anything", timeout=bad),
            lambda: system.items.put(("users",), "u1", {"n": 1}, timeout=bad),
            lambda: system.export(data_dir.parent / "out.jsonl", timeout=bad),
            lambda: system.wait_idle(bad),  # type: ignore[arg-type]
            lambda: system.status(bad),  # type: ignore[arg-type]
            lambda: system.retire("a1", bad),  # type: ignore[arg-type]
        ]
        for call in calls:
            with pytest.raises(InvalidInputError, match=r"^timeout must be a number of seconds"):
                call()
        assert system.wait_idle(10)
        assert agent.list_knowledge() == [] and agent.list_episodes() == []
        assert system.items.get(("users",), "u1") is None
        assert not (data_dir.parent / "out.jsonl").exists()
