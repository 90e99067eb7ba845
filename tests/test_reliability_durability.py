"""Durable acknowledgement under ``kill -9``: what a call acknowledged is never lost.

A child process writes in a loop and prints one line after each call returns; the parent reads
a random number of lines, then SIGKILLs the child while it is in the middle of later writes (it
never waits for the parent). Every acknowledged write must then be found, the databases must pass
``PRAGMA integrity_check``, and entries, full-text rows and vectors must agree without repair.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from memstrata import Config, MemorySystem
from memstrata.actors._outbox import Outbox
from memstrata.layers import EpisodicMemory, KnowledgeStore
from memstrata.storage import VectorIndex, open_database
from tests._support import check_knowledge
from tests.fakes import FakeEmbedder

REPO = Path(__file__).resolve().parent.parent
SEED = 20250901

LAYERS_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from memstrata.layers import EpisodicMemory, KnowledgeStore
    from tests.fakes import FakeEmbedder

    data, start = Path(sys.argv[1]), int(sys.argv[2])
    embedder = FakeEmbedder()
    store = KnowledgeStore.open(data / "knowledge.sqlite", embedder)
    episodic = EpisodicMemory.open(data / "episodic.sqlite", embedder)
    for i in range(start, start + 100_000):
        entry = store.add(
            f"knowledge entry {i} about subsystem s{i % 7}",
            category="pitfall" if i % 3 == 0 else "pattern",
            tags={"n": str(i)},
        )
        episode = episodic.record(f"episode {i} happened in run r{i % 5}", task_run_id=f"r{i % 5}")
        print(i, entry, episode, flush=True)
    """
)

