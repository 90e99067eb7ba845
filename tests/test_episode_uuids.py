"""Episode uuids across data dirs: a seeded store never hands out a uuid it already holds (live,
deleted or archived), and import and restore skip only the same episode; a different episode
under a uuid held here is kept under a new uuid derived from its own."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from memstrata.actors import IdSource
from memstrata.errors import InvalidInputError
from memstrata.layers import EpisodicMemory
from memstrata.layers._episodic_migrations import _MIGRATIONS
from memstrata.storage import apply_migrations, open_database
from memstrata.testing import simulation
from tests.fakes import FakeEmbedder

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
SCOPE = "episode:qa:1"  # what the first open of agent qa's store draws from


def _store(path: Path, seed: int = 42) -> EpisodicMemory:
    """A store whose uuids come from the seed, as a seeded system's first open of it."""
    store = EpisodicMemory.open(path, FakeEmbedder(), clock=lambda: T0 + timedelta(days=1))
    store.new_uuid = IdSource(seed).for_scope(SCOPE)
    return store


def _sequence(count: int, seed: int = 42) -> list[str]:
    source = IdSource(seed).for_scope(SCOPE)
    return [source() for _ in range(count)]


def test_a_new_episode_skips_every_uuid_the_store_holds_live_deleted_or_archived(data_dir: Path) -> None:
    drawn = _sequence(5)
    with _store(data_dir / "qa.sqlite") as store:
        ids = [store.record(f"note {n}", at=T0 + timedelta(hours=n)) for n in range(3)]
        assert store.delete(ids[0])
        assert store.archive(data_dir / "old.sqlite", before=T0 + timedelta(hours=2)) == 1  # the second
        store.new_uuid = IdSource(42).for_scope(SCOPE)  # the same sequence again: another run's
        fresh = store.record("a later note")
        again = store.record_many([{"content": "one more"}, {"content": "and one more"}])
        uuids = [store.get(i).uuid for i in (fresh, *again)]  # type: ignore[union-attr]
    assert uuids == [drawn[3], drawn[4], _sequence(6)[5]]


def test_a_source_that_repeats_itself_is_refused_by_name(data_dir: Path) -> None:
    with _store(data_dir / "qa.sqlite") as store:
        store.record("a note")
        store.new_uuid = lambda: _sequence(1)[0]
        with pytest.raises(InvalidInputError, match=r"new_uuid gave the uuid .* twice"):
            store.record("another note")
        assert store.count() == 1


def test_a_restore_from_another_run_with_the_same_seed_keeps_every_episode(
    data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    archive = data_dir / "a-archive.sqlite"
    with _store(data_dir / "a.sqlite") as run_a:
        run_a.record("A: sandbox flaked", at=T0)
        run_a.record("A: ledger lock", at=T0 + timedelta(hours=1))
        assert run_a.archive(archive) == 2
    with _store(data_dir / "b.sqlite") as run_b:
        own = run_b.record("B: my own first note", at=T0 + timedelta(hours=2))
        with caplog.at_level(logging.WARNING, logger="memstrata.episodic"):
            assert run_b.restore(archive) == 2
        assert "names another episode here" in caplog.text
        episodes = run_b.timeline()
        contents = [e.content for e in episodes]
        assert contents == ["A: sandbox flaked", "A: ledger lock", "B: my own first note"]
        assert len({e.uuid for e in episodes}) == 3
        assert run_b.get(own).uuid == _sequence(1)[0]  # type: ignore[union-attr]
        assert run_b.restore(archive) == 0  # the same episodes now: restoring twice adds nothing
        later = run_b.record("B: a later note")
        assert run_b.get(later).uuid not in {e.uuid for e in episodes}  # type: ignore[union-attr]


def test_a_deleted_episode_blocks_only_its_own_return(data_dir: Path) -> None:
    archive = data_dir / "a-archive.sqlite"
    with _store(data_dir / "a.sqlite") as run_a:
        run_a.record("A: sandbox flaked", at=T0)
        assert run_a.archive(archive, remove=False) == 1
        run_a.delete(1)
        assert run_a.restore(archive) == 0  # deleted for good: never restored
    with _store(data_dir / "b.sqlite") as run_b:
        assert run_b.delete(run_b.record("B: scratch", at=T0))  # took A's uuid, then deleted
        assert run_b.restore(archive) == 1  # another episode: kept under a new uuid
        assert [e.content for e in run_b.timeline()] == ["A: sandbox flaked"]


def test_an_upgraded_store_remembers_the_uuids_of_its_archives(data_dir: Path) -> None:
    archive = data_dir / "old-archive.sqlite"
    with _store(data_dir / "a.sqlite") as run_a:
        run_a.record("A: archived before the upgrade", at=T0)
        assert run_a.archive(archive) == 1
    path = data_dir / "old.sqlite"
    db = open_database(path)
    apply_migrations(db, "episodic", _MIGRATIONS[:4])  # the schema before episode identities
    with db.transaction():
        db.execute(
            "INSERT INTO archives(path, archive_uuid, episodes, removed, created_us) "
            "VALUES (?, 'x', 1, 1, 0)",
            (str(archive),),
        )
    db.close()
    with _store(path) as upgraded:
        fresh = upgraded.record("a new note")
        assert upgraded.get(fresh).uuid == _sequence(2)[1]  # type: ignore[union-attr]


def test_a_fresh_run_with_the_same_seed_goes_on_after_an_import(tmp_path: Path) -> None:
    """The next remember() after importing a seeded snapshot takes a uuid of its own; a run that
    recorded first keeps both its own episode and the snapshot's; both replay exactly."""
    with simulation(tmp_path / "run1", seed=42) as system:
        qa = system.agent("qa")
        qa.fail_task("t1", "payment tests flaked: parallel runs")
        qa.remember("the sandbox rate-limits parallel runs")
        system.wait_idle()
        system.export(tmp_path / "snapshot.jsonl")
    seen = []
    for run in ("run2", "run2-again"):
        with simulation(tmp_path / run, seed=42) as system:
            assert system.import_(tmp_path / "snapshot.jsonl")["episode"] == 2
            qa = system.agent("qa")
            qa.remember("a new observation")
            seen.append([(e.uuid, e.content) for e in qa.list_episodes(newest_first=False)])
    assert seen[0] == seen[1] and len({u for u, _ in seen[0]}) == 3
    for run in ("run3", "run3-again"):
        with simulation(tmp_path / run, seed=42) as system:
            qa = system.agent("qa")
            qa.remember("a local note")
            counts = system.import_(tmp_path / "snapshot.jsonl")
            assert (counts["episode"], counts["skipped"]) == (2, 0)
            assert system.import_(tmp_path / "snapshot.jsonl")["episode"] == 0  # now the same ones
            seen.append([(e.uuid, e.content) for e in qa.list_episodes(newest_first=False)])
    assert seen[2] == seen[3]
    assert [c for _, c in seen[2]] == [
        "a local note",
        "payment tests flaked: parallel runs",
        "the sandbox rate-limits parallel runs",
    ]
    assert len({u for u, _ in seen[2]}) == 3
