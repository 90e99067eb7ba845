"""The open's consistency check of a large store runs beside its first calls: the store answers
at once, the examination uses a read-only connection of its own, and a difference it finds is
repaired on the owner's thread at the next call, exactly as the check at open repairs it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memstrata.layers import EpisodicMemory, KnowledgeStore
from memstrata.storage import (
    CheckSpec,
    Database,
    VectorIndex,
    _open_check,
    apply_migrations,
    fts_schema,
    open_database,
)
from memstrata.storage._consistency import examine_consistency
from tests._support import seeded_vector
from tests.fakes import FakeEmbedder
from tests.test_reliability_consistency import WORDS, damage_episodic

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


class Gate:
    """Holds every examination until :meth:`open` (no sleeps: the test decides when it ends),
    and records the connections the examinations ran on and what they found."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._event = threading.Event()
        self.started = threading.Event()  # an examination is under way
        self._monkeypatch = monkeypatch
        self.connections: list[Database] = []
        self.results: list[Any] = []

    def arm(self, *, endless: bool = False) -> None:
        """From now on every store opens as a large one, and its examination waits for the
        gate; ``endless``: it runs a statement that never ends instead, until a stop aborts it."""
        examine = _open_check.examine_consistency

        def held(db: Database, spec: CheckSpec) -> Any:
            self.connections.append(db)
            self.started.set()
            if endless:
                db.query(_ENDLESS)
            else:
                assert self._event.wait(60), "the test never opened the gate"
            self.results.append(examine(db, spec))
            return self.results[-1]

        self._monkeypatch.setattr(_open_check, "BACKGROUND_FROM_BYTES", 0)  # every store is large
        self._monkeypatch.setattr(_open_check, "examine_consistency", held)

    def open(self) -> None:
        self._event.set()


# counts for ever: only SQLite's progress handler (a stop) ends it
_ENDLESS = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT count(*) FROM n"


def closed(db: Database) -> bool:
    try:
        db.conn.execute("SELECT 1")
    except Exception:
        return True
    return False


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    held = Gate(monkeypatch)
    yield held
    held.open()  # a failing test must not leave an examination waiting


def knowledge_with_gaps(path: Path) -> list[int]:
    """A knowledge store whose entry 2 lost its vector and entry 5 its full-text row (by hand,
    bypassing the layer): what the check is the safety net for."""
    embedder = FakeEmbedder()
    with KnowledgeStore.open(path, embedder) as store:
        ids = [store.add(f"{word} rollout guidance", category="pattern") for word in WORDS[:6]]
    with open_database(path) as db:
        VectorIndex(db, "knowledge", embedder.dim, metadata={"category": "text"}).delete(ids[1])
        row = db.query("SELECT id, content, tag_text, ident FROM knowledge WHERE id = ?", (ids[4],))[0]
        with db.transaction():
            db.execute(
                "INSERT INTO knowledge_fts(knowledge_fts, rowid, content, tag_text, ident) "
                "VALUES ('delete', ?, ?, ?, ?)",
                tuple(row),
            )
    return ids


def test_a_large_store_answers_before_its_examination_ends(tmp_path: Path, gate: Gate) -> None:
    path = tmp_path / "k.sqlite"
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        store.add("bravo rollout guidance", category="pattern")
    gate.arm()
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        check = store._open_check
        assert check.pending  # held by the gate: the open did not wait for it
        assert [h.entry.content for h in store.search("bravo", top_k=1)] == ["bravo rollout guidance"]
        assert store.add("charlie rollout guidance", category="pattern") == 2
        assert check.pending
        gate.open()
        report = store.status()["consistency"]  # waits for the examination (held until now)
        assert report["consistent"] and (report["rows"], report["vectors"]) == (2, 2)
        assert not check.pending
    (reader,) = gate.connections
    assert reader.read_only and closed(reader)  # its own connection, closed once examined
    assert gate.results[0] is not None  # the examination found nothing to repair


def test_a_difference_found_beside_is_repaired_at_the_next_call(tmp_path: Path, gate: Gate) -> None:
    path = tmp_path / "k.sqlite"
    ids = knowledge_with_gaps(path)
    gate.arm()
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        # the first call sees the store as it is: entry 5 is missing from the word index
        assert ids[4] not in {h.entry.id for h in store.search("echo", mode="keyword")}
        thread = store._open_check._thread
        assert thread is not None
        gate.open()
        thread.join()  # the examination is over: it found the difference
        assert gate.results == [None]
        # the next call repairs on the owner's connection, as an open used to
        assert [h.entry.id for h in store.search("echo", mode="keyword")] == [ids[4]]
        report = store.status()["consistency"]
        assert report["fts_rebuilt"] == ["knowledge_fts"] and report["missing_vectors"] == 1
        assert store.status()["pending_vectors"] == 0  # re-embedded at once
        assert [h.entry.id for h in store.search("bravo", mode="vector", top_k=1)] == [ids[1]]
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        assert store.status()["consistency"]["consistent"]  # repaired for good


