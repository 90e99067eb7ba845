"""Result schemas written with ``returns``: the same JSON Schema objects the operations declared
literally before, and a fresh one at each call (the doors may adapt a schema they are given)."""

from __future__ import annotations

from memstrata.bridges._operation import QUEUED, returns
from memstrata.bridges._operations import find


def test_returns_gives_each_field_its_type_and_any_for_any() -> None:
    assert returns(deleted="boolean") == {"type": "object", "properties": {"deleted": {"type": "boolean"}}}
    assert returns(found="boolean", value="any") == {
        "type": "object",
        "properties": {"found": {"type": "boolean"}, "value": {}},
    }
    assert list(returns(path="string", archived="integer")["properties"]) == ["path", "archived"]


def test_returns_gives_a_new_schema_each_time() -> None:
    first, second = returns(removed="integer"), returns(removed="integer")
    first["properties"]["removed"]["minimum"] = 0
    assert second == {"type": "object", "properties": {"removed": {"type": "integer"}}}


def test_the_declared_results_keep_their_shape() -> None:
    assert QUEUED == {
        "type": "object",
        "properties": {"task_id": {"type": "string"}, "queued": {"type": "boolean"}, "outbox_id": {}},
    }
    assert find("delete_knowledge").result == {
        "type": "object",
        "properties": {"deleted": {"type": "boolean"}},
    }
    assert find("archive_episodes").result == {
        "type": "object",
        "properties": {"path": {"type": "string"}, "archived": {"type": "integer"}},
    }
    assert find("get_signal").result == {
        "type": "object",
        "properties": {"found": {"type": "boolean"}, "value": {}},
    }
