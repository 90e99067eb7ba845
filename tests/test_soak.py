"""Soak: many agents running many tasks at once through ``MemorySystem``, with seeded random
failures and blackboard traffic; the end state is counted exactly.

The soak uses the fast fake embedder: it exercises the actors, the outbox, SQLite and the
blackboard at volume, which the real model would only slow down (~480 short texts/s on 2 cores,
so 64,000 texts would take minutes of pure embedding); the real model has its own tests.

``make test-slow`` runs the full size (16 agents x 2,000 tasks); the normal suite runs 16 x 50.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from memstrata import Config, MemorySystem
from memstrata.config import ActorsConfig
from tests.fakes import FakeEmbedder

TOPICS = ["payment", "billing", "search", "auth", "cache", "queue", "deploy", "logging", "ledger", "export"]
SEED = 1729


def vm_rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


@dataclass
class Figures:
    agents: int
    tasks: int
    seconds: float = 0.0
    rss_before_kib: int = 0
    rss_after_kib: int = 0
    prompts: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    @property
    def tasks_per_s(self) -> float:
        return self.agents * self.tasks / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        return (
            f"soak {self.agents} agents x {self.tasks} tasks: {self.seconds:.1f} s, "
            f"{self.tasks_per_s:.0f} tasks/s, RSS {self.rss_before_kib / 1024:.0f} MiB -> "
            f"{self.rss_after_kib / 1024:.0f} MiB"
        )


def plan(agents: int, tasks: int) -> dict[str, list[tuple[str, str, bool]]]:
    """Per agent: (task id, topic, fails) for every task, decided up front from the seed."""
    rng = random.Random(SEED)
    return {
        f"agent{a:02d}": [(f"t{n}", rng.choice(TOPICS), rng.random() < 0.2) for n in range(tasks)]
        for a in range(agents)
    }


def soak(data_dir: Path, agents: int, tasks: int, deadline_s: float) -> Figures:
    work = plan(agents, tasks)
    figures = Figures(agents, tasks)
    config = Config(data_dir=data_dir, actors=ActorsConfig(stop_timeout_s=120))
    system = MemorySystem.start(config, embedder=FakeEmbedder())
    try:
        board = system.blackboard("soak")
        delivered: Counter[str] = Counter()
        lock = threading.Lock()

        def on_signal(signal: Any) -> None:
            with lock:
                delivered[signal.key.split(":")[1]] += 1

        subscription = board.subscribe("agent:*", on_signal)
        for agent_id in work:  # every agent starts with something to retrieve: no prompt may fall back
            agent = system.agent(agent_id)
            for topic in TOPICS:
                agent.store_knowledge(f"{topic} handling guideline for {agent_id}", category="pattern")
        assert system.wait_idle(60)
        figures.rss_before_kib = vm_rss_kib()
        started = time.monotonic()

        def run(agent_id: str) -> None:
            agent = system.agent(agent_id)
            try:
                for task_id, topic, fails in work[agent_id]:
                    prompt = agent.begin_task(task_id, f"{topic} handling for {task_id}")
                    kind = "fallback" if prompt.fallback else "knowledge"
                    if prompt.reason is not None:
                        kind = f"{kind}:{prompt.reason.split(':')[0]}"
                    with lock:
                        figures.prompts[kind] += 1
                    agent.set_working("task", task_id, task_id=task_id)
                    board.publish(f"agent:{agent_id}:current", task_id, agent_id)
                    if fails:
                        agent.fail_task(task_id, f"{topic} step of {task_id} failed for {agent_id}")
                    else:
                        agent.complete_task(task_id, f"{topic} step of {task_id} done by {agent_id}")
                board.publish(f"agent:{agent_id}:done", len(work[agent_id]), agent_id)
            except BaseException as exc:
                with lock:
                    figures.errors.append(f"{agent_id}: {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=run, args=(a,), name=f"soak-{a}") for a in work]
        for thread in threads:
            thread.start()
        end = time.monotonic() + deadline_s
        for thread in threads:
            thread.join(max(0.0, end - time.monotonic()))
        assert not any(t.is_alive() for t in threads), f"the soak did not finish within {deadline_s:g} s"
        assert system.wait_idle(max(10.0, end - time.monotonic()))
        figures.seconds = time.monotonic() - started
        figures.rss_after_kib = vm_rss_kib()
        assert figures.errors == []

        # exact counts: prompts, knowledge per category, episodes, outboxes, blackboard
        assert figures.prompts == Counter({"knowledge": agents * tasks}), figures.prompts
        status = system.status()
        assert status["warnings"] == [] and status["degraded"] == {} and status["restarts"] == {}
        for agent_id, steps in work.items():
            failed = sum(1 for _, _, fails in steps if fails)
            agent = system.agent(agent_id)
            state = status["agents"][agent_id]
            assert state["agent"]["outbox_pending"] == 0 and state["agent"]["outbox_dead"] == 0
            assert state["agent"].get("fallbacks", 0) == 0
            assert state["agent"]["tasks_failed"] == failed
            assert state["agent"]["tasks_completed"] == tasks - failed
            knowledge = state["knowledge"]["store"]
            assert knowledge["entries"] == len(TOPICS) + tasks and knowledge["pending_vectors"] == 0
            pitfalls = agent.list_knowledge(category="pitfall", limit=10_000)
            outcomes = agent.list_knowledge(category="outcome", limit=10_000)
            assert (len(pitfalls), len(outcomes)) == (failed, tasks - failed)
            assert {e.tags["taskId"] for e in pitfalls + outcomes} == {t for t, _, _ in steps}
            episodic = state["episodic"]["store"]
            assert episodic["episodes"] == tasks and episodic["vectors"] == tasks
            assert episodic["consistency"]["consistent"]
            assert board.get(f"agent:{agent_id}:current") == steps[-1][0]
            assert board.get(f"agent:{agent_id}:done") == tasks
            assert delivered[agent_id] == tasks + 1
            last = steps[-1][0]
            assert agent.get_working("task", task_id=last) is None  # cleared when the task ended
        assert len(board.list("agent:")) == 2 * agents
        subscription.unsubscribe()
    finally:
        report = system.stop()
    assert report.drained and report.late == ()
    return figures


def test_soak_quick(data_dir: Path) -> None:
    figures = soak(data_dir, agents=16, tasks=50, deadline_s=240)
    print(figures.line())
    assert figures.rss_after_kib - figures.rss_before_kib < 200 * 1024


@pytest.mark.slow
def test_soak_full(data_dir: Path) -> None:
    figures = soak(data_dir, agents=16, tasks=2_000, deadline_s=3_600)
    print(figures.line())
    # the stores' own caches grow with what they hold (64-d vectors of 32,000 entries and
    # 32,000 episodes, BM25 postings); a leak per task would exceed this by far
    assert figures.rss_after_kib - figures.rss_before_kib < 600 * 1024
