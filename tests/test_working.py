"""WorkingMemory: key-value with TTL on an injectable clock, copies in and out."""

from __future__ import annotations

import pytest

from memstrata.errors import InvalidInputError
from memstrata.layers import WorkingMemory
from tests._support import HandClock


@pytest.fixture
def tick() -> HandClock:
    return HandClock()


@pytest.fixture
def wm(tick: HandClock) -> WorkingMemory:
    """A working memory on ``tick``'s clock: a test moves time on by hand."""
    return WorkingMemory(clock=tick)


def test_set_get_delete_clear() -> None:
    wm = WorkingMemory()
    wm.set("plan", ["a", "b"])
    wm.set("count", 3)
    assert wm.get("plan") == ["a", "b"]
    assert wm.get("missing", "dflt") == "dflt"
    assert wm.keys() == ["count", "plan"]
    assert "plan" in wm and len(wm) == 2
    assert wm.delete("plan") is True
    assert wm.delete("plan") is False
    assert wm.clear() == 1
    assert len(wm) == 0


def test_values_are_copies() -> None:
    wm = WorkingMemory()
    value = {"steps": [1]}
    wm.set("k", value)
    value["steps"].append(2)
    got = wm.get("k")
    assert got == {"steps": [1]}
    got["steps"].append(3)
    assert wm.get("k") == {"steps": [1]}


def test_ttl_follows_the_injected_clock(tick: HandClock, wm: WorkingMemory) -> None:
    wm.set("short", 1, ttl_s=5)
    wm.set("long", 2)
    tick.now += 4.9
    assert wm.get("short") == 1
    tick.now += 0.2
    assert wm.get("short") is None
    assert wm.keys() == ["long"]
    assert wm.items() == {"long": 2}


def test_an_entry_a_moment_from_expiry_still_has_time_left_that_a_write_accepts(
    tick: HandClock, wm: WorkingMemory
) -> None:
    wm.set("k", 1, ttl_s=5)
    tick.now += 5 - 1e-9  # live, with less time left than the six decimals entries() keep
    (entry,) = wm.entries()
    assert entry.expires_in_s is not None and entry.expires_in_s > 0
    again = WorkingMemory(clock=HandClock())
    again.set(entry.key, entry.value, ttl_s=entry.expires_in_s)  # as an import sets it
    assert again.get("k") == 1


def test_overwriting_resets_ttl(tick: HandClock, wm: WorkingMemory) -> None:
    wm.set("k", 1, ttl_s=1)
    wm.set("k", 2)
    tick.now += 10
    assert wm.get("k") == 2


@pytest.mark.parametrize("key", ["", 5, None, "x" * 1025])
def test_bad_keys(key: object) -> None:
    with pytest.raises(InvalidInputError, match="key"):
        WorkingMemory().set(key, 1)  # type: ignore[arg-type]


def test_bad_values_and_ttl() -> None:
    wm = WorkingMemory()
    with pytest.raises(InvalidInputError, match="JSON"):
        wm.set("k", object())
    # one rule, said the same way for every bad value (0 included: gone the moment it is stored)
    for bad in (0, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(InvalidInputError, match="ttl_s must be a positive number of seconds, got"):
            wm.set("k", 1, ttl_s=bad)
    assert len(wm) == 0


def test_limits() -> None:
    wm = WorkingMemory(max_items=2, max_value_bytes=10)
    wm.set("a", 1)
    wm.set("b", 2)
    with pytest.raises(InvalidInputError, match="full"):
        wm.set("c", 3)
    wm.set("a", 5)  # replacing an existing key is fine
    with pytest.raises(InvalidInputError, match="bytes"):
        wm.set("a", "x" * 20)
    assert wm.get("a") == 5


def test_each_task_has_its_own_space_beside_the_agent_wide_one(wm: WorkingMemory) -> None:
    wm.set("cursor", "wide")
    wm.set("cursor", 3, task_id="t3")
    wm.set("cursor", 4, task_id="t4", ttl_s=10)
    assert [wm.get("cursor"), wm.get("cursor", task_id="t3"), wm.get("cursor", task_id="t4")] == [
        "wide",
        3,
        4,
    ]
    assert wm.get("cursor", "none", task_id="t5") == "none"  # no fallback to the agent-wide space
    assert wm.keys() == ["cursor"] and wm.keys(task_id="t3") == ["cursor"] and len(wm) == 3
    assert wm.tasks() == ["t3", "t4"]
    assert [(e.task_id, e.key, e.value, e.expires_in_s) for e in wm.entries()] == [
        (None, "cursor", "wide", None),
        ("t3", "cursor", 3, None),
        ("t4", "cursor", 4, 10.0),
    ]
    assert wm.clear(task_id="t3") == 1  # the task ended: only its space goes
    assert wm.get("cursor", task_id="t4") == 4 and wm.get("cursor") == "wide"
    assert wm.delete("cursor", task_id="t4") is True and wm.contains("cursor")
    assert wm.clear() == 1 and wm.clear_all() == 0


def test_task_spaces_share_the_key_limit_and_check_the_task_id() -> None:
    wm = WorkingMemory(max_items=2)
    wm.set("a", 1, task_id="t1")
    wm.set("a", 1, task_id="t2")
    with pytest.raises(InvalidInputError, match="full"):
        wm.set("a", 1)
    for bad in (5, "x" * 300, "a\x00"):
        with pytest.raises(InvalidInputError, match="task_id"):
            wm.set("b", 1, task_id=bad)  # type: ignore[arg-type]
    assert wm.clear_all() == 2
