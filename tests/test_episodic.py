"""EpisodicMemory with the fake embedder: records, filters, recency, archives, promotion, retention."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memstrata import Config
from memstrata.config import EpisodicConfig, SearchConfig
from memstrata.core.constants import MAX_TOP_K
from memstrata.errors import (
    ArchiveError,
    InvalidInputError,
    SchemaMismatchError,
    StorageError,
)
from memstrata.layers import Episode, EpisodeHit, EpisodicMemory
from memstrata.storage import _connection, open_database
from tests._support import assert_bulk_write_refused, assert_restored, vector_blob, without_default_model
from tests.fakes import BreakableEmbedder, FakeEmbedder

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


class FakeClock:
    """A settable clock: the store dates new episodes and measures recency with it."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0 + timedelta(days=30))


@pytest.fixture
def store(data_dir: Path, fake_embedder: FakeEmbedder, clock: FakeClock) -> Iterator[EpisodicMemory]:
    with EpisodicMemory.open(data_dir / "episodic" / "agent.sqlite", fake_embedder, clock=clock) as ep:
        yield ep


def ids(hits: list[EpisodeHit]) -> list[int]:
    return [h.episode.id for h in hits]


# -- records ------------------------------------------------------------------------------------


def test_record_and_get_round_trip(store: EpisodicMemory) -> None:
    plus_two = timezone(timedelta(hours=2))
    at = datetime(2025, 3, 1, 14, 30, 15, 123456, tzinfo=plus_two)
    ident = store.record(
        "Refactored the payment module",
        title="Task t1 completed",
        task_run_id="run-1",
        tags={"taskId": "t1", "bare": ""},
        kind="task-outcome",
        at=at,
    )
    episode = store.get(ident)
    assert isinstance(episode, Episode)
    assert episode.content == "Refactored the payment module"
    assert episode.title == "Task t1 completed"
    assert episode.task_run_id == "run-1"
    assert episode.tags == {"bare": "", "taskId": "t1"}
    assert episode.kind == "task-outcome"
    assert episode.at == at and episode.at.tzinfo is UTC
    assert episode.at.utcoffset() == timedelta(0)
    assert episode.archive is None and not episode.archived
    assert len(episode.uuid) == 36
    assert store.get(ident + 100) is None
    assert store.count() == 1


def test_record_defaults_to_the_clock(store: EpisodicMemory, clock: FakeClock) -> None:
    episode = store.get(store.record("observed something"))
    assert episode is not None
    assert episode.at == clock.now
    assert episode.kind == "note" and episode.title is None and episode.task_run_id is None
    assert episode.tags == {}


def test_record_many_is_one_batch_and_ids_are_in_order(
    store: EpisodicMemory, fake_embedder: FakeEmbedder
) -> None:
    before = fake_embedder.calls
    new = store.record_many(
        [{"content": f"step {n} of the migration", "at": T0 + timedelta(minutes=n)} for n in range(20)]
    )
    assert fake_embedder.calls == before + 1
    assert new == sorted(new) and len(set(new)) == 20
    assert [e.content for e in store.timeline(limit=None)] == [
        f"step {n} of the migration" for n in range(20)
    ]


def test_ids_are_never_reused(store: EpisodicMemory, data_dir: Path) -> None:
    first = store.record_many([{"content": f"e{n}", "at": T0} for n in range(3)])
    assert store.archive(data_dir / "a.sqlite") == 3
    again = store.record("after the archive", at=T0)
    assert again > max(first)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"at": datetime(2025, 1, 1)}, "at"),
        ({"at": "2025-01-01T00:00:00Z"}, "at"),
        ({"kind": "Bad Kind"}, "kind"),
        ({"kind": ""}, "kind"),
        ({"tags": {"k": 1}}, "tags"),
        ({"tags": "a"}, "tags"),  # a list of bare tags is accepted; a bare string is not
        ({"tags": {"": "x"}}, "tags"),
        ({"title": 5}, "title"),
        ({"task_run_id": 7}, "task_run_id"),
    ],
)
def test_bad_arguments_are_named_and_nothing_is_written(
    store: EpisodicMemory, kwargs: dict[str, Any], name: str
) -> None:
    with pytest.raises(InvalidInputError, match=name) as info:
        store.record("content", **kwargs)
    assert "\n" not in str(info.value)
    assert store.count() == 0


@pytest.mark.parametrize("content", ["", "   \n", 42, None])
def test_bad_content_is_rejected(store: EpisodicMemory, content: Any) -> None:
    with pytest.raises(InvalidInputError, match="content"):
        store.record(content)
    assert store.count() == 0


def test_lone_surrogates_in_free_text_become_replacement_characters(store: EpisodicMemory) -> None:
    """The one rule for free text (content, title, tag values): repaired, the rest kept."""
    ident = store.record("lone \ud800 surrogate", title="t\udfff", tags={"k": "v\ud800"})
    episode = store.get(ident)
    assert episode is not None
    assert episode.content == "lone \ufffd surrogate"
    assert (episode.title, episode.tags) == ("t\ufffd", {"k": "v\ufffd"})


def test_content_size_limit_comes_from_config(data_dir: Path, fake_embedder: FakeEmbedder) -> None:
    config = replace(Config(data_dir=data_dir), max_content_bytes=1_000)
    with EpisodicMemory.open(data_dir / "e.sqlite", fake_embedder, config=config) as ep:
        ep.record("x" * 1_000)
        with pytest.raises(InvalidInputError, match="content is 1001 bytes"):
            ep.record("x" * 1_001)
        assert ep.count() == 1


def test_any_well_formed_kind_is_accepted(store: EpisodicMemory) -> None:
    for kind in ("note", "planning-pitfall", "tool_call", "0day"):
        assert store.get(store.record("x", kind=kind)).kind == kind  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("items", "error"),
    [
        pytest.param(
            [{"content": "fine", "at": T0}, {"content": "naive", "at": datetime(2025, 1, 1)}],
            r"items\[1\]\.at",
            id="naive-time-after-a-good-item",
        ),
        pytest.param([{"content": "x", "when": T0}], r"items\[0\] has unknown key", id="unknown-key"),
        pytest.param([{"title": "x"}], r"items\[0\] lacks 'content'", id="no-content"),
        pytest.param("not items", "items", id="not-a-list"),
    ],
)
def test_record_many_checks_everything_first(store: EpisodicMemory, items: Any, error: str) -> None:
    assert_bulk_write_refused(store, items, error)


def test_a_clock_returning_naive_times_is_refused(data_dir: Path, fake_embedder: FakeEmbedder) -> None:
    with EpisodicMemory.open(data_dir / "e.sqlite", fake_embedder, clock=lambda: datetime(2025, 1, 1)) as ep:
        with pytest.raises(InvalidInputError, match="timezone-aware"):
            ep.record("x")
        with pytest.raises(InvalidInputError, match="clock"):
            ep.search("x", recency_half_life=timedelta(days=1))
        assert ep.count() == 0


