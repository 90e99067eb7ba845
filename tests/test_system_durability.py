"""Write-back durability: acknowledged outcomes survive stop(), a crash, and kill -9."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from memstrata import Config, MemorySystem
from memstrata.actors._outbox import Outbox
from memstrata.layers import EpisodicMemory, KnowledgeStore
from tests._support import in_threads
from tests.fakes import FakeEmbedder

REPO = Path(__file__).resolve().parent.parent


def stored(data_dir: Path, agent: str) -> tuple[list[str], list[str]]:
    """Knowledge contents and episode contents of ``agent``, read straight from its files."""
    embedder = FakeEmbedder()
    with KnowledgeStore.open(data_dir / "knowledge" / f"{agent}.sqlite", embedder) as store:
        knowledge = [e.content for e in store.list(limit=10_000)]
    episodic = EpisodicMemory.open(data_dir / "episodic" / f"{agent}.sqlite", embedder)
    try:
        episodes = [e.content for e in episodic.timeline(limit=None)]
    finally:
        episodic.close()
    return knowledge, episodes


def pending(data_dir: Path, agent: str) -> int:
    outbox = Outbox(data_dir / "outbox" / f"{agent}.sqlite")
    try:
        return outbox.counts()["pending"]
    finally:
        outbox.close()


def test_a_thousand_write_backs_then_an_immediate_stop_lose_nothing(data_dir: Path) -> None:
    agents = ["w0", "w1", "w2", "w3"]
    per_agent = 250
    system = MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder())
    errors: list[BaseException] = []

    def work(agent_id: str) -> None:
        try:
            agent = system.agent(agent_id)
            for i in range(per_agent):
                if i % 5 == 0:
                    agent.fail_task(f"t{i}", f"{agent_id} failed task {i}: timeout talking to service {i}")
                else:
                    agent.complete_task(f"t{i}", f"{agent_id} finished task {i} with result {i * 7}")
        except BaseException as exc:
            errors.append(exc)

    in_threads(work, agents, 120)
    assert errors == []
    report = system.stop()  # no wait_idle: stop itself must drain
    assert report.drained and report.late == ()
    for agent_id in agents:
        knowledge, episodes = stored(data_dir, agent_id)
        assert len(knowledge) == per_agent == len(set(knowledge))
        assert len(episodes) == per_agent == len(set(episodes))
        assert pending(data_dir, agent_id) == 0
    with KnowledgeStore.open(data_dir / "knowledge" / "w0.sqlite", FakeEmbedder()) as store:
        pitfalls = store.list(category="pitfall", limit=1000)
        assert len(pitfalls) == per_agent // 5
        assert all(e.tags["taskId"].startswith("t") for e in pitfalls)


def test_unprocessed_outbox_rows_are_replayed_on_start(data_dir: Path) -> None:
    # a process acknowledged two write-backs and died before processing them
    at = dt.datetime(2025, 5, 1, 9, 0, tzinfo=dt.UTC)
    outbox = Outbox(data_dir / "outbox" / "a1.sqlite")
    outbox.append("completed", "t1", "shipped the search index rebuild", at)
    outbox.append("failed", "t2", "the index rebuild ran out of memory", at)
    outbox.close()
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        assert system.wait_idle(10)
        status = system.status()["agents"]["a1"]["agent"]
        assert status["outbox_pending"] == 0
    knowledge, episodes = stored(data_dir, "a1")
    assert "shipped the search index rebuild" in knowledge
    assert sorted(episodes) == sorted(knowledge)
    episodic = EpisodicMemory.open(data_dir / "episodic" / "a1.sqlite", FakeEmbedder())
    try:
        assert {e.at for e in episodic.timeline()} == {at}  # the original completion time is kept
        assert {e.title for e in episodic.timeline()} == {"Task t1 completed", "Task t2 failed"}
    finally:
        episodic.close()


def test_replay_of_a_half_processed_row_does_not_duplicate(data_dir: Path) -> None:
    at = dt.datetime(2025, 5, 1, 9, 0, tzinfo=dt.UTC)
    embedder = FakeEmbedder()
    text = "rotated the signing keys"
    # both parts were stored, but the process died before the outbox row was marked done
    with KnowledgeStore.open(data_dir / "knowledge" / "a1.sqlite", embedder) as store:
        store.add(text, category="outcome", tags={"taskId": "t1"}, author="a1")
    episodic = EpisodicMemory.open(data_dir / "episodic" / "a1.sqlite", embedder)
    episodic.record(text, title="Task t1 completed", task_run_id="t1", kind="task", at=at)
    episodic.close()
    outbox = Outbox(data_dir / "outbox" / "a1.sqlite")
    outbox.append("completed", "t1", text, at)
    outbox.close()
    with MemorySystem.start(Config(data_dir=data_dir), embedder=embedder) as system:
        assert system.wait_idle(10)
    knowledge, episodes = stored(data_dir, "a1")
    assert knowledge == [text]
    assert episodes == [text]
    assert pending(data_dir, "a1") == 0


CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from memstrata import Config, MemorySystem
    from tests.fakes import FakeEmbedder

    system = MemorySystem.start(Config(data_dir=Path(sys.argv[1])), embedder=FakeEmbedder())
    agent = system.agent("victim")
    i = 0
    while True:
        agent.complete_task(f"t{i}", f"acknowledged outcome number {i}")
        print(i, flush=True)
        i += 1
    """
)


def test_kill_minus_nine_loses_nothing_acknowledged(data_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(data_dir)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    acked = -1
    try:
        assert child.stdout is not None
        for line in child.stdout:
            acked = int(line)
            if acked >= 60:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    assert acked >= 60, "the child never got going"
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        assert system.wait_idle(30)
    knowledge, episodes = stored(data_dir, "victim")
    for i in range(acked + 1):
        text = f"acknowledged outcome number {i}"
        assert text in knowledge
        assert text in episodes
    assert len(set(episodes)) == len(episodes)
    assert pending(data_dir, "victim") == 0
