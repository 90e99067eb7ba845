"""A retried write-back (the same outcome of the same task again, its first answer lost) is
recorded once also when the agent was retired or the system restarted in between: the outcomes
an agent remembers to tell a retry from news are kept in its outbox."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from memstrata import Config, MemorySystem
from memstrata.actors._outbox import Outbox
from memstrata.storage import open_database
from memstrata.testing import HashEmbedder, ManualClock

SUMMARY = "payment tests pass serially"


def _start(data_dir: Path) -> MemorySystem:
    return MemorySystem.start(Config(data_dir=data_dir), embedder=HashEmbedder(), clock=ManualClock(), seed=3)


def _recorded(system: MemorySystem, task: str = "t1") -> tuple[int, int]:
    """How many episodes of ``task`` and knowledge entries the agent holds, once all has landed."""
    assert system.wait_idle(10)
    agent = system.agent("qa")
    return len(agent.list_episodes(task_run_id=task)), len(agent.list_knowledge())


def test_a_retry_after_a_retire_is_recorded_once(data_dir: Path) -> None:
    with _start(data_dir) as system:
        agent = system.agent("qa")
        agent.complete_task("t1", SUMMARY)
        assert _recorded(system) == (1, 1)
        system.retire("qa")
        agent.complete_task("t1", SUMMARY)
        assert _recorded(system) == (1, 1)


def test_a_retry_after_a_restart_is_recorded_once(data_dir: Path) -> None:
    with _start(data_dir) as system:
        system.agent("qa").fail_task("t1", SUMMARY)
        assert _recorded(system) == (1, 1)
    with _start(data_dir) as system:
        system.agent("qa").fail_task("t1", SUMMARY)
        assert _recorded(system) == (1, 1)
        system.agent("qa").complete_task("t1", SUMMARY)  # another outcome: news
        assert _recorded(system) == (2, 2)


def test_a_task_begun_again_gets_its_outcome_recorded_again(data_dir: Path) -> None:
    """Beginning the task again starts a new run: the same outcome then is news, not a retry,
    also across a restart."""
    with _start(data_dir) as system:
        agent = system.agent("qa")
        agent.complete_task("t1", SUMMARY)
        agent.begin_task("t1", "run the payment tests again")
        agent.complete_task("t1", SUMMARY)
        agent.complete_task("t1", SUMMARY)  # a retry of that one
        assert _recorded(system) == (2, 1)
    with _start(data_dir) as system:
        agent = system.agent("qa")
        agent.begin_task("t1", "and once more")
        agent.complete_task("t1", SUMMARY)
        assert _recorded(system) == (3, 1)


def test_an_outbox_remembers_its_latest_outcomes_only(tmp_path: Path) -> None:
    at = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    outbox = Outbox(tmp_path / "qa.sqlite")
    try:
        first = outbox.append("completed", "t0", "done", at)
        ids = outbox.append_many([("completed", f"t{i}", "done", at) for i in range(1, 1024)])
        # t0 completed again is a repeat (now the latest); t0 failed is news, and the 1,025th
        # outcome: the oldest, t1, is forgotten
        again = outbox.append_many([("completed", "t0", "done", at), ("failed", "t0", "done", at)])
        assert outbox.take_repeats([first, *ids, *again]) == {again[0]}
        later = outbox.append_many([("completed", "t1", "done", at), ("completed", "t2", "done", at)])
        assert outbox.take_repeats(later) == {later[1]}
    finally:
        outbox.close()


def test_rows_an_earlier_version_left_are_remembered_when_its_outbox_is_upgraded(data_dir: Path) -> None:
    """An earlier version acknowledged t1 and stored its episode, not yet its entry, when it
    stopped: after the upgrade, t1 sent again is known as a retry of that row."""
    with _start(data_dir) as system:
        system.agent("qa").complete_task("t1", SUMMARY)
        assert _recorded(system) == (1, 1)
    db = open_database(data_dir / "outbox" / "qa.sqlite", load_vec=False)
    with db.transaction():  # the outbox as the earlier version left it
        db.execute("DROP TABLE IF EXISTS recent_outcomes")
        db.execute("UPDATE metadata SET value = '3' WHERE key = 'schema_version'")
        db.execute(
            "INSERT INTO outbox(kind, task_id, text, at, episode_done) VALUES (?, ?, ?, ?, 1)",
            ("completed", "t1", SUMMARY.encode(), dt.datetime(2025, 1, 1, tzinfo=dt.UTC).isoformat()),
        )
    db.close()
    with _start(data_dir) as system:
        system.agent("qa").complete_task("t1", SUMMARY)  # its answer was lost
        assert _recorded(system) == (1, 1)