@given(st.datetimes(timezones=st.timezones()))
def test_times_round_trip_to_the_microsecond(value: datetime) -> None:
    from memstrata.core.validation import check_aware
    from memstrata.layers._episode_records import from_us, to_us

    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        with pytest.raises(InvalidInputError, match="out of range"):
            check_aware(value, "at")
        return
    back = from_us(to_us(check_aware(value, "at")))
    assert back == utc and back.tzinfo is UTC


# -- search -------------------------------------------------------------------------------------


def test_search_filters_by_task_run(store: EpisodicMemory) -> None:
    store.record("deploy failed because the database migration timed out", task_run_id="a", at=T0)
    store.record("deploy failed: migration timed out on the database", task_run_id="b", at=T0)
    store.record("wrote release notes", task_run_id="b", at=T0)
    hits = store.search("database migration timed out", task_run_id="b")
    assert hits and all(h.episode.task_run_id == "b" for h in hits)
    assert hits[0].episode.content.startswith("deploy failed: migration")
    assert store.search("database migration", task_run_id="nope") == []


def test_time_range_includes_since_and_excludes_until(store: EpisodicMemory) -> None:
    for hour in range(6):
        store.record(f"checked the queue at hour {hour}", at=T0 + timedelta(hours=hour))
    since, until = T0 + timedelta(hours=2), T0 + timedelta(hours=4)
    for mode in ("hybrid", "vector", "keyword"):
        hits = store.search("checked the queue", since=since, until=until, mode=mode)
        assert sorted(h.episode.at for h in hits) == [since, since + timedelta(hours=1)], mode
    assert len(store.search("queue", since=since)) == 4
    assert len(store.search("queue", until=until)) == 4
    assert store.search("queue", since=since, until=since) == []
    with pytest.raises(InvalidInputError, match="since"):
        store.search("queue", since=until, until=since)
    with pytest.raises(InvalidInputError, match="since"):
        store.search("queue", since=datetime(2025, 1, 1))
    with pytest.raises(InvalidInputError, match="until"):
        store.search("queue", until=datetime(2025, 1, 1))


def test_hits_carry_scores_ranks_and_match_types(store: EpisodicMemory) -> None:
    store.record("parseHttpRequest rejects chunked request bodies", at=T0)
    store.record("lunch menu for friday", at=T0)
    hits = store.search("http request")
    assert hits[0].episode.content.startswith("parseHttpRequest")
    assert hits[0].match_type == "hybrid" and hits[0].score == pytest.approx(1.0)
    assert hits[0].vector_rank == 1 and hits[0].keyword_rank == 1
    assert hits[0].similarity is not None and 0 < hits[0].similarity <= 1.0001
    assert all(0.0 <= h.score <= 1.0 for h in hits)
    keyword = store.search("http", mode="keyword")
    assert [h.match_type for h in keyword] == ["keyword"]
    vector = store.search("friday lunch", mode="vector")
    assert vector[0].match_type == "semantic" and vector[0].keyword_rank is None
    with pytest.raises(InvalidInputError, match="mode"):
        store.search("x", mode="fuzzy")
    with pytest.raises(InvalidInputError, match="top_k"):
        store.search("x", top_k=0)
    with pytest.raises(InvalidInputError, match="query"):
        store.search(None)  # type: ignore[arg-type]


def test_top_k_and_empty_queries(store: EpisodicMemory) -> None:
    store.record_many([{"content": f"backup job {n} finished", "at": T0} for n in range(15)])
    assert len(store.search("backup job", top_k=4)) == 4
    assert len(store.search("backup job")) == 10
    assert store.search("") == [] and store.search("   ") == []


def test_recent_wins_ties(store: EpisodicMemory, clock: FakeClock) -> None:
    old = store.record("cache invalidation bug in the session service", at=clock.now - timedelta(days=9))
    new = store.record("cache invalidation bug in the session service", at=clock.now - timedelta(days=1))
    plain = store.search("cache invalidation", recency_half_life=None)
    assert {h.episode.id for h in plain} == {old, new}
    # equal texts: ranks 1 and 2 in both lists, which the default fusion (k = 5) scores 1 and 6/7
    assert plain[1].score == pytest.approx(plain[0].score * 6 / 7)
    decayed = store.search("cache invalidation", recency_half_life=timedelta(days=2))
    assert ids(decayed) == [new, old]
    plain_new = next(h.score for h in plain if h.episode.id == new)
    assert decayed[0].score == pytest.approx(plain_new * 0.5**0.5, rel=0.05)
    assert decayed[1].score < decayed[0].score / 8


def test_default_half_life_from_open_and_from_config(
    data_dir: Path, fake_embedder: FakeEmbedder, clock: FakeClock
) -> None:
    # the older episode matches better; only decay can put the newer one first
    config = replace(Config(data_dir=data_dir), episodic=EpisodicConfig(recency_half_life_s=3600.0))
    with EpisodicMemory.open(data_dir / "e.sqlite", fake_embedder, clock=clock, config=config) as ep:
        old = ep.record("disk full on build agent seven", at=clock.now - timedelta(days=3))
        new = ep.record("disk full warning", at=clock.now - timedelta(minutes=5))
        assert ids(ep.search("disk full on build agent seven"))[0] == new
        assert ids(ep.search("disk full on build agent seven", recency_half_life=None))[0] == old
        assert ep.status()["recency_half_life_s"] == 3600.0
    with EpisodicMemory.open(
        data_dir / "e.sqlite", fake_embedder, clock=clock, recency_half_life=timedelta(hours=2)
    ) as ep:
        assert ep.status()["recency_half_life_s"] == 7200.0
        assert ids(ep.search("disk full on build agent seven"))[0] == new
    with pytest.raises(InvalidInputError, match="recency_half_life"):
        EpisodicMemory.open(data_dir / "x.sqlite", fake_embedder, recency_half_life=timedelta(0))


def test_decay_reaches_recent_episodes_beyond_the_candidate_depth(
    data_dir: Path, fake_embedder: FakeEmbedder, clock: FakeClock
) -> None:
    """300 old, better matches fill both candidate lists; the recent weak match must still win."""
    path = data_dir / "deep.sqlite"
    query = "invoice reconciliation failed for the ledger export"
    with EpisodicMemory.open(path, fake_embedder, clock=clock) as ep:
        ep.record_many(
            [
                {"content": f"{query} batch {n}", "at": clock.now - timedelta(days=60, hours=n)}
                for n in range(300)
            ]
        )
        recent = ep.record(
            "the ledger was mentioned while fixing unrelated printer drivers and coffee machines",
            at=clock.now - timedelta(hours=1),
        )
        undecayed = ep.search(query, top_k=10, recency_half_life=None)
        assert recent not in ids(undecayed)
        decayed = ep.search(query, top_k=10, recency_half_life=timedelta(days=1))
        assert ids(decayed)[0] == recent
        assert decayed[0].vector_rank is not None and decayed[0].vector_rank > 50
    # the same answer as with candidate lists deep enough to hold every episode
    deep = replace(Config(data_dir=data_dir), search=SearchConfig(depth=2_000))
    with EpisodicMemory.open(path, fake_embedder, clock=clock, config=deep) as ep:
        assert ids(ep.search(query, top_k=10, recency_half_life=timedelta(days=1))) == ids(decayed)


