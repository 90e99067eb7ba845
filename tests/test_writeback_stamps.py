"""One outcome has one time: a write-back's knowledge entry is dated when the write-back was
acknowledged (as its episode is), and a published signal when publish was called, however late
an actor gets to them."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path
from typing import Any

from memstrata import Config, MemorySystem
from memstrata.actors import LayerStores
from memstrata.actors._outbox import _MIGRATIONS
from memstrata.layers import KnowledgeStore
from memstrata.storage import Embedder, apply_migrations, open_database
from memstrata.testing import HashEmbedder, ManualClock

START = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
HOUR = 3600.0


class GatedKnowledge(LayerStores):
    """Knowledge writes wait for ``gate`` (set: they go through), as a busy store makes them wait."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()

    def open_knowledge(self, path: Path, embedder: Embedder | None, config: Config) -> Any:
        layer = super().open_knowledge(path, embedder, config)
        add_many, gate = layer.add_many, self.gate

        def gated(*args: Any, **kwargs: Any) -> Any:
            assert gate.wait(10)
            return add_many(*args, **kwargs)

        layer.add_many = gated
        return layer


class HeldClock(ManualClock):
    """A manual clock that other threads cannot read while it is held (they wait for release)."""

    def __init__(self, start: dt.datetime) -> None:
        super().__init__(start)
        self.caller = threading.get_ident()
        self.released = threading.Event()
        self.released.set()

    def now(self) -> dt.datetime:
        if threading.get_ident() != self.caller:
            assert self.released.wait(10)
        return super().now()


def _start(data_dir: Path, clock: ManualClock, stores: LayerStores | None = None) -> MemorySystem:
    return MemorySystem.start(
        Config(data_dir=data_dir), embedder=HashEmbedder(), clock=clock, stores=stores, seed=1
    )


def test_a_write_back_entry_is_dated_when_it_was_acknowledged(data_dir: Path) -> None:
    clock, stores = ManualClock(START), GatedKnowledge()
    with _start(data_dir, clock, stores) as system:
        agent = system.agent("qa")
        stores.gate.clear()  # the knowledge store is busy: the entries are written late
        agent.complete_task("t1", "payment tests pass serially")
        clock.advance(HOUR)
        agent.fail_task("t2", "the ledger migration timed out")
        clock.advance(HOUR)
        stores.gate.set()
        assert system.wait_idle(10)
        episodes = {e.task_run_id: e.at for e in agent.list_episodes()}
        entries = {e.tags["taskId"]: e for e in agent.list_knowledge()}
    assert episodes == {"t1": START, "t2": START + dt.timedelta(hours=1)}
    for task, at in episodes.items():
        assert entries[task].created_at == entries[task].updated_at == at.timestamp(), task


def test_a_replayed_write_back_keeps_the_time_it_was_acknowledged(data_dir: Path) -> None:
    """A row an earlier version left in the outbox (its schema, no newer table) is replayed at a
    restart a month later: entry and episode are dated at its acknowledgement."""
    acked = START - dt.timedelta(days=30)
    path = data_dir / "outbox" / "qa.sqlite"
    path.parent.mkdir(parents=True)
    db = open_database(path, load_vec=False)
    apply_migrations(db, "outbox", _MIGRATIONS[:3])
    with db.transaction():
        db.execute(
            "INSERT INTO outbox(kind, task_id, text, at) VALUES (?, ?, ?, ?)",
            ("failed", "t1", b"ledger migration timed out", acked.isoformat()),
        )
    db.close()
    with _start(data_dir, ManualClock(START)) as system:
        assert system.wait_idle(10)
        agent = system.agent("qa")
        [episode] = agent.list_episodes()
        [entry] = agent.list_knowledge()
    assert episode.at == acked
    assert (entry.category, entry.created_at, entry.updated_at) == (
        "pitfall",
        acked.timestamp(),
        acked.timestamp(),
    )


def test_a_publish_is_dated_at_the_call(data_dir: Path) -> None:
    clock = HeldClock(START)
    with _start(data_dir, clock) as system:
        board = system.blackboard("release")
        seen: list[dt.datetime | None] = []
        board.subscribe("status", lambda signal: seen.append(signal.updated_at))
        clock.released.clear()  # the board reads the clock only after the caller moved it on
        board.publish("status", "green")
        clock.advance(HOUR)
        clock.released.set()
        assert system.wait_idle(10)
        signal = board.signal("status")
    assert (signal.value, signal.version, signal.updated_at) == ("green", 1, START)
    assert seen == [START]


def test_a_dedup_keeps_the_first_and_the_last_time_whatever_the_order(tmp_path: Path) -> None:
    """``created_at`` is the earliest write of the content, ``updated_at`` the latest: a replayed
    write-back acknowledged earlier than a later write never moves the entry back."""
    embedder = HashEmbedder()
    with KnowledgeStore.open(tmp_path / "k.sqlite", embedder) as store:
        first = store.add("retry the upload", category="pattern", at=2000.0)
        assert store.add("retry the upload", category="pattern", at=1000.0) == first
        assert store.add("retry the upload", category="pattern", at=1500.0) == first
        entry = store.get(first)
        assert entry is not None and (entry.created_at, entry.updated_at) == (1000.0, 2000.0)
        ids = store.add_many(
            [{"content": "a", "category": "fact"}, {"content": "b"}, {"content": "a", "category": "fact"}],
            times=[10.0, None, 5.0],
        )
        a, b = store.get(ids[0]), store.get(ids[1])
        assert ids[0] == ids[2] and a is not None and b is not None
        assert (a.created_at, a.updated_at) == (5.0, 10.0)
        assert b.created_at == b.updated_at and b.created_at > 10.0  # the store's clock
