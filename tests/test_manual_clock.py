"""ManualClock: one exact counter, so a boundary does not depend on how the steps are split."""

from __future__ import annotations

import datetime as _dt
import math
import threading
from pathlib import Path

import pytest

from memstrata.layers import WorkingMemory
from memstrata.testing import ManualClock, simulation

START = _dt.datetime(2025, 1, 1, tzinfo=_dt.UTC)


def _advanced(*steps: float) -> ManualClock:
    clock = ManualClock(START)
    for step in steps:
        clock.advance(step)
    return clock


@pytest.mark.parametrize("steps", [(0.8,), (0.1, 0.7), (0.7, 0.1), (0.3, 0.5), (0.2, 0.2, 0.2, 0.2)])
def test_the_same_total_gives_the_same_time_however_it_is_split(steps: tuple[float, ...]) -> None:
    clock = _advanced(*steps)
    assert clock.monotonic() == 0.8
    assert clock.now() == START + _dt.timedelta(milliseconds=800)


def test_now_and_monotonic_move_together_below_a_microsecond() -> None:
    clock = _advanced(*[4e-7] * 1000)
    assert clock.monotonic() == 0.0004
    assert clock.now() == START + _dt.timedelta(microseconds=400)


def test_now_never_runs_ahead_of_monotonic() -> None:
    clock = _advanced(4e-7, 4e-7)  # 0.8 µs: wall time shows whole microseconds only
    assert clock.monotonic() == 8e-7
    assert clock.now() == START
    clock.advance(2e-7)
    assert clock.now() == START + _dt.timedelta(microseconds=1)


@pytest.mark.parametrize("seconds", [-1.0, -1e-9, math.nan, math.inf])
def test_advance_refuses_a_step_that_is_not_a_finite_forward_one(seconds: float) -> None:
    clock = ManualClock(START)
    with pytest.raises(ValueError, match="advance by"):
        clock.advance(seconds)
    assert clock.monotonic() == 0.0
    assert clock.now() == START


def test_advance_accepts_whole_seconds_as_integers() -> None:
    clock = _advanced(3, 2)
    assert clock.monotonic() == 5.0
    assert clock.now() == START + _dt.timedelta(seconds=5)


@pytest.mark.parametrize(
    ("set_after", "ttl_s", "steps"),
    [
        ((), 0.8, (0.1, 0.7)),
        ((), 0.9, (0.3, 0.6)),
        ((0.1,), 0.2, (0.2,)),  # 0.1 + 0.2 is 0.30000000000000004 in floats
        ((0.7,), 0.1, (0.1,)),
    ],
)
def test_a_key_expires_exactly_at_its_boundary_however_the_steps_are_split(
    set_after: tuple[float, ...], ttl_s: float, steps: tuple[float, ...]
) -> None:
    clock = _advanced(*set_after)
    memory = WorkingMemory(clock=clock.monotonic)
    memory.set("k", "v", ttl_s=ttl_s)
    for step in steps[:-1]:
        clock.advance(step)
    clock.advance(steps[-1] - 1e-9)
    assert memory.get("k") == "v"  # one nanosecond before the boundary
    assert memory.entries()[0].expires_in_s == 1e-6  # time left is never shown as 0
    clock.advance(1e-9)
    assert memory.get("k", "expired") == "expired"


def test_an_agents_working_memory_expires_at_the_boundary_in_a_simulation(tmp_path: Path) -> None:
    with simulation(tmp_path / "data", seed=1) as system:
        agent = system.agent("a")
        agent.set_working("k", "v", ttl_s=0.8)
        system.clock.advance(0.1)
        assert agent.get_working("k") == "v"
        system.clock.advance(0.7)
        assert agent.get_working("k", "expired") == "expired"


def test_a_ttl_below_a_nanosecond_still_keeps_the_key_for_one() -> None:
    clock = ManualClock(START)
    memory = WorkingMemory(clock=clock.monotonic)
    memory.set("k", "v", ttl_s=1e-12)
    assert memory.get("k") == "v"
    clock.advance(1e-9)
    assert memory.get("k", "expired") == "expired"


@pytest.mark.parametrize(("before", "delay"), [(0.1, 0.2), (0.7, 0.1), (0.3, 0.5)])
def test_a_timer_on_the_clock_is_due_exactly_at_its_boundary(before: float, delay: float) -> None:
    """A deadline set at ``before`` for ``delay`` fires once the clock has moved ``delay`` on,
    however the float sum of the two would round (0.1 + 0.2 is above 0.3 as floats)."""
    from memstrata.actors._concurrency import Scheduler

    clock = _advanced(before)
    scheduler = Scheduler(clock=clock)
    fired: list[str] = []
    last = threading.Event()
    try:
        scheduler.call_later(delay, lambda: fired.append("deadline"), on_clock=True)
        clock.advance(delay)
        # due at the same instant, set later: runs after the deadline, on the same thread
        scheduler.call_later(0, lambda: (fired.append("marker"), last.set()), on_clock=True)
        assert last.wait(30)
    finally:
        scheduler.close()
    assert fired == ["deadline", "marker"]


def test_now_is_utc_whatever_zone_the_start_was_given_in(tmp_path: Path) -> None:
    """``Clock.now`` is UTC (the protocol's word), so what the clock dates reads the same
    whatever zone a simulation started in: an export of two such runs is the same bytes."""
    plus_two = _dt.timezone(_dt.timedelta(hours=2))
    clock = ManualClock(_dt.datetime(2025, 1, 1, 2, 0, tzinfo=plus_two))
    clock.advance(1.5)
    assert clock.now() == START + _dt.timedelta(seconds=1.5)
    assert clock.now().utcoffset() == _dt.timedelta(0)
    exports = []
    for name, start in (("utc", START), ("plus2", _dt.datetime(2025, 1, 1, 2, 0, tzinfo=plus_two))):
        with simulation(tmp_path / name, seed=1, start=start) as system:
            system.blackboard("b").publish("k", 1, wait=True)
            system.agent("a").remember("x")
            system.export(tmp_path / f"{name}.jsonl")
        exports.append((tmp_path / f"{name}.jsonl").read_bytes())
    assert exports[0] == exports[1]