def test_the_same_repairs_as_the_check_at_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small store is checked at open; the report is the one the examination path ends with."""
    reports = []
    for large in (False, True):
        path = tmp_path / f"k{int(large)}.sqlite"
        knowledge_with_gaps(path)
        with monkeypatch.context() as patch:
            if large:
                patch.setattr(_open_check, "BACKGROUND_FROM_BYTES", 0)
            with KnowledgeStore.open(path, FakeEmbedder()) as store:
                report = store.status()["consistency"]
                del report["seconds"]
                reports.append(report)
    assert reports[0] == reports[1] and not reports[0]["consistent"]


def test_episodic_examined_beside_then_repaired(tmp_path: Path, gate: Gate) -> None:
    path = tmp_path / "e.sqlite"
    embedder = FakeEmbedder()
    with EpisodicMemory.open(path, embedder) as episodic:
        for n, word in enumerate(WORDS[:6], start=1):
            episodic.record(f"{word} deployment note {n}", at=T0)
    damage_episodic(path)
    gate.arm()
    with EpisodicMemory.open(path, embedder) as episodic:
        assert episodic._open_check is not None and episodic._open_check.pending
        assert [h.episode.id for h in episodic.search("charlie", mode="keyword")] == []  # as it is
        gate.open()
        status = episodic.status()
        report = status["consistency"]
        assert report["fts_rebuilt"] == ["episodes_fts"]
        assert (report["orphan_vectors_removed"], report["missing_vectors"], report["vectors_repaired"]) == (
            1,
            2,
            2,
        )
        assert (status["episodes"], status["vectors"], status["pending_vectors"]) == (6, 6, 0)
        assert [h.episode.id for h in episodic.search("charlie", mode="keyword")] == [3]


def test_an_examination_that_fails_leaves_the_check_to_the_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "k.sqlite"
    ids = knowledge_with_gaps(path)

    def broken(db: Database, spec: CheckSpec) -> Any:
        raise OSError("disk went away")

    monkeypatch.setattr(_open_check, "BACKGROUND_FROM_BYTES", 0)
    monkeypatch.setattr(_open_check, "examine_consistency", broken)
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        report = store.status()["consistency"]
        assert report["fts_rebuilt"] == ["knowledge_fts"]  # the owner checked and repaired
        assert [h.entry.id for h in store.search("echo", mode="keyword")] == [ids[4]]
    assert "disk went away" in caplog.text


def test_closing_stops_the_examination_and_waits_for_it(tmp_path: Path, gate: Gate) -> None:
    """A store opened and closed at once (``memstrata query``) does not wait for the check: the
    stop reaches SQLite and aborts the examination's statement, here one that never ends."""
    path = tmp_path / "k.sqlite"
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        store.add("alpha rollout guidance", category="pattern")
    gate.arm(endless=True)
    store = KnowledgeStore.open(path, FakeEmbedder())
    thread = store._open_check._thread
    assert thread is not None and gate.started.wait(60)
    store.close()  # while (or just before) the statement runs: it is aborted either way
    assert not thread.is_alive() and closed(gate.connections[0])
    assert gate.results == []  # stopped, not finished: nothing to act on, nothing repaired


def test_examining_reads_one_snapshot_and_writes_nothing(tmp_path: Path) -> None:
    db = open_database(tmp_path / "s.sqlite")
    apply_migrations(db, "test", ["CREATE TABLE docs (id INTEGER PRIMARY KEY, body TEXT NOT NULL);"
                                  + fts_schema("docs", ["body"])])  # fmt: skip
    vectors = VectorIndex(db, "docs", 8)
    with db.transaction():
        db.executemany("INSERT INTO docs(id, body) VALUES (?, ?)", [(n, f"doc {n}") for n in range(1, 11)])
        vectors.upsert_many(list(range(1, 11)), np.stack([seeded_vector(n) for n in range(1, 11)]))
    spec = CheckSpec.of(db, table="docs", fts={"docs_fts": None}, vectors=vectors)
    with open_database(db.path, read_only=True, load_vec=False) as reader:
        clean = examine_consistency(reader, spec)
        assert clean is not None and clean.consistent and (clean.rows, clean.vectors) == (10, 10)
        vectors.delete(3)
        assert examine_consistency(reader, spec) is None  # a vector missing: the owner must repair
    assert db.scalar("SELECT count(*) FROM docs") == 10 and vectors.count() == 9  # nothing repaired
    db.close()