def test_decay_never_underflows_into_a_wrong_order(store: EpisodicMemory, clock: FakeClock) -> None:
    a = store.record("rotate the signing keys", at=clock.now - timedelta(days=400))
    b = store.record("rotate the signing keys now", at=clock.now - timedelta(days=399))
    hits = store.search("rotate the signing keys", recency_half_life=timedelta(minutes=1))
    assert ids(hits) == [b, a]  # both decay below the smallest float; ranking still holds


def test_deep_decay_over_very_old_episodes(store: EpisodicMemory, clock: FakeClock) -> None:
    made = store.record_many(
        [
            {"content": f"rotate signing keys {n}", "at": clock.now - timedelta(days=400, minutes=n)}
            for n in range(120)
        ]
    )
    hits = store.search("rotate signing keys", recency_half_life=timedelta(minutes=1), top_k=5)
    assert ids(hits) == made[:5]  # newest first: every score underflows, the order does not
    assert all(h.score == 0.0 for h in hits)
    # a brand-new, unrelated episode outranks them all, though it is last in the vector list
    fresh = store.record("lunch order for the team", at=clock.now)
    hits = store.search("rotate signing keys", recency_half_life=timedelta(minutes=1), top_k=5)
    assert ids(hits) == [fresh, *made[:4]]
    assert hits[0].score > 0.0 and hits[0].match_type == "semantic"


def test_decay_times_keyword_hits_whose_vectors_are_pending(data_dir: Path, clock: FakeClock) -> None:
    """A decayed search takes its keyword hits' times from the vector index, and from the table
    for an episode still waiting for its vector: each decays by its own time."""
    model = BreakableEmbedder()
    with EpisodicMemory.open(data_dir / "p.sqlite", model, clock=clock) as ep:
        old = ep.record("rotate the signing keys", at=clock.now - timedelta(days=30))
        model.broken = True
        pending = ep.record("rotate the signing keys before the audit", at=clock.now - timedelta(hours=1))
        model.broken = False
        assert ep.status()["vectors"] == 1
        plain = ep.search("rotate the signing keys", recency_half_life=None)
        assert ids(plain) == [old, pending]
        decayed = ep.search("rotate the signing keys", recency_half_life=timedelta(days=1))
        assert ids(decayed) == [pending, old]
        assert decayed[0].match_type == "keyword" and decayed[0].episode.at == clock.now - timedelta(hours=1)


def test_hostile_queries_never_raise(store: EpisodicMemory, data_dir: Path) -> None:
    store.record_many(
        [
            {"content": 'quote " and NEAR(a b) * ^ : - AND OR NOT', "at": T0},
            {"content": "中文内容测试 記憶 메모리", "at": T0},
            {"content": "emoji 🚀 launch", "at": T0},
        ]
    )
    store.archive(data_dir / "arch.sqlite", remove=False)
    queries = [
        '"',
        '""',
        "a OR",
        "NEAR(",
        "*",
        "^x",
        "col:val",
        "-",
        "AND",
        "\x00",
        "nul\x00inside",
        "\ud800",
        "lone \udfff surrogate",
        "x" * 100_000,
        "中文",
        "内容测试",
        "中",
        "🚀",
        "'; DROP TABLE episodes; --",
        "\n\t\r",
        "{}[]()",
        "%_%",
    ]
    for q in queries:
        for mode in ("hybrid", "vector", "keyword"):
            for include in (False, True):
                result = store.search(
                    q, mode=mode, include_archives=include, recency_half_life=timedelta(days=1)
                )
                assert isinstance(result, list)
    assert store.search("中文", mode="keyword")[0].episode.content.startswith("中文")
    assert store.count() == 3


# -- timeline -----------------------------------------------------------------------------------


def test_timeline_order_bounds_and_limit(store: EpisodicMemory) -> None:
    made = [
        store.record(f"event {n}", task_run_id="r1" if n % 2 else "r2", at=T0 + timedelta(hours=n))
        for n in (3, 0, 4, 1, 2)
    ]
    everything = store.timeline()
    assert [e.content for e in everything] == [f"event {n}" for n in range(5)]
    assert [e.content for e in store.timeline(limit=2)] == ["event 0", "event 1"]
    assert [e.content for e in store.timeline(limit=2, newest_first=True)] == ["event 4", "event 3"]
    bounded = store.timeline(since=T0 + timedelta(hours=1), until=T0 + timedelta(hours=3))
    assert [e.content for e in bounded] == ["event 1", "event 2"]
    assert [e.content for e in store.timeline(task_run_id="r1")] == ["event 1", "event 3"]
    assert store.timeline(limit=0) == []
    assert len(made) == 5
    with pytest.raises(InvalidInputError, match="limit"):
        store.timeline(limit=-1)
    with pytest.raises(InvalidInputError, match="since"):
        store.timeline(since=datetime(2025, 1, 1))


def test_same_time_keeps_insertion_order(store: EpisodicMemory) -> None:
    made = [store.record(f"tick {n}", at=T0) for n in range(5)]
    assert [e.id for e in store.timeline()] == made


# -- archives -----------------------------------------------------------------------------------


def fill(store: EpisodicMemory) -> list[int]:
    return store.record_many(
        [
            {
                "content": f"nightly build {n} failed on the arm runner" if n < 4 else f"sprint review {n}",
                "title": f"build {n}",
                "task_run_id": "ci" if n < 4 else "planning",
                "tags": {"n": str(n), "kind": "ci"},
                "kind": "task-outcome",
                "at": T0 + timedelta(days=n),
            }
            for n in range(8)
        ]
    )


def test_archive_removes_from_live_and_stays_searchable(store: EpisodicMemory, data_dir: Path) -> None:
    made = fill(store)
    path = data_dir / "archives" / "old.sqlite"
    path.parent.mkdir()
    assert store.archive(path, before=T0 + timedelta(days=3)) == 3
    assert path.is_file()
    assert store.count() == 5
    assert all(store.get(i) is None for i in made[:3])
    assert [e.id for e in store.timeline()] == made[3:]
    live_only = store.search("nightly build failed arm runner")
    assert {h.episode.id for h in live_only} <= set(made[3:])
    everything = store.search("nightly build failed arm runner", include_archives=True)
    archived = [h for h in everything if h.source == "archive"]
    assert {h.episode.id for h in archived} == set(made[:3])
    assert all(h.episode.archive == str(path) and h.episode.archived for h in archived)
    assert all(h.match_type == "hybrid" for h in archived)
    narrowed = store.search(
        "nightly build", include_archives=True, since=T0 + timedelta(days=1), until=T0 + timedelta(days=2)
    )
    assert [h.episode.id for h in narrowed] == [made[1]]
    planning = store.search("nightly build sprint review", include_archives=True, task_run_id="planning")
    assert planning and all(h.episode.task_run_id == "planning" for h in planning)
    tracked = store.status()["archives"]
    assert [(a["path"], a["episodes"], a["available"]) for a in tracked] == [(str(path), 3, True)]
    # a plain SQLite reader sees one self-contained file
    conn = sqlite3.connect(path)
    meta = dict(conn.execute("SELECT key, value FROM metadata").fetchall())
    assert meta["format"] == "memstrata-episodic-archive" and meta["format_version"] == "1"
    assert meta["embedding_model"] == "fake-bow" and meta["embedding_dim"] == "64"
    assert conn.execute("SELECT count(*) FROM vectors").fetchone()[0] == 3
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()
    assert not list(path.parent.glob(".*partial*"))


