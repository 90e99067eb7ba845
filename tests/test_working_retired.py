"""Working memory of a retired agent: its values outlive the retire, so ending a task clears
them and an export writes them as if the agent had never been retired."""

from __future__ import annotations

from pathlib import Path

import orjson

from memstrata.testing import simulation


def _working_lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().splitlines() if orjson.loads(line)["kind"] == "working"]


def test_ending_a_task_after_a_retire_clears_that_tasks_space(tmp_path: Path) -> None:
    """The task's space is cleared though its actor stopped with the retire (the values did not):
    a later task with the same id does not find the old values."""
    with simulation(tmp_path / "data", seed=1) as system:
        agent = system.agent("a1")
        agent.begin_task("t1", "task one")
        agent.set_working("scratch", "t1 data", task_id="t1")
        agent.set_working("plan", {"step": 1})
        agent.set_working("scratch", "t2 data", task_id="t2")
        system.retire("a1")
        agent.complete_task("t1", "done")
        assert system.wait_idle(30)
        assert agent.get_working("scratch", "cleared", task_id="t1") == "cleared"
        assert agent.get_working("plan") == {"step": 1}  # other spaces keep theirs
        assert agent.get_working("scratch", task_id="t2") == "t2 data"
        system.retire("a1")
        agent.fail_task("t2", "gave up")
        assert system.wait_idle(30)
        assert agent.get_working("scratch", "cleared", task_id="t2") == "cleared"


def test_export_writes_the_working_memory_of_a_retired_agent(tmp_path: Path) -> None:
    """An export after a retire holds the same working records, byte for byte, as one before."""
    with simulation(tmp_path / "data", seed=1) as system:
        agent = system.agent("a1")
        agent.set_working("plan", {"step": 1})
        agent.set_working("cursor", 7, task_id="t1")
        system.agent("b1").set_working("draft", "kept")
        system.export(tmp_path / "before.jsonl")
        system.retire("a1")
        system.retire("b1")
        system.export(tmp_path / "after_retire.jsonl")
    before = _working_lines(tmp_path / "before.jsonl")
    assert len(before) == 3
    assert _working_lines(tmp_path / "after_retire.jsonl") == before
    assert (tmp_path / "after_retire.jsonl").read_bytes() == (tmp_path / "before.jsonl").read_bytes()
