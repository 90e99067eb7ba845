"""The startup consistency check: content rows, full-text indexes and vectors agree, or are repaired."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from memstrata.errors import InvalidInputError
from memstrata.layers import EpisodicMemory, KnowledgeStore
from memstrata.storage import (
    Database,
    VectorIndex,
    apply_migrations,
    check_consistency,
    fts_schema,
    open_database,
)
from tests._support import VectorRepair, check_knowledge, seeded_vector, without_default_model
from tests.fakes import FakeEmbedder

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[Database, VectorIndex]]:
    """A small store shaped like the layers' ones: ``docs`` + two FTS indexes + vectors."""
    db = open_database(tmp_path / "s.sqlite")
    schema = "CREATE TABLE docs (id INTEGER PRIMARY KEY, body TEXT NOT NULL, cjk TEXT NOT NULL DEFAULT '');"
    schema += fts_schema("docs", ["body"])
    apply_migrations(db, "test", [schema])
    vectors = VectorIndex(db, "docs", 8)
    with db.transaction():
        db.executemany(
            "INSERT INTO docs(id, body) VALUES (?, ?)",
            [(n, f"{WORDS[n % 10]} document {n}") for n in range(1, 31)],
        )
        vectors.upsert_many(list(range(1, 31)), np.stack([seeded_vector(n) for n in range(1, 31)]))
    yield db, vectors
    db.close()


def check(db: Database, vectors: VectorIndex, **kwargs: object) -> dict[str, object]:
    report = check_consistency(
        db,
        table="docs",
        fts={"docs_fts": None, "docs_tri": None},
        vectors=vectors,
        **kwargs,  # type: ignore[arg-type]
    )
    return report.as_dict()


def keyword_ids(db: Database, word: str) -> list[int]:
    return sorted(int(r[0]) for r in db.query("SELECT rowid FROM docs_fts WHERE docs_fts MATCH ?", (word,)))


def bypass(db: Database, trigger: str, sql: str, params: tuple[object, ...]) -> None:
    """Change ``docs`` without its full-text trigger (what a bug or an old version could do)."""
    create = db.scalar("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?", (trigger,))
    with db.transaction():
        db.execute(f"DROP TRIGGER {trigger}")
        db.execute(sql, params)
        db.execute(create)


def test_a_consistent_store_is_left_alone(store: tuple[Database, VectorIndex]) -> None:
    db, vectors = store
    report = check(db, vectors, full=True)
    assert report["consistent"] and report["problems"] == []
    assert (report["rows"], report["vectors"], report["fts_rebuilt"]) == (30, 30, [])


def test_missing_full_text_rows_are_rebuilt(store: tuple[Database, VectorIndex]) -> None:
    db, vectors = store
    bypass(db, "docs_ai", "INSERT INTO docs(id, body) VALUES (?, ?)", (31, "kilo document 31"))
    vectors.upsert(31, seeded_vector(31))
    assert keyword_ids(db, "kilo") == []
    report = check(db, vectors)
    assert report["fts_rebuilt"] == ["docs_fts", "docs_tri"]
    assert not report["consistent"] and "1 row(s) differ" in str(report["problems"])
    assert keyword_ids(db, "kilo") == [31]
    assert check(db, vectors, full=True)["consistent"]


def test_full_text_rows_of_deleted_content_are_rebuilt(store: tuple[Database, VectorIndex]) -> None:
    db, vectors = store
    bypass(db, "docs_ad", "DELETE FROM docs WHERE id = ?", (5,))
    vectors.delete(5)
    report = check(db, vectors)
    assert report["fts_rebuilt"] == ["docs_fts", "docs_tri"]
    assert keyword_ids(db, "document") == [n for n in range(1, 31) if n != 5]


def test_stale_full_text_rows_need_the_full_check(store: tuple[Database, VectorIndex]) -> None:
    db, vectors = store
    bypass(db, "docs_au", "UPDATE docs SET body = ? WHERE id = ?", ("lima document 7", 7))
    assert check(db, vectors)["consistent"]  # same counts: the quick check cannot see it
    report = check(db, vectors, full=True)
    assert report["fts_rebuilt"] == ["docs_fts", "docs_tri"]
    assert "integrity check failed" in str(report["problems"])
    assert keyword_ids(db, "lima") == [7]


