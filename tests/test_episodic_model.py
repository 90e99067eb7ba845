"""EpisodicMemory with the real default model, real SQLite, sqlite-vec and FTS5."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from memstrata.errors import ArchiveError, InvalidInputError
from memstrata.layers import EpisodicMemory, KnowledgeStore
from memstrata.storage import Embedder
from tests._support import assert_restored, vector_blob

pytestmark = pytest.mark.model

NOW = datetime(2025, 6, 1, 9, 0, tzinfo=UTC)

EPISODES = [
    ("The checkout page timed out because the payments API was rate limiting us", "run-pay", 20),
    ("Retried card authorisation with exponential backoff and the errors stopped", "run-pay", 19),
    ("Upgraded the Postgres driver; connection pool exhaustion is gone", "run-db", 12),
    ("Vacuumed the orders table, query latency dropped by half", "run-db", 11),
    ("Wrote onboarding docs for the new support engineers", "run-docs", 5),
    ("Customers could not pay: the payment provider throttled our requests again", "run-pay", 1),
]


@pytest.fixture
def memory(data_dir: Path, real_embedder: Embedder) -> Iterator[EpisodicMemory]:
    with EpisodicMemory.open(data_dir / "episodic" / "ops.sqlite", real_embedder, clock=lambda: NOW) as ep:
        ep.record_many(
            [
                {
                    "content": text,
                    "task_run_id": run,
                    "at": NOW - timedelta(days=age),
                    "tags": {"age": str(age)},
                }
                for text, run, age in EPISODES
            ]
        )
        yield ep


def contents(hits: list[Any]) -> list[str]:
    return [h.episode.content for h in hits]


def test_semantic_search_finds_paraphrases(memory: EpisodicMemory) -> None:
    hits = memory.search("payment gateway throttling", top_k=3)
    assert [h.episode.task_run_id for h in hits] == ["run-pay"] * 3  # none of them says "gateway"
    assert hits[0].similarity is not None and hits[0].similarity > 0.3
    assert memory.status()["mode"] == "hybrid" and memory.status()["dim"] == 384


def test_task_run_and_time_range_filters(memory: EpisodicMemory) -> None:
    db_hits = memory.search("slow database", task_run_id="run-db")
    assert len(db_hits) == 2 and {h.episode.task_run_id for h in db_hits} == {"run-db"}
    recent = memory.search("payments rate limiting", since=NOW - timedelta(days=10))
    assert all(h.episode.at >= NOW - timedelta(days=10) for h in recent)
    assert contents(recent)[0].startswith("Customers could not pay")
    older = memory.search("payments rate limiting", until=NOW - timedelta(days=10))
    assert all(h.episode.at < NOW - timedelta(days=10) for h in older)
    assert contents(older)[0].startswith("The checkout page timed out")


def test_recency_prefers_the_recent_incident(memory: EpisodicMemory) -> None:
    query = "checkout timed out because the payments API was rate limiting"
    plain = memory.search(query, top_k=2, recency_half_life=None)
    assert contents(plain)[0].startswith("The checkout page")
    decayed = memory.search(query, top_k=2, recency_half_life=timedelta(days=3))
    assert contents(decayed)[0].startswith("Customers could not pay")
    assert decayed[0].score > decayed[1].score


def test_timeline_is_oldest_first(memory: EpisodicMemory) -> None:
    timeline = memory.timeline()
    assert [e.at for e in timeline] == sorted(e.at for e in timeline)
    assert [e.content for e in memory.timeline(limit=1, newest_first=True)] == [EPISODES[-1][0]]


def test_archive_search_restore_round_trip(
    memory: EpisodicMemory, data_dir: Path, real_embedder: Embedder
) -> None:
    originals = {e.uuid: e for e in memory.timeline()}
    vectors = {e.uuid: vector_blob(memory.path, e.id) for e in originals.values()}

    archive = data_dir / "ops-2025-05.sqlite"
    assert memory.archive(archive, before=NOW - timedelta(days=10)) == 4
    assert memory.count() == 2
    assert all(h.source == "live" for h in memory.search("postgres connection pool"))
    with_archives = memory.search("postgres connection pool", include_archives=True)
    assert with_archives[0].source == "archive"
    assert with_archives[0].episode.content.startswith("Upgraded the Postgres driver")

    fresh_path = data_dir / "fresh.sqlite"
    with EpisodicMemory.open(fresh_path, real_embedder) as fresh:
        assert fresh.restore(archive) == 4
        assert fresh.restore(archive) == 0
        restored = fresh.timeline()
        assert len(restored) == 4
        assert_restored(restored, fresh_path, originals, vectors)
        assert fresh.search("database driver upgrade")[0].episode.content.startswith("Upgraded the Postgres")


def test_bad_input_is_refused_and_nothing_is_lost(memory: EpisodicMemory, data_dir: Path) -> None:
    with pytest.raises(InvalidInputError, match="at"):
        memory.record("naive", at=datetime(2025, 1, 1))
    truncated = data_dir / "cut.sqlite"
    archive = data_dir / "whole.sqlite"
    memory.archive(archive, task_run_id="run-docs")
    truncated.write_bytes(archive.read_bytes()[:2000])
    with pytest.raises(ArchiveError):
        memory.restore(truncated)
    with pytest.raises(ArchiveError, match="not an SQLite file"):
        memory.restore(Path(__file__))
    assert memory.count() == 5
    for query in ['"', "NEAR(x", "\ud800", "x" * 100_000, "记忆", "🚀🚀", "\x00"]:
        assert isinstance(memory.search(query, include_archives=True), list)


def test_promotion_into_a_real_knowledge_store(
    memory: EpisodicMemory, data_dir: Path, real_embedder: Embedder
) -> None:
    lesson = memory.timeline(task_run_id="run-pay")[1]
    with KnowledgeStore.open(data_dir / "knowledge" / "ops.sqlite", real_embedder) as knowledge:
        (entry_id,) = memory.promote([lesson.id], knowledge)
        hits = knowledge.search("how to handle card authorisation errors", top_k=1)
        assert hits[0].entry.id == entry_id
        assert hits[0].entry.category == "outcome"
        assert hits[0].entry.tags["episode_id"] == str(lesson.id)
        assert hits[0].entry.tags["task_run_id"] == "run-pay"
