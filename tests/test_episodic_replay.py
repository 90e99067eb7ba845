"""Episodic stores in a simulation: with a seeded id source and a clock, the same calls leave the
same store and archive files, byte for byte; without a seed, the store and its archives still get
random uuids."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from memstrata import Config, MemorySystem
from memstrata.actors import IdSource, route
from memstrata.actors.messages import ArchiveEpisodes
from memstrata.layers import EpisodicMemory
from memstrata.layers._archive import ArchiveFile
from tests._support import GatedModel
from tests.fakes import FakeEmbedder

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def _tables(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every plain table of an SQLite file, rows sorted (the vector tables are compared by bytes)."""
    db = sqlite3.connect(path)
    try:
        names = [
            str(r[0])
            for r in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE 'CREATE VIRTUAL%' "
                "AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '%vec%' ORDER BY name"
            )
        ]
        return {name: sorted(db.execute(f'SELECT * FROM "{name}"'), key=repr) for name in names}
    finally:
        db.close()


def _run(folder: Path, source: Callable[[], str] | None) -> tuple[bytes, dict[str, Any], dict[str, Any]]:
    """Record, archive the older half, record again: the archive's bytes, its tables, the store's."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    now = T0 + timedelta(days=1)
    with EpisodicMemory.open(folder / "agent.sqlite", FakeEmbedder(), clock=lambda: now) as store:
        if source is not None:  # what a seeded system does once it has opened the store
            store.new_uuid = source
            assert store.name_store(source())
        for n, text in enumerate(["checkout timed out", "the sandbox rate-limits", "retries fixed it"]):
            store.record(text, task_run_id="t1", at=T0 + timedelta(hours=n))
        assert store.archive(folder / "old.sqlite", before=T0 + timedelta(hours=2)) == 2
        store.record("the next task began")
        archive = ArchiveFile(folder / "old.sqlite", verify=True)
        try:
            assert archive.meta["created_at"] == now.isoformat()  # the store's clock, not wall time
            assert archive.source_store_uuid == store.store_uuid == store.status()["store_uuid"]
        finally:
            archive.close()
    return (
        (folder / "old.sqlite").read_bytes(),
        _tables(folder / "old.sqlite"),
        _tables(folder / "agent.sqlite"),
    )


def test_a_seeded_store_leaves_the_same_store_and_archive_files(data_dir: Path) -> None:
    runs = [_run(data_dir / "run", IdSource(7).for_scope("episode:a:0")) for _ in range(2)]
    assert runs[0][0] == runs[1][0]  # the archive file, byte for byte
    assert runs[0][1] == runs[1][1]
    assert runs[0][2] == runs[1][2]  # the store: metadata (its uuid), episodes, archives
    meta = dict(runs[0][2]["metadata"])
    episode_uuids = {str(r[1]) for r in runs[0][2]["episodes"]} | {str(r[1]) for r in runs[0][1]["episodes"]}
    assert meta["store_uuid"] not in episode_uuids and len(episode_uuids) == 4
    other = _run(data_dir / "run", IdSource(8).for_scope("episode:a:0"))
    assert dict(other[2]["metadata"])["store_uuid"] != meta["store_uuid"]
    assert dict(other[1]["metadata"])["archive_uuid"] != dict(runs[0][1]["metadata"])["archive_uuid"]


def test_without_a_seed_the_store_and_its_archives_get_random_uuids(data_dir: Path) -> None:
    runs = [_run(data_dir / "run", None) for _ in range(2)]
    for table, key in ((2, "store_uuid"), (1, "archive_uuid"), (1, "source_store_uuid")):
        assert dict(runs[0][table]["metadata"])[key] != dict(runs[1][table]["metadata"])[key]


def test_a_source_given_later_never_renames_a_store(data_dir: Path) -> None:
    path = data_dir / "agent.sqlite"
    with EpisodicMemory.open(path, FakeEmbedder()) as store:
        made = store.store_uuid
    with EpisodicMemory.open(path, FakeEmbedder()) as store:
        assert not store.name_store(IdSource(7).uuid("store:a"))  # a restart: the store already exists
        assert store.store_uuid == made
    with EpisodicMemory.open(data_dir / "fresh.sqlite", FakeEmbedder(), clock=lambda: T0) as store:
        store.record("an early note", at=T0 - timedelta(days=1))
        store.archive(data_dir / "early.sqlite")  # the archive holds the store's uuid: it stays
        named = store.store_uuid
        assert not store.name_store(IdSource(7).uuid("store:b"))
        assert store.store_uuid == named == store.status()["store_uuid"]


def test_an_archive_carries_the_vectors_still_being_computed(data_dir: Path) -> None:
    """An episode's vector is computed by the shared embedding service and stored when it comes:
    an archive asked for meanwhile waits for it, so what the archive holds (and a seeded run's
    archive bytes) does not depend on the model's timing."""
    model = GatedModel()
    path = data_dir / "archive.sqlite"
    with MemorySystem.start(Config(data_dir=data_dir / "d"), embedder=model) as system:
        agent = system.agent("a")
        model.mode = "hang"
        agent.remember("checkout timed out behind the payment sandbox")
        assert model.entered.wait(30)  # its vector is being computed, held by the model
        runtime = system._runtime
        archive = ArchiveEpisodes("a", str(path), None, None)
        asked = runtime.request(*route(archive), archive)  # in the mailbox before the vector's answer
        model.release.set()
        assert runtime.wait(asked, 30, "archive").archived == 1
    archived = ArchiveFile(path, verify=True)
    try:
        assert archived.meta["embedding_model"] == model.model_id
        assert archived.db.execute("SELECT count(*) FROM vectors").fetchone()[0] == 1
    finally:
        archived.close()
