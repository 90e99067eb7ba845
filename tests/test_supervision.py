"""The restart budget on its own, on a clock the test moves: crashes within the window count,
older ones are forgotten, and an infinite window forgets none."""

from __future__ import annotations

import math

from memstrata.actors._supervision import Supervision
from memstrata.core.config import ActorsConfig, Config


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _crash(budget: Supervision, n: int = 1) -> list[bool]:
    return [budget.child_failed("knowledge", "alice", "alice", RuntimeError("boom")) for _ in range(n)]


def test_crashes_beyond_the_budget_within_the_window_degrade_the_owner() -> None:
    clock = _Clock()
    budget = Supervision(max_restarts=2, window_s=60.0, clock=clock)
    assert _crash(budget, 2) == [True, True]
    assert _crash(budget) == [False]
    reason = budget.degraded_reason("alice")
    assert reason == "knowledge actor crashed 3 times within 60 s (last: RuntimeError: boom)"
    assert budget.degraded_reason("bob") is None


def test_crashes_older_than_the_window_are_forgotten() -> None:
    clock = _Clock()
    budget = Supervision(max_restarts=2, window_s=60.0, clock=clock)
    for _ in range(5):
        assert _crash(budget) == [True]
        clock.now += 31.0  # two crashes at most within any 60 s
    assert budget.degraded() == {}


def test_an_infinite_window_counts_every_restart_since_the_start() -> None:
    clock = _Clock()
    budget = Supervision(max_restarts=2, window_s=math.inf, clock=clock)
    assert _crash(budget, 2) == [True, True]
    clock.now += 1e9
    assert _crash(budget) == [False]
    assert budget.degraded_reason("alice") == (
        "knowledge actor crashed 3 times since it started (last: RuntimeError: boom)"
    )


def test_the_config_accepts_an_infinite_restart_window() -> None:
    assert Config(actors=ActorsConfig(restart_window_s=math.inf)).actors.restart_window_s == math.inf
    env = {"MEMSTRATA_ACTORS__RESTART_WINDOW_S": "inf"}
    assert Config.load(None, env=env, data_dir="/tmp/unused").actors.restart_window_s == math.inf
