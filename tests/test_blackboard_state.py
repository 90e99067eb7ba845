"""BlackboardState: values, key and prefix subscriptions, snapshot and restore."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from memstrata.errors import InvalidInputError
from memstrata.layers import BlackboardState
from memstrata.layers._blackboard import _SNAPSHOT_MIGRATIONS
from memstrata.storage import apply_migrations, open_database


def test_publish_get_versions_and_sorted_list() -> None:
    board = BlackboardState()
    record, subscribers = board.publish("b", {"x": 1}, "p1")
    assert (record.version, subscribers) == (1, [])
    board.publish("a:2", 2)
    board.publish("a:1", 1)
    record, _ = board.publish("b", {"x": 2}, "p2")
    assert record.version == 2 and record.publisher_id == "p2"
    assert board.get("b").value == {"x": 2}  # type: ignore[union-attr]
    assert board.get("missing") is None
    assert board.list() == ["a:1", "a:2", "b"]
    assert board.list("a:") == ["a:1", "a:2"]
    assert board.list("zzz") == []


def test_values_are_copied() -> None:
    board = BlackboardState()
    value = [1]
    board.publish("k", value)
    value.append(2)
    got = board.get("k").value  # type: ignore[union-attr]
    got.append(3)
    assert board.get("k").value == [1]  # type: ignore[union-attr]


def test_subscriptions_exact_prefix_and_all() -> None:
    board = BlackboardState()
    board.publish("agent:a:status", "busy")
    board.publish("other", 1)
    exact, current = board.subscribe("agent:a:status")
    assert [r.value for r in current] == ["busy"]
    prefix, current = board.subscribe("agent:*")
    assert [r.key for r in current] == ["agent:a:status"]
    everything, current = board.subscribe("*")
    assert [r.key for r in current] == ["agent:a:status", "other"]
    _, subscribers = board.publish("agent:a:status", "idle")
    assert subscribers == sorted([exact, prefix, everything])
    _, subscribers = board.publish("agent:b:status", "idle")
    assert subscribers == [prefix, everything]
    _, subscribers = board.publish("agent:a:status:extra", 1)  # an exact key is not a prefix
    assert exact not in subscribers
    assert board.unsubscribe(prefix) is True
    assert board.unsubscribe(prefix) is False
    _, subscribers = board.publish("agent:b:status", "busy")
    assert subscribers == [everything]
    assert board.subscriber_count == 2


@pytest.mark.parametrize("key", ["", "a*", None, "x" * 1025, "\ud800"])
def test_bad_keys_are_rejected(key: object) -> None:
    with pytest.raises(InvalidInputError):
        BlackboardState().publish(key, 1)  # type: ignore[arg-type]


def test_bad_patterns_and_values() -> None:
    board = BlackboardState()
    with pytest.raises(InvalidInputError):
        board.subscribe("a*b*")
    with pytest.raises(InvalidInputError, match="JSON"):
        board.publish("k", {1, 2})
    assert len(board) == 0


def test_snapshot_and_restore(tmp_path: Path) -> None:
    when = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    board = BlackboardState(clock=lambda: when)
    board.publish("a", {"nested": [1, None, "é"]}, "p")
    board.publish("a", 2, "q")
    board.publish("b", "text")
    board.subscribe("*")
    path = tmp_path / "board.sqlite"
    assert board.snapshot(path) == 2
    board.publish("c", 3)
    assert board.snapshot(path) == 3  # replaces, not appends
    restored = BlackboardState()
    assert restored.restore(path) == 3
    record = restored.get("a")
    assert record is not None
    assert (record.value, record.publisher_id, record.version, record.updated_at) == (2, "q", 2, when)
    assert restored.subscriber_count == 0
    assert BlackboardState().restore(tmp_path / "missing.sqlite") == 0


def test_a_deleted_key_goes_on_with_its_versions_after_a_restore(tmp_path: Path) -> None:
    board = BlackboardState()
    for value in (1, 2):
        board.publish("gone", value)
    board.publish("back", 1)
    assert board.delete("gone")[0] is not None and board.delete("back")[0] is not None  # v3, v2
    board.publish("back", 2)  # v3: live again
    path = tmp_path / "board.sqlite"
    board.snapshot(path)
    restored = BlackboardState()
    assert restored.restore(path) == 1
    assert restored.publish("gone", 3)[0].version == 4  # not 1: the count survived the restart
    back = restored.get("back")
    assert back is not None and back.version == 3
    assert restored.publish("back", 4)[0].version == 4


def test_a_ray_journal_keeps_its_deleted_versions_through_the_schema_upgrade(tmp_path: Path) -> None:
    """A Ray board's journal of the previous schema kept deleted keys in a table of its own."""
    path = tmp_path / "board.sqlite"
    db = open_database(path, load_vec=False)
    apply_migrations(db, "blackboard", _SNAPSHOT_MIGRATIONS[:1])
    db.execute("CREATE TABLE ray_deleted (key TEXT PRIMARY KEY, version INTEGER NOT NULL)")
    db.execute("INSERT INTO ray_deleted VALUES ('k', 7)")
    db.close()
    restored = BlackboardState()
    assert restored.restore(path) == 0
    assert restored.publish("k", 1)[0].version == 8