def test_orphan_vectors_are_deleted_and_missing_ones_repaired(store: tuple[Database, VectorIndex]) -> None:
    db, vectors = store
    vectors.upsert_many([40, 41], np.stack([seeded_vector(40), seeded_vector(41)]))  # no rows 40 and 41
    vectors.delete_many([3, 9])
    embed = VectorRepair(vectors)
    report = check(db, vectors, repair_missing=embed)
    assert embed.asked == [[3, 9]]
    assert (report["orphan_vectors_removed"], report["missing_vectors"], report["vectors_repaired"]) == (
        2,
        2,
        2,
    )
    assert report["vectors"] == 30 and vectors.rowids() == set(range(1, 31))
    assert [h.rowid for h in vectors.search(seeded_vector(9), 1)] == [9]
    assert check(db, vectors, repair_missing=embed)["consistent"] and len(embed.asked) == 1


def test_rows_that_need_no_vector_are_not_missing(store: tuple[Database, VectorIndex]) -> None:
    db, vectors = store
    vectors.delete_many([1, 2])
    report = check(db, vectors, vector_rows="id > 2")
    assert report["consistent"] and report["missing_vectors"] == 0
    report = check(db, vectors)  # without a repair callback the gap is reported, not hidden
    assert report["missing_vectors"] == 2 and report["vectors_repaired"] == 0 and not report["consistent"]


def test_an_index_of_some_rows_is_rebuilt_from_those_rows(tmp_path: Path) -> None:
    db = open_database(tmp_path / "p.sqlite")
    db.executescript(
        "CREATE TABLE docs (id INTEGER PRIMARY KEY, body TEXT NOT NULL, cjk TEXT NOT NULL DEFAULT '');"
        "CREATE VIRTUAL TABLE docs_tri USING fts5(cjk, content='docs', content_rowid='id', "
        "tokenize='trigram');"
    )
    with db.transaction():
        db.executemany(
            "INSERT INTO docs(id, body, cjk) VALUES (?, ?, ?)",
            [(1, "plain", ""), (2, "東京 text", "東京駅前"), (3, "more", ""), (4, "大阪 x", "大阪城公園")],
        )
        db.execute("INSERT INTO docs_tri(rowid, cjk) VALUES (2, '東京駅前')")  # row 4 was never indexed
    report = check_consistency(db, table="docs", fts={"docs_tri": "cjk != ''"}, full=True)
    assert report.fts_rebuilt == ["docs_tri"]
    assert db.scalar("SELECT count(*) FROM docs_tri_docsize") == 2  # only the rows it is meant to hold
    assert [r[0] for r in db.query("SELECT rowid FROM docs_tri WHERE docs_tri MATCH '大阪城'")] == [4]
    assert check_consistency(db, table="docs", fts={"docs_tri": "cjk != ''"}, full=True).consistent
    db.close()


def test_bad_names_are_refused(store: tuple[Database, VectorIndex]) -> None:
    db, _ = store
    with pytest.raises(InvalidInputError, match="table"):
        check_consistency(db, table="docs; DROP TABLE docs")
    with pytest.raises(InvalidInputError, match="fts table"):
        check_consistency(db, table="docs", fts={"x y": None})


# -- the episodic layer runs the check on open --------------------------------------------------


def damage_episodic(path: Path) -> None:
    with open_database(path) as db:
        vectors = VectorIndex(db, "episodes", FakeEmbedder().dim, mirror=False)
        vectors.delete_many([2, 4])  # two episodes lose their vectors
        vectors.upsert(999, np.ones(FakeEmbedder().dim, dtype=np.float32))  # a vector of nothing
        row = db.query("SELECT id, content, title, ident FROM episodes WHERE id = 3")[0]
        with db.transaction():  # episode 3 vanishes from the word index
            db.execute(
                "INSERT INTO episodes_fts(episodes_fts, rowid, content, title, ident) "
                "VALUES ('delete', ?, ?, ?, ?)",
                tuple(row),
            )