def test_archive_by_task_run(store: EpisodicMemory, data_dir: Path) -> None:
    fill(store)
    assert store.archive(data_dir / "ci.sqlite", task_run_id="ci") == 4
    assert {e.task_run_id for e in store.timeline()} == {"planning"}


def test_archive_with_nothing_selected_writes_nothing(store: EpisodicMemory, data_dir: Path) -> None:
    fill(store)
    assert store.archive(data_dir / "none.sqlite", before=T0 - timedelta(days=1)) == 0
    assert not (data_dir / "none.sqlite").exists()
    assert store.status()["archives"] == []


def test_archive_never_overwrites(store: EpisodicMemory, data_dir: Path) -> None:
    fill(store)
    path = data_dir / "taken.sqlite"
    path.write_text("something precious")
    with pytest.raises(ArchiveError, match="already exists"):
        store.archive(path)
    assert path.read_text() == "something precious"
    assert store.count() == 8
    with pytest.raises(ArchiveError, match="does not exist"):
        store.archive(data_dir / "no" / "such" / "dir.sqlite")
    assert store.count() == 8


def test_archive_copy_is_not_found_twice(store: EpisodicMemory, data_dir: Path) -> None:
    made = fill(store)
    assert store.archive(data_dir / "copy.sqlite", remove=False) == 8
    assert store.count() == 8
    hits = store.search("nightly build", include_archives=True, top_k=20)
    assert sorted(h.episode.id for h in hits) == sorted(made)
    assert all(h.source == "live" for h in hits)


def test_restore_into_a_fresh_store_round_trips_everything(
    store: EpisodicMemory, data_dir: Path, fake_embedder: FakeEmbedder
) -> None:
    made = fill(store)
    originals = {store.get(i).uuid: store.get(i) for i in made}  # type: ignore[union-attr]
    blobs = {originals[u].uuid: vector_blob(store.path, originals[u].id) for u in originals}
    path = data_dir / "all.sqlite"
    assert store.archive(path) == 8
    assert store.count() == 0
    embedded = fake_embedder.texts_embedded
    fresh_path = data_dir / "fresh.sqlite"
    with EpisodicMemory.open(fresh_path, fake_embedder) as fresh:
        assert fresh.restore(path) == 8
        assert fake_embedder.texts_embedded == embedded  # the archive's vectors were reused
        restored = fresh.timeline(limit=None)
        assert len(restored) == 8
        assert_restored(restored, fresh_path, originals, blobs)
        assert fresh.restore(path) == 0  # idempotent
        assert fresh.count() == 8
        assert fresh.search("nightly build arm runner")[0].episode.task_run_id == "ci"


def test_restore_into_the_same_store_gives_original_ids_back(store: EpisodicMemory, data_dir: Path) -> None:
    made = fill(store)
    path = data_dir / "a.sqlite"
    store.archive(path, before=T0 + timedelta(days=4))
    later = store.record("written after archiving", at=T0 + timedelta(days=9))
    assert len(store.search("nightly build", mode="vector", top_k=20)) == 5  # vectors now in memory
    assert store.restore(path) == 4
    assert len(store.search("nightly build", mode="vector", top_k=20)) == 9
    assert store.restore(path) == 0
    assert [e.id for e in store.timeline(limit=None)] == [*made, later]
    # restored episodes are live again: the archive copy is not returned twice
    hits = store.search("nightly build", include_archives=True, top_k=20)
    assert sorted(h.episode.id for h in hits) == sorted([*made, later])  # each once, all live
    assert all(h.source == "live" for h in hits)


def test_restore_with_another_model_re_embeds(store: EpisodicMemory, data_dir: Path) -> None:
    fill(store)
    path = data_dir / "a.sqlite"
    store.archive(path)
    other = FakeEmbedder(dim=32, model_id="fake-other")
    with EpisodicMemory.open(data_dir / "other.sqlite", other) as ep:
        assert ep.restore(path) == 8
        assert other.texts_embedded == 8
        assert ep.status()["vectors"] == 8
        assert ep.search("nightly build arm", mode="vector")[0].episode.task_run_id == "ci"