TASKS_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from memstrata import Config, MemorySystem
    from tests.fakes import FakeEmbedder

    data, start = Path(sys.argv[1]), int(sys.argv[2])
    system = MemorySystem.start(Config(data_dir=data), embedder=FakeEmbedder())
    agent = system.agent("victim")
    for i in range(start, start + 100_000):
        if i % 3 == 0:
            agent.fail_task(f"t{i}", f"task {i} failed: dependency d{i % 11} timed out")
        else:
            agent.complete_task(f"t{i}", f"task {i} done: shipped feature f{i % 13}")
        print(i, flush=True)
    """
)


def run_and_kill(script: str, data_dir: Path, start: int, acks: int, log: Path) -> list[list[int]]:
    """Run ``script``; SIGKILL it once ``acks`` writes were acknowledged; return every acknowledged line.

    The child keeps writing while the parent reads (the pipe buffers its lines), so more than
    ``acks`` writes may have returned by the time the signal lands: the lines still in the pipe
    after the kill are acknowledgements too and are returned as well. A line cut short by the
    kill is not complete, so its write counts as unacknowledged.
    """
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("w") as errors:
        child = subprocess.Popen(
            [sys.executable, "-c", script, str(data_dir), str(start)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=errors,
        )
        lines: list[list[int]] = []
        rest = b""
        try:
            assert child.stdout is not None
            while len(lines) < acks:
                line = child.stdout.readline()
                if not line.endswith(b"\n"):
                    break
                lines.append([int(x) for x in line.split()])
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(30)
            if child.stdout is not None:
                rest = child.stdout.read()
                child.stdout.close()
    assert len(lines) == acks, f"the child stopped early: {log.read_text()[-2000:]}"
    assert child.returncode == -signal.SIGKILL
    complete = rest[: rest.rfind(b"\n") + 1]
    lines += [[int(x) for x in line.split()] for line in complete.splitlines()]
    return lines


def integrity(path: Path) -> str:
    with open_database(path) as db:
        return str(db.scalar("PRAGMA integrity_check"))


def knowledge_consistency(path: Path, dim: int) -> dict[str, Any]:
    """The shared check applied to a knowledge store (as its layer is to call it on open)."""
    with open_database(path) as db:
        vectors = VectorIndex(db, "knowledge", dim, metadata={"category": "text"})
        report = check_knowledge(db, vectors, full=True)
        return report.as_dict()


def test_kill_minus_nine_loses_no_acknowledged_add_or_record(data_dir: Path, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    acked: dict[int, tuple[int, int]] = {}
    start = 0
    rounds = 3
    for round_no in range(rounds):
        lines = run_and_kill(
            LAYERS_CHILD, data_dir, start, rng.randint(15, 90), tmp_path / f"l{round_no}.log"
        )
        for i, entry, episode in lines:
            acked[i] = (entry, episode)
        # the write after the last acknowledged one may or may not have committed: skip its index
        start = max(acked) + 2
        for name in ("knowledge.sqlite", "episodic.sqlite"):
            assert integrity(data_dir / name) == "ok"
        full = knowledge_consistency(data_dir / "knowledge.sqlite", FakeEmbedder().dim)
        assert full["consistent"], full
        assert full["rows"] == full["vectors"]
    embedder = FakeEmbedder()
    with KnowledgeStore.open(data_dir / "knowledge.sqlite", embedder) as store:
        for i, (entry, _) in acked.items():
            found = store.get(entry)
            assert found is not None and found.content == f"knowledge entry {i} about subsystem s{i % 7}"
            assert found.tags == {"n": str(i)}
        # at most one committed but unacknowledged write per kill
        assert len(acked) <= store.count() <= len(acked) + rounds
        last = max(acked)
        text = f"knowledge entry {last} about subsystem s{last % 7}"
        assert store.search(text, mode="keyword", top_k=1)[0].entry.id == acked[last][0]
        assert acked[last][0] in {h.entry.id for h in store.search(text, mode="vector", top_k=5)}
        assert store.status()["pending_vectors"] == 0
    with EpisodicMemory.open(data_dir / "episodic.sqlite", embedder) as episodic:
        check = episodic.status()["consistency"]
        assert check["consistent"] and check["rows"] == check["vectors"], check
        assert episodic.check(full=True).consistent
        for i, (_, episode) in acked.items():
            found_episode = episodic.get(episode)
            assert (
                found_episode is not None and found_episode.content == f"episode {i} happened in run r{i % 5}"
            )
        assert len(acked) <= episodic.count() <= len(acked) + rounds
        hits = episodic.search(f"episode {last} happened", top_k=3)
        assert acked[last][1] in {h.episode.id for h in hits}


def test_kill_minus_nine_loses_no_acknowledged_task_outcome(data_dir: Path, tmp_path: Path) -> None:
    """complete_task/fail_task acknowledged -> stored exactly once, even when later processes are
    killed while replaying the outbox left by earlier ones."""
    rng = random.Random(SEED + 1)
    acked: list[int] = []
    unacknowledged: set[str] = set()  # per kill, the one task whose call may have been cut short
    start = 0
    rounds = 3
    for round_no in range(rounds):
        lines = run_and_kill(TASKS_CHILD, data_dir, start, rng.randint(10, 70), tmp_path / f"t{round_no}.log")
        acked += [line[0] for line in lines]
        unacknowledged.add(f"t{max(acked) + 1}")
        start = max(acked) + 2  # a task id is never reused: the unacknowledged one may exist
        for name in ("knowledge/victim.sqlite", "episodic/victim.sqlite", "outbox/victim.sqlite"):
            if (data_dir / name).exists():
                assert integrity(data_dir / name) == "ok"
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        assert system.wait_idle(60)
        assert system.status()["agents"]["victim"]["agent"]["outbox_pending"] == 0
    embedder = FakeEmbedder()
    with KnowledgeStore.open(data_dir / "knowledge" / "victim.sqlite", embedder) as store:
        entries = store.list(limit=10_000)
    by_task: dict[str, list[Any]] = {}
    for entry in entries:
        by_task.setdefault(entry.tags["taskId"], []).append(entry)
    with EpisodicMemory.open(data_dir / "episodic" / "victim.sqlite", embedder) as episodic:
        episodes = episodic.timeline(limit=None)
        assert episodic.status()["consistency"]["consistent"]
    runs: dict[str | None, int] = {}
    for episode in episodes:
        runs[episode.task_run_id] = runs.get(episode.task_run_id, 0) + 1
    for i in acked:
        task = f"t{i}"
        assert len(by_task.get(task, [])) == 1, task
        entry = by_task[task][0]
        if i % 3 == 0:
            assert (entry.category, entry.content) == (
                "pitfall",
                f"task {i} failed: dependency d{i % 11} timed out",
            )
        else:
            assert (entry.category, entry.content) == ("outcome", f"task {i} done: shipped feature f{i % 13}")
        assert runs.get(task) == 1, f"{task} has {runs.get(task)} episodes"
    assert all(n == 1 for n in runs.values()), "a replay recorded an episode twice"
    assert all(len(found) == 1 for found in by_task.values()), "a replay stored an outcome twice"
    known = {f"t{i}" for i in acked} | unacknowledged
    assert set(by_task) <= known, sorted(set(by_task) - known)[:5]
    assert set(runs) <= known, sorted(str(r) for r in set(runs) - known)[:5]
    outbox = Outbox(data_dir / "outbox" / "victim.sqlite")
    try:
        assert outbox.counts() == {"pending": 0, "dead": 0}
    finally:
        outbox.close()
    knowledge = knowledge_consistency(data_dir / "knowledge" / "victim.sqlite", embedder.dim)
    assert knowledge["consistent"], knowledge