def test_episodic_open_repairs_and_reports(data_dir: Path) -> None:
    path = data_dir / "e.sqlite"
    embedder = FakeEmbedder()
    with EpisodicMemory.open(path, embedder) as episodic:
        for n, word in enumerate(WORDS[:6], start=1):
            assert episodic.record(f"{word} deployment note {n}", at=T0) == n
        assert episodic.status()["consistency"]["consistent"]
    damage_episodic(path)
    with EpisodicMemory.open(path, embedder) as episodic:
        status = episodic.status()
        report = status["consistency"]
        assert not report["consistent"]
        assert report["fts_rebuilt"] == ["episodes_fts"]
        assert (report["orphan_vectors_removed"], report["missing_vectors"], report["vectors_repaired"]) == (
            1,
            2,
            2,
        )
        assert status["repaired_on_open"]["embedded"] == 2
        assert (status["episodes"], status["vectors"], status["pending_vectors"]) == (6, 6, 0)
        assert [h.episode.id for h in episodic.search("charlie", mode="keyword")] == [3]
        assert episodic.search("delta deployment", mode="vector", top_k=1)[0].episode.id == 4
        assert episodic.check(full=True).consistent
    with EpisodicMemory.open(path, embedder) as episodic:
        assert episodic.status()["consistency"]["consistent"]


def test_keyword_only_episodic_keeps_its_gaps_for_the_model(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a model, episodes without vectors are expected (not repaired, not a problem)."""
    path = data_dir / "e.sqlite"
    with EpisodicMemory.open(path, FakeEmbedder()) as episodic:
        episodic.record("first note", at=T0)
    without_default_model(monkeypatch, "no model here")
    with EpisodicMemory.open(path) as episodic:
        episodic.record("second note", at=T0)
        status = episodic.status()
        assert status["consistency"]["consistent"] and status["pending_vectors"] == 1
    with EpisodicMemory.open(path, FakeEmbedder()) as episodic:
        status = episodic.status()
        assert status["consistency"]["vectors_repaired"] == 1 and status["pending_vectors"] == 0


# -- the knowledge layer: the call its owner is to add on open -----------------------------------


def test_the_check_repairs_a_knowledge_store(data_dir: Path) -> None:
    path = data_dir / "k.sqlite"
    embedder = FakeEmbedder()
    with KnowledgeStore.open(path, embedder) as store:
        ids = [store.add(f"{word} rollout guidance", category="pattern") for word in WORDS[:5]]
        store.add("東京の配備手順", category="pattern")
    with open_database(path) as db:
        vectors = VectorIndex(db, "knowledge", embedder.dim, metadata={"category": "text"})
        vectors.delete(ids[1])
        bypass_knowledge = db.scalar("SELECT sql FROM sqlite_master WHERE name = 'knowledge_ad'")
        with db.transaction():
            db.execute("DROP TRIGGER knowledge_ad")
            db.execute("DELETE FROM knowledge WHERE id = ?", (ids[4],))
            db.execute(bypass_knowledge)
        vectors.delete(ids[4])

        def mark_pending(missing: list[int]) -> int:  # the layer re-embeds pending rows itself
            with db.transaction():
                db.executemany(
                    "UPDATE knowledge SET vector_pending = 1 WHERE id = ?", [(i,) for i in missing]
                )
            return 0

        report = check_knowledge(db, vectors, repair_missing=mark_pending)
        assert report.fts_rebuilt == ["knowledge_fts"] and report.missing_vectors == 1
    with KnowledgeStore.open(path, embedder) as store:
        assert store.status()["pending_vectors"] == 0  # re-embedded by the store itself
        assert [h.entry.id for h in store.search("bravo", mode="vector", top_k=1)] == [ids[1]]
        assert ids[4] not in {h.entry.id for h in store.search("echo", mode="keyword")}
        assert store.search("東京", mode="keyword")[0].entry.content == "東京の配備手順"