@pytest.mark.parametrize(
    "damage", ["text", "empty", "header", "truncated", "format", "version", "not-archive", "missing"]
)
def test_bad_archives_get_a_clear_error_and_lose_nothing(
    store: EpisodicMemory, data_dir: Path, damage: str
) -> None:
    made = fill(store)
    good = data_dir / "good.sqlite"
    store.archive(good, before=T0 + timedelta(days=2))
    before = (store.count(), ids(store.search("nightly build", top_k=20)))
    bad = data_dir / f"bad-{damage}.sqlite"
    expected = {
        "text": "not an SQLite file",
        "empty": "not an SQLite file",
        "header": "truncated",
        "truncated": "truncated",
        "format": "unknown format",
        "version": "format_version 99",
        "not-archive": "live 'episodic' store",
        "missing": "does not exist",
    }[damage]
    if damage == "text":
        bad.write_text("hello, I am not a database\n" * 100)
    elif damage == "empty":
        bad.write_bytes(b"")
    elif damage == "header":
        bad.write_bytes(good.read_bytes()[:60])
    elif damage == "truncated":
        data = good.read_bytes()
        bad.write_bytes(data[: len(data) // 2])
    elif damage in ("format", "version"):
        bad.write_bytes(good.read_bytes())
        conn = sqlite3.connect(bad)
        if damage == "format":
            conn.execute("UPDATE metadata SET value = 'zip-of-episodes' WHERE key = 'format'")
        else:
            conn.execute("UPDATE metadata SET value = '99' WHERE key = 'format_version'")
        conn.commit()
        conn.close()
    elif damage == "not-archive":
        bad = store.path
    with pytest.raises(ArchiveError, match=expected) as info:
        store.restore(bad)
    assert "\n" not in str(info.value)
    assert (store.count(), ids(store.search("nightly build", top_k=20))) == before
    assert store.restore(good) == 2  # the good archive still restores afterwards
    assert store.count() == len(made)


def test_a_failure_after_writing_the_archive_keeps_the_live_store(
    store: EpisodicMemory, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = fill(store)
    vectors = store._vectors
    assert vectors is not None

    def fail(rowids: Any) -> None:
        raise StorageError("disk I/O error (simulated)")

    monkeypatch.setattr(vectors, "delete_many", fail)
    path = data_dir / "half.sqlite"
    with pytest.raises(StorageError, match="simulated"):
        store.archive(path)
    monkeypatch.undo()
    assert [e.id for e in store.timeline()] == made
    assert store.status()["vectors"] == 8
    assert not path.exists() and store.status()["archives"] == []
    assert store.archive(path) == 8  # and it works once the fault is gone


def test_bulk_archive_keeps_the_other_vectors_exactly(
    store: EpisodicMemory, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = store.record_many(
        [
            {"content": f"sensor reading {n} from rack {n % 7}", "at": T0 + timedelta(minutes=n)}
            for n in range(1_300)
        ]
    )
    odd = set(made[1::2])
    kept = [i for i in made if i not in odd]
    blobs = {i: vector_blob(store.path, i) for i in kept[:50]}
    archived = {i: vector_blob(store.path, i) for i in sorted(odd)}
    vectors = store._vectors
    assert vectors is not None

    def fail(*args: Any, **kwargs: Any) -> None:
        raise StorageError("disk full (simulated)")

    # a fault halfway through the rebuild rolls everything back
    with monkeypatch.context() as patch:
        patch.setattr(vectors, "upsert_many", fail)
        with pytest.raises(StorageError, match="simulated"):
            store._archive_ids(data_dir / "failed.sqlite", sorted(odd), remove=True, selection={})
    assert store.count() == 1_300 and store.status()["vectors"] == 1_300
    assert not (data_dir / "failed.sqlite").exists()
    assert len(store.search("sensor reading rack", mode="vector", top_k=MAX_TOP_K)) == MAX_TOP_K

    assert store._archive_ids(data_dir / "odd.sqlite", sorted(odd), remove=True, selection={}) == 650
    assert store.count() == 650 and store.status()["vectors"] == 650
    assert all(vector_blob(store.path, i) == blob for i, blob in blobs.items())
    with open_database(data_dir / "odd.sqlite") as db:  # the archive holds the stored bytes exactly
        assert {int(i): bytes(b) for i, b in db.query("SELECT id, embedding FROM vectors")} == archived
    found = store.search("sensor reading rack", mode="vector", top_k=MAX_TOP_K)
    assert sorted(h.episode.id for h in found) == kept
    with EpisodicMemory.open(data_dir / "back.sqlite", FakeEmbedder()) as other:
        assert other.restore(data_dir / "odd.sqlite") == 650


def test_an_archive_from_another_model_is_searched_by_keywords(
    store: EpisodicMemory, data_dir: Path, clock: FakeClock
) -> None:
    fill(store)
    store.archive(data_dir / "a.sqlite", before=T0 + timedelta(days=2))
    path = store.path
    store.close()
    with EpisodicMemory.open(path, FakeEmbedder(dim=40, model_id="fake-v3"), clock=clock) as ep:
        hits = ep.search("nightly build arm runner", include_archives=True, top_k=20)
        archived = [h for h in hits if h.source == "archive"]
        assert len(archived) == 2 and all(h.match_type == "keyword" for h in archived)
        assert any(h.match_type == "hybrid" for h in hits if h.source == "live")


@pytest.mark.parametrize("damage", ["deleted", "overwritten", "truncated"])
def test_an_unusable_archive_is_skipped_by_search_and_reported(
    store: EpisodicMemory, data_dir: Path, damage: str
) -> None:
    fill(store)
    path = data_dir / "gone.sqlite"
    store.archive(path, before=T0 + timedelta(days=2))
    assert any(h.source == "archive" for h in store.search("nightly build", include_archives=True))
    if damage == "deleted":
        path.unlink()
    elif damage == "overwritten":
        path.write_bytes(b"junk" * 1000)
    else:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    hits = store.search("nightly build", include_archives=True)
    assert hits and all(h.source == "live" for h in hits)
    (entry,) = store.status()["archives"]
    assert entry["available"] is False and entry["problem"]


def test_an_archive_from_the_keyword_only_store_restores_with_vectors_later(
    data_dir: Path, fake_embedder: FakeEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    without_default_model(monkeypatch, "no model in this test")
    with EpisodicMemory.open(data_dir / "kw.sqlite") as kw:
        kw.record("keyword only episode about kafka lag", at=T0)
        kw.archive(data_dir / "kw-archive.sqlite")
    with EpisodicMemory.open(data_dir / "vec.sqlite", fake_embedder) as ep:
        assert ep.restore(data_dir / "kw-archive.sqlite") == 1
        assert ep.status()["vectors"] == 1
        assert ep.search("kafka lag", mode="vector")


# -- promotion ----------------------------------------------------------------------------------


def test_promote_copies_episodes_with_provenance(
    store: EpisodicMemory, data_dir: Path, fake_embedder: FakeEmbedder
) -> None:
    from memstrata.layers import KnowledgeStore

    first = store.record(
        "Use exponential backoff for the payments API", task_run_id="t7", tags={"area": "pay"}
    )
    second = store.record("Standup notes")
    with KnowledgeStore.open(data_dir / "knowledge" / "agent.sqlite", fake_embedder) as knowledge:
        new_ids = store.promote([first, second], knowledge)
        assert len(new_ids) == 2
        entry = knowledge.get(new_ids[0])
        assert entry is not None
        assert entry.content == "Use exponential backoff for the payments API"
        assert entry.category == "outcome"
        assert entry.tags["episode_id"] == str(first)
        assert entry.tags["task_run_id"] == "t7"
        assert entry.tags["area"] == "pay"
        other = knowledge.get(new_ids[1])
        assert (
            other is not None and other.tags["task_run_id"] == "" and other.tags["episode_id"] == str(second)
        )
        assert store.promote([first], knowledge, category="pattern") != []
        count = knowledge.count()
        with pytest.raises(InvalidInputError, match="episode"):
            store.promote([first, 9999], knowledge)
        with pytest.raises(InvalidInputError, match="category"):
            store.promote([first], knowledge, category="Not OK")
        assert knowledge.count() == count  # nothing was added by the failed calls


def test_promote_calls_the_knowledge_contract(store: EpisodicMemory) -> None:
    class Recorder:
        def __init__(self) -> None:
            self.calls: list[tuple[str, str, dict[str, str]]] = []

        def add(self, content: str, *, category: str, tags: dict[str, str]) -> int:
            self.calls.append((content, category, tags))
            return len(self.calls)

    sink = Recorder()
    ident = store.record("lesson", task_run_id="r", tags={"k": "v"})
    assert store.promote([ident], sink, category="pitfall") == [1]
    assert sink.calls == [("lesson", "pitfall", {"k": "v", "episode_id": str(ident), "task_run_id": "r"})]
    crowded = store.record("crowded", tags={f"t{n}": "" for n in range(63)})
    with pytest.raises(InvalidInputError, match=rf"episode {crowded} has 63 tags: .* would have 65, over"):
        store.promote([crowded], sink, category="pitfall")
    assert len(sink.calls) == 1


# -- retention, durability, modes ---------------------------------------------------------------


def test_retention_by_count_deletes_oldest_on_commit(
    data_dir: Path, fake_embedder: FakeEmbedder, clock: FakeClock
) -> None:
    with EpisodicMemory.open(data_dir / "e.sqlite", fake_embedder, clock=clock, retention_max_count=3) as ep:
        made = [ep.record(f"event {n}", at=T0 + timedelta(hours=n)) for n in range(5)]
        assert ep.count() == 5  # nothing happens before commit
        assert ep.commit() == 2
        assert [e.id for e in ep.timeline()] == made[2:]
        assert ep.commit() == 0


def test_retention_by_age_archives_when_configured(
    data_dir: Path, fake_embedder: FakeEmbedder, clock: FakeClock
) -> None:
    config = replace(
        Config(data_dir=data_dir),
        episodic=EpisodicConfig(retention_max_age_s=7 * 86400.0, archive_dir="retired"),
    )
    path = data_dir / "episodic" / "agent.sqlite"
    with EpisodicMemory.open(path, fake_embedder, clock=clock, config=config) as ep:
        ep.record("ancient outage in the billing cluster", at=clock.now - timedelta(days=20))
        keep = ep.record("fresh outage in the billing cluster", at=clock.now - timedelta(days=1))
        assert ep.commit() == 1
        assert [e.id for e in ep.timeline()] == [keep]
        files = list((path.parent / "retired").glob("*.sqlite"))
        assert len(files) == 1
        hits = ep.search("billing outage", include_archives=True)
        assert {h.source for h in hits} == {"live", "archive"}
        assert ep.status()["retention"]["archive_dir"] == str(path.parent / "retired")


def test_an_age_longer_than_the_calendar_retires_nothing(
    data_dir: Path, fake_embedder: FakeEmbedder, clock: FakeClock
) -> None:
    for age in (timedelta.max, timedelta(days=800_000)):  # past what SQLite holds, and past year 1
        path = data_dir / f"e{age.days}.sqlite"
        with EpisodicMemory.open(path, fake_embedder, clock=clock, retention_max_age=age) as ep:
            kept = ep.record("the first deploy", at=clock.now - timedelta(days=3650))
            assert ep.commit() == 0
            assert [e.id for e in ep.timeline()] == [kept]


def test_commit_checkpoints_the_wal(store: EpisodicMemory) -> None:
    store.record_many([{"content": f"x {n}", "at": T0} for n in range(50)])
    wal = Path(f"{store.path}-wal")
    assert wal.exists() and wal.stat().st_size > 0
    store.commit()
    assert not wal.exists() or wal.stat().st_size == 0


def test_a_reader_commits_without_waiting_for_a_writer_s_lock(
    data_dir: Path, fake_embedder: FakeEmbedder
) -> None:
    """A commit's checkpoint only tidies the WAL: it never waits for another process's write
    lock (a reader closing beside a writer waited SQLite's busy timeout at every close)."""
    path = data_dir / "e.sqlite"
    with EpisodicMemory.open(path, fake_embedder) as ep:
        ep.record("the deploy failed on a missing secret", at=T0)
    other = open_database(path)  # another process writing
    try:
        other.execute("BEGIN IMMEDIATE")
        with EpisodicMemory.open(path, fake_embedder) as ep:
            assert [h.episode.content for h in ep.search("deploy secret")]

            statements: list[str] = []

            class Recorded:  # the connection, each statement it runs written down
                def __init__(self, conn: Any) -> None:
                    self._conn = conn

                def execute(self, sql: str, *args: Any) -> Any:
                    statements.append(sql)
                    return self._conn.execute(sql, *args)

                def __getattr__(self, name: str) -> Any:
                    return getattr(self._conn, name)

            ep._db.conn = Recorded(ep._db.conn)
            assert ep.commit() == 0
            checkpoint = next(i for i, sql in enumerate(statements) if "wal_checkpoint" in sql)
            assert "PRAGMA busy_timeout = 0" in statements[:checkpoint]  # it does not wait
    finally:
        other.close()


def test_keyword_only_mode_then_vectors_are_repaired(
    data_dir: Path, fake_embedder: FakeEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    without_default_model(monkeypatch, "the model files are missing")
    path = data_dir / "e.sqlite"
    with EpisodicMemory.open(path) as ep:
        status = ep.status()
        assert status["mode"] == "keyword-only"
        assert "model files are missing" in status["keyword_only_reason"]
        ep.record("grafana dashboard shows p99 spikes", at=T0)
        ep.record("nothing to see", at=T0)
        assert [h.match_type for h in ep.search("grafana spikes")] == ["keyword"]
        assert ep.search("grafana", mode="vector") == []
    with EpisodicMemory.open(path, fake_embedder) as ep:
        status = ep.status()
        assert status["mode"] == "hybrid" and status["vectors"] == 2
        assert status["repaired_on_open"]["embedded"] == 2
        assert ep.search("grafana dashboard", mode="vector")[0].episode.content.startswith("grafana")


def test_model_change_rebuilds_vectors(data_dir: Path, fake_embedder: FakeEmbedder) -> None:
    path = data_dir / "e.sqlite"
    with EpisodicMemory.open(path, fake_embedder) as ep:
        ep.record_many([{"content": f"topic {n} alpha beta", "at": T0} for n in range(5)])
    other = FakeEmbedder(dim=48, model_id="fake-v2")
    with EpisodicMemory.open(path, other) as ep:
        status = ep.status()
        assert (status["model"], status["dim"], status["vectors"]) == ("fake-v2", 48, 5)
        assert status["repaired_on_open"]["rebuilt"] == 5
        assert other.texts_embedded == 5
        assert len(ep.search("alpha beta", mode="vector")) == 5
    with EpisodicMemory.open(path, other) as ep:
        assert ep.status()["repaired_on_open"]["rebuilt"] == 0


def test_a_read_only_store_writes_nothing_and_searches_what_it_can(
    data_dir: Path, fake_embedder: FakeEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opened read-only (a read-only data dir), a store that would write at open (no vectors yet,
    the vectors of another model) runs keyword-only, says why, and writes nothing; one whose
    vectors serve the model searches them, an episode still pending by keywords."""
    pending, bare, other = (data_dir / f"{name}.sqlite" for name in ("pending", "bare", "other"))
    with EpisodicMemory.open(pending, fake_embedder) as ep:
        ep.record("the grafana dashboard shows spikes", at=T0)
    with EpisodicMemory.open(pending, fake_embedder, defer_vectors=True) as ep:
        ep.record("the grafana alert is still waiting for its vector", at=T0)
    with EpisodicMemory.open(other, FakeEmbedder(dim=48, model_id="fake-old")) as ep:
        ep.record("the grafana board of the old model", at=T0)
    without_default_model(monkeypatch, "no model here")
    with EpisodicMemory.open(bare) as ep:
        ep.record("the grafana board stored without a model", at=T0)
    before = {p.name: p.read_bytes() for p in sorted(data_dir.glob("*.sqlite"))}
    monkeypatch.setattr(_connection, "writable", lambda path: False)  # as on a read-only mount
    with EpisodicMemory.open(pending, fake_embedder) as ep:
        assert ep.status()["mode"] == "hybrid"
        assert len(ep.search("grafana", mode="keyword")) == 2
        assert ep.search("the grafana dashboard shows spikes", mode="vector")[0].match_type == "semantic"
    for path, why in ((bare, "no vector index"), (other, "another model (fake-old)")):
        with EpisodicMemory.open(path, fake_embedder) as ep:
            status = ep.status()
            assert status["mode"] == "keyword-only" and why in status["keyword_only_reason"]
            assert "read-only" in status["keyword_only_reason"]
            assert [h.match_type for h in ep.search("grafana board")] == ["keyword"]
    assert {p.name: p.read_bytes() for p in sorted(data_dir.glob("*.sqlite"))} == before


def test_a_second_connection_sees_new_episodes(data_dir: Path, fake_embedder: FakeEmbedder) -> None:
    path = data_dir / "shared.sqlite"
    with (
        EpisodicMemory.open(path, fake_embedder) as reader,
        EpisodicMemory.open(path, fake_embedder) as writer,
    ):
        writer.record("first observation about rabbitmq", at=T0)
        assert len(reader.search("rabbitmq", mode="vector")) == 1
        writer.record("second observation about rabbitmq", at=T0)
        assert len(reader.search("rabbitmq", mode="vector")) == 2


def test_close_and_context_manager(data_dir: Path, fake_embedder: FakeEmbedder) -> None:
    ep = EpisodicMemory.open(data_dir / "e.sqlite", fake_embedder)
    ep.record("x", at=T0)
    ep.close()
    ep.close()
    with pytest.raises(StorageError, match="closed"):
        ep.record("y")
    with pytest.raises(StorageError, match="closed"):
        ep.search("x")
    with EpisodicMemory.open(data_dir / "e.sqlite", fake_embedder) as again:
        assert again.count() == 1
        assert "hybrid" in repr(again)


def test_another_kind_of_database_is_refused(data_dir: Path, fake_embedder: FakeEmbedder) -> None:
    from memstrata.storage import apply_migrations

    db = open_database(data_dir / "k.sqlite")
    apply_migrations(db, "knowledge", ["CREATE TABLE x (id INTEGER PRIMARY KEY)"])
    db.close()
    with pytest.raises(SchemaMismatchError):
        EpisodicMemory.open(data_dir / "k.sqlite", fake_embedder)


def test_status_reports_counts_and_range(store: EpisodicMemory) -> None:
    store.record("a", at=T0)
    store.record("b", at=T0 + timedelta(days=1))
    status = store.status()
    assert status["episodes"] == 2 and status["vectors"] == 2
    assert status["oldest"] == T0.isoformat() and status["newest"] == (T0 + timedelta(days=1)).isoformat()
    assert status["model"] == "fake-bow" and status["mode"] == "hybrid"


# -- dialogue: neighbouring turns, dates, conversation mode -------------------------------------

DIALOGUE = [
    "Ana: I adopted a dog from the shelter last week",
    "Ben: That's wonderful! What did you name her?",
    "Ana: Luna. She already knows the way to the park",
    "Ben: I spent the weekend repainting the kitchen",
    "Ana: Which colour did you pick in the end?",
    "Ben: A pale green, like the old farmhouse",
]


def record_dialogue(store: EpisodicMemory, run: str = "chat-1") -> list[int]:
    return store.record_many(
        {"content": text, "task_run_id": run, "at": T0 + timedelta(seconds=n), "kind": "turn"}
        for n, text in enumerate(DIALOGUE)
    )


def test_context_finds_a_turn_by_its_neighbours_words(store: EpisodicMemory) -> None:
    turns = record_dialogue(store)
    store.record("Luna moth sighted near the lamp", at=T0)  # no task run: no context
    # the answer ("Luna") holds neither "adopted" nor "dog": only its neighbours do
    hits = store.search("adopted dog", mode="keyword")
    found = ids(hits)
    assert found[0] == turns[0]  # its own words count more than a neighbour's
    assert turns[2] in found and turns[1] in found
    assert all(h.match_type == "keyword" for h in hits)
    # neighbours farther than two turns away add nothing
    assert turns[4] not in found and turns[5] not in found


def test_context_follows_later_turns_and_deletes(store: EpisodicMemory, data_dir: Path) -> None:
    first = store.record("Ana: Luna loves the park", task_run_id="chat", at=T0)
    assert first not in ids(store.search("frisbee", mode="keyword"))
    later = store.record("Ben: does she chase a frisbee?", task_run_id="chat", at=T0 + timedelta(seconds=1))
    assert ids(store.search("frisbee", mode="keyword")) == [later, first]
    store.archive(data_dir / "a.msarchive", task_run_id="chat")
    assert store.search("frisbee", mode="keyword") == []
    assert store._db.scalar("SELECT count(*) FROM episodes_ctx") == 0


@pytest.mark.parametrize("remove", [False, True], ids=["kept-live", "archived-and-restored"])
@pytest.mark.parametrize("mode", ["hybrid", "vector", "keyword"])
def test_a_deleted_episode_is_not_found_in_an_archive_written_before(
    store: EpisodicMemory, data_dir: Path, remove: bool, mode: str
) -> None:
    """Only the archive holds the deleted episode's words: its copy there is dropped all the same."""
    secret = store.record("secret payroll numbers", at=T0)
    other = store.record("unrelated note", at=T0 + timedelta(days=1))
    store.archive(data_dir / "x.msarchive", remove=remove)
    if remove:
        assert store.restore(data_dir / "x.msarchive") == 2
    assert store.delete(secret)
    hits = store.search("secret payroll", include_archives=True, mode=mode)
    assert secret not in ids(hits)
    assert other in ids(store.search("unrelated note", include_archives=True, mode=mode))


CONTEXTS = "SELECT e.content, c.context FROM episodes e JOIN episodes_ctx c ON c.rowid = e.id ORDER BY 1"


def test_archived_turns_leave_their_neighbours_context_until_restored(
    store: EpisodicMemory, data_dir: Path
) -> None:
    turns = record_dialogue(store)
    recorded = store._db.query(CONTEXTS)
    assert ids(store.search("adopted", mode="keyword"))[:3] == turns[:3]  # turn 0, then by context
    assert store.archive(data_dir / "old.msarchive", before=T0 + timedelta(seconds=2)) == 2
    # only the archive holds "adopted" now: no live neighbour is found by its words
    assert store.search("adopted", mode="keyword") == []
    hits = store.search("adopted", mode="keyword", include_archives=True)
    assert [(h.episode.id, h.source) for h in hits][:1] == [(turns[0], "archive")]
    assert all(h.source == "archive" for h in hits)
    with EpisodicMemory.open(data_dir / "rest.sqlite", FakeEmbedder()) as rest:
        rest.record_many(
            {"content": text, "task_run_id": "chat-1", "at": T0 + timedelta(seconds=n)}
            for n, text in enumerate(DIALOGUE)
            if n >= 2
        )
        assert store._db.query(CONTEXTS) == rest._db.query(CONTEXTS)
    assert store.restore(data_dir / "old.msarchive") == 2
    assert store._db.query(CONTEXTS) == recorded
    assert ids(store.search("adopted", mode="keyword"))[:3] == turns[:3]


@pytest.mark.parametrize("archive_dir", [None, "retired"])
def test_retired_turns_leave_their_neighbours_context(
    data_dir: Path, fake_embedder: FakeEmbedder, clock: FakeClock, archive_dir: str | None
) -> None:
    path = data_dir / "e.sqlite"
    with EpisodicMemory.open(
        path, fake_embedder, clock=clock, retention_max_count=4, archive_dir=archive_dir
    ) as ep:
        turns = record_dialogue(ep)
        assert ep.commit() == 2
        assert [e.id for e in ep.timeline()] == turns[2:]
        assert ep.search("adopted", mode="keyword") == []
        context = dict(ep._db.query(CONTEXTS))
        assert "adopted" not in context[DIALOGUE[2]] and "name her" not in context[DIALOGUE[2]]
        assert DIALOGUE[4] in context[DIALOGUE[2]]


def test_turns_recorded_out_of_order_get_the_same_context(store: EpisodicMemory, data_dir: Path) -> None:
    items = [
        {"content": text, "task_run_id": "chat", "at": T0 + timedelta(seconds=n)}
        for n, text in enumerate(DIALOGUE)
    ]
    for item in reversed(items):
        store.record(**item)
    with EpisodicMemory.open(data_dir / "ordered.sqlite", FakeEmbedder()) as ordered:
        ordered.record_many(items)
        query = "SELECT e.content, c.context FROM episodes e JOIN episodes_ctx c ON c.rowid = e.id ORDER BY 1"
        assert store._db.query(query) == ordered._db.query(query)


def test_batches_of_backdated_turns_over_many_runs_get_the_same_context(data_dir: Path) -> None:
    """A batch touching many task runs writes every run's contexts at once, in rowid order (with
    replaced rows): the contexts equal those of the same turns recorded in time order."""
    rng = random.Random(5)
    items = [
        {"content": f"turn {n} of run {run}: {rng.choice(DIALOGUE)}", "task_run_id": f"run-{run}",
         "at": T0 + timedelta(seconds=n)}
        for run in range(12) for n in range(rng.randint(1, 9))
    ]  # fmt: skip
    shuffled = items[:]
    rng.shuffle(shuffled)
    query = "SELECT e.content, c.context FROM episodes e JOIN episodes_ctx c ON c.rowid = e.id ORDER BY 1"
    with (
        EpisodicMemory.open(data_dir / "shuffled.sqlite", FakeEmbedder()) as backdated,
        EpisodicMemory.open(data_dir / "ordered.sqlite", FakeEmbedder()) as ordered,
    ):
        for start in range(0, len(shuffled), 7):
            backdated.record_many(shuffled[start : start + 7])
        ordered.record_many(sorted(items, key=lambda item: (item["task_run_id"], item["at"])))
        assert backdated._db.query(query) == ordered._db.query(query)
        assert backdated._db.scalar("SELECT count(*) FROM episodes_ctx") == ordered._db.scalar(
            "SELECT count(*) FROM episodes_ctx"
        )
        backdated._db.execute("INSERT INTO episodes_ctx(episodes_ctx, rank) VALUES ('integrity-check', 1)")
        found = [
            sorted(h.episode.content for h in store.search("shelter", mode="keyword", top_k=100))
            for store in (backdated, ordered)
        ]
        assert found[0] and found[0] == found[1]


def test_an_existing_store_upgrades_and_gets_context(data_dir: Path, fake_embedder: FakeEmbedder) -> None:
    from memstrata.layers._episodic import _MIGRATIONS
    from memstrata.storage import apply_migrations, schema_version

    path = data_dir / "old.sqlite"
    db = open_database(path)
    apply_migrations(db, "episodic", _MIGRATIONS[:1])  # the schema before neighbouring context
    with db.transaction():
        for n, text in enumerate(DIALOGUE):
            db.execute(
                "INSERT INTO episodes(uuid, at_us, kind, task_run_id, content, recorded_us) "
                "VALUES (?, ?, 'turn', 'chat', ?, 0)",
                (f"u{n}", 1_700_000_000_000_000 + n, text),
            )
    db.close()
    with EpisodicMemory.open(path, fake_embedder) as store:
        assert schema_version(store._db) == len(_MIGRATIONS)
        assert 3 in ids(store.search("adopted dog", mode="keyword"))


def test_the_date_is_part_of_what_is_embedded(data_dir: Path) -> None:
    seen: list[str] = []

    class Recording(FakeEmbedder):
        def embed_documents(self, texts: Any) -> Any:
            seen.extend(texts)
            return super().embed_documents(texts)

    with EpisodicMemory.open(data_dir / "d.sqlite", Recording()) as store:
        store.record("we met at the lake", title="Trip", at=datetime(2023, 5, 8, 13, 56, tzinfo=UTC))
    assert seen == ["Trip\n\nwe met at the lake (8 May 2023)"]


def test_conversation_mode_returns_each_hit_with_its_neighbours(store: EpisodicMemory) -> None:
    turns = record_dialogue(store)
    record_dialogue(store, run="chat-2")
    hits = store.search("pale green farmhouse", task_run_id="chat-1", neighbours=1, top_k=1)
    assert ids(hits) == [turns[5]]
    assert [e.id for e in hits[0].neighbours] == [turns[4], turns[5]]  # nothing after the last turn
    wide = store.search("name her", task_run_id="chat-1", neighbours=2, mode="keyword", top_k=1)
    assert [e.id for e in wide[0].neighbours] == turns[:4]
    assert store.search("pale green", top_k=1)[0].neighbours == ()
    with pytest.raises(InvalidInputError, match="neighbours must be"):
        store.search("x", neighbours=-1)


def test_plain_rrf_stays_selectable(data_dir: Path, fake_embedder: FakeEmbedder) -> None:
    from memstrata.storage import rrf

    plain = replace(Config(data_dir=data_dir), search=SearchConfig(rrf_k=60, keyword_weight=1.0))
    with EpisodicMemory.open(data_dir / "p.sqlite", fake_embedder, config=plain) as store:
        record_dialogue(store)
        vector = ids(store.search("dog park", mode="vector", top_k=50))
        keyword = ids(store.search("dog park", mode="keyword", top_k=50))
        hits = store.search("dog park", recency_half_life=None)
        expected = rrf([vector, keyword], k=60)
        assert [(h.episode.id, h.vector_rank, h.keyword_rank) for h in hits] == [
            (f.key, *f.ranks) for f in expected
        ]
        assert [h.score for h in hits] == pytest.approx([f.score for f in expected])
